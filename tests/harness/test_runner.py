"""`run_configs` end to end in this process, with real (fake) server processes: verdicts,
exit codes, artifacts, kernel proof, baselines, `--server-url` and `--limit`."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import sys
import xml.etree.ElementTree as ET
from itertools import islice
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from quantgate.harness.config import inspect_config
from quantgate.harness.gates import Baseline, evaluate_gate
from quantgate.harness.runner import gate_line, exit_code
from quantgate.harness.server import build_command
from tests.harness.fake_server import _share
from tests.harness import runner_fixtures
from tests.harness.runner_fixtures import (FAKE_SERVER, expected_accuracy, fake_args, launch, load_json, pid_alive,
                                           run_in_process, write_config)
from tests.harness.test_config_properties import CONFIGS, VALID_CONFIGS
from tests.harness.test_gates import config as gate_config
from tests.harness.test_results import RESULT_SCHEMA

gsm8k_dir = runner_fixtures.gsm8k_dir  # the shared pytest fixture


def test_a_passing_config_writes_every_artifact(tmp_path: Path, gsm8k_dir: Path) -> None:
    # The fake answers a hash-chosen 90% of a random data set right: 12 questions can score 7/12
    # (0.4% of seeds), so the threshold sits far below, where no seed reaches.
    config = write_config(tmp_path, "good", gsm8k_dir, {"accuracy": 0.9, "linear_backend": "marlin"},
                          accuracy_threshold=0.3, tolerance=0.0, expect={"linear_kernel": "marlin"})
    code, output = run_in_process([config], tmp_path / "out")
    assert code == 0, output
    run_dir = tmp_path / "out" / "good"
    result = load_json(run_dir / "result.json")
    jsonschema.validate(result, RESULT_SCHEMA)
    assert result["verdict"] == "PASS"
    assert result["metrics"]["value"] == pytest.approx(expected_accuracy(gsm8k_dir, 0.9, 12))
    assert result["gate"]["mode"] == "absolute" and result["gate"]["threshold"] == pytest.approx(0.3)
    assert result["expect"]["passed"] and result["kernels"]["source"] == "server log"
    assert result["config"]["sha256"] and result["task"]["sha256"] and result["dataset"]["sha256"]
    assert set(result["versions"]) >= {"quantgate", "lm_eval", "torch", "engine"}
    assert result["versions"]["engine"] is None  # a vLLM without GET /version: unknown, not quantgate's version
    assert set(result["timings"]) >= {"server_start_s", "eval_s", "total_s"}
    assert result["timings"]["total_s"] >= result["timings"]["eval_s"] > 0
    server = result["server"]
    assert server["exit_status"] is not None and not pid_alive(server["pid"])
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 12 and {"id", "prompt_hash", "response", "extracted", "correct"} <= set(samples[0])
    assert "ready on" in (run_dir / "server.log").read_text()
    assert (tmp_path / "out" / "junit.xml").is_file() and (tmp_path / "out" / "summary.md").is_file()
    assert "PASS" in output and "quantgate summary" in output


def test_a_failed_gate_exits_1_with_its_arithmetic(tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "weak", gsm8k_dir, {"accuracy": 0.3}, accuracy_threshold=0.9, tolerance=0.05)
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "weak" / "result.json")
    assert code == 1 and result["verdict"] == "FAIL"
    assert "gate absolute failed" in result["reason"]
    assert "0.9000 - 0.0500 = 0.8500" in result["gate"]["explanation"]
    assert "0.9000 - 0.0500 = 0.8500" in output


def test_expect_mismatch_fails_even_when_accuracy_passes(tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "claims-marlin", gsm8k_dir, {"accuracy": 1.0, "linear_backend": "triton"},
                          expect={"linear_kernel": "marlin"})
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "claims-marlin" / "result.json")
    assert code == 1 and result["verdict"] == "FAIL"
    assert result["gate"]["passed"] is True
    assert "expected 'marlin'" in result["reason"] and "TritonFp8BlockScaledMMKernel (backend triton)" in result["reason"]
    assert "model.layers.0.self_attn.qkv_proj" in result["reason"]
    assert len(result["expect"]["mismatches"]) == 8
    assert "accuracy passed, but the backend under test did not run" in output


def test_a_vllm_kernel_choice_logged_at_the_first_request_is_checked_too(tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "late", gsm8k_dir, {"linear_backend": "marlin", "late_kernel": "triton"},
                          expect={"linear_kernel": "marlin"})
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "late" / "result.json")
    assert code == 1 and result["verdict"] == "FAIL", output
    assert [m["module"] for m in result["expect"]["mismatches"]] == ["model.layers.0.self_attn.qkv_proj#2"]
    assert "TritonFp8BlockScaledMMKernel (backend triton)" in result["reason"]


def test_server_url_refuses_a_server_whose_model_folder_is_another(tmp_path: Path, gsm8k_dir: Path) -> None:
    """A server started on another checkpoint was evaluated under the config's name (a note said
    so on every attached run); a paired candidate attached to it later was its own baseline and
    PASSed. /v1/models gives the served folder as `root`."""
    cmd = build_command("vllm", "/srv/models/served", [*fake_args(gsm8k_dir, model_root="/srv/models/other"),
                                                       "--linear-backend", "emulation"],
                        {}, [sys.executable, str(FAKE_SERVER)])
    server = launch(cmd, tmp_path / "external.log", startup_timeout_s=30)
    try:
        config = write_config(tmp_path, "cfg", gsm8k_dir, engine="builtin", server_args=[],
                              model_name="tiny-qwen3-fp8-block-native", expect={"linear_kernel": "emulation"})
        code, output = run_in_process([config], tmp_path / "out", server_url=server.base_url)
    finally:
        server.stop()
    result = load_json(tmp_path / "out" / "cfg" / "result.json")
    assert code == 3 and result["verdict"] == "ERROR" and result["server"]["served_root"] == "/srv/models/other"
    assert ("serves /srv/models/other, not this config's model tiny-qwen3-fp8-block-native" in result["reason"]
            and "quantgate repro" in result["reason"]), result["reason"]


def test_which_served_roots_are_the_configs_model(tmp_path: Path) -> None:
    from quantgate.harness.config import load_config
    from quantgate.harness.runner import other_model_served
    from quantgate.harness.server import AttachedServer

    (tmp_path / "fp8" / "tiny").mkdir(parents=True)
    (tmp_path / "bf16" / "tiny").mkdir(parents=True)
    (tmp_path / "latest").symlink_to(tmp_path / "fp8" / "tiny")

    def refused(model_name: str, root: str, served: str = "served") -> bool:
        path = tmp_path / "c.yaml"
        path.write_text(f"model_name: {model_name}\naccuracy_threshold: 0.5\nengine: vllm\n")
        return other_model_served(load_config(path), AttachedServer("http://h", served, served_root=root)) is not None

    here = str(tmp_path / "fp8" / "tiny")
    assert refused(here, str(tmp_path / "bf16" / "tiny"))  # same last name, another folder here
    assert not refused(here, str(tmp_path / "latest"))  # a link to the same folder
    assert not refused(here, "/remote/checkpoints/tiny/")  # elsewhere: only the name can be compared
    assert refused(here, "/remote/checkpoints/other")
    assert not refused(here, ".")  # the server's own folder: nothing to compare by
    hub = "org/tiny-qwen3"
    assert not refused(hub, "/cache/hub/models--org--tiny-qwen3/snapshots/0123abcd")
    assert refused(hub, "/cache/hub/models--someone--tiny-qwen3/snapshots/0123abcd")
    assert refused(hub, "otherorg/tiny-qwen3") and not refused(hub, hub)
    assert not refused(hub, "/models/tiny-qwen3") and not refused(hub, "C:\\models\\tiny-qwen3")
    assert not refused(here, str(tmp_path / "bf16" / "tiny"), served=here)  # named as the config's model


def test_server_url_evaluates_a_running_server_with_its_kernel_report(tmp_path: Path,
                                                                      gsm8k_dir: Path) -> None:
    cmd = build_command("vllm", "fake-model", [*fake_args(gsm8k_dir), "--linear-backend", "emulation"], {},
                        [sys.executable, str(FAKE_SERVER)])
    server = launch(cmd, tmp_path / "external.log", startup_timeout_s=30)
    try:
        good = write_config(tmp_path, "emul", gsm8k_dir, engine="builtin", server_args=[],
                            expect={"linear_kernel": "emulation"}, accuracy_threshold=0.9, tolerance=0.0)
        wrong = write_config(tmp_path, "marl", gsm8k_dir, engine="builtin", server_args=[],
                             expect={"linear_kernel": "MarlinFp8LinearKernel"}, accuracy_threshold=0.9)
        code, output = run_in_process([good, wrong], tmp_path / "out", server_url=server.base_url)
        assert server.poll() is None, "an attached server is never stopped"
    finally:
        server.stop()
    good_result = load_json(tmp_path / "out" / "emul" / "result.json")
    wrong_result = load_json(tmp_path / "out" / "marl" / "result.json")
    assert good_result["verdict"] == "PASS" and good_result["kernels"]["source"] == "GET /v1/kernels"
    assert good_result["server"]["attached"] is True
    assert wrong_result["verdict"] == "FAIL" and "EmulationLinearKernel" in wrong_result["reason"]
    assert code == 1


def test_an_attached_server_must_prove_the_backend_server_args_ask_for(tmp_path: Path, gsm8k_dir: Path) -> None:
    """--server-url cannot apply server_args: a `--linear-backend marlin` there is checked as an
    expectation, or a server running another kernel would pass for the config's."""
    server = launch(build_command("vllm", "fake-model", fake_args(gsm8k_dir, linear_backend="emulation"), {},
                                  [sys.executable, str(FAKE_SERVER)]), tmp_path / "external.log", startup_timeout_s=30)
    try:
        marlin = write_config(tmp_path, "marlin", gsm8k_dir, {"linear_backend": "marlin"}, num_questions=4)
        emulation = write_config(tmp_path, "emulation", gsm8k_dir, {"linear_backend": "emulation"}, num_questions=4)
        auto = write_config(tmp_path, "auto", gsm8k_dir, {"linear_backend": "auto"}, num_questions=4)
        code, output = run_in_process([marlin, emulation, auto], tmp_path / "out", server_url=server.base_url)
    finally:
        server.stop()
    wrong = load_json(tmp_path / "out" / "marlin" / "result.json")
    assert code == 1 and wrong["verdict"] == "FAIL", output
    assert wrong["expect"]["from_server_args"] == ["linear"] and wrong["expect"]["expected"] == {"linear": "marlin"}
    assert "server_args' --linear-backend (not applied to a server this run did not start" in wrong["reason"]
    assert "expected 'marlin'" in wrong["reason"] and "EmulationLinearKernel" in wrong["reason"]
    assert "start that server with --linear-backend marlin" in wrong["reason"]
    assert "server_args' --linear-backend marlin cannot be applied to a running server" in output.replace("\n", "")
    right = load_json(tmp_path / "out" / "emulation" / "result.json")
    assert right["verdict"] == "PASS" and "kernels as expected (linear=emulation from server_args)" in right["reason"]
    untested = load_json(tmp_path / "out" / "auto" / "result.json")
    assert untested["verdict"] == "PASS" and untested["expect"] is None  # `auto` asks for no backend


