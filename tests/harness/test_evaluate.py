"""lm-eval through its Python API against a real (fake) server process: the offline task,
the scores, per-question records, and failed requests that are never scored."""

from __future__ import annotations

import asyncio
import errno
import gc
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from quantgate.harness.evaluate import (EvalSettings, EvalSetupError, check_metric, compile_templates_once,
                                        installed_task_yaml, lm_eval_command, model_args, per_question, run_eval,
                                        task_config, write_task_yaml)
from quantgate.harness.server import LaunchedServer, build_command
from tests.harness import runner_fixtures
from tests.harness.runner_fixtures import FAKE_SERVER, expected_accuracy, fake_args, launch

gsm8k_dir = runner_fixtures.gsm8k_dir  # the shared pytest fixture


def _settings(data: Path, work: Path, base_url: str = "http://127.0.0.1:9", **overrides) -> EvalSettings:
    values = dict(base_url=base_url, model="fake-model", task="gsm8k", test_file=data / "test.jsonl",
                  train_file=data / "train.jsonl", num_fewshot=2, limit=10, max_tokens=64, max_concurrency=4,
                  request_timeout_s=20, seed=None, temperature=None, metric="exact_match,strict-match",
                  work_dir=work)
    values.update(overrides)
    return EvalSettings(**values)


@pytest.fixture
def serve(tmp_path: Path, gsm8k_dir: Path) -> Iterator:
    """Start the fake server with the given flags; every server started is stopped after the test."""
    started: list[LaunchedServer] = []

    def start(**flags) -> LaunchedServer:
        cmd = build_command("vllm", "fake-model", fake_args(gsm8k_dir, **flags), {},
                            [sys.executable, str(FAKE_SERVER)])
        server = launch(cmd, tmp_path / f"server{len(started)}.log", startup_timeout_s=30)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_task_yaml_is_the_installed_one_with_only_the_dataset_replaced(tmp_path: Path,
                                                                      gsm8k_dir: Path) -> None:
    written = write_task_yaml(_settings(gsm8k_dir, tmp_path))
    original = yaml.safe_load(installed_task_yaml("gsm8k").read_text())
    ours = yaml.safe_load(written.read_text())
    data_files = ours.pop("dataset_kwargs")["data_files"]
    assert ours.pop("dataset_path") == "json"
    for key in ("dataset_path", "dataset_name", "dataset_kwargs"):
        original.pop(key, None)
    assert ours == original
    assert data_files == {"test": str((gsm8k_dir / "test.jsonl").resolve()),
                          "train": str((gsm8k_dir / "train.jsonl").resolve())}
    assert all(Path(p).is_absolute() for p in data_files.values())


