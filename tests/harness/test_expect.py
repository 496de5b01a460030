"""`expect:` against kernel reports: /v1/kernels for the built-in engine, the log for vLLM."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quantgate.harness.config import Expect, inspect_config, load_config
from quantgate.harness.backends import vllm_linear_backend
from quantgate.harness.expect import (MOE_LOG_MODULE, KernelReportUnavailable, kernel_matches, proof_env,
                                      report_from_server, report_from_vllm_log, verify)
from quantgate.harness.server import build_command
from tests.harness import runner_fixtures
from tests.harness.runner_fixtures import FAKE_SERVER, fake_args, launch

gsm8k_dir = runner_fixtures.gsm8k_dir  # the shared pytest fixture

VLLM_LOG = """\
INFO 11-29 10:00:01 [gpu_model_runner.py:2000] Starting to load model Qwen/Qwen3-30B-A3B-FP8...
(VllmWorker TP0 pid=4242) INFO 11-29 10:00:02 [fp8.py:321] Selected CutlassFp8BlockScaledMMKernel for model.layers.0.self_attn.qkv_proj
(VllmWorker TP0 pid=4242) INFO 11-29 10:00:02 [fp8.py:321] Selected FlashInferFP8ScaledMMLinearKernel for model.layers.0.self_attn.o_proj
INFO 11-29 10:00:03 [fp8.py:400] Using DEEPGEMM Fp8 MoE backend out of potential backends: ['DEEPGEMM', 'TRITON']
"""


def _module(kernel: str, backend: str, scheme: str = "fp8-block", layer: str = "linear") -> dict:
    return {"layer": layer, "scheme": scheme, "kernel": kernel, "backend": backend, "rejected": []}


def _report(**modules: dict) -> dict:
    return {"source": "GET /v1/kernels", "platform": {"device": "cpu"}, "modules": modules}


def test_vllm_log_lines_become_a_kernel_report() -> None:
    report = report_from_vllm_log(VLLM_LOG)
    assert report is not None and report["source"] == "server log"
    modules = report["modules"]
    assert modules["model.layers.0.self_attn.qkv_proj"]["kernel"] == "CutlassFp8BlockScaledMMKernel"
    assert modules["model.layers.0.self_attn.qkv_proj"]["backend"] == "cutlass"
    assert modules["model.layers.0.self_attn.o_proj"]["backend"] == "flashinfer_cutlass"
    assert modules[MOE_LOG_MODULE] == {"layer": "moe", "scheme": None, "kernel": "DEEPGEMM", "backend": "deep_gemm",
                                       "scale_attr": None, "rejected": []}
    assert report_from_vllm_log("INFO nothing about kernels here") is None


def test_every_distinct_kernel_a_vllm_log_names_is_checked() -> None:
    """vLLM names the method class, not the layer, and logs once per distinct argument set and
    TP worker: a later line must not hide an earlier, different choice."""
    log = "\n".join([
        "(Worker_TP0 pid=1) INFO [__init__.py:662] Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod",
        "(Worker_TP0 pid=1) INFO [fp8.py:405] Using TRITON Fp8 MoE backend out of potential backends: ['MARLIN']",
        "(Worker_TP1 pid=2) INFO [__init__.py:662] Selected MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod",
        "(Worker_TP1 pid=2) INFO [fp8.py:405] Using MARLIN Fp8 MoE backend out of potential backends: ['MARLIN']",
        "(Worker_TP1 pid=2) INFO [__init__.py:662] Selected MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod",
    ])
    report = report_from_vllm_log(log)
    assert report is not None
    assert {name: m["kernel"] for name, m in report["modules"].items()} == {
        "Fp8LinearMethod": "CutlassFP8ScaledMMLinearKernel", "Fp8LinearMethod#2": "MarlinFP8ScaledMMLinearKernel",
        MOE_LOG_MODULE: "TRITON", f"{MOE_LOG_MODULE}#2": "MARLIN"}  # the repeated Marlin line collapses
    check = verify(Expect(linear_kernel="marlin", moe_kernel="marlin"), report, "server.log")
    assert not check.passed
    assert [m["module"] for m in check.mismatches] == ["Fp8LinearMethod", MOE_LOG_MODULE]


def test_vllm_kernel_class_to_backend() -> None:
    assert vllm_linear_backend("MarlinFP8ScaledMMLinearKernel") == "marlin"
    assert vllm_linear_backend("PerTensorTorchFP8ScaledMMLinearKernel") == "torch"
    # vLLM's own table, not the class name's words: its default block-FP8 kernel on Hopper is a
    # FlashInfer kernel, not DeepGEMM; the weight-only XPU kernel is xpu_woq, not xpu.
    assert vllm_linear_backend("FlashInferFp8DeepGEMMDynamicBlockScaledKernel") == "flashinfer_cutlass"
    assert vllm_linear_backend("FlashInferMxFp4LinearKernel") == "flashinfer_cutlass"
    assert vllm_linear_backend("XPUW8A16FP8LinearKernel") == "xpu_woq"
    assert vllm_linear_backend("SomethingNew") is None


def _vllm_line(text: str, level: str = "INFO") -> str:
    return f"(EngineCore_DP0 pid=7) {level} 11-30 10:00:02 [__init__.py:634] {text}"


def test_a_flashinfer_kernel_named_after_deepgemm_is_not_deep_gemm() -> None:
    report = report_from_vllm_log(_vllm_line(
        "Selected FlashInferFp8DeepGEMMDynamicBlockScaledKernel for Fp8LinearMethod"))
    assert not verify(Expect(linear_kernel="deep_gemm"), report, "server.log").passed
    assert verify(Expect(linear_kernel="flashinfer_cutlass"), report, "server.log").passed
    unknown = report_from_vllm_log(_vllm_line("Selected NewerFp8Kernel for Fp8LinearMethod"))
    assert not verify(Expect(linear_kernel="cutlass"), unknown, "server.log").passed
    assert verify(Expect(linear_kernel="NewerFp8Kernel"), unknown, "server.log").passed  # the class itself


def test_mixed_precision_and_gemm_selection_lines_are_linear_choices() -> None:
    report = report_from_vllm_log("\n".join([
        _vllm_line("Using MacheteLinearKernel for mixed-precision linear"),
        _vllm_line("Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM")]))
    assert report is not None
    assert {m: (e["kernel"], e["backend"]) for m, e in report["modules"].items()} == {
        "mixed-precision linear": ("MacheteLinearKernel", "machete"),
        "NVFP4 GEMM": ("FlashInferCutlassNvFp4LinearKernel", "flashinfer_cutlass")}
    check = verify(Expect(linear_kernel="machete"), report, "server.log")
    assert not check.passed and [m["module"] for m in check.mismatches] == ["NVFP4 GEMM"]


_DEEPGEMM_SELECTED = _vllm_line("Using DEEPGEMM Fp8 MoE backend out of potential backends: ['TRITON', 'DEEPGEMM']")


def test_deep_gemm_moe_cannot_be_proven_without_debug_lines() -> None:
    """vLLM's deep_gemm MoE runs Triton for shapes DeepGEMM refuses and logs that only at DEBUG."""
    check = verify(Expect(moe_kernel="deep_gemm"), report_from_vllm_log(_DEEPGEMM_SELECTED), "server.log")
    assert not check.passed and "cannot be verified" in check.message and "VLLM_LOGGING_LEVEL=DEBUG" in check.message