def test_an_attached_builtin_server_must_prove_the_backend_server_args_ask_for(tmp_path: Path) -> None:
    """A `quantgate serve` someone else started (--server-url, engine: builtin) never had this
    config's server_args applied either: its backends are expectations, as for vLLM. Only a
    built-in server this run starts needs none (it refuses to start instead)."""
    from quantgate.harness import runner
    from quantgate.harness.server import AttachedServer

    cfg = gate_config(tmp_path, "accuracy_threshold: 0.5\nengine: builtin\nserver_args: [--linear-backend, marlin]\n")
    attached = AttachedServer(base_url="http://127.0.0.1:9", served_model="m")
    assert runner._implied_expectations(cfg, attached) == {"linear": "marlin"}
    assert runner._implied_expectations(cfg, SimpleNamespace(poll=lambda: None)) == {}  # one this run launched


def test_an_attached_server_serving_one_other_model_is_evaluated_with_a_note_and_recorded(
        tmp_path: Path, gsm8k_dir: Path) -> None:
    server = launch(build_command("vllm", "other-model", fake_args(gsm8k_dir), {},
                                  [sys.executable, str(FAKE_SERVER)]), tmp_path / "external.log", startup_timeout_s=30)
    try:
        code, output = run_in_process([write_config(tmp_path, "named", gsm8k_dir)], tmp_path / "out",
                                      server_url=server.base_url)
    finally:
        server.stop()
    result = load_json(tmp_path / "out" / "named" / "result.json")
    assert code == 0 and result["server"]["served_model"] == "other-model", output
    assert "the config names 'fake-model', the server serves only 'other-model'" in output.replace("\n", "")


def test_a_server_without_a_kernel_report_fails_a_kernel_check_as_unproven_not_as_another_kernel(
        tmp_path: Path, gsm8k_dir: Path) -> None:
    server = launch(build_command("vllm", "fake-model", [*fake_args(gsm8k_dir), "--no-kernels-endpoint"], {},
                                  [sys.executable, str(FAKE_SERVER)]), tmp_path / "external.log", startup_timeout_s=30)
    try:
        config = write_config(tmp_path, "unproven", gsm8k_dir, {"accuracy": 1.0}, expect={"linear_kernel": "marlin"})
        code, output = run_in_process([config], tmp_path / "out", server_url=server.base_url)
    finally:
        server.stop()
    result = load_json(tmp_path / "out" / "unproven" / "result.json")
    assert code == 1 and result["verdict"] == "FAIL" and result["expect"]["mismatches"] == []
    assert "cannot be verified" in result["reason"] and "nothing proves which kernel ran" in result["reason"]


def test_a_kernel_report_request_that_fails_is_an_error_not_a_failed_kernel_check(tmp_path: Path,
                                                                                   gsm8k_dir: Path) -> None:
    """A 503 from GET /v1/kernels was taken for "no kernel report": the run FAILed (exit 1) on a
    check it never made. A 404 (no such endpoint, as vLLM) still is no report (the test above)."""
    server = launch(build_command("vllm", "fake-model", fake_args(gsm8k_dir, kernels_status=503), {},
                                  [sys.executable, str(FAKE_SERVER)]), tmp_path / "external.log", startup_timeout_s=30)
    try:
        checked = write_config(tmp_path, "checked", gsm8k_dir, num_questions=4, expect={"linear_kernel": "emulation"})
        unchecked = write_config(tmp_path, "unchecked", gsm8k_dir, num_questions=4)
        code, output = run_in_process([checked, unchecked], tmp_path / "out", server_url=server.base_url)
    finally:
        server.stop()
    result = load_json(tmp_path / "out" / "checked" / "result.json")
    assert code == 2 and result["verdict"] == "ERROR" and result["usage_error"] is False, output
    assert f"the kernel report could not be read: GET {server.base_url}/v1/kernels answered 503" in result["reason"]
    assert "(linear=emulation) needs it, so there is no verdict" in result["reason"]
    assert result["metrics"]["n"] == 4  # what was measured is kept
    other = load_json(tmp_path / "out" / "unchecked" / "result.json")  # nothing to check: a verdict, and a note
    assert other["verdict"] == "PASS" and "note: the kernel report could not be read" in other["reason"]


def test_a_kernel_report_a_transient_error_kept_back_is_asked_for_again_after_the_evaluation(
        tmp_path: Path, gsm8k_dir: Path) -> None:
    server = launch(build_command("vllm", "fake-model", fake_args(gsm8k_dir, kernels_status=503, kernels_status_times=1),
                                  {}, [sys.executable, str(FAKE_SERVER)]), tmp_path / "external.log", startup_timeout_s=30)
    try:
        config = write_config(tmp_path, "checked", gsm8k_dir, num_questions=4, expect={"linear_kernel": "emulation"})
        code, output = run_in_process([config], tmp_path / "out", server_url=server.base_url)
    finally:
        server.stop()
    result = load_json(tmp_path / "out" / "checked" / "result.json")
    assert code == 0 and result["verdict"] == "PASS" and result["expect"]["passed"], output
    assert "could not be read" not in result["reason"]


def test_answers_cut_at_max_tokens_are_recorded_and_said_when_they_are_many(tmp_path: Path, gsm8k_dir: Path) -> None:
    cut = write_config(tmp_path, "cut", gsm8k_dir, {"finish_reason": "length"}, num_questions=4, max_tokens=64)
    whole = write_config(tmp_path, "whole", gsm8k_dir, num_questions=4)
    code, output = run_in_process([cut, whole], tmp_path / "out")
    result = load_json(tmp_path / "out" / "cut" / "result.json")
    assert code == 0 and result["verdict"] == "PASS", output
    assert result["evaluation"]["truncated"] == 4 and result["evaluation"]["finish_reasons"] == {"length": 4}
    assert "note: 4 of 4 answers (100%) stopped at max_tokens (64; finish_reason \"length\")" in result["reason"]
    assert "raise max_tokens in the config" in result["reason"] and "raise max_tokens" in output
    assert all(json.loads(line)["finish_reason"] == "length"
               for line in (tmp_path / "out" / "cut" / "samples.jsonl").read_text().splitlines())
    plain = load_json(tmp_path / "out" / "whole" / "result.json")
    assert plain["evaluation"]["truncated"] == 0 and "max_tokens" not in plain["reason"]


def test_a_servers_aliases_of_its_model_are_the_names_of_the_same_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM and quantgate serve answer every request with their first --served-model-name: the
    others (same `root` in /v1/models) are the same model. Another model's name never is."""
    import httpx

    from quantgate.harness import runner

    cards = [{"id": "first", "root": "/models/a"}, {"id": "second", "root": "/models/a"},
             {"id": "other", "root": "/models/b"}, {"id": "rootless"}]
    monkeypatch.setattr(httpx, "get", lambda *a, **k: httpx.Response(200, json={"data": cards}))
    server = SimpleNamespace(base_url="http://h", api_key=None, served_model="second")
    assert runner.model_aliases(server) == ("first",)
    assert runner.model_aliases(SimpleNamespace(base_url="http://h", api_key=None, served_model="rootless")) == ()
    monkeypatch.setattr(httpx, "get", lambda *a, **k: httpx.Response(404))
    assert runner.model_aliases(server) == ()


def _assert_kept_out(secret: str, run_dir: Path, output: str) -> None:
    for artifact in ("result.json", "server.log"):
        assert secret not in (run_dir / artifact).read_text()
    assert secret not in output  # the console, which CI logs keep


def test_a_server_with_an_api_key_is_evaluated_with_it_and_the_key_is_not_in_the_artifacts(
        tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "keyed", gsm8k_dir, {"api_key": "s3cret-key", "linear_backend": "marlin"},
                          expect={"linear_kernel": "marlin"})
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "keyed" / "result.json")
    assert code == 0 and result["verdict"] == "PASS", output
    _assert_kept_out("s3cret-key", tmp_path / "out" / "keyed", output)
    assert "--api-key '<redacted>'" in result["server"]["command_line"]
    # --server-url: the config's key goes to /v1/models, /v1/kernels and the completions.
    for key, expected_code in (("s3cret-key", 0), ("another-key", 3)):  # a wrong key: fix the config
        running = launch(build_command("vllm", "fake-model", fake_args(gsm8k_dir, api_key=key, linear_backend="marlin"),
                                       {}, [sys.executable, str(FAKE_SERVER)]), tmp_path / f"{key}.log", 30)
        try:
            code, output = run_in_process([config], tmp_path / key, server_url=running.base_url)
        finally:
            running.stop()
        result = load_json(tmp_path / key / "keyed" / "result.json")
        assert code == expected_code, output
        if expected_code == 0:
            assert result["kernels"]["source"] == "GET /v1/kernels"
        else:
            assert result["reason"].startswith("server not usable: --server-url ")  # the user's, running
            assert "refused the request (401): the API key is wrong" in result["reason"]