def test_relative_data_files_are_written_as_absolute_paths(tmp_path: Path, gsm8k_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """lm-eval resolves a relative data file against its own CWD, not the config's: `quantgate repro`'s
    lm_eval command, run from elsewhere, would load another file or none."""
    monkeypatch.chdir(gsm8k_dir.parent)
    written = write_task_yaml(_settings(Path(gsm8k_dir.name), tmp_path / "run"))
    assert yaml.safe_load(written.read_text())["dataset_kwargs"]["data_files"] == {
        "test": str((gsm8k_dir / "test.jsonl").resolve()), "train": str((gsm8k_dir / "train.jsonl").resolve())}


def test_unknown_metric_and_missing_train_file_are_setup_errors(tmp_path: Path, gsm8k_dir: Path) -> None:
    with pytest.raises(EvalSetupError, match="exact_match,flexible-extract"):
        check_metric(task_config("gsm8k")[1], "exact_match,strict")
    with pytest.raises(EvalSetupError, match="train file"):
        write_task_yaml(_settings(gsm8k_dir, tmp_path, train_file=None))
    with pytest.raises(EvalSetupError, match="not the name of a task in the installed lm-eval"):
        installed_task_yaml("no_such_task_anywhere")


# -- tasks by name: lm-eval names a task by its YAML's `task:` key, never by its file name ----------


def test_a_task_is_found_by_its_task_key_and_rebuilt_from_its_one_file(tmp_path: Path, gsm8k_dir: Path) -> None:
    """gsm8k_cot lives in gsm8k/gsm8k-cot.yaml: looking for `gsm8k_cot.yaml` refused it."""
    from lm_eval.tasks import TaskManager

    assert installed_task_yaml("gsm8k_cot").name == "gsm8k-cot.yaml"
    source, task_cfg = task_config("gsm8k_cot")
    assert task_cfg["task"] == "gsm8k_cot" and check_metric(task_cfg, "exact_match,strict-match")
    written = write_task_yaml(_settings(gsm8k_dir, tmp_path, task="gsm8k_cot"))
    task = TaskManager(include_path=str(written.parent), include_defaults=False).load(["gsm8k_cot"])["tasks"]
    assert len(task["gsm8k_cot"].test_docs()) == runner_fixtures.N_TEST  # the local data, offline


def test_a_task_with_its_own_few_shot_examples_is_rebuilt_without_a_train_file(tmp_path: Path, gsm8k_dir: Path) -> None:
    written = write_task_yaml(_settings(gsm8k_dir, tmp_path, task="gsm8k_cot", train_file=None, num_fewshot=8))
    assert "train" not in yaml.safe_load(written.read_text())["dataset_kwargs"]["data_files"]
    with pytest.raises(EvalSetupError, match="no train file to draw few-shot examples from"):
        write_task_yaml(_settings(gsm8k_dir, tmp_path / "plain", task="gsm8k", train_file=None, num_fewshot=8))
    zero_shot = write_task_yaml(_settings(gsm8k_dir, tmp_path / "zero", task="gsm8k", train_file=None, num_fewshot=0))
    assert yaml.safe_load(zero_shot.read_text())["dataset_kwargs"]["data_files"] == {
        "test": str((gsm8k_dir / "test.jsonl").resolve())}  # zero-shot draws no examples: no train file needed


def test_a_file_name_is_not_a_task_name_and_the_error_names_the_task(tmp_path: Path) -> None:
    """`task: gsm8k-cot` (the file's stem) linted clean, then ended a run with lm-eval's KeyError."""
    with pytest.raises(EvalSetupError) as refused:
        task_config("gsm8k-cot")
    message = str(refused.value)
    assert "'gsm8k-cot' is not the name of a task" in message and "gsm8k-cot.yaml" in message
    assert "not by its file name" in message and message.endswith("Did you mean 'gsm8k_cot'?")
    with pytest.raises(EvalSetupError, match="did you mean 'gsm8k'"):
        task_config("gsm8kk")


@pytest.mark.parametrize(("name", "says"), [
    ("mmlu", "is a group of tasks (mmlu_stem, "),
    ("metabench", "is a group of tasks"),
    ("chain_of_thought", "is an lm-eval tag of "),  # a `tag:` of gsm8k_cot and others
    ("squadv2", "is defined by a Python class (`class:`)"),
    ("aime25", "!function"),
])
def test_groups_tags_and_python_tasks_are_refused_as_what_they_are(name: str, says: str) -> None:
    with pytest.raises(EvalSetupError, match=re.escape(says)) as refused:
        task_config(name)
    assert "not the name of a task" not in str(refused.value)  # they are installed: never "not found"


def test_a_task_name_that_is_a_file_name_is_refused_at_load_before_any_server(tmp_path: Path,
                                                                             gsm8k_dir: Path) -> None:
    config = runner_fixtures.write_config(tmp_path, "cot", gsm8k_dir, task="gsm8k-cot")
    code, output = runner_fixtures.run_in_process([config], tmp_path / "out")
    assert code == 3 and "Did you mean 'gsm8k_cot'?" in output.replace("\n", ""), output
    assert not (tmp_path / "out" / "cot" / "server.log").exists()


def test_the_task_index_names_what_lm_evals_own_index_names() -> None:
    """quantgate reads the installed task YAMLs' names itself (lm-eval's TaskIndex takes 6 s to
    import and build, on every lint): both must agree on every name, its kind and its file."""
    from lm_eval.tasks._index import Kind, TaskIndex

    from quantgate.harness.evaluate import _task_index, _tasks_dir

    ours = _task_index(_tasks_dir())
    kinds = {Kind.TASK: "task", Kind.PY_TASK: "python task", Kind.GROUP: "group", Kind.TAG: "tag"}
    theirs = TaskIndex.build([_tasks_dir()])
    assert set(ours.entries) == set(theirs)
    for name, entry in theirs.items():
        mine = ours.get(name)
        assert mine is not None and mine.kind == kinds[entry.kind], name
        assert mine.path == (entry.yaml_path.resolve() if entry.yaml_path else None), name
        if entry.kind == Kind.TAG:
            assert set(mine.members) == entry.tags, name


def test_prompt_templates_compile_once_and_render_as_before() -> None:
    from lm_eval import utils

    compile_templates_once()
    compile_templates_once()  # idempotent: one cache, not a cache of a cache
    source = "Question: {{question}}\nAnswer:{% if answer %} {{answer | upper}}{% endif %}"
    assert utils.env.from_string(source) is utils.env.from_string(source)
    for doc in ({"question": "2+2?", "answer": "four"}, {"question": "3*3?", "answer": ""}):
        uncached = type(utils.env).from_string(utils.env, source).render(**doc)  # jinja's own compile
        assert utils.apply_template(source, doc) == uncached


def test_gen_prefix_is_in_the_task_file_that_run_and_repro_both_load(tmp_path: Path, gsm8k_dir: Path) -> None:
    from lm_eval.tasks import TaskManager

    written = write_task_yaml(_settings(gsm8k_dir, tmp_path, gen_prefix="The answer is"))
    assert yaml.safe_load(written.read_text())["gen_prefix"] == "The answer is"
    task = TaskManager(include_path=str(written.parent), include_defaults=False).load(["gsm8k"])["tasks"]["gsm8k"]
    assert task.config.gen_prefix == "The answer is"
    assert "gen_prefix" not in yaml.safe_load(write_task_yaml(_settings(gsm8k_dir, tmp_path / "b")).read_text())


def test_a_task_dataset_the_hub_cannot_give_is_a_setup_error_that_says_what_to_do(tmp_path: Path) -> None:
    # A config without `dataset:` makes lm-eval download the task's; offline that must say so,
    # not end as an internal error. A fresh process, so `datasets` reads the offline switches.
    code = ("import sys; from pathlib import Path; from tests.harness.test_evaluate import _settings; "
            "from quantgate.harness.evaluate import run_eval, DatasetUnreachable\n"
            "try:\n    run_eval(_settings(Path('.'), Path(sys.argv[1]), test_file=None, train_file=None))\n"
            "except DatasetUnreachable as exc:\n    print(exc)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2]).stdout
    assert "task gsm8k: its dataset could not be loaded from the Hugging Face hub" in out
    assert "set `dataset: {train: ..., test: ...}`" in out


def test_scores_match_what_the_server_answered(tmp_path: Path, gsm8k_dir: Path, serve) -> None:
    server = serve(accuracy=0.6, invalid=0.5)
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=16))
    assert outcome.error is None and outcome.requested == outcome.answered == 16
    expected = expected_accuracy(gsm8k_dir, 0.6, 16)
    assert outcome.metrics["value"] == pytest.approx(expected)
    assert outcome.metrics["strict_match"] == pytest.approx(expected)
    assert outcome.metrics["n"] == 16 and outcome.metrics["complete"]
    assert outcome.metrics["stderr"] > 0
    assert [s["id"] for s in outcome.samples] == list(range(16))
    for sample in outcome.samples:
        gold = sample["target"].rsplit("#### ", 1)[1]
        assert sample["correct"] == (sample["extracted"] == gold)
        assert sample["invalid"] == (sample["extracted"] == "[invalid]")
        assert set(sample["filters"]) == {"strict-match", "flexible-extract"}
    invalid = sum(s["invalid"] for s in outcome.samples) / 16
    assert outcome.metrics["invalid_rate"] == pytest.approx(invalid)
    assert 0 < outcome.server_busy_s <= outcome.eval_s
    # by role: swapped, or one file hashed for both, the result would vouch for data it never read
    assert outcome.dataset_sha256 == {role: hashlib.sha256((gsm8k_dir / f"{role}.jsonl").read_bytes()).hexdigest()
                                      for role in ("test", "train")}