def test_deep_gemm_moe_that_ran_triton_for_the_models_shape_fails() -> None:
    # Qwen3-30B-A3B at TP=2: each rank's expert width is 768 / 2 = 384 <= 512.
    refused = _vllm_line("DeepGemm disabled for N <= 512. M: 4096, N: 384, K: 2048. This means we will fallback "
                         "to triton for this specific shape for further speed up.", level="DEBUG")
    check = verify(Expect(moe_kernel="deep_gemm"), report_from_vllm_log(f"{_DEEPGEMM_SELECTED}\n{refused}"), "log")
    assert not check.passed
    assert "ran Triton, not DeepGEMM" in check.message and "N: 384" in check.message
    assert check.mismatches and check.mismatches[0]["backend"] == "triton"


def test_deep_gemm_moe_falling_back_only_for_small_batches_passes_with_a_note() -> None:
    small = _vllm_line("DeepGemm disabled due to unaligned problem size. M: 1, N: 768, K: 2048. M should >= 128 "
                       "and N and K must be multiples of 128. This is not an error and we will fall back to triton.",
                       level="\x1b[36mDEBUG\x1b[0m")  # vLLM's colour formatter
    check = verify(Expect(moe_kernel="deep_gemm"), report_from_vllm_log(f"{_DEEPGEMM_SELECTED}\n{small}"), "log")
    assert check.passed, check.message
    assert len(check.notes) == 1 and "below DeepGEMM's row alignment" in check.notes[0]
    unaligned_n = small.replace("N: 768", "N: 760")
    assert not verify(Expect(moe_kernel="deep_gemm"), report_from_vllm_log(f"{_DEEPGEMM_SELECTED}\n{unaligned_n}"),
                      "log").passed
    quiet = _vllm_line("Scheduler running", level="DEBUG")
    check = verify(Expect(moe_kernel="deep_gemm"), report_from_vllm_log(f"{_DEEPGEMM_SELECTED}\n{quiet}"), "log")
    assert check.passed and not check.notes


