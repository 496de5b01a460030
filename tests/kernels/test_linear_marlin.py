"""The marlin backend (W8A16 with int32-packed FP8 weights). On CPU it runs under
TRITON_INTERPRET=1 in float16: the interpreter truncates bfloat16 stores and computes bfloat16
dots through float16, so bfloat16 runs in the GPU tests."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import LinearLayerConfig, Platform, Scheme, quant
from quantgate.kernels.linear.marlin import MarlinFp8LinearKernel
from quantgate.kernels.schemes import SCALE_NAMES

from .linear_cases import GPU_K, GPU_MS, GPU_N, SCHEMES, make_case, reference_w8a16, rel_error, untuned  # noqa: F401

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_pack_roundtrip_and_layout(seed):
    from quantgate.kernels.triton.w8a16_gemm import pack_weight, unpack_weight

    w = torch.randint(0, 256, (40, 300), dtype=torch.uint8).view(quant.FP8_DTYPE)
    packed = pack_weight(w)
    assert packed.dtype == torch.int32 and packed.shape == (3 * 32, 40)
    assert torch.equal(unpack_weight(packed, 300).view(torch.uint8), w.view(torch.uint8))
    # Byte p of row j in K tile t is w[:, 128 t + 32 p + j].
    as_bytes = packed.view(torch.uint8).view(96, 40, 4)
    assert torch.equal(as_bytes[32 + 5, :, 2], w.view(torch.uint8)[:, 128 + 64 + 5])
    # K is zero-padded to the 128-wide tile.
    assert unpack_weight(packed, 384).view(torch.uint8)[:, 300:].eq(0).all()


@pytest.mark.parametrize("m", [1, 16], ids=["gemv-path", "dot-path"])
@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    DEVICE == "cpu", reason="the interpreter computes bf16 dots in fp16 and truncates bf16 stores"))])
def test_every_fp8_value_converts_exactly(m, dtype):
    """Row n of the weight holds FP8 code n in every column; one-hot activations read it back.
    Covers subnormals, zeros and the extremes of the bit conversion (-0 sums to +0)."""
    from quantgate.kernels.triton.w8a16_gemm import SCALE_SHIFT, pack_weight, w8a16_gemm

    codes = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=torch.uint8)  # no NaNs
    w = codes[:, None].expand(-1, 128).contiguous().view(quant.FP8_DTYPE).to(DEVICE)
    x = torch.zeros(m, 128, device=DEVICE, dtype=dtype)
    x[torch.arange(m), torch.arange(m)] = 1.0
    scale = torch.full((1, len(codes)), 2.0 ** SCALE_SHIFT[dtype], device=DEVICE, dtype=dtype)  # 1.0 as stored
    out = w8a16_gemm(x, pack_weight(w), scale, groupwise=False)
    expected = w.float()[:, 0].to(dtype)  # every e4m3 value is exact in fp16 and bf16
    assert torch.equal(out, expected[None, :].expand(m, -1))


def test_a_strided_bias_view_is_read_as_its_values(seed):
    case = make_case(200, 300, Scheme.FP8_BLOCK, bias=True, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    every_other = torch.zeros(2 * 200, dtype=case.layer.bias.dtype, device=DEVICE)
    every_other[::2] = case.layer.bias
    x = torch.randn(3, 300, device=DEVICE).half()
    assert rel_error(kernel.apply(case.layer, x, every_other[::2]), reference_w8a16(case, x, torch.float16)) < 1e-3
    with pytest.raises(ValueError, match="bias of shape"):
        kernel.apply(case.layer, x, every_other)


def test_an_activation_view_with_a_k_stride_is_read_as_its_values(seed):
    case = make_case(200, 300, Scheme.FP8_CHANNEL, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(3, 600, device=DEVICE).half()[:, ::2]
    assert rel_error(kernel.apply(case.layer, x), reference_w8a16(case, x, torch.float16)) < 1e-3


def test_weight_blocks_narrower_than_128_rows(seed):
    # 64-row blocks: each block scale covers 64 output columns, not 128.
    case = make_case(200, 300, Scheme.FP8_BLOCK, block=(64, 128), device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(3, 300, device=DEVICE).half()
    assert rel_error(kernel.apply(case.layer, x), reference_w8a16(case, x, torch.float16)) < 1e-3


@pytest.mark.parametrize("m", [1, 3], ids=["gemv", "dot"])
def test_activation_columns_past_k_are_never_read(seed, m):
    # K = 300: the last K tile is partial. x is a view of a wider NaN-filled buffer, so any read
    # past column K (a missing or off-by-one mask) turns the output into NaN.
    case = make_case(200, 300, Scheme.FP8_CHANNEL, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    wide = torch.full((m, 384), float("nan"), device=DEVICE).half()
    wide[:, :300] = torch.randn(m, 300, device=DEVICE).half()
    x = wide[:, :300]
    assert rel_error(kernel.apply(case.layer, x), reference_w8a16(case, x, torch.float16)) < 1e-3


@pytest.mark.parametrize("m", [1, 16], ids=["gemv-path", "dot-path"])
def test_tiny_activations_times_subnormal_weights_are_not_flushed(m):
    """2^-24 (the smallest fp16) times the smallest FP8 subnormal, 2^-9: the GEMV's float32
    products would be 2^-153 (below float32's subnormals) without the 2^64 activation pre-scale."""
    from quantgate.kernels.triton.w8a16_gemm import SCALE_SHIFT, pack_weight, w8a16_gemm

    w = torch.full((32, 128), 0x01, dtype=torch.uint8).view(quant.FP8_DTYPE).to(DEVICE)
    x = torch.full((m, 128), 2.0**-24, device=DEVICE).half()
    scale = torch.full((1, 32), 32.0 * 2.0 ** SCALE_SHIFT[torch.float16], device=DEVICE).half()
    out = w8a16_gemm(x, pack_weight(w), scale, groupwise=False)
    assert torch.equal(out, torch.full((m, 32), 2.0**-21, device=DEVICE).half())  # 128 * 2^-24 * 2^-9 * 32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scales_are_stored_in_the_activation_dtype(dtype):
    # fp16 keeps scale * 2^10 (rounded once, after the shift: 1e-6 would be an fp16 subnormal
    # before it), bf16 the scale itself; under the checkpoint's scale name.
    case = make_case(200, 300, Scheme.FP8_CHANNEL, act_dtype=dtype, scale_name="weight_scale_inv", device=DEVICE)
    scales = torch.logspace(-6, -2, 200, device=DEVICE)[:, None]
    case.layer.weight_scale_inv = scales
    MarlinFp8LinearKernel(case.config).process_weights_after_loading(case.layer)
    shift = 10 if dtype == torch.float16 else 0
    assert not hasattr(case.layer, "weight_scale")
    assert torch.equal(case.layer.weight_scale_inv, (scales.double() * 2.0**shift).to(dtype).reshape(1, 200))


def test_a_packed_weight_of_another_k_is_refused():
    from quantgate.kernels.triton.w8a16_gemm import pack_weight, w8a16_gemm

    packed = pack_weight(torch.zeros(32, 256, device=DEVICE).to(quant.FP8_DTYPE))  # [64, 32]
    for k in (128, 384):
        with pytest.raises(ValueError, match=rf"packed weight \(64, 32\) does not match K={k} "):
            w8a16_gemm(torch.zeros(1, k, device=DEVICE).half(), packed, torch.ones(1, 32, device=DEVICE).half(),
                       groupwise=False)


def test_block_scales_must_be_128_wide_along_k():
    ok, reason = MarlinFp8LinearKernel.can_implement(
        LinearLayerConfig(256, 256, Scheme.FP8_BLOCK, act_dtype=torch.float16, block_size=(128, 64)))
    assert not ok and reason == "weight blocks must be 128 wide along K; this checkpoint has [128, 64]"
    assert MarlinFp8LinearKernel.can_implement(
        LinearLayerConfig(256, 256, Scheme.FP8_BLOCK, act_dtype=torch.float16, block_size=(64, 128))) == (True, None)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
@pytest.mark.parametrize("scale_name", SCALE_NAMES)
@pytest.mark.parametrize("m", [1, 20])
def test_apply_matches_float64_reference(seed, scheme, scale_name, m):
    # K and N not multiples of 128; the tensor scheme's static input scale is ignored (W8A16).
    case = make_case(200, 300, scheme, scale_name=scale_name, bias=True,
                     static_input_scale=scheme is Scheme.FP8_TENSOR, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    assert case.layer.weight.dtype == torch.int32 and getattr(case.layer, scale_name).dtype == torch.float16
    x = torch.randn(m, 300, device=DEVICE).half()
    out = kernel.apply(case.layer, x, case.layer.bias)
    assert out.shape == (m, 200) and out.dtype == torch.float16
    assert rel_error(out, reference_w8a16(case, x, torch.float16)) < 1e-3
    assert case.layer.workspace.eq(0).all()


@pytest.mark.parametrize("split_k", [2, 4])
@pytest.mark.parametrize("m", [1, 3], ids=["gemv", "dot"])
def test_split_k_sums_every_slice_once(seed, split_k, m):
    from quantgate.kernels.triton.w8a16_gemm import candidates_for, pack_weight, w8a16_gemm, workspace_size

    w = torch.randn(96, 640, device=DEVICE) * 0.02
    wq, ws = quant.quantize_weight_block(w)
    stored = (ws.double() * 2.0**10).half()  # [1, 5] block scales as marlin keeps them
    scale = stored.repeat_interleave(128, 0)[:96].t().contiguous()  # per column: [K groups, N]
    x = torch.randn(m, 640, device=DEVICE).half()
    ref = x.double() @ quant.dequantize_weight(wq, stored.double() / 2.0**10, (128, 128), torch.float64).t()
    counters = torch.zeros(workspace_size(96), dtype=torch.int32, device=DEVICE)
    for _ in range(2):
        out = w8a16_gemm(x, pack_weight(wq), scale, groupwise=True, workspace=counters,
                         config=candidates_for(m)[0], split_k=split_k)
        assert rel_error(out, ref) < 1e-3
    assert counters.eq(0).all()


def _gemv_candidates():
    from quantgate.kernels.triton.w8a16_gemm import candidates_for

    return candidates_for(1)


@pytest.mark.parametrize("config", _gemv_candidates(), ids=str)
def test_every_gemv_candidate_matches_float64_reference(seed, config):
    # 5 K tiles (the last partial): split ones get slices of 3 and 2 tiles, so loads of 2 to 16
    # tiles and the next load in flight run past each slice's end (masked); split_per_sm 0 runs
    # all 5 unsplit.
    from quantgate.kernels.triton.w8a16_gemm import w8a16_gemm, workspace_size

    case = make_case(96, 600, Scheme.FP8_BLOCK, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(1, 600, device=DEVICE).half()
    workspace = torch.zeros(workspace_size(96), dtype=torch.int32, device=DEVICE)
    out = w8a16_gemm(x, case.layer.weight, case.layer.weight_scale, groupwise=True, workspace=workspace, config=config)
    assert rel_error(out, reference_w8a16(case, x, torch.float16)) < 1e-3
    assert workspace.eq(0).all()


def _tma_candidates():
    from quantgate.kernels.triton.w8a16_gemm import SM90_CANDIDATES

    return sorted({c for cands in SM90_CANDIDATES.values() for c in cands if c.tma}, key=str)


@pytest.mark.parametrize("config", _tma_candidates(), ids=str)
@pytest.mark.parametrize("m", [1, 5, 16])
def test_every_tma_candidate_matches_float64_reference(seed, config, m):
    # Hopper's TMA weight loads (the interpreter runs tensor descriptors on CPU): 5 K tiles, the
    # last partial, N = 200 not a multiple of the 64-column tile (the descriptor fills zeros).
    from quantgate.kernels.triton.w8a16_gemm import w8a16_gemm, workspace_size

    case = make_case(200, 600, Scheme.FP8_BLOCK, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(m, 600, device=DEVICE).half()
    workspace = torch.zeros(workspace_size(200), dtype=torch.int32, device=DEVICE)
    for split_k in (None, 2):
        out = w8a16_gemm(x, case.layer.weight, case.layer.weight_scale, groupwise=True, workspace=workspace,
                         config=config, split_k=split_k)
        assert rel_error(out, reference_w8a16(case, x, torch.float16)) < 1e-3, split_k
        assert workspace.eq(0).all()


def test_tma_configs_need_sixteen_byte_rows():
    from quantgate.kernels.triton.w8a16_gemm import pack_weight, tma_capable, w8a16_gemm

    assert not tma_capable(torch.device("cpu"), 256)
    x = torch.zeros(2, 128, device=DEVICE).half()
    packed = pack_weight(torch.zeros(30, 128, device=DEVICE).to(quant.FP8_DTYPE))
    with pytest.raises(ValueError, match="N a multiple of 4"):
        w8a16_gemm(x, packed, torch.ones(1, 30, device=DEVICE).half(), groupwise=False,
                   config=_tma_candidates()[0])


def test_gemv_config_refuses_more_than_one_row():
    from quantgate.kernels.triton.w8a16_gemm import candidates_for, pack_weight, w8a16_gemm

    x = torch.zeros(2, 128, device=DEVICE).half()
    packed = pack_weight(torch.zeros(32, 128, device=DEVICE).to(quant.FP8_DTYPE))
    with pytest.raises(ValueError, match="computes one row"):
        w8a16_gemm(x, packed, torch.ones(1, 32, device=DEVICE).half(), groupwise=False, config=candidates_for(1)[0])


def test_fp16_scales_that_overflow_are_refused():
    case = make_case(128, 128, Scheme.FP8_CHANNEL, device=DEVICE)
    case.layer.weight_scale = torch.full((128, 1), 100.0, device=DEVICE)
    # The message gives the checkpoint scale, not the 2^10-shifted one.
    message = "Module.weight_scale: weight scales up to 100 do not fit torch.float16 marlin scales; serve this " \
              "checkpoint with --dtype bfloat16"
    with pytest.raises(ValueError, match=f"^{message}$"):
        MarlinFp8LinearKernel(case.config).process_weights_after_loading(case.layer)


def test_verdicts():
    assert MarlinFp8LinearKernel.is_supported(Platform.hypothetical("cuda", "8.0")) == (True, None)
    ok, reason = MarlinFp8LinearKernel.is_supported(Platform.hypothetical("cuda", "7.5"))
    assert not ok and reason == "requires CUDA compute capability >= 8.0 (bf16 tensor cores); this GPU is 7.5"
    ok, reason = MarlinFp8LinearKernel.can_implement(LinearLayerConfig(256, 256, Scheme.FP8_BLOCK, act_dtype=torch.float32))
    assert not ok and "float32" in reason


GPU_CASES = [(scheme, dtype, m) for scheme in SCHEMES for dtype in (torch.bfloat16, torch.float16) for m in GPU_MS]


@pytest.mark.gpu
@pytest.mark.parametrize("scheme, dtype, m", GPU_CASES, ids=str)
@pytest.mark.usefixtures("untuned")
def test_cuda_matches_float64_reference(seed, scheme, dtype, m):
    # M 1: the GEMV; 16: tensor-core dots with split-K; 300: large tiles.
    case = make_case(GPU_N, GPU_K, scheme, act_dtype=dtype, device="cuda")
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(m, GPU_K, device="cuda").to(dtype)
    out = kernel.apply(case.layer, x)
    assert out.shape == (m, GPU_N) and out.dtype == dtype
    assert rel_error(out, reference_w8a16(case, x, dtype), round_ref=dtype == torch.bfloat16) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", [Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL], ids=lambda s: s.value)
@pytest.mark.usefixtures("untuned")
def test_cuda_launches_by_handle_follow_each_call(seed, scheme):
    """Eager launches go by the compiled kernel's handle after the first (launch.py): later
    calls with other row counts, split-K on and off, a bias and none, each get their own result."""
    case = make_case(GPU_N, GPU_K, scheme, bias=True, device="cuda")
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    for m, bias in ((1, case.layer.bias), (1, None), (3, case.layer.bias), (16, None), (300, case.layer.bias),
                    (333, None), (1, case.layer.bias)):
        x = torch.randn(m, GPU_K, device="cuda").half()
        ref = reference_w8a16(case, x, torch.float16) - (0 if bias is not None else case.bias.double())
        assert rel_error(kernel.apply(case.layer, x, bias), ref) < 1e-3, (m, bias is not None)
        assert case.layer.workspace.eq(0).all()