def test_concurrency_one_uses_the_synchronous_path(tmp_path: Path, gsm8k_dir: Path, serve) -> None:
    server = serve(accuracy=0.5)
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=6, max_concurrency=1))
    assert outcome.error is None and outcome.answered == 6
    assert outcome.metrics["value"] == pytest.approx(expected_accuracy(gsm8k_dir, 0.5, 6))


def test_chat_completions(tmp_path: Path, gsm8k_dir: Path, serve) -> None:
    server = serve(accuracy=0.5)
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=6, use_chat_completions=True))
    assert outcome.error is None and outcome.answered == 6
    assert outcome.metrics["value"] == pytest.approx(expected_accuracy(gsm8k_dir, 0.5, 6))


@pytest.mark.parametrize("chat", [False, True])
def test_the_configs_max_tokens_temperature_and_seed_are_what_every_request_asks_for(
        tmp_path: Path, gsm8k_dir: Path, serve, chat: bool) -> None:
    """Without them, lm-eval sends its own (256 tokens, the task's temperature 0, seed 1234):
    a sampled config would be evaluated greedily, and no one would see it in the scores."""
    server = serve(log_requests=True)
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=4, max_tokens=48, temperature=0.6,
                                 seed=7, use_chat_completions=chat))
    assert outcome.error is None and outcome.answered == 4
    sent = [json.loads(line.split("fake server: request ", 1)[1])
            for line in server.log_path.read_text().splitlines() if "fake server: request " in line]
    assert len(sent) == 4
    assert all((s["max_tokens"], s["temperature"], s["seed"]) == (48, 0.6, 7) for s in sent), sent
    assert all("Question:" in s["stop"] for s in sent)  # the task's own stop sequences