def test_the_runner_starts_vllm_with_debug_logs_only_for_a_deep_gemm_moe_expectation(tmp_path: Path) -> None:
    def env(text: str) -> dict:
        path = tmp_path / "c.yaml"
        path.write_text("model_name: m\naccuracy_threshold: 0.5\n" + text)
        return proof_env(load_config(path))

    assert env("engine: vllm\nexpect: {moe_kernel: deep-gemm}\n") == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert env("engine: vllm\nexpect: {moe_kernel: triton}\n") == {}
    assert env("engine: builtin\nexpect: {moe_kernel: triton}\n") == {}
    assert env("engine: vllm\nexpect: {moe_kernel: deep_gemm}\nenv: {VLLM_LOGGING_LEVEL: debug}\n") == {}
    [error] = inspect_config(write_text(tmp_path, "engine: vllm\nexpect: {moe_kernel: deep_gemm}\n"
                                        "env: {VLLM_LOGGING_LEVEL: INFO}\n")).errors
    assert error.field == "env.VLLM_LOGGING_LEVEL" and "needs VLLM_LOGGING_LEVEL=DEBUG" in error.message


def write_text(directory: Path, text: str) -> Path:
    path = directory / "lint.yaml"
    path.write_text("model_name: m\naccuracy_threshold: 0.5\n" + text)
    return path


def test_names_match_by_backend_or_class_ignoring_case_and_dashes() -> None:
    assert kernel_matches("deep-gemm", "DeepGemmFp8", "deep_gemm")
    assert kernel_matches("Marlin", "MarlinFp8LinearKernel", "marlin")
    assert kernel_matches("MarlinFp8LinearKernel", "MarlinFp8LinearKernel", None)
    assert kernel_matches("marlinfp8linearkernel", "MarlinFp8LinearKernel", None)  # a class name, case ignored
    assert not kernel_matches("marlin", "EmulationLinearKernel", "emulation")
    assert not kernel_matches("cutlass", "FlashInferFP8ScaledMMLinearKernel", "flashinfer_cutlass")


def test_mismatch_names_expected_and_actual_kernel_per_module() -> None:
    report = _report(**{
        "model.layers.0.mlp.down_proj": _module("EmulationLinearKernel", "emulation"),
        "model.layers.1.mlp.down_proj": _module("MarlinFp8LinearKernel", "marlin"),
        "lm_head": _module("UnquantizedLinearKernel", "torch", scheme="unquantized"),
    })
    check = verify(Expect(linear_kernel="marlin"), report, "GET /v1/kernels")
    assert not check.passed
    assert check.mismatches == [{"module": "model.layers.0.mlp.down_proj", "layer": "linear", "expected": "marlin",
                                 "kernel": "EmulationLinearKernel", "backend": "emulation"}]
    assert "expected 'marlin'" in check.message
    assert "EmulationLinearKernel (backend emulation) ran model.layers.0.mlp.down_proj" in check.message
    assert "1 of 2" in check.message  # lm_head is unquantized: not a module the backend applies to
    assert check.to_dict()["passed"] is False