def test_an_attached_server_gets_openai_api_key_when_the_config_sets_no_key(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lm-eval's convention for an OpenAI-style server someone else started: the key is in OPENAI_API_KEY."""
    monkeypatch.setenv("OPENAI_API_KEY", "env-s3cret")
    running = launch(build_command("vllm", "fake-model", fake_args(gsm8k_dir, api_key="env-s3cret"), {},
                                   [sys.executable, str(FAKE_SERVER)]), tmp_path / "external.log", 30)
    try:
        config = write_config(tmp_path, "plain", gsm8k_dir, num_questions=4)
        code, output = run_in_process([config], tmp_path / "out", server_url=running.base_url)
    finally:
        running.stop()
    result = tmp_path / "out" / "plain" / "result.json"
    assert code == 0 and load_json(result)["verdict"] == "PASS", output
    assert "env-s3cret" not in result.read_text() + output


def test_a_vllm_api_key_the_server_inherits_from_the_runners_environment_is_sent(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM reads VLLM_API_KEY from the environment it inherits (the runner's, under the config's
    `env`), not only from the config: every request must carry it, and no artifact may show it."""
    monkeypatch.setenv("VLLM_API_KEY", "inherited-s3cret")
    config = write_config(tmp_path, "inherited", gsm8k_dir, {"linear_backend": "marlin"},
                          expect={"linear_kernel": "marlin"})
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "inherited" / "result.json")
    assert code == 0 and result["verdict"] == "PASS", output
    _assert_kept_out("inherited-s3cret", tmp_path / "out" / "inherited", output)
    # The config's own env wins over the runner's, as in the server's environment.
    assert build_command("vllm", "m", [], {"VLLM_API_KEY": "own"}, [sys.executable]).api_key == "own"
    assert build_command("builtin", "m", [], {}).api_key is None  # quantgate serve reads no VLLM_API_KEY


def test_the_kernel_report_of_a_huge_vllm_log_is_scanned_a_line_at_a_time(tmp_path: Path) -> None:
    """A 1.26 GB vLLM log once took the runner to 2.67 GB: it is never read whole."""
    import tracemalloc

    from quantgate.harness import runner
    from quantgate.harness.server import LaunchedServer, ServerCommand

    log = tmp_path / "server.log"
    noise = "INFO 01-01 00:00:00 [metrics.py:1] Avg prompt throughput: 1.0 tokens/s, api_key s3cret " + "." * 900 + "\n"
    with open(log, "w") as f:
        f.write("INFO [fp8.py:1] Selected MarlinFp8LinearKernel for model.layers.0.self_attn.qkv_proj\n")
        f.write(noise * 32_000)  # 32 MB
        f.write("INFO [fp8.py:1] Using TRITON Fp8 MoE backend out of potential backends: [TRITON]\n")
        f.write("INFO [fp8.py:1] Selected TritonBlockFp8LinearKernel for model.layers.0.self_attn.qkv_proj\n")
    server = LaunchedServer(ServerCommand(argv=[], env={}, served_model="m", api_key="s3cret"), log)
    tracemalloc.start()
    try:
        report, where = runner._kernel_report(SimpleNamespace(engine="vllm"), server)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB held to scan a 32 MB log"
    assert {name: m["kernel"] for name, m in report["modules"].items()} == {
        "model.layers.0.self_attn.qkv_proj": "MarlinFp8LinearKernel",
        "model.layers.0.self_attn.qkv_proj#2": "TritonBlockFp8LinearKernel", "fused_moe": "TRITON"}
    assert "server.log" in where
    noisy = list(islice(server.log_lines(), 2))[1]
    assert "s3cret" not in noisy and "api_key <redacted>" in noisy  # the lines returned are redacted


def test_limit_overrides_num_questions_with_the_terminal_display(tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "lim", gsm8k_dir, num_questions=30)
    code, output = run_in_process([config], tmp_path / "out", terminal=True, limit=5)
    result = load_json(tmp_path / "out" / "lim" / "result.json")
    assert code == 0 and result["metrics"]["n"] == 5, output
    assert "evaluating" in output and "/5" in output
    assert "could not fail" not in result["reason"]  # absolute: a threshold it can miss


def test_result_json_names_the_commit_of_the_configs_checkout(tmp_path: Path, gsm8k_dir: Path) -> None:
    """A nightly's artifacts did not say which version of the config and code ran them."""
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    config = write_config(repo, "versioned", gsm8k_dir, num_questions=3)
    git = ["git", "-C", str(repo), "-c", "user.email=ci@example.com", "-c", "user.name=ci"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "config"]):
        subprocess.run([*git, *args], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    assert run_in_process([config], tmp_path / "out")[0] == 0
    assert load_json(tmp_path / "out" / "versioned" / "result.json")["config"]["commit"] == head
    config.write_text(config.read_text().replace("num_questions: 3", "num_questions: 2"))
    assert run_in_process([config], tmp_path / "out")[0] == 0
    assert load_json(tmp_path / "out" / "versioned" / "result.json")["config"]["commit"] == f"{head}-dirty"
    new = write_config(repo, "uncommitted", gsm8k_dir, num_questions=3)  # no commit holds it
    assert run_in_process([new], tmp_path / "out")[0] == 0
    assert load_json(tmp_path / "out" / "uncommitted" / "result.json")["config"]["commit"] == f"{head}-untracked"
    outside = write_config(tmp_path, "loose", gsm8k_dir, num_questions=3)  # tmp_path is in no checkout
    assert run_in_process([outside], tmp_path / "out")[0] == 0
    assert load_json(tmp_path / "out" / "loose" / "result.json")["config"]["commit"] is None


def test_a_pass_on_too_few_questions_to_fail_says_so_in_its_reason(tmp_path: Path, gsm8k_dir: Path) -> None:
    """`--limit 1` on a hypothesis gate: the threshold falls below 0. The explanation said "cannot
    fail", but summary.md, junit and the console line read a plain PASS from the reason."""
    config = write_config(tmp_path, "few", gsm8k_dir, gate={"mode": "hypothesis"},
                          reference={"value": 0.5, "n": 1000}, accuracy_threshold=None)
    code, output = run_in_process([config], tmp_path / "out", limit=1)
    result = load_json(tmp_path / "out" / "few" / "result.json")
    assert code == 0 and result["verdict"] == "PASS" and result["gate"]["can_fail"] is False, output
    assert result["reason"].endswith("; warning: on 1 question(s) this gate could not fail, so this PASS says nothing "
                                     "about accuracy; evaluate more questions"), result["reason"]
    assert "could not fail" in (tmp_path / "out" / "summary.md").read_text()


def test_any_error_makes_the_run_exit_2_and_every_config_has_a_result(tmp_path: Path,
                                                                       gsm8k_dir: Path) -> None:
    broken = write_config(tmp_path, "broken", gsm8k_dir, {"exit_during_startup": 0.2})
    fine = write_config(tmp_path, "fine", gsm8k_dir)
    code, output = run_in_process([broken, fine], tmp_path / "out")
    assert code == 2
    broken_result = load_json(tmp_path / "out" / "broken" / "result.json")
    assert broken_result["verdict"] == "ERROR" and "server did not start" in broken_result["reason"]
    assert "failed to load the model" in broken_result["log_tail"]
    assert load_json(tmp_path / "out" / "fine" / "result.json")["verdict"] == "PASS"


def test_a_legacy_kernel_switch_the_server_would_inherit_from_the_runner_is_refused_as_in_a_config(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`env: {VLLM_TEST_FORCE_FP8_MARLIN: "1"}` is exit 3; exported in the CI agent's or the shell's
    environment it reached `vllm serve` all the same, and an `auto` config PASSed on forced Marlin
    kernels with nothing in result.json saying so."""
    config = write_config(tmp_path, "auto", gsm8k_dir)
    monkeypatch.setenv("VLLM_TEST_FORCE_FP8_MARLIN", "1")
    code, output = run_in_process([config], tmp_path / "out")
    assert code == 3 and "VLLM_TEST_FORCE_FP8_MARLIN='1'" in output and "--linear-backend" in output, output
    assert not (tmp_path / "out" / "auto").exists()
    from quantgate.harness import runner

    # Only the variables the config's engine reads: quantgate serve never reads vLLM's.
    builtin = SimpleNamespace(engine="builtin")
    assert runner.inherited_legacy_vars(builtin) == []
    monkeypatch.setenv("QUANTGATE_DISABLED_KERNELS", "MarlinFp8LinearKernel")
    assert runner.inherited_legacy_vars(builtin) == ["QUANTGATE_DISABLED_KERNELS"]


def test_config_problems_exit_3_before_any_server_starts(tmp_path: Path, gsm8k_dir: Path) -> None:
    good = write_config(tmp_path, "good", gsm8k_dir)
    listing = tmp_path / "nightly.txt"
    listing.write_text(f"# nightly\n{good.name}\nmissing.yaml\n")
    code, output = run_in_process([listing], tmp_path / "out")
    assert code == 3 and "missing.yaml" in output and "nightly.txt:3" in output
    assert not (tmp_path / "out" / "good").exists()
    bad_metric = write_config(tmp_path, "bad-metric", gsm8k_dir, metric="exact_match,strictest")
    code, output = run_in_process([bad_metric], tmp_path / "out")
    assert code == 3 and "exact_match,strict-match" in output


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fields,expected", [
    ({"server_args": ["--tokenizer-mode", "auto"]}, "refuses these flags: unknown flag(s): --tokenizer-mode"),
    ({"server_args": ["--tensor-parallel-size", "2"]}, "--tensor-parallel-size 2 is not supported"),
    ({"model_name": "no-such-model"}, "model_name: no-such-model is not a model folder"),
])
def test_builtin_configs_the_engine_would_refuse_exit_3_before_any_server_starts(
        tmp_path: Path, gsm8k_dir: Path, fields: dict, expected: str) -> None:
    # Deterministic for every machine: exit 3 (never retried), not a server that exits at
    # start-up (exit 2, which CI retries).
    config = write_config(tmp_path, "builtin", gsm8k_dir, engine="builtin", vllm_command=None,
                          **{"model_name": str(REPO / "models" / "tiny-qwen3"), "server_args": [], **fields})
    code, output = run_in_process([config], tmp_path / "out")
    assert code == 3 and expected in output.replace("\n", " "), output
    assert not (tmp_path / "out" / "builtin").exists()


def test_a_builtin_model_folder_without_a_tokenizer_exits_3_before_any_server_starts(tmp_path: Path,
                                                                                     gsm8k_dir: Path) -> None:
    """The engine serves such a folder token ids only, lm-eval sends text: every request was a 400
    and the run an ERROR (exit 2) that CI retried twice for nothing."""
    folder = tmp_path / "untokenized"
    folder.mkdir()
    shutil.copy(REPO / "models" / "tiny-qwen3" / "config.json", folder)
    config = write_config(tmp_path, "builtin", gsm8k_dir, engine="builtin", vllm_command=None,
                          model_name=str(folder), server_args=[])
    code, output = run_in_process([config], tmp_path / "out")
    assert code == 3 and f"model_name: {folder} has no tokenizer.json" in output.replace("\n", " "), output
    assert not (tmp_path / "out" / "builtin").exists()


@pytest.mark.parametrize("paths,expected", [
    ({"output_dir": "afile"}, "--output-dir {tmp}/afile is a file; pass a folder path"),
    ({"markdown": "afile/summary.md"}, "--markdown {tmp}/afile/summary.md: {tmp}/afile is a file"),
    ({"junit": "out"}, "--output-dir and --junit are the same path {tmp}/out"),
    ({"junit": "adir"}, "--junit {tmp}/adir is a folder; pass a file path"),
])
def test_unwritable_artifact_paths_exit_3_before_anything_runs(tmp_path: Path, gsm8k_dir: Path, paths: dict,
                                                               expected: str) -> None:
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    config = write_config(tmp_path, "good", gsm8k_dir)
    options = {"output_dir": tmp_path / "out", **{k: tmp_path / v for k, v in paths.items()}}
    code, output = run_in_process([config], options.pop("output_dir"), **options)
    assert code == 3 and expected.format(tmp=tmp_path) in output.replace("\n", ""), output
    assert not (tmp_path / "out" / "good").exists()


def test_lint_warns_about_flags_the_builtin_engine_refuses(tmp_path: Path) -> None:
    # vLLM's own files name no engine and must load unchanged: a warning with its line.
    path = tmp_path / "vllm-file.yaml"
    path.write_text("model_name: Qwen/Qwen3-0.6B\naccuracy_threshold: 0.4\n"
                    "server_args: --max-model-len 4096 --gpu-memory-utilization 0.9\n")
    report = inspect_config(path)
    assert report.errors == []
    [warning] = report.warnings
    assert warning.line == 3 and "--gpu-memory-utilization" in str(warning) and "quantgate run` refuses this config" in str(warning)


def test_recovery_runs_its_baseline_first_then_reuses_the_cached_result(tmp_path: Path,
                                                                         gsm8k_dir: Path) -> None:
    write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 1.0})
    candidate = write_config(tmp_path, "cand", gsm8k_dir, {"accuracy": 0.5}, baseline="base",
                             gate={"mode": "recovery", "recovery": 0.9}, accuracy_threshold=None)
    code, output = run_in_process([candidate], tmp_path / "out")
    base_result = tmp_path / "out" / "base" / "result.json"
    cand = load_json(tmp_path / "out" / "cand" / "result.json")
    assert code == 1 and cand["verdict"] == "FAIL"
    expected = expected_accuracy(gsm8k_dir, 0.5, 12)
    assert cand["gate"]["baseline_measured"] == pytest.approx(1.0)
    assert cand["gate"]["recovery_ratio"] == pytest.approx(expected)
    assert output.index("[1/2] base") < output.index("[2/2] cand")
    assert cand["gate"]["baseline"] == {"name": "base", "result": str(base_result.resolve()), "engine": "vllm",
                                        "started_at": load_json(base_result)["started_at"], "reused": False}
    stamp = base_result.stat().st_mtime_ns
    code, output = run_in_process([candidate], tmp_path / "out")
    assert code == 1 and "[1/1] cand" in output and base_result.stat().st_mtime_ns == stamp
    assert "gate recovery against baseline base's earlier run: " in output.replace("\n", "")
    assert load_json(tmp_path / "out" / "cand" / "result.json")["gate"]["baseline"]["reused"] is True
    # Listed in the run too, the baseline is measured in it, first, and compared against: not its earlier run.
    from quantgate.harness.runner import RunOptions, plan

    items = plan([candidate, tmp_path / "base.yaml"], RunOptions(output_dir=tmp_path / "out"))
    assert [item.config.name for item in items] == ["base", "cand"] and items[1].baseline_cached is None
    # Measured by another engine (`--engine` changes it, not the file): not this config's baseline.
    other_engine = load_json(base_result)
    other_engine["config"]["engine"] = "builtin"
    base_result.write_text(json.dumps(other_engine))
    code, output = run_in_process([candidate], tmp_path / "out")
    assert "[1/2] base" in output and load_json(base_result)["config"]["engine"] == "vllm"
    code, output = run_in_process([candidate], tmp_path / "out", limit=6)  # other questions: not comparable
    assert "[1/2] base" in output and load_json(base_result)["metrics"]["n"] == 6
    code, output = run_in_process([candidate], tmp_path / "out", limit=6)
    assert "[1/1] cand" in output
    test_file = gsm8k_dir / "test.jsonl"  # other data under the same config file: measured again
    test_file.write_text(test_file.read_text() + test_file.read_text().splitlines(keepends=True)[0])
    code, output = run_in_process([candidate], tmp_path / "out", limit=6)
    assert "[1/2] base" in output


def test_a_cached_baseline_of_a_model_folder_rebuilt_since_is_measured_again(tmp_path: Path,
                                                                             gsm8k_dir: Path) -> None:
    """The same config file, engine, questions and data, but the model folder's files changed (a
    checkpoint rebuilt at the same path), or the cached run evaluated a --server-url server: the
    cached result is not of the model this run would launch."""
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 1.0}, model_name=str(checkpoint))
    candidate = write_config(tmp_path, "cand", gsm8k_dir, {"accuracy": 1.0}, baseline="base",
                             gate={"mode": "recovery"}, accuracy_threshold=None)
    code, output = run_in_process([candidate], tmp_path / "out")
    assert code == 0 and "[1/2] base" in output, output
    assert load_json(tmp_path / "out" / "base" / "result.json")["config"]["model_files"] is not None
    code, output = run_in_process([candidate], tmp_path / "out")
    assert code == 0 and "[1/1] cand" in output, output
    (checkpoint / "model.safetensors").write_bytes(b"rebuilt")
    code, output = run_in_process([candidate], tmp_path / "out")
    assert code == 0 and "[1/2] base" in output, output
    # Measured against a --server-url server (whatever it served): not a launched run's baseline.
    base_result = tmp_path / "out" / "base" / "result.json"
    attached = load_json(base_result)
    attached["server"]["attached"] = True
    base_result.write_text(json.dumps(attached))
    code, output = run_in_process([candidate], tmp_path / "out")
    assert code == 0 and "[1/2] base" in output, output


def test_a_model_fingerprint_reads_names_sizes_and_times_and_skips_what_it_cannot_stat(tmp_path: Path) -> None:
    from quantgate.harness.runner import model_fingerprint

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "model.safetensors").write_bytes(b"w")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # a broken link: no crash, not counted
    first = model_fingerprint(str(tmp_path))
    assert first is not None and model_fingerprint(str(tmp_path)) == first
    (tmp_path / "shards" / "model.safetensors").write_bytes(b"ww")
    assert model_fingerprint(str(tmp_path)) != first
    assert model_fingerprint("org/model") is None  # a hub id


def test_a_baseline_measured_on_other_questions_is_exit_3_not_a_retry(tmp_path: Path, gsm8k_dir: Path) -> None:
    write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 1.0}, num_questions=4)
    candidate = write_config(tmp_path, "cand", gsm8k_dir, baseline="base", num_questions=6,
                             gate={"mode": "recovery"}, accuracy_threshold=None)
    code, output = run_in_process([candidate], tmp_path / "out")
    cand = load_json(tmp_path / "out" / "cand" / "result.json")
    assert code == 3 and cand["verdict"] == "ERROR" and cand["usage_error"] is True, output
    assert "evaluated 6 questions and the baseline 4" in cand["reason"]


def _reversed_test_data(tmp_path: Path, gsm8k_dir: Path) -> Path:
    """As many questions as gsm8k_dir's test file, in another order: another test file."""
    other = tmp_path / "other"
    other.mkdir()
    rows = (gsm8k_dir / "test.jsonl").read_text().splitlines(keepends=True)
    (other / "test.jsonl").write_text("".join(reversed(rows)))
    (other / "train.jsonl").write_text((gsm8k_dir / "train.jsonl").read_text())
    return other


def test_a_recovery_baseline_of_another_test_file_is_exit_3_not_a_pass(tmp_path: Path, gsm8k_dir: Path) -> None:
    # As many questions (num_questions 12 both) of another test file: the ratio compares nothing.
    other = _reversed_test_data(tmp_path, gsm8k_dir)
    write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 1.0})
    candidate = write_config(tmp_path, "cand", other, {"accuracy": 1.0}, baseline="base",
                             gate={"mode": "recovery"}, accuracy_threshold=None)
    code, output = run_in_process([candidate], tmp_path / "out")
    cand = load_json(tmp_path / "out" / "cand" / "result.json")
    assert code == 3 and cand["verdict"] == "ERROR" and cand["usage_error"] is True, output
    assert "different targets for" in cand["reason"] and "different data sets" in cand["reason"]