def test_http_errors_are_never_scored_and_answers_so_far_are_kept(tmp_path: Path, gsm8k_dir: Path,
                                                                  serve) -> None:
    server = serve(error_after=5)
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=12, max_concurrency=1))
    assert outcome.error is not None and "500" in outcome.error
    assert outcome.error.startswith("request failed after lm-eval's retries: ")  # a request, not lm-eval, failed
    assert "injected failure" in outcome.error  # the server's own words, not only its status
    assert outcome.answered == 5 and len(outcome.samples) == 5
    assert all(s["correct"] for s in outcome.samples)  # the five answered ones, scored by the task's filters
    assert outcome.metrics["complete"] is False and outcome.metrics["n"] == 5
    assert outcome.requested == 12  # what was asked for, not only what was answered
    # the answers before the abort keep their finish_reason, counted as in a complete run
    assert [s["finish_reason"] for s in outcome.samples] == ["stop"] * 5
    assert outcome.finish_reasons == {"stop": 5} and outcome.truncated == 0


def test_a_hanging_server_fails_within_the_request_timeout(tmp_path: Path, gsm8k_dir: Path,
                                                           serve) -> None:
    server = serve(hang_after=3)
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=10, max_concurrency=2,
                                 request_timeout_s=2))
    assert outcome.error is not None and "timed out" in outcome.error
    assert outcome.eval_s < 2 + 3, "a timed-out request must not be retried"
    assert outcome.answered == 3


@pytest.mark.parametrize("concurrency", [1, 2])
@pytest.mark.parametrize("broken, stall_s", [("stall_body", 60), ("trickle_body", 0.5)])
def test_a_body_that_stalls_or_trickles_after_the_headers_times_out_within_the_bound_on_either_path(
        tmp_path: Path, gsm8k_dir: Path, serve, concurrency: int, broken: str, stall_s: float) -> None:
    """requests reports a read timeout in the body as a ConnectionError (lm-eval retried it, 3 times
    the bound, and the run said "connection error"), and its timeout bounds each read, so a body
    sent a byte at a time never timed out; aiohttp's total timeout covers the body."""
    server = serve(error_after=3, broken=broken, stall_s=stall_s)
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=10, max_concurrency=concurrency,
                                 request_timeout_s=2))
    assert outcome.error is not None and "timed out" in outcome.error, outcome.error
    assert "request_timeout_seconds" in outcome.error
    assert outcome.eval_s < 2 + 3, "a timed-out request must not be retried"
    assert outcome.answered == 3


@pytest.mark.parametrize("concurrency", [1, 4])
def test_an_answer_from_another_model_stops_the_evaluation_unless_the_server_names_it_an_alias(
        tmp_path: Path, gsm8k_dir: Path, serve, concurrency: int) -> None:
    server = serve(answer_as="other-model")
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=4, max_concurrency=concurrency))
    assert outcome.error is not None and outcome.config_error and outcome.answered == 0
    # nothing answered: no score and no invalid_rate (0.0 would read as "every answer parsed")
    assert outcome.metrics["value"] is None and outcome.metrics["invalid_rate"] is None
    assert "answered as model 'other-model', but the requests asked for 'fake-model'" in outcome.error
    # vLLM and quantgate serve answer with their first --served-model-name whichever alias was asked for.
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=4, max_concurrency=concurrency,
                                 model_aliases=("other-model",)))
    assert outcome.error is None and outcome.answered == 4 and not outcome.config_error


