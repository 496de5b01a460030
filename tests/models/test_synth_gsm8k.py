"""The shipped data regenerate byte for byte, the splits are disjoint, every answer's arithmetic checks."""

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


def test_splits_have_their_sizes_and_are_disjoint(shipped) -> None:
    train_q = [d["question"] for d in shipped["train"]]
    test_q = [d["question"] for d in shipped["test"]]
    assert (len(train_q), len(test_q)) == (synth_gsm8k.SPLIT_SIZES["train"], synth_gsm8k.SPLIT_SIZES["test"])
    assert len(set(train_q)) == len(train_q) and len(set(test_q)) == len(test_q)
    assert not set(train_q) & set(test_q)


def test_training_stream_excludes_test_questions(shipped) -> None:
    test_q = frozenset(d["question"] for d in shipped["test"])
    stream = synth_gsm8k.problems("stream", exclude=test_q)
    assert not any(next(stream)["question"] in test_q for _ in range(3000))


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
    assert synth_gsm8k.problem("v1", "stream", 12345) == synth_gsm8k.problem("v1", "stream", 12345)
    assert synth_gsm8k.problem("v1", "stream", 1) != synth_gsm8k.problem("v1", "stream", 2)
    with pytest.raises(ValueError, match="unknown data version"):
        synth_gsm8k.problem("v2", "test", 0)
