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
    from quantgate.kernels.triton.w8a16_gemm import pack_weight, w8a16_gemm, workspace_size

    case = make_case(96, 600, Scheme.FP8_BLOCK, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)  # the scales as marlin keeps them
    x = torch.randn(1, 600, device=DEVICE).half()
    workspace = torch.zeros(workspace_size(96), dtype=torch.int32, device=DEVICE)
    out = w8a16_gemm(x, pack_weight(case.weight), case.layer.weight_scale, groupwise=True, workspace=workspace,
                     config=config)
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
    from quantgate.kernels.triton.w8a16_gemm import pack_weight, w8a16_gemm, workspace_size

    case = make_case(200, 600, Scheme.FP8_BLOCK, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)  # the scales as marlin keeps them
    x = torch.randn(m, 600, device=DEVICE).half()
    workspace = torch.zeros(workspace_size(200), dtype=torch.int32, device=DEVICE)
    packed = pack_weight(case.weight)
    for split_k in (None, 2):
        out = w8a16_gemm(x, packed, case.layer.weight_scale, groupwise=True, workspace=workspace,
                         config=config, split_k=split_k)
        assert rel_error(out, reference_w8a16(case, x, torch.float16)) < 1e-3, split_k
        assert workspace.eq(0).all()


# -- Hopper's path: the activations split exactly into FP8 terms (kernels/triton/w8a16_split.py)


@pytest.fixture
def split_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Marlin layers take the Hopper path on this device (the interpreter runs it on CPU)."""
    from quantgate.kernels.triton import w8a16_split

    monkeypatch.setattr(w8a16_split, "split_layer", lambda device, n, k: True)


def test_only_wide_layers_on_hopper_take_the_split_path(monkeypatch):
    from quantgate.kernels.triton import w8a16_split

    assert not w8a16_split.split_layer(torch.device("cpu"), 14336, 4096)
    monkeypatch.setattr(w8a16_split, "tma_device", lambda device: True)
    assert w8a16_split.split_layer(torch.device("cuda"), 14336, 4096)  # a gate/up projection
    assert not w8a16_split.split_layer(torch.device("cuda"), 4096, 4096)
    assert not w8a16_split.split_layer(torch.device("cuda"), 4096, 14336)  # a down projection


def test_rows_layout_roundtrip():
    from quantgate.kernels.triton.w8a16_split import pack_weight_rows, unpack_weight_rows

    w = torch.randint(0, 256, (40, 300), dtype=torch.uint8).view(quant.FP8_DTYPE)
    packed = pack_weight_rows(w)
    assert packed.dtype == torch.int32 and packed.shape == (40, 3 * 32)
    assert torch.equal(unpack_weight_rows(packed, 300).view(torch.uint8), w.view(torch.uint8))
    assert packed.view(torch.uint8)[:, 300:].eq(0).all()  # K padding: zeros, which add nothing


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_split_terms_sum_back_to_the_activations(seed, dtype):
    """Exact for every value at or above e4m3's subnormal step in its group (bf16: a quarter of the
    group's scale, two terms; fp16: twice it, four terms); below, off by at most 2^-10 scales."""
    from quantgate.kernels.triton.scratch import device_buffer
    from quantgate.kernels.triton.w8a16_split import TERMS, pack_weight_rows, w8a16_split_gemm

    m, k = 5, 300
    # Values over 24 octaves inside every group, signs mixed, a zero row: the scale handles all.
    x = (torch.randn(m, k, device=DEVICE) * torch.logspace(-8, 4, k, base=2.0, device=DEVICE)).to(dtype)
    x[3] = 0
    w = torch.zeros(32, k, device=DEVICE).to(quant.FP8_DTYPE)
    w8a16_split_gemm(x, pack_weight_rows(w), torch.ones(32, 1, device=DEVICE, dtype=dtype), groupwise=False)
    terms, k_pad = TERMS[dtype], 384
    xs = device_buffer(x.device, "w8a16_split_x", 1, torch.uint8)[:terms * m * k_pad].view(quant.FP8_DTYPE)
    xs = quant.fp8_to_float(xs).view(m, terms, k_pad)[:, :, :k]
    xsc = device_buffer(x.device, "w8a16_split_scales", 1, torch.float32)[:3 * terms * m].view(3, m, terms)
    scale = xsc[:, :, 0].t().repeat_interleave(128, dim=1)[:, :k]  # [m, k]: each value's group scale
    assert torch.equal(xsc, xsc[:, :, :1].expand(-1, -1, terms))  # one scale per row and group
    rebuilt = (xs * scale[:, None, :]).sum(dim=1)
    exact_from = 0.25 if dtype == torch.bfloat16 else 2.0
    held = x.float().abs() >= exact_from * scale
    assert held.sum() > 0.9 * x[:3].numel() and torch.equal(rebuilt[held], x.float()[held])
    assert ((rebuilt - x.float()).abs() <= 2.0**-10 * scale).all()
    assert (xs[:, 0].abs() <= 256).all() and rebuilt[3].eq(0).all()


