"""The shipped data regenerate byte for byte, the splits share no twin, every answer's arithmetic checks."""

from __future__ import annotations

import re
from collections import Counter

import pytest

import synth_gsm8k

_CALC = re.compile(r"<<(\d+)([-+*/])(\d+)=(\d+)>>(\d+)")


@pytest.fixture(scope="module")
def shipped() -> dict[str, list[dict]]:
    return {s: synth_gsm8k.read_jsonl(synth_gsm8k.DATA_DIR / f"{s}.jsonl") for s in ("train", "test")}


def test_files_regenerate_byte_identical() -> None:
    for split, rows in synth_gsm8k.make_splits().items():
        assert synth_gsm8k.to_jsonl(rows) == (synth_gsm8k.DATA_DIR / f"{split}.jsonl").read_bytes(), split


def test_check_mode_reports_a_modified_file(tmp_path, capsys) -> None:
    assert synth_gsm8k.main(["--out", str(tmp_path)]) == 0
    assert synth_gsm8k.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "test.jsonl").write_bytes((tmp_path / "test.jsonl").read_bytes().replace(b"#### 1", b"#### 2", 1))
    assert synth_gsm8k.main(["--out", str(tmp_path), "--check"]) == 1
    assert "test.jsonl" in capsys.readouterr().err


def test_splits_have_their_sizes_and_share_no_twin(shipped) -> None:
    train_k = [synth_gsm8k.twin_key(d) for d in shipped["train"]]
    test_k = [synth_gsm8k.twin_key(d) for d in shipped["test"]]
    assert (len(train_k), len(test_k)) == (synth_gsm8k.SPLIT_SIZES["train"], synth_gsm8k.SPLIT_SIZES["test"])
    assert len(set(train_k)) == len(train_k) and len(set(test_k)) == len(test_k)
    assert not set(train_k) & set(test_k)


def test_twin_key_ignores_names_but_not_numbers() -> None:
    doc = synth_gsm8k.problem(synth_gsm8k.VERSION, "test", 0)
    renamed = dict(doc, question=doc["question"].replace(doc["question"].split()[0], "Someone", 1))
    assert renamed["question"] != doc["question"]
    assert synth_gsm8k.twin_key(renamed) == synth_gsm8k.twin_key(doc)
    first = re.search(r"\d+", doc["question"])
    renumbered = dict(doc, question=doc["question"][: first.start()] + "7" + first.group() + doc["question"][first.end():])
    assert synth_gsm8k.twin_key(renumbered) != synth_gsm8k.twin_key(doc)


def test_training_stream_excludes_the_twins_of_test_questions(shipped) -> None:
    test_k = frozenset(map(synth_gsm8k.twin_key, shipped["test"]))
    test_q = frozenset(d["question"] for d in shipped["test"])
    raw = [synth_gsm8k.problem(synth_gsm8k.VERSION, "stream", i) for i in range(20_000)]
    # Without the filter the stream does repeat test problems under other names: the check has teeth.
    assert any(synth_gsm8k.twin_key(p) in test_k and p["question"] not in test_q for p in raw)
    stream = synth_gsm8k.problems("stream", exclude=test_k)
    assert not any(synth_gsm8k.twin_key(next(stream)) in test_k for _ in range(20_000))


def test_every_annotation_is_right_and_the_final_answer_is_the_last_result(shipped) -> None:
    for doc in shipped["train"] + shipped["test"]:
        *lines, final = doc["answer"].split("\n")
        assert final.startswith("#### ")
        results = []
        for line in lines:
            steps = _CALC.findall(line)
            assert len(steps) == 1, line
            a, op, b, c, shown = steps[0]
            a, b, c = int(a), int(b), int(c)
            expected = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
            assert c == expected and shown == str(c), line
            assert op != "/" or a % b == 0, line
            assert f"{a}{op}{b}=<<" in line, line
            results.append(c)
        assert final == f"#### {results[-1]}"
        assert results[-1] >= 0


def test_variety_steps_operations_and_magnitudes(shipped) -> None:
    docs = shipped["test"]
    steps = Counter(d["answer"].count("<<") for d in docs)
    assert set(steps) == {1, 2, 3, 4}
    ops = Counter(op for d in docs for _, op, *_ in _CALC.findall(d["answer"]))
    assert set(ops) == {"+", "-", "*", "/"}
    finals = [int(d["answer"].rsplit("#### ", 1)[1]) for d in docs]
    # Guessing fails: most answers have 2-4 digits and none repeats too often.
    assert sum(10 <= f < 10_000 for f in finals) / len(finals) > 0.9
    assert Counter(finals).most_common(1)[0][1] < 0.02 * len(finals)
    assert len(synth_gsm8k.TEMPLATES) >= 20
    first_words = Counter(" ".join(d["question"].split()[1:4]) for d in docs)
    assert len(first_words) >= 20


def test_problem_is_a_pure_function_of_its_arguments() -> None:
    assert synth_gsm8k.problem("v2", "stream", 12345) == synth_gsm8k.problem("v2", "stream", 12345)
    assert synth_gsm8k.problem("v2", "stream", 1) != synth_gsm8k.problem("v2", "stream", 2)
    assert synth_gsm8k.problem("v1", "stream", 1) != synth_gsm8k.problem("v2", "stream", 1)
    with pytest.raises(ValueError, match="unknown data version"):
        synth_gsm8k.problem("v3", "test", 0)