def test_every_checked_module_on_the_expected_backend_passes() -> None:
    report = _report(a=_module("MarlinFp8LinearKernel", "marlin"),
                     experts=_module("MarlinMoEKernel", "marlin", layer="moe"))
    assert verify(Expect(linear_kernel="marlin", moe_kernel="MarlinMoEKernel"), report, "x").passed


def test_a_bf16_checkpoint_checks_all_its_linears() -> None:
    report = _report(a=_module("EmulationLinearKernel", "emulation", scheme="unquantized"),
                     b=_module("UnquantizedLinearKernel", "torch", scheme="unquantized"))
    check = verify(Expect(linear_kernel="emulation"), report, "x")
    assert not check.passed and [m["module"] for m in check.mismatches] == ["b"]


def test_an_expectation_that_cannot_be_checked_fails() -> None:
    check = verify(Expect(linear_kernel="marlin"), None, "GET http://h/v1/kernels")
    assert not check.passed and "cannot be verified" in check.message and "GET http://h/v1/kernels" in check.message
    dense_only = _report(a=_module("MarlinFp8LinearKernel", "marlin"))
    check = verify(Expect(moe_kernel="marlin"), dense_only, "x")
    assert not check.passed and "has no moe module" in check.message


def test_report_from_a_server_and_from_one_without_the_endpoint(tmp_path: Path, gsm8k_dir: Path) -> None:
    servers = []
    try:
        for extra in ([], ["--no-kernels-endpoint"]):
            cmd = build_command("vllm", "fake-model", [*fake_args(gsm8k_dir), "--linear-backend", "triton", *extra],
                                {}, [sys.executable, str(FAKE_SERVER)])
            servers.append(launch(cmd, tmp_path / f"s{len(servers)}.log", startup_timeout_s=30))
        report = report_from_server(servers[0].base_url)
        assert report is not None and report["source"] == "GET /v1/kernels"
        assert report["modules"]["model.layers.0.mlp.down_proj"]["backend"] == "triton"
        assert report_from_server(servers[1].base_url) is None
    finally:
        for server in servers:
            server.stop()


