"""The triton backend (W8A8 block / channel GEMM). On CPU it runs under TRITON_INTERPRET=1 in
float16 (the interpreter truncates bfloat16 stores); bfloat16 runs in the GPU tests."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import LinearLayerConfig, Platform, Scheme, quant
from quantgate.kernels.linear.triton_block import TritonBlockFp8LinearKernel
from quantgate.kernels.schemes import SCALE_NAMES

from .linear_cases import make_case, reference_w8a8, rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCHEMES = (Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
@pytest.mark.parametrize("scale_name", SCALE_NAMES)
@pytest.mark.parametrize("m", [1, 20])
def test_apply_matches_float64_reference(seed, scheme, scale_name, m):
    # K and N not multiples of 128: partial scale blocks along both.
    case = make_case(200, 300, scheme, scale_name=scale_name, bias=True, device=DEVICE)
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(m, 300, device=DEVICE).half()
    out = kernel.apply(case.layer, x, case.layer.bias)
    assert out.shape == (m, 200) and out.dtype == torch.float16
    assert rel_error(out, reference_w8a8(case, x)) < 1e-3
    assert case.layer.workspace.eq(0).all()  # split-K counters are back to zero


def test_weight_blocks_narrower_than_the_column_tile(seed):
    # 64-row weight blocks under a 128-column tile: per-column weight scales in the K loop.
    case = make_case(200, 300, Scheme.FP8_BLOCK, block=(64, 128), device=DEVICE)
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(70, 300, device=DEVICE).half()
    assert rel_error(kernel.apply(case.layer, x), reference_w8a8(case, x)) < 1e-3


@pytest.mark.parametrize("split_k", [2, 4])
def test_split_k_sums_every_slice_once(seed, split_k):
    from quantgate.kernels.triton.act_quant import quantize_per_token_group
    from quantgate.kernels.triton.fp8_block_gemm import w8a8_gemm, workspace_size

    w = torch.randn(96, 640, device=DEVICE) * 0.02
    wq, ws = quant.quantize_weight_block(w)
    x = torch.randn(3, 640, device=DEVICE).half()
    xq, xs = quantize_per_token_group(x, 128)
    ref = (xq.double() * xs.double().repeat_interleave(128, 1)) @ quant.dequantize_weight(wq, ws, (128, 128), torch.float64).t()
    counters = torch.zeros(workspace_size(96), dtype=torch.int32, device=DEVICE)
    for _ in range(2):  # a second launch reuses the counters the first one reset
        out = w8a8_gemm(xq, xs, wq, ws, torch.float16, groupwise=True, workspace=counters, split_k=split_k)
        assert rel_error(out, ref) < 1e-3
    assert counters.eq(0).all()


def test_split_k_needs_a_workspace():
    from quantgate.kernels.triton.fp8_block_gemm import w8a8_gemm

    a = torch.zeros(2, 256, device=DEVICE).to(quant.FP8_DTYPE)
    with pytest.raises(ValueError, match="workspace"):
        w8a8_gemm(a, torch.ones(2, 2, device=DEVICE), a, torch.ones(1, 2, device=DEVICE), torch.float16,
                  groupwise=True, split_k=2)


def test_verdicts():
    ok, reason = TritonBlockFp8LinearKernel.is_supported(Platform.hypothetical("cuda", "8.0"))
    assert not ok and reason == "requires CUDA compute capability >= 8.9 (FP8 tensor cores); this GPU is 8.0"
    assert TritonBlockFp8LinearKernel.is_supported(Platform.hypothetical("cuda", "8.9")) == (True, None)
    ok, reason = TritonBlockFp8LinearKernel.can_implement(LinearLayerConfig(256, 256, Scheme.FP8_TENSOR))
    assert not ok and "fp8-tensor" in reason


CUDA_CAPABILITY = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


@pytest.mark.gpu
@pytest.mark.skipif(CUDA_CAPABILITY < (8, 9), reason="needs FP8 tensor cores (8.9+)")
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 16, 300])
def test_cuda_matches_float64_reference(seed, scheme, dtype, m):
    case = make_case(1000, 1400, scheme, act_dtype=dtype, bias=True, device="cuda")
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(m, 1400, device="cuda").to(dtype)
    out = kernel.apply(case.layer, x, case.layer.bias)
    assert rel_error(out, reference_w8a8(case, x), round_ref=dtype == torch.bfloat16) < 1e-3