@pytest.mark.parametrize("chat", [False, True])
# Only "length" is a cut at max_tokens; a server that gives no finish_reason leaves the count unknown
# (None), never 0 ("none was cut").
@pytest.mark.parametrize("reason, truncated", [("length", 6), ("stop", 0), ("content_filter", 0), ("null", None)])
def test_answers_cut_at_max_tokens_are_counted_and_marked(tmp_path: Path, gsm8k_dir: Path, serve, reason: str,
                                                           truncated: int | None, chat: bool) -> None:
    server = serve(finish_reason=reason)
    given = None if reason == "null" else reason
    for concurrency in (1, 4):
        outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=6, max_concurrency=concurrency,
                                     use_chat_completions=chat))
        assert outcome.error is None and outcome.truncated == truncated
        assert outcome.finish_reasons == ({given: 6} if given else {})
        assert [s["finish_reason"] for s in outcome.samples] == [given] * 6


async def _interrupted() -> None:
    task = asyncio.current_task()  # noqa: F841  a cycle through the traceback, as aiohttp's writer task has
    raise KeyboardInterrupt


def test_an_interrupt_inside_a_request_task_leaves_no_exception_to_print(tmp_path: Path, gsm8k_dir: Path, serve,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """SIGINT/SIGTERM land where the main thread is, often in a task nobody awaits (aiohttp's
    request writer): asyncio printed its exception as "never retrieved", with a traceback, once
    the task was collected, after the run's result."""
    server = serve()

    def land_in_a_task(answered: int, requested: int) -> None:
        if answered == 1:
            asyncio.get_running_loop().create_task(_interrupted())

    with pytest.raises(KeyboardInterrupt):
        run_eval(_settings(gsm8k_dir, tmp_path, server.base_url), on_progress=land_in_a_task)
    gc.collect()  # when asyncio reports the exceptions of tasks nobody retrieved
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_per_question_merges_filters_and_gates_on_the_chosen_one() -> None:
    logged = [
        {"doc_id": 1, "prompt_hash": "h1", "target": "x #### 7", "resps": [["#### 7"]], "filtered_resps": ["7"],
         "filter": "strict-match", "exact_match": 1.0},
        {"doc_id": 1, "prompt_hash": "h1", "target": "x #### 7", "resps": [["#### 7"]], "filtered_resps": ["7"],
         "filter": "flexible-extract", "exact_match": 1.0},
        {"doc_id": 0, "prompt_hash": "h0", "target": "x #### 3", "resps": [["it is 3"]],
         "filtered_resps": ["[invalid]"], "filter": "strict-match", "exact_match": 0.0},
        {"doc_id": 0, "prompt_hash": "h0", "target": "x #### 3", "resps": [["it is 3"]], "filtered_resps": ["3"],
         "filter": "flexible-extract", "exact_match": 1.0},
    ]
    strict = per_question(logged, "exact_match,strict-match")
    assert [(s["id"], s["correct"], s["invalid"], s["extracted"]) for s in strict] == [
        (0, False, True, "[invalid]"), (1, True, False, "7")]
    flexible = per_question(logged, "exact_match,flexible-extract")
    assert [(s["id"], s["correct"], s["invalid"]) for s in flexible] == [(0, True, False), (1, True, False)]
    assert strict[0]["response"] == "it is 3"


def test_retry_after_is_read_for_429_and_503_only_and_bounded() -> None:
    from quantgate.harness.evaluate import RETRY_AFTER_MAX_S, _retry_after_s

    assert _retry_after_s(429, {"Retry-After": "2.5"}) == 2.5 and _retry_after_s(503, {"Retry-After": "1"}) == 1.0
    assert _retry_after_s(500, {"Retry-After": "5"}) == 0.0  # not a rate limit: lm-eval's backoff alone
    assert _retry_after_s(429, {"Retry-After": "3600"}) == RETRY_AFTER_MAX_S
    for bad in ("nan", "inf", "-3", "Wed, 21 Oct 2026 07:28:00 GMT", ""):  # nan used to sleep forever
        assert 0.0 <= _retry_after_s(429, {"Retry-After": bad}) <= RETRY_AFTER_MAX_S
    assert _retry_after_s(429, None) == 0.0


def test_retry_after_is_honoured_on_the_concurrent_path_too(tmp_path: Path, gsm8k_dir: Path, serve) -> None:
    """max_concurrency > 1 sends through aiohttp, whose 429 is waited on in a path of its own."""
    server = serve(error_after=0, error_status=429, retry_after=1.5)
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=1, max_concurrency=2))
    assert outcome.error is not None and "429" in outcome.error and outcome.answered == 0
    # three attempts, each waiting its 1.5 s Retry-After (lm-eval's own backoff alone waits 2 s in all)
    assert outcome.eval_s >= 3 * 1.5


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS])
def test_a_full_disk_behind_a_libraries_own_error_is_named_with_its_fix(code: int) -> None:
    """datasets re-raises a write the full disk refused as "Cannot find data file", keeping the OSError
    as its cause: the run must say the disk is full, not that lm-eval stopped for no clear reason."""
    from quantgate.harness.evaluate import _failure, disk_error

    full = OSError(code, os.strerror(code))
    wrapped = FileNotFoundError("Cannot find data file")
    wrapped.__cause__ = full
    assert disk_error(wrapped) is full
    said = _failure(wrapped, None)
    assert said.startswith("lm-eval stopped: a file could not be written") and "free space" in said
    assert disk_error(OSError(errno.ENOENT, "missing")) is None


