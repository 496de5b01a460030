"""The torch backend (`torch._scaled_mm`): tensor-wise and row-wise on CPU, all three on CUDA."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import LinearLayerConfig, Platform, Scheme, select_linear_kernel
from quantgate.kernels.linear.torch_scaled_mm import TorchBlockScaledMMLinearKernel, TorchScaledMMLinearKernel
from quantgate.kernels.platform import CPU_ROWWISE_SCALED_MM
from quantgate.kernels.schemes import SCALE_NAMES

from .linear_cases import GPU_N, make_case, reference_w8a8, rel_error

# The CPU kernel runs where selection lets it: torch 2.11's CPU `_scaled_mm` (the H200 image's)
# asserts on row scales.
cpu_rows = pytest.mark.skipif(CPU_ROWWISE_SCALED_MM not in Platform.detect("cpu").libraries,
                              reason=f"torch {torch.__version__}'s CPU _scaled_mm takes no row scales")


@cpu_rows
@pytest.mark.parametrize("scheme, dtype, static", [
    (Scheme.FP8_CHANNEL, torch.bfloat16, False),
    (Scheme.FP8_TENSOR, torch.float16, False),
    (Scheme.FP8_TENSOR, torch.float16, True),
    (Scheme.FP8_TENSOR, torch.bfloat16, True),
], ids=["channel-bf16", "tensor-fp16-dynamic", "tensor-fp16-static", "tensor-bf16-static"])
@pytest.mark.parametrize("scale_name", SCALE_NAMES)
@pytest.mark.parametrize("m", [1, 7])
def test_cpu_matches_float64_reference(seed, scheme, dtype, static, scale_name, m):
    case = make_case(208, 320, scheme, act_dtype=dtype, scale_name=scale_name, bias=True, static_input_scale=static)
    kernel = TorchScaledMMLinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(m, 320).to(dtype)
    out = kernel.apply(case.layer, x, case.layer.bias)
    assert out.shape == (m, 208) and out.dtype == dtype
    assert rel_error(out, reference_w8a8(case, x), round_ref=dtype == torch.bfloat16) < 1e-3
    assert getattr(case.layer, scale_name).dtype == torch.float32


@cpu_rows
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_cpu_per_tensor_runs_row_wise(seed, monkeypatch, static):
    """CPU tensor-wise `_scaled_mm` is ~1000x slower than row-wise, so per-tensor scales go in as rows."""
    m, k, n = 300, 336, 208
    case = make_case(n, k, Scheme.FP8_TENSOR, act_dtype=torch.bfloat16, bias=True, static_input_scale=static)
    kernel = TorchScaledMMLinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    scale_shapes = []
    scaled_mm = torch._scaled_mm

    def recording_scaled_mm(*args, scale_a, scale_b, **kwargs):
        scale_shapes.append((tuple(scale_a.shape), tuple(scale_b.shape)))
        return scaled_mm(*args, scale_a=scale_a, scale_b=scale_b, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", recording_scaled_mm)
    x = torch.randn(m, k).bfloat16()
    out = kernel.apply(case.layer, x, case.layer.bias)
    assert scale_shapes == [((m, 1), (1, n))]
    assert rel_error(out, reference_w8a8(case, x), round_ref=True) < 1e-3


@cpu_rows
@pytest.mark.parametrize("scheme", [Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR], ids=lambda s: s.value)
def test_cpu_empty_batch_gives_an_empty_output(scheme):
    case = make_case(72, 200, scheme)
    kernel = TorchScaledMMLinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    assert kernel.apply(case.layer, torch.empty(2, 0, 200).half()).shape == (2, 0, 72)


@cpu_rows
@pytest.mark.parametrize("scheme", [Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR], ids=lambda s: s.value)
def test_cpu_a_bias_in_another_dtype_joins_as_the_activation_dtype(seed, scheme):
    """_scaled_mm on CUDA takes a bias only in the output dtype: a float32 bias is rounded to it
    first, on CPU too, so both devices add the same bias values."""
    case = make_case(208, 320, scheme, act_dtype=torch.bfloat16)
    kernel = TorchScaledMMLinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(7, 320).bfloat16()
    bias = torch.randn(208) + 1 / 3  # not on the bfloat16 grid
    out = kernel.apply(case.layer, x, bias)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, kernel.apply(case.layer, x, bias.bfloat16()))


def test_platform_verdicts():
    assert TorchScaledMMLinearKernel.is_supported(Platform.hypothetical("cpu")) == (True, None)
    ok, reason = TorchScaledMMLinearKernel.is_supported(Platform.hypothetical("cuda", "8.0"))
    assert not ok and reason == "requires CUDA compute capability >= 8.9 (FP8 tensor cores); this GPU is 8.0"
    assert TorchBlockScaledMMLinearKernel.is_supported(Platform.hypothetical("cuda", "9.0")) == (True, None)
    for spec in (("cpu", None), ("cuda", "8.9"), ("cuda", "10.0")):
        ok, reason = TorchBlockScaledMMLinearKernel.is_supported(Platform.hypothetical(*spec))
        assert not ok and "block scaling" in reason


def test_a_cpu_torch_without_row_scales_is_refused_at_selection(monkeypatch):
    """Not an assertion inside torch at the first forward: the reason names the fix."""
    from quantgate.kernels import platform

    def torch_2_11_scaled_mm(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("Now _scaled_mm only supports per-tensor scaling for CPU backend.")

    monkeypatch.setattr(torch, "_scaled_mm", torch_2_11_scaled_mm)
    platform._cpu_scaled_mm_takes_row_scales.cache_clear()
    try:
        old_torch = Platform.detect("cpu")
    finally:
        platform._cpu_scaled_mm_takes_row_scales.cache_clear()
    assert CPU_ROWWISE_SCALED_MM not in old_torch.libraries
    ok, reason = TorchScaledMMLinearKernel.is_supported(old_torch)
    assert not ok and reason == (f"torch {torch.__version__}'s CPU _scaled_mm takes one scale per tensor only, and "
                                 "this kernel scales rows on CPU: install torch >= 2.13 or use --linear-backend emulation")
    strict = select_linear_kernel(old_torch, LinearLayerConfig(256, 256, Scheme.FP8_CHANNEL), "torch")
    assert strict.kernel is None and reason in strict.error


def test_the_pinned_torch_scales_rows_on_cpu():
    """torch 2.13 (the Makefile's) runs the CPU kernel: a described CPU assumes it."""
    if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13):
        assert CPU_ROWWISE_SCALED_MM in Platform.detect("cpu").libraries
    assert CPU_ROWWISE_SCALED_MM in Platform.hypothetical("cpu").libraries