@pytest.mark.parametrize("scheme, block", [(s, (128, 128)) for s in SCHEMES] + [(Scheme.FP8_BLOCK, (32, 128))],
                         ids=str)
@pytest.mark.parametrize("m", [1, 20])
@pytest.mark.usefixtures("split_path")
def test_split_path_apply_matches_float64_reference(seed, scheme, block, m):
    # K and N not multiples of 128; fp16 (four terms): the interpreter's bf16 dots run in fp16.
    # 32-row scale blocks: narrower than every column tile, so each column reads its own scale.
    case = make_case(200, 300, scheme, block=block, bias=True, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    assert case.layer.weight.shape == (200, 3 * 32)  # the rows layout
    assert getattr(case.layer, case.config.scale_name).shape == (200, 3 if scheme is Scheme.FP8_BLOCK else 1)
    x = torch.randn(m, 300, device=DEVICE).half()
    out = kernel.apply(case.layer, x, case.layer.bias)
    assert out.shape == (m, 200) and out.dtype == torch.float16
    assert rel_error(out, reference_w8a16(case, x, torch.float16)) < 1e-3
    assert case.layer.workspace.eq(0).all()


def _split_candidates():
    from quantgate.kernels.triton.w8a16_split import LARGE_M, CANDIDATES

    return sorted({c for cands in (*CANDIDATES.values(), LARGE_M) for c in cands}, key=str)


@pytest.mark.parametrize("config", _split_candidates(), ids=str)
def test_every_split_candidate_matches_float64_reference(seed, config):
    # 5 K tiles (the last partial), N = 200 not a multiple of any tile, rows from 1 to past one
    # program's columns; split-K on and off where there is one row tile.
    from quantgate.kernels.triton.w8a16_gemm import workspace_size
    from quantgate.kernels.triton.w8a16_split import pack_weight_rows, w8a16_split_gemm

    case = make_case(200, 600, Scheme.FP8_BLOCK, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)  # the scales as marlin keeps them, transposed for this path
    packed, scale = pack_weight_rows(case.weight), case.layer.weight_scale.t().contiguous()
    workspace = torch.zeros(workspace_size(200), dtype=torch.int32, device=DEVICE)
    # scale_block_n 128: a tile inside one scale block reads one scale per K step; 1: one per column.
    for m, split_k, scale_block_n in ((1, None, 128), (3, 2, 1), (config.columns // 4 + 1, None, 128)):
        x = torch.randn(m, 600, device=DEVICE).half()
        out = w8a16_split_gemm(x, packed, scale, groupwise=True, scale_block_n=scale_block_n,
                               workspace=workspace, config=config, split_k=split_k)
        assert rel_error(out, reference_w8a16(case, x, torch.float16)) < 1e-3, (m, split_k, scale_block_n)
        assert workspace.eq(0).all()


@pytest.mark.usefixtures("split_path")
def test_split_path_reload_keeps_storage(seed):
    from .linear_cases import processed_storage, reload

    case = make_case(200, 300, Scheme.FP8_BLOCK, device=DEVICE)
    kernel = MarlinFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    before = processed_storage(case.layer)
    case = reload(case)
    kernel.process_weights_after_loading(case.layer)
    assert processed_storage(case.layer) == before
    x = torch.randn(3, 300, device=DEVICE).half()
    assert rel_error(kernel.apply(case.layer, x), reference_w8a16(case, x, torch.float16)) < 1e-3


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
    with pytest.raises(ValueError, match="--dtype bfloat16"):
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


def test_split_path_refuses_scales_in_the_other_kernels_layout():
    from quantgate.kernels.triton.w8a16_split import pack_weight_rows, w8a16_split_gemm

    x = torch.zeros(2, 256, device=DEVICE).half()
    packed = pack_weight_rows(torch.zeros(96, 256, device=DEVICE).to(quant.FP8_DTYPE))
    with pytest.raises(ValueError, match=r"scales \(2, 96\) .* expects \[N, 2\], each row contiguous"):
        w8a16_split_gemm(x, packed, torch.ones(2, 96, device=DEVICE).half(), groupwise=True)