@pytest.mark.parametrize("body, chat", [({"choices": [{"index": 0, "message": "not an object"}]}, True),
                                        ({"choices": [{"index": 3, "text": "x"}]}, False),
                                        ({"choices": [{"index": 1, "text": "x"}]}, False),
                                        # two answers for prompt 0 and none for prompt 1, which was scored "None"
                                        ({"choices": [{"index": 0, "text": " 4"}, {"index": 0, "text": " 5"}]}, False),
                                        (["a list"], False)])
def test_a_body_of_the_wrong_shape_is_a_malformed_response_not_a_crash(body, chat) -> None:
    from quantgate.harness.evaluate import MalformedResponse, _choices

    with pytest.raises(MalformedResponse, match="the server answered 200"):
        _choices(body, chat)


def test_a_200_with_an_error_is_malformed_even_when_it_also_has_choices() -> None:
    """A body carrying both an error and a (blank) choice: guards against reading the choice and
    scoring the error as an empty, wrong answer."""
    from quantgate.harness.evaluate import MalformedResponse, _choices

    body = {"error": {"message": "engine overloaded", "type": "server_error"},
            "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}
    with pytest.raises(MalformedResponse, match="answered 200 with an error: .*engine overloaded"):
        _choices(body, False)
    chat = {"error": "engine overloaded", "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}}]}
    with pytest.raises(MalformedResponse, match="answered 200 with an error: engine overloaded"):
        _choices(chat, True)
    assert _choices({"choices": [{"index": 0, "text": ""}]}, False) == [("", None)]  # no error: an empty answer


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_an_answer_whose_generation_broke_off_is_malformed_not_scored(reason: str) -> None:
    # The text before the break is no answer: scored, it was a wrong one.
    from quantgate.harness.evaluate import MalformedResponse, _choices

    with pytest.raises(MalformedResponse, match=f"finish_reason '{reason}' in choice 0: generation did not finish"):
        _choices({"choices": [{"index": 0, "text": " 12 + 3 =", "finish_reason": reason}]}, False)
    assert _choices({"choices": [{"index": 0, "text": " 15", "finish_reason": "stop"}]}, False) == [(" 15", "stop")]


def test_the_gated_value_is_the_configured_filters_score() -> None:
    """metric exact_match,flexible-extract gates on flexible-extract's score, from lm-eval's
    aggregate and, for an aborted run, from the per-question records: guards against the gated
    value being strict-match's whatever the metric names."""
    from quantgate.harness.evaluate import FLEXIBLE, STRICT, _metrics

    scores = {STRICT: 0.5, FLEXIBLE: 0.8, "exact_match_stderr,strict-match": 0.05,
              "exact_match_stderr,flexible-extract": 0.04}
    metrics = _metrics(scores, [], FLEXIBLE, 10)
    assert (metrics["metric"], metrics["value"], metrics["strict_match"], metrics["flexible_extract"]) == (
        FLEXIBLE, 0.8, 0.5, 0.8)
    assert metrics["stderr"] == 0.04 and metrics["complete"] is True
    assert _metrics(scores, [], STRICT, 10)["value"] == 0.5

    def sample(strict: bool, flexible: bool) -> dict:
        return {"filters": {"strict-match": {"extracted": "[invalid]" if not strict else "3", "correct": strict},
                            "flexible-extract": {"extracted": "3", "correct": flexible}}, "invalid": False}

    answered = [sample(False, True), sample(False, True), sample(True, True), sample(False, False)]  # aborted run
    metrics = _metrics({}, answered, FLEXIBLE, 4)
    assert (metrics["value"], metrics["strict_match"], metrics["flexible_extract"]) == (0.75, 0.25, 0.75)
    assert metrics["complete"] is False and metrics["stderr"] is None


def test_answers_without_the_gsm8k_marker_score_only_under_flexible_extract(tmp_path: Path, gsm8k_dir: Path,
                                                                             serve) -> None:
    """End to end, the two filters disagree ("The answer is N." has no '#### N'): the run gated
    on flexible-extract reports flexible-extract's accuracy, not strict-match's 0."""
    server = serve(accuracy=1.0, plain_answers=True)
    outcome = run_eval(_settings(gsm8k_dir, tmp_path, server.base_url, limit=8,
                                 metric="exact_match,flexible-extract"))
    assert outcome.error is None and outcome.answered == 8
    assert (outcome.metrics["value"], outcome.metrics["flexible_extract"], outcome.metrics["strict_match"]) == (
        1.0, 1.0, 0.0)
    assert all(s["correct"] and not s["invalid"] for s in outcome.samples)
    assert all(s["filters"]["strict-match"]["extracted"] == "[invalid]" for s in outcome.samples)


def test_importing_lm_eval_in_the_background_leaves_the_servers_environment_as_it_was() -> None:
    """lm-eval's import sets HF_XET_HIGH_PERFORMANCE: every server launched after the preload
    inherited it, unrecorded in env_diff, and the first one did not."""
    code = ("import os; from quantgate.harness.evaluate import preload; before = dict(os.environ); "
            "preload().join(); import lm_eval; print(sorted(set(os.environ) ^ set(before)))")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_XET_HIGH_PERFORMANCE", "HF_HUB_ENABLE_HF_TRANSFER")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_model_args_are_the_configs_and_the_api_key_is_never_among_them() -> None:
    """`quantgate repro` prints model_args and the lm_eval command: a seed of 0 is a seed (left out,
    lm-eval sends its own 1234), and the key goes only into the request header."""
    settings = _settings(Path("."), Path("."), base_url="http://h:8/", seed=0, max_concurrency=3, max_tokens=48,
                         request_timeout_s=2.4, api_key="s3cret-key")
    assert model_args(settings) == {"base_url": "http://h:8/v1/completions", "model": "fake-model",
                                    "tokenizer_backend": None, "tokenized_requests": False, "num_concurrent": 3,
                                    "max_gen_toks": 48, "timeout": 2, "seed": 0}
    assert model_args(_settings(Path("."), Path("."), request_timeout_s=0.2))["timeout"] == 1  # never 0: no bound
    chat = _settings(Path("."), Path("."), use_chat_completions=True, api_key="s3cret-key", temperature=0.6)
    command = lm_eval_command(chat, Path("/run/task/gsm8k.yaml"), Path("/run/lm_eval"))
    assert "s3cret-key" not in " ".join(command)
    assert command[command.index("--model") + 1] == "local-chat-completions" and "--apply_chat_template" in command
    assert "base_url=http://127.0.0.1:9/v1/chat/completions" in command[command.index("--model_args") + 1]


def test_a_response_is_checked_against_the_model_asked_for_only_when_it_names_one() -> None:
    """OpenAI's responses name their model, and one that names another is not the model under test's
    answer; a body that names none (some OpenAI-compatible servers omit it) is an answer all the
    same, not a wrong-model error that stops the run."""
    from quantgate.harness.evaluate import WrongModelAnswered, _recording_model_class

    lm = _recording_model_class(False)(on_progress=None, model_aliases=("alias",),
                                       **model_args(_settings(Path("."), Path("."))))
    choices = [{"index": 0, "text": " 4", "finish_reason": "stop"}]
    for named in ({}, {"model": "fake-model"}, {"model": "alias"}):
        assert lm.parse_generations(outputs={**named, "choices": choices}) == [" 4"]
    with pytest.raises(WrongModelAnswered, match="other-model"):
        lm.parse_generations(outputs={"model": "other-model", "choices": choices})