@pytest.mark.parametrize("mode", ["paired", "recovery"])
def test_a_baseline_asked_with_other_prompts_is_exit_3_not_a_verdict(tmp_path: Path, gsm8k_dir: Path,
                                                                     mode: str) -> None:
    # The same 12 questions and targets, but the baseline 0-shot and the candidate 2-shot: every
    # prompt differs, so flips (or a ratio) would measure the prompts, not quantization.
    base = write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 1.0}, num_fewshot=0)
    candidate = write_config(tmp_path, "cand", gsm8k_dir, {"accuracy": 1.0}, baseline="base",
                             gate={"mode": mode}, accuracy_threshold=None, num_fewshot=2)
    # A baseline config: refused before any server starts.
    code, output = run_in_process([candidate, base], tmp_path / "out")
    said = output.replace("\n", "")
    assert code == 3 and "is asked with other prompts: num_fewshot 0 there, 2 here" in said, output
    assert not (tmp_path / "out" / "cand").exists()
    # A baseline results file: its samples' prompt hashes show it, after the evaluation.
    assert run_in_process([base], tmp_path / "first")[0] == 0
    from_file = write_config(tmp_path, "file", gsm8k_dir, {"accuracy": 1.0}, gate={"mode": mode},
                             baseline=str(tmp_path / "first" / "base" / "result.json"), accuracy_threshold=None)
    code, output = run_in_process([from_file], tmp_path / "out")
    result = load_json(tmp_path / "out" / "file" / "result.json")
    assert code == 3 and result["verdict"] == "ERROR" and result["usage_error"] is True, output
    assert "different prompts for 12 of 12 question id(s)" in result["reason"] and "num_fewshot" in result["reason"]
    # Evaluated alike, the same pair reaches its verdict.
    same = write_config(tmp_path, "same", gsm8k_dir, {"accuracy": 1.0}, baseline="base",
                        gate={"mode": mode}, accuracy_threshold=None, num_fewshot=0)
    code, output = run_in_process([same, base], tmp_path / "again")
    assert code == 0, output


