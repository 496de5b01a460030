"""MoE kernel selection on CPU, 8.0, 8.9 and 9.0, for every scheme and --moe-backend."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import KernelSelectionError, Platform, select_moe_kernel
from quantgate.kernels.schemes import MoELayerConfig, Scheme

B, C, T, U = Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR, Scheme.UNQUANTIZED
QWEN3_30B = dict(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768)
PLATFORMS = {"cpu": Platform.hypothetical("cpu"), "8.0": Platform.hypothetical("cuda", "8.0"),
             "8.9": Platform.hypothetical("cuda", "8.9"), "9.0": Platform.hypothetical("cuda", "9.0")}

_FP8_ON_HOPPER = {"auto": "TritonFusedMoEKernel", "emulation": "EmulationMoEKernel",
                  "triton": "TritonFusedMoEKernel", "marlin": "MarlinMoEKernel"}
# platform -> scheme -> requested backend -> selected kernel, or None for a strict error.
EXPECTED = {
    "cpu": {s: {"auto": "EmulationMoEKernel", "emulation": "EmulationMoEKernel", "triton": None, "marlin": None}
            for s in Scheme},
    "8.0": {**{s: {"auto": "MarlinMoEKernel", "emulation": "EmulationMoEKernel", "triton": None,
                   "marlin": "MarlinMoEKernel"} for s in (B, C, T)},
            U: {"auto": "TritonUnquantizedMoEKernel", "emulation": "EmulationMoEKernel",
                "triton": "TritonUnquantizedMoEKernel", "marlin": None}},
    "8.9": {**{s: _FP8_ON_HOPPER for s in (B, C, T)},
            U: {"auto": "TritonUnquantizedMoEKernel", "emulation": "EmulationMoEKernel",
                "triton": "TritonUnquantizedMoEKernel", "marlin": None}},
}
EXPECTED["9.0"] = EXPECTED["8.9"]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("scheme", list(Scheme))
@pytest.mark.parametrize("requested", ["auto", "emulation", "triton", "marlin"])
def test_selection(platform: str, scheme: Scheme, requested: str) -> None:
    cfg = MoELayerConfig(scheme=scheme, act_dtype=torch.bfloat16, **QWEN3_30B)
    selection = select_moe_kernel(PLATFORMS[platform], cfg, requested)
    expected = EXPECTED[platform][scheme][requested]
    if expected is None:
        assert selection.kernel is None
        with pytest.raises(KernelSelectionError) as err:
            selection.require("model.layers.0.mlp.experts")
        message = str(err.value)
        # Strict: every candidate of the backend is named with its reason, and the fix is given.
        assert f"--moe-backend {requested}" in message and "model.layers.0.mlp.experts" in message
        assert all(c.reason and c.reason in message for c in selection.candidates) and selection.candidates
        assert "Choose another --moe-backend" in message
    else:
        assert selection.kernel is not None and selection.kernel.kernel_name() == expected
        assert selection.to_dict()["selected"]["kernel"] == expected


def test_triton_on_ampere_says_fp8_needs_89() -> None:
    cfg = MoELayerConfig(scheme=B, **QWEN3_30B)
    error = select_moe_kernel(PLATFORMS["8.0"], cfg, "triton").error
    assert "TritonFusedMoEKernel: requires compute capability >= 8.9 (FP8 tensor cores); this GPU is 8.0" in error


def test_float32_activations_fall_back_to_emulation_on_gpu() -> None:
    cfg = MoELayerConfig(scheme=B, act_dtype=torch.float32, **QWEN3_30B)
    selection = select_moe_kernel(PLATFORMS["9.0"], cfg)
    assert selection.kernel.kernel_name() == "EmulationMoEKernel"
    assert [c.kernel for c in selection.rejected] == ["TritonFusedMoEKernel", "MarlinMoEKernel"]
    assert {c.reason for c in selection.rejected} == {
        "activations must be bfloat16 or float16, not torch.float32 (use --dtype bfloat16)"}


def test_blocks_other_than_128x128_run_on_emulation_only() -> None:
    cfg = MoELayerConfig(scheme=B, block_size=(64, 128), **QWEN3_30B)
    selection = select_moe_kernel(PLATFORMS["9.0"], cfg)
    assert selection.kernel.kernel_name() == "EmulationMoEKernel"
    assert {c.reason for c in selection.rejected} == {"block size (64, 128) not handled (handles: 128x128)"}


def test_block_layout_that_cannot_be_stacked_is_refused_everywhere() -> None:
    cfg = MoELayerConfig(scheme=B, num_experts=8, top_k=2, hidden_size=256, intermediate_size=96)
    selection = select_moe_kernel(PLATFORMS["cpu"], cfg)
    assert selection.kernel is None and "multiple of the block height 128" in selection.error


def test_disabled_kernels_are_skipped() -> None:
    cfg = MoELayerConfig(scheme=B, **QWEN3_30B)
    selection = select_moe_kernel(PLATFORMS["9.0"], cfg, disabled=frozenset({"TritonFusedMoEKernel"}))
    assert selection.kernel.kernel_name() == "MarlinMoEKernel"
    assert selection.rejected[0].reason == "disabled by QUANTGATE_DISABLED_KERNELS"


_FP8 = (B, C, T)
CANDIDATES = {  # platform -> scheme -> the candidates `quantgate kernels` and strict errors list, in order
    "cpu": {**{s: ["EmulationMoEKernel", "TritonFusedMoEKernel", "MarlinMoEKernel"] for s in _FP8},
            U: ["EmulationMoEKernel", "TritonUnquantizedMoEKernel"]},
    "8.0": {**{s: ["MarlinMoEKernel", "TritonFusedMoEKernel", "EmulationMoEKernel"] for s in _FP8},
            U: ["TritonUnquantizedMoEKernel", "EmulationMoEKernel"]},
    "8.9": {**{s: ["TritonFusedMoEKernel", "MarlinMoEKernel", "EmulationMoEKernel"] for s in _FP8},
            U: ["TritonUnquantizedMoEKernel", "EmulationMoEKernel"]},
}


@pytest.mark.parametrize("platform", list(CANDIDATES))
@pytest.mark.parametrize("scheme", list(Scheme))
def test_auto_lists_the_candidates_in_the_registrys_documented_order(platform: str, scheme: Scheme) -> None:
    """Written out, not read from MOE_PRIORITY: registry.py keeps kernels a platform cannot run
    in its rows so that this order stays as it is, and auto's pick alone cannot show it (the
    kernel a row lists first may be refused there, and the next one picked either way)."""
    cfg = MoELayerConfig(scheme=scheme, act_dtype=torch.bfloat16, **QWEN3_30B)
    selection = select_moe_kernel(PLATFORMS[platform], cfg)
    assert [c.kernel for c in selection.candidates] == CANDIDATES[platform][scheme]
    # Platforms between two rows take the lower one: an 8.6 GPU lists as an 8.0 one.
    if platform == "8.0":
        between = select_moe_kernel(Platform.hypothetical("cuda", "8.6"), cfg)
        assert [c.kernel for c in between.candidates] == CANDIDATES["8.0"][scheme]


@pytest.mark.parametrize("platform", list(PLATFORMS) + ["8.6", "10.0"])
@pytest.mark.parametrize("scheme", list(Scheme))
def test_auto_falls_back_to_emulation_when_every_other_kernel_is_disabled(platform: str, scheme: Scheme) -> None:
    """Emulation runs anywhere, so every MoE priority row lists it: auto never fails for want of it."""
    from quantgate.kernels.registry import ALL_MOE_KERNELS

    described = PLATFORMS.get(platform) or Platform.hypothetical("cuda", platform)
    others = frozenset(k.kernel_name() for k in ALL_MOE_KERNELS) - {"EmulationMoEKernel"}
    cfg = MoELayerConfig(scheme=scheme, **QWEN3_30B)
    selection = select_moe_kernel(described, cfg, disabled=others)
    assert selection.require().kernel_name() == "EmulationMoEKernel"
    emulation = next(c for c in selection.candidates if c.kernel == "EmulationMoEKernel")
    assert emulation.supported and emulation.reason is None


def test_an_unknown_moe_backend_lists_the_known_ones_in_order() -> None:
    from quantgate.kernels import UnknownBackendError

    cfg = MoELayerConfig(scheme=B, **QWEN3_30B)
    with pytest.raises(UnknownBackendError, match=r"unknown --moe-backend 'cutlass' \(known: auto, emulation, triton, "
                                                  r"marlin\)$"):
        select_moe_kernel(PLATFORMS["9.0"], cfg, "cutlass")


@pytest.mark.parametrize("kernel", ["TritonFusedMoEKernel", "TritonUnquantizedMoEKernel", "MarlinMoEKernel"])
def test_gpu_kernels_name_what_the_platform_lacks(kernel: str) -> None:
    from quantgate.kernels.registry import ALL_MOE_KERNELS

    kernel_class = next(k for k in ALL_MOE_KERNELS if k.kernel_name() == kernel)
    ok, reason = kernel_class.is_supported(PLATFORMS["cpu"])
    assert not ok and reason.startswith("requires CUDA (compute capability >= 8.") and "this is cpu" in reason
    assert "--moe-backend emulation" in reason
    no_triton = Platform("cuda", (9, 0), "cuda sm_90", frozenset({"cuda"}))
    assert kernel_class.is_supported(no_triton) == (False, "triton is not installed (pip install triton)")
    assert kernel_class.is_supported(PLATFORMS["9.0"]) == (True, None)