def test_block_layout_limits_are_refused_up_front():
    ok, reason = TorchBlockScaledMMLinearKernel.can_implement(LinearLayerConfig(384, 256, Scheme.FP8_BLOCK))
    assert not ok and "K=384" in reason
    assert TorchBlockScaledMMLinearKernel.can_implement(LinearLayerConfig(1024, 384, Scheme.FP8_BLOCK)) == (True, None)


CUDA_CAPABILITY = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


@pytest.mark.gpu
@pytest.mark.skipif(CUDA_CAPABILITY < (8, 9), reason="needs FP8 tensor cores (8.9+)")
@pytest.mark.parametrize("scheme", [Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR], ids=lambda s: s.value)
@pytest.mark.parametrize("m", [1, 5, 300])
def test_cuda_matches_float64_reference(seed, scheme, m):
    kernel_cls = TorchBlockScaledMMLinearKernel if scheme is Scheme.FP8_BLOCK else TorchScaledMMLinearKernel
    ok, reason = kernel_cls.is_supported(Platform.detect("cuda"))
    if not ok:
        pytest.skip(reason)
    # Block: cuBLASLt's scale layout needs K % 512 and N % 128; the others take any multiple of 16,
    # so they are checked on N and K that are not multiples of 128.
    n, k = (1024, 1536) if scheme is Scheme.FP8_BLOCK else (GPU_N, 1040)
    case = make_case(n, k, scheme, act_dtype=torch.bfloat16, bias=True, device="cuda")
    kernel = kernel_cls(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = kernel.apply(case.layer, x, case.layer.bias)
    assert out.shape == (m, n)
    # Correct outputs sit ~1.3e-4 from the rounded reference; a bias added after rounding the
    # GEMM to bf16 (a second rounding) sat at 1.0-1.1e-3.
    assert rel_error(out, reference_w8a8(case, x), round_ref=True) < 5e-4


def test_a_static_input_scale_is_checked_and_bound_as_apply_reads_it():
    """compressed-tensors stores the static scale as [1] in the checkpoint dtype: processing binds it
    as the 0-d float32 the quantization launch takes (no conversion per call), and refuses a
    declared one that is missing, as the emulation backend does, instead of failing in `apply`."""
    case = make_case(72, 208, Scheme.FP8_TENSOR, act_dtype=torch.bfloat16, static_input_scale=True)
    case.layer.input_scale = torch.tensor([0.02], dtype=torch.bfloat16)
    TorchScaledMMLinearKernel(case.config).process_weights_after_loading(case.layer)
    assert (case.layer.input_scale.shape, case.layer.input_scale.dtype) == ((), torch.float32)
    missing = make_case(72, 208, Scheme.FP8_TENSOR, static_input_scale=True)
    del missing.layer.input_scale
    with pytest.raises(ValueError, match="declares a static activation scale"):
        TorchScaledMMLinearKernel(missing.config).process_weights_after_loading(missing.layer)