def test_a_kernel_report_request_that_fails_is_retried_then_named_not_taken_for_no_report(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantgate.harness import expect

    monkeypatch.setattr(expect, "REPORT_RETRY_WAIT_S", 0.0)
    server = launch(build_command("vllm", "fake-model", [*fake_args(gsm8k_dir), "--kernels-status", "503"], {},
                                  [sys.executable, str(FAKE_SERVER)]), tmp_path / "s.log", startup_timeout_s=30)
    try:
        with pytest.raises(KernelReportUnavailable) as error:
            report_from_server(server.base_url)
        said = str(error.value)
        assert f"GET {server.base_url}/v1/kernels answered 503 Service Unavailable" in said and "busy" in said
        assert "(3 attempts)" in said
        assert "".join(server.log_lines()).count("GET /v1/kernels") == 3
    finally:
        server.stop()
    with pytest.raises(KernelReportUnavailable, match="/v1/kernels failed: ConnectError"):
        report_from_server(server.base_url, attempts=1)  # nothing listens there any more


def test_vllm_moe_lines_of_every_oracle_are_read() -> None:
    """Each oracle's line names the backend; the experts-class line after it is no second choice."""
    log = "\n".join([_vllm_line("Using 'FLASHINFER_TRTLLM' NvFp4 MoE backend out of potential backends: ['X']."),
                     _vllm_line("Using TRITON Unquantized MoE backend out of potential backends: ['FlashInfer "
                                "TRTLLM', 'FlashInfer CUTLASS', 'TRITON', 'BATCHED_TRITON']"),
                     _vllm_line("Using TritonExperts MoE backend"),
                     _vllm_line("Using FlashInfer CUTLASS Unquantized MoE backend"),
                     _vllm_line("Using FlashInfer TRTLLM backend for FP8 MoE")])
    report = report_from_vllm_log(log)
    assert report is not None
    assert [(m["kernel"], m["backend"]) for m in report["modules"].values()] == [
        ("FLASHINFER_TRTLLM", "flashinfer_trtllm"), ("TRITON", "triton"),
        ("FlashInfer CUTLASS", "flashinfer_cutlass"), ("FlashInfer TRTLLM", "flashinfer_trtllm")]
    one = report_from_vllm_log("\n".join(log.splitlines()[1:3]))
    assert verify(Expect(moe_kernel="triton"), one, "server.log").passed


def test_a_server_args_backend_for_a_layer_type_the_model_lacks_is_a_note_on_vllm() -> None:
    """migrate writes --moe-backend marlin with --linear-backend marlin for any model: on a dense
    one vLLM ignores it, and a run that ran marlin must not fail for it. Named in expect:, it
    is still required; an attached server must still prove it."""
    dense = report_from_vllm_log(_vllm_line("Selected MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod"))
    implied = {"linear": "marlin", "moe": "marlin"}
    check = verify(Expect(), dense, "server.log", implied, "vllm")
    assert check.passed and len(check.notes) == 1 and "--moe-backend marlin" in check.notes[0]
    assert not verify(Expect(moe_kernel="marlin"), dense, "server.log", {"linear": "marlin"}, "vllm").passed
    assert not verify(Expect(), dense, "server.log", implied, "attached").passed
    # A log that shows nothing (vLLM at WARNING) proves nothing: not a note.
    assert not verify(Expect(), None, "server.log", implied, "vllm").passed
    moe_only = report_from_vllm_log(_DEEPGEMM_SELECTED)
    assert not verify(Expect(), moe_only, "server.log", {"linear": "marlin"}, "vllm").passed


def test_a_shape_refusal_anywhere_in_a_debug_log_fails_deep_gemm() -> None:
    """Real DEBUG logs hold many lines before a refusal, and small-batch refusals beside shape ones."""
    other = _vllm_line("Scheduler running", level="DEBUG")
    small = _vllm_line("DeepGemm disabled due to unaligned problem size. M: 1, N: 768, K: 2048. M should >= 128 "
                       "and N and K must be multiples of 128. This is not an error and we will fall back to triton.",
                       level="DEBUG")
    shape = _vllm_line("DeepGemm disabled for N <= 512. M: 4096, N: 384, K: 2048. This means we will fallback "
                       "to triton for this specific shape for further speed up.", level="DEBUG")
    unaligned_k = small.replace("K: 2048", "K: 2000")
    for lines in ([other, shape], [small, shape], [other, unaligned_k]):
        report = report_from_vllm_log("\n".join([_DEEPGEMM_SELECTED, *lines]))
        assert not verify(Expect(moe_kernel="deep_gemm"), report, "log").passed, lines


def test_moe_lines_of_the_w4a8_humming_and_gptq_marlin_oracles_are_read() -> None:
    """vLLM's W4A8 (`Using %s W4A8 MoE backend.`), Humming (`Using HUMMING Humming MoE backend
    out of ...`) and GPTQ-Marlin (`Using '%s' GPTQ-Marlin MoE backend.`) oracles log their choice
    in their own words. Missed, a MoE model reads as one without MoE layers: an expectation of its
    backend fails, and a server_args --moe-backend the oracle ignored becomes a note (a PASS)."""
    linear = _vllm_line("Using CutlassW4A8LinearKernel for mixed-precision linear")
    for line, backend in ((_vllm_line("Using CUTLASS W4A8 MoE backend."), "cutlass"),
                          (_vllm_line("Using HUMMING Humming MoE backend out of potential backends: ['HUMMING']."),
                           "humming"),
                          (_vllm_line("Using 'MARLIN' GPTQ-Marlin MoE backend."), "marlin"),
                          (_vllm_line("Using 'BATCHED_MARLIN' WNA16 MoE backend."), "marlin")):
        report = report_from_vllm_log(f"{linear}\n{line}")
        assert report is not None and MOE_LOG_MODULE in report["modules"], line
        assert report["modules"][MOE_LOG_MODULE]["backend"] == backend, line
        assert verify(Expect(moe_kernel=backend), report, "server.log").passed, line
    # The W4A8 oracle always runs CUTLASS, whatever --moe-backend says: not a dense model's note.
    report = report_from_vllm_log(f"{linear}\n" + _vllm_line("Using CUTLASS W4A8 MoE backend."))
    check = verify(Expect(), report, "server.log", {"moe": "marlin"}, "vllm")
    assert not check.passed and not check.notes


def test_a_moe_architecture_without_a_moe_kernel_line_is_unverified_not_a_dense_models_note() -> None:
    """A MoE model whose selector logs in words the reader does not know looked like a model
    without MoE layers: a --moe-backend vLLM ignored passed as a note. vLLM names the
    architecture it resolved; a mixture-of-experts one has MoE layers whatever the log misses."""
    linear = _vllm_line("Selected CutlassFp8BlockScaledMMKernel for Fp8LinearMethod")
    for arch, moe in (("Qwen3MoeForCausalLM", True), ("MixtralForCausalLM", True), ("DeepseekV3ForCausalLM", True),
                      ("Qwen3ForCausalLM", False), ("LlamaForCausalLM", False)):
        report = report_from_vllm_log(f"{_vllm_line(f'Resolved architecture: {arch}')}\n{linear}")
        assert report is not None and report["architecture"] == arch
        check = verify(Expect(), report, "server.log", {"moe": "marlin"}, "vllm")
        assert check.passed is not moe and bool(check.notes) is not moe, arch
        if moe:
            assert "cannot be verified" in check.message and "has no moe module" in check.message


# -- mutation survivors (session 17) ------------------------------------------------------------------


def _answering(monkeypatch: pytest.MonkeyPatch, status: int, body: bytes = b"", content_type: str = "text/plain"
               ) -> list[str]:
    """GET /v1/kernels answered with `status` and `body` (no server); returns the URLs asked."""
    import httpx

    from quantgate.harness import expect

    asked: list[str] = []

    def get(url: str, **_: object) -> httpx.Response:
        asked.append(url)
        return httpx.Response(status, content=body, headers={"content-type": content_type})

    monkeypatch.setattr(expect.httpx, "get", get)
    monkeypatch.setattr(expect, "REPORT_RETRY_WAIT_S", 0.0)
    return asked


@pytest.mark.parametrize("status", [404, 405, 501])
def test_a_server_without_the_kernels_endpoint_has_no_report(monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    asked = _answering(monkeypatch, status)
    assert report_from_server("http://h") is None and asked == ["http://h/v1/kernels"]  # asked once


@pytest.mark.parametrize("status", [500, 401, 403, 302])
def test_any_other_refusal_of_the_kernels_endpoint_is_unavailable_not_no_report(monkeypatch: pytest.MonkeyPatch,
                                                                                status: int) -> None:
    """A 500, a wrong API key (401/403) or a redirect says nothing about which kernel ran: the run
    is an ERROR (retryable), never 'cannot be verified' as for a server without the endpoint."""
    asked = _answering(monkeypatch, status, b'{"error": {"message": "no"}}', "application/json")
    with pytest.raises(KernelReportUnavailable, match=f"answered {status} "):
        report_from_server("http://h", attempts=2)
    assert len(asked) == 2


@pytest.mark.parametrize("body", [b'{"modules": []}', b'{"modules": null}', b"[]", b"not json"])
def test_a_200_without_a_modules_object_is_no_report(monkeypatch: pytest.MonkeyPatch, body: bytes) -> None:
    _answering(monkeypatch, 200, body, "application/json")
    assert report_from_server("http://h") is None


def test_a_later_non_debug_deepgemm_line_does_not_unsay_the_debug_lines() -> None:
    """Once a DEBUG line was seen the log is a DEBUG log: an INFO line mentioning DeepGemm later
    must not make a deep_gemm MoE expectation 'cannot be verified'."""
    log = "\n".join([_DEEPGEMM_SELECTED, _vllm_line("Scheduler running", level="DEBUG"),
                     _vllm_line("DeepGemm JIT cache warmed up")])
    report = report_from_vllm_log(log)
    assert report["debug_logged"] is True
    assert verify(Expect(moe_kernel="deep_gemm"), report, "log").passed


def test_a_deep_gemm_linear_expectation_needs_no_debug_lines() -> None:
    """Only vLLM's deep_gemm MoE backend falls back to Triton per shape; its linear kernel class
    is proven by its Selected line alone."""
    report = report_from_vllm_log(_vllm_line("Selected DeepGemmFp8BlockScaledMMKernel for Fp8LinearMethod"))
    assert report["debug_logged"] is False
    check = verify(Expect(linear_kernel="deep_gemm"), report, "log")
    assert check.passed and not check.notes, check.message



def test_the_wna16_selection_line_is_a_linear_choice() -> None:
    """compressed-tensors' W4A16/W8A16 scheme logs `Using <Kernel> for CompressedTensorsWNA16`:
    unread, a marlin expectation on such a model could not be verified (FAIL)."""
    report = report_from_vllm_log(_vllm_line("Using MarlinLinearKernel for CompressedTensorsWNA16"))
    assert report is not None and report["modules"] == {"CompressedTensorsWNA16": {
        "layer": "linear", "scheme": None, "kernel": "MarlinLinearKernel", "backend": "marlin", "scale_attr": None,
        "rejected": []}}
    assert verify(Expect(linear_kernel="marlin"), report, "server.log").passed


def test_server_args_asking_for_auto_imply_no_expectation() -> None:
    """`--linear-backend auto` asks for no backend: checked as an expectation named 'auto', no
    kernel would ever match it and every such vLLM or --server-url run would FAIL."""
    from quantgate.harness.expect import implied_by_server_args

    assert implied_by_server_args(Expect(), {"--linear-backend": "auto", "--moe-backend": "AUTO"}) == {}
    assert implied_by_server_args(Expect(), {"--linear-backend": "marlin", "--moe-backend": "auto"}) == {
        "linear": "marlin"}
    assert implied_by_server_args(Expect(linear_kernel="triton"), {"--linear-backend": "marlin"}) == {}


def test_kernel_report_retries_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantgate.harness import expect

    _answering(monkeypatch, 503)
    monkeypatch.setattr(expect, "REPORT_RETRY_WAIT_S", 1.5)
    waits: list[float] = []
    monkeypatch.setattr(expect.time, "sleep", waits.append)
    with pytest.raises(KernelReportUnavailable, match="answered 503 .*\\(3 attempts\\)"):
        report_from_server("http://h")
    assert waits == [1.5, 3.0]  # none before the first attempt, then longer each time


def test_debug_lines_in_bold_colours_are_read() -> None:
    """vLLM's colour formatter may write multi-parameter SGR codes (bold cyan: ESC[1;36m)."""
    small = _vllm_line("DeepGemm disabled due to unaligned problem size. M: 1, N: 768, K: 2048. M should >= 128 "
                       "and N and K must be multiples of 128.", level="\x1b[1;36mDEBUG\x1b[0m")
    report = report_from_vllm_log(f"{_DEEPGEMM_SELECTED}\n{small}")
    assert report["debug_logged"] is True
    assert verify(Expect(moe_kernel="deep_gemm"), report, "log").passed


def test_a_mismatch_names_six_modules_and_counts_the_rest() -> None:
    report = _report(**{f"model.layers.{i}.mlp.down_proj": _module("TritonBlockFp8LinearKernel", "triton")
                        for i in range(8)})
    check = verify(Expect(linear_kernel="marlin"), report, "x")
    assert not check.passed and len(check.mismatches) == 8
    assert "8 of 8 ran another kernel" in check.message and "model.layers.5.mlp.down_proj and 2 more" in check.message
    assert "model.layers.6." not in check.message


def test_several_shape_refusals_are_counted() -> None:
    lines = [_vllm_line(f"DeepGemm disabled for N <= 512. M: 4096, N: {n}, K: 2048. This means we will fallback "
                        "to triton.", level="DEBUG") for n in (384, 256)]
    check = verify(Expect(moe_kernel="deep_gemm"), report_from_vllm_log("\n".join([_DEEPGEMM_SELECTED, *lines])),
                   "log")
    assert not check.passed and "(and 1 more such lines)" in check.message


# -- mutation survivors (session 24) ------------------------------------------------------------------


def test_an_expect_entry_wins_over_what_server_args_imply_for_its_layer() -> None:
    """Only the layers `expect:` leaves unset are checked for server_args' backend, and only those
    are listed as implied (result.json's `from_server_args`)."""
    report = _report(a=_module("MarlinFp8LinearKernel", "marlin"), experts=_module("TritonMoE", "triton", layer="moe"))
    check = verify(Expect(linear_kernel="marlin"), report, "x", {"linear": "triton", "moe": "triton"})
    assert check.passed, check.message
    assert check.expected == {"linear": "marlin", "moe": "triton"} and check.from_server_args == ["moe"]
    assert check.to_dict()["from_server_args"] == ["moe"]


def test_the_kernel_report_keeps_the_servers_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    _answering(monkeypatch, 200, b'{"platform": {"device": "cuda", "capability": "9.0"}, "modules": {}}',
               "application/json")
    assert report_from_server("http://h") == {"source": "GET /v1/kernels", "modules": {},
                                              "platform": {"device": "cuda", "capability": "9.0"}}


def test_a_refused_connection_is_retried_and_one_attempt_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    from quantgate.harness import expect

    answers: list = [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"),
                     httpx.Response(200, json={"platform": None, "modules": {}})]

    def get(url: str, **_: object) -> httpx.Response:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(expect.httpx, "get", get)
    monkeypatch.setattr(expect, "REPORT_RETRY_WAIT_S", 0.0)
    assert report_from_server("http://h")["modules"] == {} and answers == []
    _answering(monkeypatch, 503)
    with pytest.raises(KernelReportUnavailable, match=r"answered 503 Service Unavailable \(1 attempt\)$"):
        report_from_server("http://h", attempts=1)



def test_a_report_naming_no_module_at_all_proves_no_implied_backend_even_on_vllm() -> None:
    """The dense-model note needs the linear choices that show the log was read; an empty report
    shows nothing."""
    check = verify(Expect(), _report(), "x", {"moe": "marlin"}, "vllm")
    assert not check.passed and not check.notes and "has no moe module" in check.message


def test_an_expectation_with_no_module_of_its_layer_is_one_problem() -> None:
    dense = report_from_vllm_log(_vllm_line("Selected MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod"))
    check = verify(Expect(moe_kernel="deep_gemm"), dense, "server.log")
    assert not check.passed and check.mismatches == []
    assert check.problems == ["expect.moe_kernel 'deep_gemm' cannot be verified: the kernel report (server log) has "
                              "no moe module"]


def test_a_kernels_endpoint_naming_deep_gemm_is_proof_without_debug_lines() -> None:
    """Only vLLM's log hides deep_gemm's per-shape Triton fallback: a /v1/kernels report names
    what each module ran."""
    report = _report(experts=_module("DeepGemmMoEKernel", "deep_gemm", layer="moe"))
    check = verify(Expect(moe_kernel="deep_gemm"), report, "GET /v1/kernels")
    assert check.passed and check.to_dict()["message"] is None and check.notes == []


@pytest.mark.parametrize("why, said", [
    ("attached", "server_args' --linear-backend (not applied to a server this run did not start, so checked as "
                 "expect.linear_kernel) 'marlin' cannot be verified: no kernel report (GET /v1/kernels); start that "
                 "server with --linear-backend marlin (or run without --server-url), or drop the flag from "
                 "server_args"),
    ("vllm", "server_args' --linear-backend (vLLM selects automatically for a layer type that backend has no kernel "
             "for, so checked as expect.linear_kernel) 'marlin' cannot be verified: no kernel report (GET "
             "/v1/kernels); name a backend that serves these layers in --linear-backend, or drop the flag from "
             "server_args"),
])
def test_an_implied_expectation_says_why_it_is_checked_and_the_fix(why: str, said: str) -> None:
    check = verify(Expect(), None, "GET /v1/kernels", {"linear": "marlin"}, why)
    assert check.problems == [said]


def test_a_server_args_deep_gemm_moe_backend_needs_debug_logs_too(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\naccuracy_threshold: 0.5\nengine: vllm\nserver_args: [--moe-backend, deep_gemm]\n")
    assert proof_env(load_config(path)) == {"VLLM_LOGGING_LEVEL": "DEBUG"}