def test_a_recovery_baseline_without_samples_is_matched_by_its_test_file(tmp_path: Path, gsm8k_dir: Path) -> None:
    base = write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 1.0})
    assert run_in_process([base], tmp_path / "first")[0] == 0
    baseline = tmp_path / "first" / "base" / "result.json"
    (baseline.parent / "samples.jsonl").unlink()  # a result shared without its samples: only the hashes are left
    other = _reversed_test_data(tmp_path, gsm8k_dir)
    candidate = write_config(tmp_path, "cand", other, {"accuracy": 1.0}, baseline=str(baseline),
                             gate={"mode": "recovery"}, accuracy_threshold=None)
    code, output = run_in_process([candidate], tmp_path / "out")
    assert code == 3 and "different test files" in output.replace("\n", ""), output
    same = write_config(tmp_path, "same", gsm8k_dir, {"accuracy": 1.0}, baseline=str(baseline),
                        gate={"mode": "recovery"}, accuracy_threshold=None)
    code, output = run_in_process([same], tmp_path / "out")
    assert code == 0, output


def test_an_in_run_recovery_baseline_that_scored_0_is_exit_3_not_a_retry(tmp_path: Path, gsm8k_dir: Path) -> None:
    write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 0.0})
    candidate = write_config(tmp_path, "cand", gsm8k_dir, {"accuracy": 1.0}, baseline="base",
                             gate={"mode": "recovery"}, accuracy_threshold=None)
    code, output = run_in_process([candidate], tmp_path / "out")
    cand = load_json(tmp_path / "out" / "cand" / "result.json")
    assert code == 3 and cand["verdict"] == "ERROR" and cand["usage_error"] is True, output
    assert "the baseline scored 0.0" in cand["reason"]


@pytest.mark.parametrize("mode", ["recovery", "paired"])
def test_an_in_run_baseline_that_ended_in_error_is_never_compared_against(tmp_path: Path, gsm8k_dir: Path,
                                                                          mode: str) -> None:
    """The baseline answered every question (its metrics and samples look complete) but its server
    exited before the evaluation ended, so it is an ERROR: guards against gating the candidate on
    numbers the run itself refused to trust."""
    write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 1.0, "exit_after_answers": 4}, max_concurrency=1,
                 num_questions=4)
    candidate = write_config(tmp_path, "cand", gsm8k_dir, {"accuracy": 1.0}, baseline="base", num_questions=4,
                             gate={"mode": mode}, accuracy_threshold=None)
    code, output = run_in_process([candidate], tmp_path / "out")
    base = load_json(tmp_path / "out" / "base" / "result.json")
    cand = load_json(tmp_path / "out" / "cand" / "result.json")
    assert base["verdict"] == "ERROR" and base["metrics"]["value"] == 1.0, output  # measured, yet not trusted
    assert code == 2 and cand["verdict"] == "ERROR" and cand["usage_error"] is False, output
    assert "baseline 'base' has no measurement in this run (ERROR: server exited with status 4" in cand["reason"]
    assert not cand["gate"].get("passed")  # no gate was evaluated


def test_paired_gate_counts_flips_against_the_baseline(tmp_path: Path, gsm8k_dir: Path) -> None:
    base = write_config(tmp_path, "pbase", gsm8k_dir, {"accuracy": 1.0})
    candidate = write_config(tmp_path, "pcand", gsm8k_dir, {"accuracy": 0.7}, baseline="pbase",
                             gate={"mode": "paired"}, accuracy_threshold=None)
    code, _ = run_in_process([candidate, base], tmp_path / "out")
    gate = load_json(tmp_path / "out" / "pcand" / "result.json")["gate"]
    rows = [json.loads(line) for line in (gsm8k_dir / "test.jsonl").read_text().splitlines()][:12]
    flips = sum(_share(r["question"]) >= 0.7 for r in rows)
    assert gate["mode"] == "paired" and gate["n_common"] == 12
    assert gate["flips_right_to_wrong"] == flips and gate["flips_wrong_to_right"] == 0
    assert code == (1 if not gate["passed"] else 0)


def test_a_config_whose_baseline_is_skipped_is_skipped_too(tmp_path: Path, gsm8k_dir: Path) -> None:
    base = write_config(tmp_path, "base", gsm8k_dir, requires={"gpus": 64})
    cand = write_config(tmp_path, "cand", gsm8k_dir, baseline="base.yaml", gate={"mode": "recovery"})
    code, output = run_in_process([base, cand], tmp_path / "out", skip_unmet=True)
    assert code == 3 and "cand: its baseline base is skipped (requires 64 GPU(s)" in output, output
    assert "internal error" not in output


def test_skip_unmet_requires_runs_what_this_machine_can_and_reports_the_rest(tmp_path: Path,
                                                                            gsm8k_dir: Path) -> None:
    big = write_config(tmp_path, "big", gsm8k_dir, requires={"gpus": 64})
    fine = write_config(tmp_path, "fine", gsm8k_dir)
    code, output = run_in_process([big, fine], tmp_path / "strict")
    assert code == 3 and "big.yaml: this config requires 64 GPU(s)" in output and "--skip-unmet-requires" in output
    code, output = run_in_process([big, fine], tmp_path / "out", skip_unmet=True)
    assert code == 0 and "SKIPPED big: requires 64 GPU(s)" in output, output
    assert not (tmp_path / "out" / "big").exists() and load_json(tmp_path / "out" / "fine" / "result.json")
    suite = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert suite.get("tests") == "2" and suite.get("skipped") == "1"
    [skipped] = suite.iter("skipped")
    assert "requires 64 GPU(s)" in skipped.get("message")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "1 PASS, 0 FAIL, 0 ERROR, 1 skipped" in summary and "- big (" in summary
    code, output = run_in_process([big], tmp_path / "none", skip_unmet=True)
    assert code == 3 and "every config was skipped, so nothing was evaluated" in output


def test_an_earlier_runs_artifacts_of_a_skipped_config_do_not_stay_to_speak_for_this_run(tmp_path: Path,
                                                                                        gsm8k_dir: Path) -> None:
    big = write_config(tmp_path, "big", gsm8k_dir, requires={"gpus": 64})
    fine = write_config(tmp_path, "fine", gsm8k_dir, num_questions=4)
    stale = tmp_path / "out" / "big"
    stale.mkdir(parents=True)
    for name in ("result.json", "samples.jsonl", "server.log", "lm_eval.log"):
        (stale / name).write_text('{"verdict": "PASS"}\n')  # measured on another machine, an earlier run
    code, output = run_in_process([big, fine], tmp_path / "out", skip_unmet=True)
    assert code == 0 and "SKIPPED big" in output, output
    assert list(stale.iterdir()) == []


def test_exit_code_priority() -> None:
    from quantgate.harness.results import RunRecord

    def rec(verdict: str) -> RunRecord:
        return RunRecord(name=verdict, verdict=verdict, reason="", config={})

    assert exit_code([rec("PASS"), rec("PASS")]) == 0
    assert exit_code([rec("PASS"), rec("FAIL")]) == 1
    assert exit_code([rec("FAIL"), rec("ERROR"), rec("PASS")]) == 2
    refused = rec("ERROR")
    refused.usage_error = True
    assert exit_code([rec("ERROR"), refused, rec("FAIL")]) == 3  # a retry cannot fix it
    # usage_error qualifies an ERROR only: a verdict reached is never exit 3.
    reached = rec("FAIL")
    reached.usage_error = True
    assert reached.exit_code == 1 and exit_code([reached, rec("PASS")]) == 1


def test_the_verdict_notes_answers_cut_at_max_tokens_above_a_tenth() -> None:
    from quantgate.harness import runner

    config = SimpleNamespace(max_tokens=256)

    def note(truncated: int) -> str | None:
        return runner._truncation_note(SimpleNamespace(truncated=truncated, finish_reasons={
            "length": truncated, "stop": 20 - truncated}), config)

    assert note(2) is None  # 10%: not many
    assert note(3).startswith("3 of 20 answers (15%) stopped at max_tokens (256;")
    assert note(0) is None


