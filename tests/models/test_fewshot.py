"""fewshot.py restates lm-eval's gsm8k task; check it against the installed lm-eval itself."""

from __future__ import annotations

from pathlib import Path

import pytest

import fewshot
import synth_gsm8k
import tokenizer as tokenizer_recipe


@pytest.fixture(scope="module")
def docs() -> dict[str, list[dict]]:
    return {s: synth_gsm8k.read_jsonl(synth_gsm8k.DATA_DIR / f"{s}.jsonl") for s in ("train", "test")}


@pytest.fixture(scope="module")
def lm_eval_task(tmp_path_factory):
    """lm-eval's own gsm8k.yaml with only the dataset replaced by the shipped files."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder = tmp_path_factory.mktemp("tasks")
    gsm8k_yaml = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    (folder / "synth.yaml").write_text(
        f"include: {gsm8k_yaml}\ntask: gsm8k_synth\ndataset_path: json\ndataset_name: null\n"
        "dataset_kwargs:\n  data_files:\n"
        f"    train: {synth_gsm8k.DATA_DIR / 'train.jsonl'}\n    test: {synth_gsm8k.DATA_DIR / 'test.jsonl'}\n"
    )
    task = TaskManager(include_path=str(folder), include_defaults=False).load(["gsm8k_synth"])["tasks"]["gsm8k_synth"]
    task.set_fewshot_seed(fewshot.FEWSHOT_SEED)
    return task


def test_prompts_equal_lm_evals(docs, lm_eval_task) -> None:
    ours = fewshot.prompts(docs["train"], docs["test"][:40])
    theirs = [lm_eval_task.fewshot_context(doc, fewshot.NUM_FEWSHOT) for doc in list(lm_eval_task.test_docs())[:40]]
    assert ours == theirs
    assert lm_eval_task.config.generation_kwargs["until"] == fewshot.STOP


def test_scoring_equals_lm_evals_filter_and_metric(docs, lm_eval_task) -> None:
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter

    doc = docs["test"][0]
    final = doc["answer"].rsplit("#### ", 1)[1]
    responses = [
        f" {doc['answer']}\n\n",
        f" some work\n#### {final}.",
        f" #### {int(final) + 1}",
        " no answer at all",
        f" #### 1,{final}",
        f" wrong\n#### 7\n#### {final}",
    ]
    kwargs = {m["metric"]: m for m in lm_eval_task.config.metric_list}["exact_match"]
    kwargs = {k: v for k, v in kwargs.items() if k in ("ignore_case", "ignore_punctuation", "regexes_to_ignore")}
    extracted = RegexFilter(regex_pattern=fewshot.STRICT_MATCH.pattern).apply([[fewshot.cut_at_stop(r)] for r in responses], [doc] * len(responses))
    for response, (pred,) in zip(responses, extracted):
        assert fewshot.strict_match(response) == pred
        expected = bool(exact_match_hf_evaluate([pred], [doc["answer"]], **kwargs)["exact_match"] == 1.0)
        assert fewshot.is_correct(response, doc) is expected, response
    assert [fewshot.is_correct(r, doc) for r in responses] == [True, True, False, False, False, False]


def test_five_shot_prompt_and_answer_fit_in_1024_tokens(docs) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_recipe.TOKENIZER_DIR)
    prompts = fewshot.prompts(docs["train"], docs["test"])
    answers = [" " + d["answer"] + "\n\nQuestion:" for d in docs["test"]]
    lengths = [len(ids) for ids in tok(prompts)["input_ids"]]
    answer_lengths = [len(ids) for ids in tok(answers)["input_ids"]]
    assert max(lengths) < 1024
    assert max(p + a for p, a in zip(lengths, answer_lengths)) <= 1024
