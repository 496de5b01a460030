"""Known backend names per engine."""

from __future__ import annotations

from quantgate.harness import backends
from quantgate.kernels import LINEAR_BACKENDS, MOE_BACKENDS
from quantgate.kernels.registry import ALL_LINEAR_KERNELS, ALL_MOE_KERNELS


def test_builtin_names_are_the_registry_names() -> None:
    assert backends.known_backends("builtin", "linear") == tuple(LINEAR_BACKENDS)
    assert backends.known_backends("builtin", "moe") == tuple(MOE_BACKENDS)
    assert set(backends.known_kernel_classes("builtin", "moe")) == {k.__name__ for k in ALL_MOE_KERNELS}
    assert set(backends.known_kernel_classes("builtin", "linear")) == {k.__name__ for k in ALL_LINEAR_KERNELS}


def test_vllm_names_cover_the_fp8_backends_of_the_nightly_matrix() -> None:
    for name in ("marlin", "triton", "deep_gemm", "flashinfer_cutlass", "flashinfer_trtllm", "cutlass"):
        assert backends.check_backend("vllm", "moe", name) is None
    for name in ("marlin", "deep_gemm", "cutlass", "triton", "torch", "flashinfer_cutlass"):
        assert backends.check_backend("vllm", "linear", name) is None
    assert backends.known_backends("vllm", "moe")[0] == "auto"


def test_equivalent_spellings_and_did_you_mean() -> None:
    assert backends.check_backend("vllm", "moe", "FlashInfer-Cutlass") is None
    problem = backends.check_backend("builtin", "linear", "emulaton")
    assert problem is not None and "did you mean 'emulation'" in problem.message


def test_expected_kernel_accepts_classes_and_rejects_auto() -> None:
    assert backends.check_expected_kernel("builtin", "moe", "TritonFusedMoEKernel") is None
    assert backends.check_expected_kernel("vllm", "linear", "MarlinFP8ScaledMMLinearKernel") is None
    problem = backends.check_expected_kernel("builtin", "linear", "auto")
    assert problem is not None and "not a kernel" in problem.message
    assert "engine vllm" not in problem.message  # vLLM would refuse it as well


def test_vllm_moe_expectations_name_backends_not_classes() -> None:
    """vLLM logs its MoE choice by backend name only: a class name could never be matched."""
    problem = backends.check_expected_kernel("vllm", "moe", "MarlinExperts")
    assert problem is not None and "never by class" in problem.message and "marlin" in problem.message
    assert backends.check_expected_kernel("vllm", "moe", "marlin") is None


def test_vllm_moe_log_names_map_to_flag_values() -> None:
    assert backends.log_name_to_backend("DEEPGEMM") == "deep_gemm"
    assert backends.log_name_to_backend("FLASHINFER_CUTLASS") == "flashinfer_cutlass"
    assert backends.log_name_to_backend("VLLM_CUTLASS") == "cutlass"
    for value in backends.VLLM_MOE_LOG_NAMES.values():
        assert value in backends.VLLM_MOE_BACKENDS


def test_an_all_caps_typo_is_no_vllm_class_name() -> None:
    """vLLM linear class names are accepted unchecked until run time; a shouted backend typo is
    not one of them and gets its did-you-mean now."""
    problem = backends.check_expected_kernel("vllm", "linear", "CUTLAS")
    assert problem is not None and "did you mean 'cutlass'" in problem.message