def test_a_score_on_zero_questions_is_no_verdict(tmp_path: Path) -> None:
    """An evaluation that reports a value over n = 0 questions (an aggregate of nothing) is an
    ERROR: an absolute gate has no n to refuse it and would PASS or FAIL on it."""
    from quantgate.harness import runner
    from quantgate.harness.results import RunRecord

    cfg = gate_config(tmp_path, "accuracy_threshold: 0.0\n")
    record = RunRecord(name="z", verdict="ERROR", reason="", config={})
    outcome = SimpleNamespace(error=None, metrics={"value": 0.0, "n": 0, "invalid_rate": None}, samples=[],
                              dataset_sha256={}, truncated=0, finish_reasons={})
    server = SimpleNamespace(poll=lambda: None)
    runner._judge(record, SimpleNamespace(), cfg, server, outcome, None, "server.log")
    assert record.verdict == "ERROR" and record.reason == "no question was evaluated (empty test set or limit 0)"
    assert record.gate is None


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="marlin serves on a GPU: needs a machine without one")
def test_a_config_the_builtin_server_refuses_at_start_up_exits_3(tmp_path: Path, gsm8k_dir: Path) -> None:
    # The plan cannot know that no marlin kernel runs on this machine; the server's exit 3 says so.
    config = write_config(tmp_path, "marlin-here", gsm8k_dir, engine="builtin", vllm_command=None,
                          model_name=str(REPO / "models" / "tiny-qwen3-fp8-block-native"),
                          server_args=["--linear-backend", "marlin", "--device", "cpu"])
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "marlin-here" / "result.json")
    assert code == 3 and result["verdict"] == "ERROR" and result["usage_error"] is True, output
    assert "the server refused the config" in result["reason"] and "MarlinFp8LinearKernel" in result["log_tail"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(CONFIGS)
def test_random_configs_exit_3_with_a_located_message_or_run(tmp_path: Path, data: dict) -> None:
    """Whatever the file holds, `run` never raises: an invalid config is exit 3 naming the
    file; a valid one reaches the (here unreachable) server and is an ERROR, exit 2."""
    path = tmp_path / "random.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    code, output = run_in_process([path], tmp_path / "out", server_url="http://127.0.0.1:9")
    valid = inspect_config(path).config is not None
    if code == 3:
        assert output.startswith(f"error: {path}"), output
    else:
        assert valid and code == 2, output


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(VALID_CONFIGS)
def test_random_valid_configs_reach_the_server_and_are_a_retryable_error(tmp_path: Path, data: dict) -> None:
    """The valid half of the property above, which CONFIGS never reaches (a random dict is
    never a valid config): a valid config is run against the unreachable server, exit 2."""
    path = tmp_path / "valid.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    code, output = run_in_process([path], tmp_path / "out", server_url="http://127.0.0.1:9")
    assert inspect_config(path).config is not None and code == 2, output
    assert "server not usable" in output, output


def _requiring(**requires):
    from quantgate.harness.config import Requires

    return SimpleNamespace(requires=Requires(**requires))


def test_requirements_are_checked_against_the_gpus_present() -> None:
    from quantgate.harness.runner import GpuScan, unmet_requirements

    h100s = GpuScan([("NVIDIA H100 80GB HBM3", "9.0")] * 2)
    assert unmet_requirements(_requiring(), GpuScan([])) is None
    assert unmet_requirements(_requiring(gpus=2, device="h100", min_compute_capability="9.0"), h100s) is None
    assert "requires 2 GPU(s); this machine has 0" in unmet_requirements(_requiring(gpus=2), GpuScan([]))
    # A device or capability alone asks for one GPU: no GPU at all is not "every GPU is an H100".
    assert "requires 1 GPU(s); this machine has 0" in unmet_requirements(_requiring(device="h100"), GpuScan([]))
    assert "requires device a100" in unmet_requirements(_requiring(gpus=1, device="a100"), h100s)
    assert "compute capability >= 10.0" in unmet_requirements(_requiring(min_compute_capability="10.0"), h100s)


def _nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """An `nvidia-smi` first on PATH running `script`; no visibility variable set."""
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + script)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for variable in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.parametrize("variable,value,names", [
    (None, None, ["A", "B", "C", "D"]),
    ("CUDA_VISIBLE_DEVICES", "2,0", ["C", "A"]),
    ("CUDA_VISIBLE_DEVICES", "GPU-bbbb,3", ["B", "D"]),  # a UUID or a unique prefix of one
    ("CUDA_VISIBLE_DEVICES", "1,7,2", ["B"]),  # CUDA drops the list from the first unknown device
    ("CUDA_VISIBLE_DEVICES", "", []),
    ("CUDA_VISIBLE_DEVICES", "-1", []),
    ("CUDA_VISIBLE_DEVICES", "none", []),
    ("CUDA_VISIBLE_DEVICES", "all", ["A", "B", "C", "D"]),
    # The container runtime's variable: nvidia-smi inside already lists only those GPUs, from 0.
    ("NVIDIA_VISIBLE_DEVICES", "3", ["A", "B", "C", "D"]),
    ("CUDA_VISIBLE_DEVICES", "MIG-1111-2222", ["A", "B", "C", "D"]),  # not in the GPU list: left as it is
])
def test_the_gpus_found_are_those_the_visibility_variables_leave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 variable: str | None, value: str | None,
                                                                 names: list[str]) -> None:
    from quantgate.harness.runner import local_gpus, unmet_requirements

    _nvidia_smi(tmp_path, monkeypatch, "".join(f"echo '{i}, GPU-{c * 4}-0000, {c.upper()}, 9.0'\n"
                                               for i, c in enumerate("abcd")))
    if variable is not None:
        monkeypatch.setenv(variable, value)
    scan = local_gpus()
    assert [name for name, _ in scan.gpus] == names
    if variable == "CUDA_VISIBLE_DEVICES" and value != "all":
        said = "names MIG instances" if value.startswith("MIG-") else f"leaves {len(names)} of the 4"
        assert f"{variable}={value!r} {said}" in unmet_requirements(_requiring(gpus=8), scan)


def test_a_gpu_whose_capability_nvidia_smi_does_not_know_is_reported_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantgate.harness.runner import local_gpus, unmet_requirements

    _nvidia_smi(tmp_path, monkeypatch, "echo '0, GPU-aaaa, NVIDIA H100 80GB HBM3, [N/A]'\n")
    scan = local_gpus()
    assert scan.gpus == [("NVIDIA H100 80GB HBM3", None)]
    assert unmet_requirements(_requiring(gpus=1, device="h100"), scan) is None
    unmet = unmet_requirements(_requiring(gpus=1, min_compute_capability="8.0"), scan)
    assert "NVIDIA H100 80GB HBM3 capability unknown" in unmet
    assert "nvidia-smi reports no compute capability for 1 of them" in unmet


def test_a_failing_nvidia_smi_is_quoted_not_taken_for_no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantgate.harness.runner import local_gpus, unmet_requirements

    _nvidia_smi(tmp_path, monkeypatch, "echo 'Field \"compute_cap\" is not a valid field to query.' >&2\nexit 2\n")
    unmet = unmet_requirements(_requiring(gpus=1), local_gpus())
    assert 'this machine has 0 GPU(s); nvidia-smi failed (exit 2): Field "compute_cap" is not a valid field' in unmet


def test_an_internal_error_is_recorded_and_the_next_config_still_runs(tmp_path: Path, gsm8k_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from quantgate.harness import runner

    real_gate = runner.evaluate_gate
    calls = iter([RuntimeError("gate exploded"), None])

    def flaky_gate(*args, **kwargs):
        problem = next(calls)
        if problem is not None:
            raise problem
        return real_gate(*args, **kwargs)

    monkeypatch.setattr(runner, "evaluate_gate", flaky_gate)
    first = write_config(tmp_path, "first", gsm8k_dir)
    second = write_config(tmp_path, "second", gsm8k_dir)
    code, output = run_in_process([first, second], tmp_path / "out")
    broken = load_json(tmp_path / "out" / "first" / "result.json")
    assert code == 2 and broken["verdict"] == "ERROR"
    assert "internal error: RuntimeError: gate exploded" in broken["reason"] and "Traceback" in output
    assert not pid_alive(broken["server"]["pid"])
    assert load_json(tmp_path / "out" / "second" / "result.json")["verdict"] == "PASS"


def test_gate_line_states_what_the_verdict_rests_on(tmp_path: Path) -> None:
    wilson = evaluate_gate(gate_config(tmp_path, "reference: {value: 0.755}\ngate: wilson\n"), {"value": 0.72, "n": 100})
    assert gate_line(wilson).startswith("exact_match,strict-match 0.7200 (Wilson lower bound 0.6411) vs threshold "
                                         "0.6946; measured accuracy needed 0.7")
    hyp = evaluate_gate(gate_config(tmp_path, "reference: {value: 0.5}\ngate: hypothesis\n"), {"value": 0.5, "n": 1319})
    assert gate_line(hyp) == "exact_match,strict-match 0.5000 vs threshold 0.4680"
    invalid = gate_config(tmp_path, "accuracy_threshold: 0.5\ngate: {mode: absolute, max_invalid_rate: 0.05}\n")
    line = gate_line(evaluate_gate(invalid, {"value": 0.9, "n": 100, "invalid_rate": 0.3}))
    assert line == ("invalid_rate 0.3000 > max_invalid_rate 0.0500 (accuracy passed: exact_match,strict-match 0.9000 "
                    "vs threshold 0.4200)")
    line = gate_line(evaluate_gate(invalid, {"value": 0.1, "n": 100, "invalid_rate": 0.3}))
    assert line == "exact_match,strict-match 0.1000 vs threshold 0.4200; invalid_rate 0.3000 > max_invalid_rate 0.0500"
    assert "invalid" not in gate_line(evaluate_gate(invalid, {"value": 0.9, "n": 100, "invalid_rate": 0.01}))
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    rows = [{"id": i, "correct": True} for i in range(20)]
    worse = [{"id": i, "correct": i >= 6} for i in range(20)]
    base = Baseline("base", {"value": 1.0, "n": 20}, rows)
    paired = evaluate_gate(gate_config(tmp_path, "baseline: base\ngate: paired\n"), {"value": 0.7, "n": 20}, worse, base)
    assert gate_line(paired) == ("exact_match,strict-match flips 6 right->wrong, 0 wrong->right; "
                                  "one-sided p-value 0.01562 vs alpha 0.05")
    recovery = evaluate_gate(gate_config(tmp_path, "baseline: base\ngate: recovery\n"), {"value": 0.7, "n": 20}, None,
                             base)
    assert gate_line(recovery) == ("exact_match,strict-match ratio 0.7000 (0.7000 / baseline 1.0000) vs recovery "
                                    "minimum 0.9500")
    # A gen-1 file gates every metric it lists: a failing other one is named, or the line reads as a PASS.
    gen1 = gate_config(tmp_path, "tasks:\n- name: gsm8k\n  metrics:\n  - {name: 'exact_match,strict-match', value: 0.5}\n"
                                 "  - {name: 'exact_match,flexible-extract', value: 1.0}\nrtol: 0.01\n")
    # The passing gated metric is left out: "strict-match 0.6000 vs threshold 0.4950" first read as a PASS.
    other = evaluate_gate(gen1, {"value": 0.6, "strict_match": 0.6, "flexible_extract": 0.95, "n": 20})
    assert gate_line(other) == "exact_match,flexible-extract 0.9500 vs threshold 0.9900"
    both = evaluate_gate(gen1, {"value": 0.4, "strict_match": 0.4, "flexible_extract": 0.95, "n": 20})
    assert gate_line(both) == ("exact_match,strict-match 0.4000 vs threshold 0.4950; "
                                "exact_match,flexible-extract 0.9500 vs threshold 0.9900")
    gated = evaluate_gate(gen1, {"value": 0.4, "strict_match": 0.4, "flexible_extract": 0.995, "n": 20})
    assert gate_line(gated) == "exact_match,strict-match 0.4000 vs threshold 0.4950"


def test_console_shows_config_names_that_look_like_markup() -> None:
    """rich read `qwen3[fp8]` as a style tag and printed `qwen3`."""
    import io

    from rich.console import Console

    from quantgate.harness.results import RunRecord
    from quantgate.harness.runner import Display

    sink = io.StringIO()
    display = Display(Console(file=sink, width=200))
    display.config_start(1, 2, SimpleNamespace(name="qwen3[fp8]", engine="vllm"))
    record = RunRecord(name="qwen3[fp8]", verdict="FAIL", reason="[red]r", config={"engine": "builtin"},
                       timings={"total_s": 1.0})
    display.verdict(record)
    display.summary([record])
    output = sink.getvalue()
    assert "[1/2] qwen3[fp8] (vllm)" in output and output.count("qwen3[fp8]") == 3, output
    assert "[red]r" in output


def test_gate_line_and_summary_table_tell_apart_what_rounds_alike(tmp_path: Path) -> None:
    # At .4f both FAILs below read as ties: "0.6725 vs threshold 0.6725", "ratio 0.9500 vs minimum 0.9500".
    import io

    from rich.console import Console

    from quantgate.harness.results import RunRecord
    from quantgate.harness.runner import Display

    hyp = evaluate_gate(gate_config(tmp_path, "reference: {value: 0.7018}\ngate: hypothesis\n"),
                        {"value": 887 / 1319, "n": 1319})
    assert not hyp.passed and gate_line(hyp) == "exact_match,strict-match 0.67248 vs threshold 0.67250"
    (tmp_path / "base.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\n")
    recovery = evaluate_gate(gate_config(tmp_path, "baseline: base\ngate: recovery\n"), {"value": 968 / 1319, "n": 1319},
                             None, Baseline("base", {"value": 1019 / 1319, "n": 1319}))
    assert not recovery.passed and gate_line(recovery) == ("exact_match,strict-match ratio 0.94995 (0.73389 / "
                                                            "baseline 0.7726) vs recovery minimum 0.95000")
    sink = io.StringIO()
    records = [RunRecord(name=name, verdict="FAIL", reason="", config={}, metrics={"value": value, "n": 1319},
                         gate=outcome.to_dict(), timings={"total_s": 1.0})
               for name, value, outcome in (("hyp", 887 / 1319, hyp), ("rec", 968 / 1319, recovery))]
    Display(Console(file=sink, width=200)).summary(records)
    rows = {line.split()[1]: line for line in sink.getvalue().splitlines() if " hyp " in line or " rec " in line}
    assert "0.67248" in rows["hyp"] and "0.67250" in rows["hyp"], sink.getvalue()
    assert "0.73389" in rows["rec"] and "0.73393" in rows["rec"], sink.getvalue()


def test_one_run_at_a_time_per_output_dir_and_no_stale_summary_speaks_for_a_run(tmp_path: Path,
                                                                                 gsm8k_dir: Path) -> None:
    import fcntl

    from quantgate.harness.runner import LOCK_FILE

    out = tmp_path / "out"
    out.mkdir()
    config = write_config(tmp_path, "good", gsm8k_dir)
    with open(out / LOCK_FILE, "w") as other_run:  # another job's run, still going
        other_run.write("pid 4242\n")
        other_run.flush()
        fcntl.flock(other_run, fcntl.LOCK_EX)
        code, output = run_in_process([config], out)
    assert code == 3 and "another quantgate run (pid 4242) is writing to it" in output.replace("\n", "")
    (out / "junit.xml").write_text("<testsuites><testsuite name='yesterday'/></testsuites>")
    (out / "summary.md").write_text("1 PASS")
    code, output = run_in_process([tmp_path / "missing.yaml"], out)  # stops at its plan
    assert code == 3 and not (out / "junit.xml").exists() and not (out / "summary.md").exists()


@pytest.mark.parametrize("error", [None, errno.EOPNOTSUPP, errno.ENOLCK, errno.EIO])
def test_the_lock_names_only_this_run_and_a_file_system_without_locks_runs_unlocked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int | None) -> None:
    """Some network file systems have no locks: a run there goes on unlocked; any other failure
    to lock is exit 2. The lock file names the run holding it, not also an earlier one."""
    import fcntl

    from quantgate.harness.runner import LOCK_FILE, OutputDirUnwritable, RunOptions, output_dir_lock

    if error is not None:
        def failing_flock(*args: object) -> None:
            raise OSError(error, os.strerror(error))

        monkeypatch.setattr(fcntl, "flock", failing_flock)
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text("pid 4242\n")  # an earlier run's, ended
    if error == errno.EIO:
        with pytest.raises(OutputDirUnwritable, match="cannot lock it"):
            with output_dir_lock(RunOptions(output_dir=out)):
                pass
        return
    with output_dir_lock(RunOptions(output_dir=out)):
        assert (out / LOCK_FILE).read_text() == f"pid {os.getpid()}\n"


def test_signals_after_the_first_are_ignored_and_the_handlers_are_restored() -> None:
    """A second Ctrl-C (or a CI cancel after a Ctrl-C) must not cut short the teardown the first
    began; and once the run is over, the process's own handlers are back."""
    from quantgate.harness.runner import InterruptGuard, RunInterrupted

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    guard = InterruptGuard()
    with guard.installed():
        with pytest.raises(RunInterrupted):
            signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)  # no second RunInterrupted
    assert guard.signal_name == "SIGTERM"
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_the_plan_leaves_to_the_attached_server_what_only_it_can_meet(tmp_path: Path, gsm8k_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """--server-url evaluates a server on a machine that has the GPUs `requires:` asks for (the
    refusal without it says so), and commands planned for another machine (`quantgate repro`)
    inherit that machine's environment, not this shell's legacy kernel switches."""
    from quantgate.harness.runner import PlanError, RunOptions, plan

    big = write_config(tmp_path, "big", gsm8k_dir, requires={"gpus": 64})
    with pytest.raises(PlanError, match="with --server-url"):
        plan([big], RunOptions(output_dir=tmp_path / "out"))
    assert [i.config.name for i in plan([big], RunOptions(output_dir=tmp_path / "out",
                                                          server_url="http://127.0.0.1:9"))] == ["big"]
    monkeypatch.setenv("VLLM_TEST_FORCE_FP8_MARLIN", "1")
    auto = write_config(tmp_path, "auto", gsm8k_dir)
    assert [i.config.name for i in plan([auto], RunOptions(output_dir=tmp_path / "out", check_machine=False))] == ["auto"]


def test_server_url_cannot_measure_a_baseline_config_that_has_no_usable_result(tmp_path: Path,
                                                                               gsm8k_dir: Path) -> None:
    """It would evaluate the one attached server as the baseline too: the candidate against itself."""
    from quantgate.harness.runner import PlanError, RunOptions, plan

    write_config(tmp_path, "base", gsm8k_dir)
    candidate = write_config(tmp_path, "cand", gsm8k_dir, baseline="base", gate={"mode": "recovery", "recovery": 0.9},
                             accuracy_threshold=None)
    with pytest.raises(PlanError, match="--server-url evaluates one server only: run the baseline first"):
        plan([candidate], RunOptions(output_dir=tmp_path / "out", server_url="http://127.0.0.1:9"))


def test_an_earlier_runs_logs_do_not_stay_in_this_runs_folder(tmp_path: Path, gsm8k_dir: Path) -> None:
    """server.log and lm_eval.log are appended to: an earlier run's lines would read as this run's."""
    config = write_config(tmp_path, "again", gsm8k_dir, num_questions=4)
    run_dir = tmp_path / "out" / "again"
    run_dir.mkdir(parents=True)
    for name in ("server.log", "lm_eval.log"):
        (run_dir / name).write_text("an earlier run's\n")
    code, output = run_in_process([config], tmp_path / "out")
    assert code == 0, output
    assert [name for name in ("server.log", "lm_eval.log") if "an earlier run's" in (run_dir / name).read_text()] == []


def test_run_says_what_lint_warns_of(tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "typo", gsm8k_dir, num_question=4)  # kept, unused: never silently
    code, output = run_in_process([config], tmp_path / "out")
    assert code == 0 and "warning:" in output and "did you mean 'num_questions'?" in output.replace("\n", "")
    # A typo'd key may be why the config is refused: the warning comes with the error.
    config.write_text(config.read_text().replace("accuracy_threshold:", "accuracy_treshold:"))
    code, output = run_in_process([config], tmp_path / "out")
    said = output.replace("\n", "")
    assert code == 3 and "no accuracy gate" in said and "did you mean 'accuracy_threshold'?" in said, output


def test_a_results_file_baseline_of_other_questions_is_refused_before_any_server_starts(
        tmp_path: Path, gsm8k_dir: Path) -> None:
    base = write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 1.0}, num_questions=4)
    assert run_in_process([base], tmp_path / "first")[0] == 0
    baseline = tmp_path / "first" / "base" / "result.json"
    candidate = write_config(tmp_path, "cand", gsm8k_dir, baseline=str(baseline), num_questions=6,
                             gate={"mode": "recovery"}, accuracy_threshold=None)
    code, output = run_in_process([candidate], tmp_path / "out")
    assert code == 3 and "evaluated 4 questions, this run would evaluate 6" in output.replace("\n", "")
    assert not (tmp_path / "out" / "cand").exists()
    same = write_config(tmp_path, "same", gsm8k_dir, baseline=str(baseline), num_questions=4,
                        gate={"mode": "recovery"}, accuracy_threshold=None)
    assert run_in_process([same], tmp_path / "out")[0] == 0


@pytest.mark.parametrize("mode", ["recovery", "paired"])
def test_a_results_file_baseline_that_errored_is_refused_before_any_server_starts(tmp_path: Path, gsm8k_dir: Path,
                                                                                  mode: str) -> None:
    base = write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 1.0})
    assert run_in_process([base], tmp_path / "first")[0] == 0
    baseline = tmp_path / "first" / "base" / "result.json"
    errored = {**load_json(baseline), "verdict": "ERROR", "reason": "server exited with status 139 during evaluation"}
    baseline.write_text(json.dumps(errored))  # its metrics and samples.jsonl are still there
    candidate = write_config(tmp_path, "cand", gsm8k_dir, {"accuracy": 1.0}, baseline=str(baseline),
                             gate={"mode": mode}, accuracy_threshold=None)
    code, output = run_in_process([candidate], tmp_path / "out")
    assert code == 3, output
    assert f"baseline {baseline}: that run's verdict is ERROR (server exited with status 139 during evaluation)" \
        in output.replace("\n", "")
    assert not (tmp_path / "out" / "cand").exists()


def test_what_a_results_file_baseline_lacks_is_refused_before_any_server_starts(tmp_path: Path,
                                                                               gsm8k_dir: Path) -> None:
    # Each was exit 2 (retried by CI) and found only after the whole evaluation.
    base = write_config(tmp_path, "base", gsm8k_dir, {"accuracy": 1.0})
    assert run_in_process([base], tmp_path / "first")[0] == 0
    baseline = tmp_path / "first" / "base" / "result.json"
    measured = load_json(baseline)

    def refused(mode: str, expected: str) -> None:
        candidate = write_config(tmp_path, "cand", gsm8k_dir, {"accuracy": 1.0}, baseline=str(baseline),
                                 gate={"mode": mode}, accuracy_threshold=None)
        code, output = run_in_process([candidate], tmp_path / "out")
        assert code == 3 and expected in output.replace("\n", ""), output
        assert not (tmp_path / "out" / "cand").exists()

    baseline.write_text(json.dumps({**measured, "metrics": {**measured["metrics"], "value": 0.0}}))
    refused("recovery", f"baseline {baseline} scored 0.0: a recovery ratio against it is undefined")
    baseline.write_text(json.dumps({**measured, "metrics": {**measured["metrics"],
                                                            "metric": "exact_match,flexible-extract"}}))
    refused("recovery", "this run gates exact_match,strict-match and baseline base gated exact_match,flexible-extract")
    baseline.write_text(json.dumps(measured))
    (baseline.parent / "samples.jsonl").unlink()
    refused("paired", f"baseline {baseline} has no samples.jsonl beside it: gate paired needs the per-sample results")


def test_a_failed_gate_and_kernel_check_are_both_in_the_reason_and_its_summary_row(tmp_path: Path,
                                                                                  gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "both", gsm8k_dir, {"accuracy": 0.3, "linear_backend": "triton"},
                          accuracy_threshold=0.9, tolerance=0.0, expect={"linear_kernel": "marlin"})
    code, _ = run_in_process([config], tmp_path / "out")
    reason = load_json(tmp_path / "out" / "both" / "result.json")["reason"]
    assert code == 1 and reason.startswith("gate absolute failed: ") and "; kernel check failed: " in reason
    assert "|" not in reason  # a table's cell separator: the summary table and CI's renderers split on it
    table = [line for line in (tmp_path / "out" / "summary.md").read_text().splitlines() if line.startswith("|")]
    cells = [len(re.split(r"(?<!\\)\|", line)) for line in table]
    assert len(table) == 3 and cells == [cells[0]] * 3 and "kernel check failed" in table[2]


@pytest.mark.parametrize("name,flags,what", [
    ("junit.xml", {}, "junit report (--junit)"),
    ("summary.md", {}, "summary (--markdown)"),
    (".quantgate-run.lock", {}, "lock file"),
    ("ci-junit.xml", {"junit": "out/ci-junit.xml"}, "junit report (--junit)"),
    ("report.md", {"markdown": "out/report.md"}, "summary (--markdown)"),
    ("JUNIT.XML", {}, "junit report (--junit) (ignoring case, as macOS and Windows file systems do)"),
])
def test_a_config_named_like_a_file_the_run_writes_is_refused_before_any_server_starts(
        tmp_path: Path, gsm8k_dir: Path, name: str, flags: dict, what: str) -> None:
    """Its run folder would take that file's path: the junit report or summary was never written."""
    config = write_config(tmp_path, name, gsm8k_dir)
    out = tmp_path / "out"
    code, output = run_in_process([config], out, **{k: tmp_path / v for k, v in flags.items()})
    assert code == 3, output
    assert (f"{config}: name: {name!r} names its run folder {out / name}, which is the path of this run's {what}: "
            "one of the two could not be written; give the config another name") in output.replace("\n", "")
    assert not (out / name).is_dir()


def test_a_config_named_junit_xml_runs_when_the_junit_report_goes_elsewhere(tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "junit.xml", gsm8k_dir, {"accuracy": 1.0})
    code, output = run_in_process([config], tmp_path / "out", junit=tmp_path / "junit.xml")
    assert code == 0, output
    assert (tmp_path / "out" / "junit.xml" / "result.json").is_file() and (tmp_path / "junit.xml").is_file()


def test_a_config_name_too_long_for_a_folder_is_refused_before_any_server_starts(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its run folder cannot exist: every run of it would end in an ERROR that says "free space"
    (exit 2, which CI retries, to the same end), with no result.json; a config problem is exit 3.
    Names above Linux's 255 bytes are refused when the config loads; a file system with a smaller
    limit (eCryptfs: 143) is found out when the run is planned."""
    config = write_config(tmp_path, "long", gsm8k_dir)
    name = "q" * 200
    config.write_text(config.read_text().replace("name: long", f"name: {name}", 1), encoding="utf-8")
    real_lstat = os.lstat

    def small_name_max(path, *args, **kwargs):
        if Path(path).name == name:
            raise OSError(errno.ENAMETOOLONG, "File name too long")
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", small_name_max)
    out = tmp_path / "out"
    code, output = run_in_process([config], out)
    assert code == 3, output
    said = output.replace("\n", "")
    assert f"{config}: name: " in said and "give the config a shorter name" in said and "free space" not in said, said
    assert [p.name for p in out.iterdir() if not p.name.startswith(".")] == []  # nothing ran


@pytest.mark.parametrize("error, code, says", [
    (FileNotFoundError(2, "No such file or directory"), 3, "cannot be created or written (No such file or directory); "
     "pass a directory this user can create and write"),
    (OSError(28, "No space left on device"), 2, "No space left on device; free space or pass another --output-dir"),
])
def test_an_output_dir_that_cannot_be_made_is_a_usage_error_unless_the_disk_is_full(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, code: int, says: str) -> None:
    """A path that cannot exist (/proc/x, a parent on a read-only file system) fails the same way on
    every retry: exit 3. A full disk may not: exit 2, which CI retries."""
    config = write_config(tmp_path, "cfg", gsm8k_dir)
    out = tmp_path / "out"
    real_mkdir = Path.mkdir

    def failing_mkdir(self: Path, *args, **kwargs) -> None:
        if self == out:
            raise error
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", failing_mkdir)
    status, output = run_in_process([config], out)
    assert status == code and says in output.replace("\n", ""), output


def test_a_baseline_config_of_another_metric_is_refused_before_any_server_starts(tmp_path: Path,
                                                                                 gsm8k_dir: Path) -> None:
    base = write_config(tmp_path, "base", gsm8k_dir, metric="exact_match,flexible-extract")
    cand = write_config(tmp_path, "cand", gsm8k_dir, baseline=str(base), gate={"mode": "paired"})
    code, output = run_in_process([cand], tmp_path / "out")
    assert code == 3, output
    assert ("baseline 'base' gates exact_match,flexible-extract, this config exact_match,strict-match: gate paired "
            "compares one metric") in output.replace("\n", "")
    assert not (tmp_path / "out" / "base" / "result.json").exists()  # nothing ran


def test_vllm_must_prove_the_backend_server_args_ask_for(tmp_path: Path, gsm8k_dir: Path) -> None:
    """vLLM, given a --linear-backend with no kernel for a layer type, warns and selects
    automatically: without `expect:`, server_args' backend is checked as one."""
    config = write_config(tmp_path, "fellback", gsm8k_dir, {"linear_backend": "marlin", "late_kernel": "cutlass"})
    code, output = run_in_process([config], tmp_path / "out")
    result = load_json(tmp_path / "out" / "fellback" / "result.json")
    assert code == 1 and result["verdict"] == "FAIL", output
    assert result["expect"]["from_server_args"] == ["linear"]
    assert "vLLM selects automatically for a layer type that backend has no kernel for" in result["reason"]
    assert "CutlassFp8BlockScaledMMKernel (backend cutlass)" in result["reason"]
