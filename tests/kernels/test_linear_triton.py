"""The triton backend (W8A8 block / channel GEMMs). On CPU it runs under TRITON_INTERPRET=1 in
float16 (the interpreter truncates bfloat16 stores); bfloat16 runs in the GPU tests. Every
kernel path (small M with in-kernel quantization, pointer tiles, TMA tiles) is checked on CPU
with explicit configs; the GPU tests run the default configs (the benchmark checks the output of
every configuration the tuner picks)."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import LinearLayerConfig, Platform, Scheme, quant
from quantgate.kernels.linear.triton_block import TritonBlockFp8LinearKernel
from quantgate.kernels.schemes import SCALE_NAMES

from .linear_cases import GPU_K, GPU_MS, GPU_N, make_case, reference_w8a8, rel_error, untuned  # noqa: F401

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
B, C = Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL
SCHEMES = (B, C)


@pytest.mark.usefixtures("untuned")
def test_a_strided_bias_view_is_read_as_its_values(seed):
    case = make_case(200, 300, Scheme.FP8_BLOCK, bias=True, device=DEVICE)
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    every_other = torch.zeros(2 * 200, dtype=case.layer.bias.dtype, device=DEVICE)
    every_other[::2] = case.layer.bias
    x = torch.randn(3, 300, device=DEVICE).half()
    assert rel_error(kernel.apply(case.layer, x, every_other[::2]), reference_w8a8(case, x)) < 1e-3
    with pytest.raises(ValueError, match="bias of shape"):
        kernel.apply(case.layer, x, every_other)


@pytest.mark.usefixtures("untuned")
def test_an_activation_view_with_a_k_stride_is_read_as_its_values(seed):
    case = make_case(200, 300, Scheme.FP8_BLOCK, device=DEVICE)
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(3, 600, device=DEVICE).half()[:, ::2]
    assert rel_error(kernel.apply(case.layer, x), reference_w8a8(case, x)) < 1e-3


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
@pytest.mark.parametrize("scale_name", SCALE_NAMES)
@pytest.mark.parametrize("m", [1, 20])
@pytest.mark.usefixtures("untuned")
def test_apply_matches_float64_reference(seed, scheme, scale_name, m):
    """Against float64 on fresh inputs; the processed scale must be bound under the checkpoint's
    own name and only there (a second copy under the other name would go stale on a reload)."""
    # K and N not multiples of 128: partial scale blocks along both.
    case = make_case(200, 300, scheme, scale_name=scale_name, bias=True, device=DEVICE)
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    other = next(n for n in SCALE_NAMES if n != scale_name)
    assert hasattr(case.layer, scale_name) and not hasattr(case.layer, other)
    assert getattr(case.layer, scale_name).dtype == torch.float32
    x = torch.randn(m, 300, device=DEVICE).half()
    out = kernel.apply(case.layer, x, case.layer.bias)
    assert out.shape == (m, 200) and out.dtype == torch.float16
    assert rel_error(out, reference_w8a8(case, x)) < 1e-3
    assert case.layer.workspace.eq(0).all()  # split-K counters are back to zero


def _paths():
    from quantgate.kernels.triton.fp8_block_gemm import GemmConfig
    from quantgate.kernels.triton.fp8_gemv import GemvConfig

    # (path, rows, config, split_k, weight block): every kernel and scale-indexing branch.
    return [
        ("gemv", 1, GemvConfig(16, 256, 4), None, (128, 128)),  # two K steps: the prefetch runs past K
        ("gemv", 1, GemvConfig(8, 512, 4), None, (8, 128)),  # 8-row scale blocks: 8-column tiles
        ("gemv", 1, GemvConfig(32, 128, 4), None, (64, 128)),  # two tiles per scale row
        ("small_m", 5, GemmConfig(16, 64, 4, 3), 2, (128, 128)),
        ("small_m", 16, GemmConfig(16, 128, 4, 3), None, (64, 128)),  # a full tile; two scale rows per tile
        ("tiled", 20, GemmConfig(32, 64, 4, 3, group_m=1), 2, (128, 128)),  # split-K: one row tile
        ("tma", 70, GemmConfig(64, 64, 4, 3), None, (128, 128)),
        ("tma", 70, GemmConfig(64, 128, 4, 3), None, (64, 128)),  # two scale rows per tile
    ]


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
@pytest.mark.parametrize("path, m, config, split_k, block", _paths(), ids=lambda v: str(v) if isinstance(v, str) else None)
def test_every_kernel_path_matches_float64_reference(seed, scheme, path, m, config, split_k, block):
    from quantgate.kernels.triton.fp8_block_gemm import w8a8_linear, workspace_size

    if scheme is C and block != (128, 128):
        pytest.skip("weight blocks are a block-scheme notion")
    # K a multiple of 16 (TMA) but not of 128; N spanning a partial column tile.
    case = make_case(208, 400, scheme, block=block, bias=True, device=DEVICE)
    scale = getattr(case.layer, case.config.scale_name)
    groupwise = scheme is B
    x = torch.randn(m, 400, device=DEVICE).half()
    workspace = torch.zeros(workspace_size(208), dtype=torch.int32, device=DEVICE)
    out = w8a8_linear(x, case.weight, scale if groupwise else scale.reshape(-1), torch.float16, groupwise=groupwise,
                      scale_block_n=block[0], bias=case.bias, workspace=workspace, path=path, config=config,
                      split_k=split_k)
    assert rel_error(out, reference_w8a8(case, x)) < 1e-3
    assert workspace.eq(0).all()


@pytest.mark.usefixtures("untuned")
def test_weight_blocks_narrower_than_the_column_tile(seed):
    # 64-row weight blocks under a 128-column tile: per-column weight scales in the K loop.
    case = make_case(200, 300, B, block=(64, 128), device=DEVICE)
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(70, 300, device=DEVICE).half()
    assert rel_error(kernel.apply(case.layer, x), reference_w8a8(case, x)) < 1e-3


# 5 K tiles: 4 slices of 2 leave the fourth empty; 5 slices of 1 fill a second group of four.
@pytest.mark.parametrize("split_k", [2, 4, 5])
def test_split_k_sums_every_slice_once(seed, split_k):
    from quantgate.kernels.triton.act_quant import quantize_per_token_group
    from quantgate.kernels.triton.fp8_block_gemm import GemmConfig, w8a8_gemm, workspace_size

    w = torch.randn(96, 640, device=DEVICE) * 0.02
    wq, ws = quant.quantize_weight_block(w)
    x = torch.randn(3, 640, device=DEVICE).half()
    xq, xs = quantize_per_token_group(x, 128)
    ref = (xq.double() * xs.double().repeat_interleave(128, 1)) @ quant.dequantize_weight(wq, ws, (128, 128), torch.float64).t()
    counters = torch.zeros(workspace_size(96), dtype=torch.int32, device=DEVICE)
    for _ in range(2):  # a second launch reuses the counters the first one reset
        out = w8a8_gemm(xq, xs, wq, ws, torch.float16, groupwise=True, workspace=counters,
                        config=GemmConfig(16, 32, 4, 3, group_m=1), split_k=split_k)
        assert rel_error(out, ref) < 1e-3
    assert counters.eq(0).all()


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
def test_a_rows_output_does_not_depend_on_how_many_rows_share_its_batch(seed, scheme):
    """A config of 32-row tiles tuned for the 64-row bucket split K at 20 rows and not at 40, so a
    request's answer changed with the requests batched beside it. Within a bucket the split is
    now the same for every M: rows computed at M = 20 and M = 40 are bit for bit equal."""
    from quantgate.kernels.triton.fp8_block_gemm import GemmConfig, w8a8_linear, workspace_size

    # 6 K tiles, the last partial: a split would run 3 slices of 2.
    case = make_case(80, 700, scheme, device=DEVICE)
    scale = getattr(case.layer, case.config.scale_name)
    groupwise = scheme is B
    x = torch.randn(40, 700, device=DEVICE).half()
    workspace = torch.zeros(workspace_size(80), dtype=torch.int32, device=DEVICE)

    def rows(m: int, config: GemmConfig, split_k: int | None = None) -> torch.Tensor:
        # float32 out: a float16 rounding would mostly hide the summation order
        return w8a8_linear(x[:m], case.weight, scale if groupwise else scale.reshape(-1), torch.float32,
                           groupwise=groupwise, workspace=workspace, path="tiled", config=config, split_k=split_k)[:20]

    tuned = GemmConfig(32, 64, 4, 3, group_m=1, split_per_sm=2)  # a 64-row bucket's candidate
    assert not torch.equal(rows(20, tuned, split_k=3), rows(20, tuned, split_k=1))  # the order shows in the bits
    assert torch.equal(rows(20, tuned), rows(40, tuned))
    assert rel_error(rows(20, tuned), reference_w8a8(case, x[:20])) < 1e-3
    whole = GemmConfig(64, 64, 4, 3, group_m=1, split_per_sm=2)  # one tile holds the bucket: it may split
    assert torch.equal(rows(20, whole), rows(20, whole, split_k=3)) and torch.equal(rows(20, whole), rows(40, whole))
    assert workspace.eq(0).all()


# 5 K tiles, the last partial or whole: uneven slices, and slices past the last tile left empty.
# Both schemes: the block-scheme test above multiplies a K step run past the end by a scale
# read out of bounds, which left such a step unseen on CPU.
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
@pytest.mark.parametrize("path", ["small_m", "tiled"])
@pytest.mark.parametrize("k", [600, 640])
@pytest.mark.parametrize("split_k", [2, 4, 5])
def test_split_k_sums_every_slice_once_in_either_scheme(seed, scheme, path, k, split_k):
    from quantgate.kernels.triton.fp8_block_gemm import GemmConfig, w8a8_linear, workspace_size

    case = make_case(96, k, scheme, device=DEVICE)
    scale = getattr(case.layer, case.config.scale_name)
    groupwise = scheme is B
    x = torch.randn(3, k, device=DEVICE).half()
    workspace = torch.zeros(workspace_size(96), dtype=torch.int32, device=DEVICE)
    out = w8a8_linear(x, case.weight, scale if groupwise else scale.reshape(-1), torch.float16, groupwise=groupwise,
                      scale_block_n=128 if groupwise else 1, workspace=workspace, path=path,
                      config=GemmConfig(16, 32, 4, 3, group_m=1), split_k=split_k)
    assert rel_error(out, reference_w8a8(case, x)) < 1e-3
    assert workspace.eq(0).all()


def test_the_decode_buckets_offer_no_tile_that_computes_rows_to_other_bits():
    """On the H200 a 32-row tile in the 17-64-row bucket, once tuned in, made answers depend on how
    many requests shared a decode batch (4-14 of 1000 moved between runs, none without it: run
    22). The interpreter cannot show GPU bits, so the candidate lists are pinned here."""
    from quantgate.kernels.triton.fp8_block_gemm import TILED_CANDIDATES

    assert [c.block_m for c in TILED_CANDIDATES[64]] == [64]


def test_split_k_needs_a_workspace():
    from quantgate.kernels.triton.fp8_block_gemm import GemmConfig, w8a8_gemm

    a = torch.zeros(2, 256, device=DEVICE).to(quant.FP8_DTYPE)
    with pytest.raises(ValueError, match="workspace"):
        w8a8_gemm(a, torch.ones(2, 2, device=DEVICE), a, torch.ones(1, 2, device=DEVICE), torch.float16,
                  groupwise=True, config=GemmConfig(16, 32, 4, 3), split_k=2)


def test_gemv_refuses_a_column_tile_across_weight_scale_blocks():
    from quantgate.kernels.triton.fp8_gemv import GemvConfig, w8a8_gemv

    case = make_case(32, 256, B, block=(8, 128), device=DEVICE)
    x = torch.randn(1, 256, device=DEVICE).half()
    with pytest.raises(ValueError, match="column tile of 16 does not lie within one of the 8-row weight scale blocks"):
        w8a8_gemv(x, case.weight, getattr(case.layer, case.config.scale_name), torch.float16, groupwise=True, scale_block_n=8,
                  config=GemvConfig(16, 256, 4))


def test_tma_path_refuses_shapes_tma_cannot_describe():
    from quantgate.kernels.triton.fp8_block_gemm import w8a8_gemm

    a = torch.zeros(4, 200, device=DEVICE).to(quant.FP8_DTYPE)  # 200-byte rows: not 16-byte aligned multiples
    with pytest.raises(ValueError, match="multiples of 16"):
        w8a8_gemm(a, torch.ones(4, 2, device=DEVICE), a[:2].contiguous(), torch.ones(1, 2, device=DEVICE),
                  torch.float16, groupwise=True, tma=True)


def test_verdicts():
    ok, reason = TritonBlockFp8LinearKernel.is_supported(Platform.hypothetical("cuda", "8.0"))
    assert not ok and reason == "requires CUDA compute capability >= 8.9 (FP8 tensor cores); this GPU is 8.0"
    assert TritonBlockFp8LinearKernel.is_supported(Platform.hypothetical("cuda", "8.9")) == (True, None)
    ok, reason = TritonBlockFp8LinearKernel.can_implement(LinearLayerConfig(256, 256, Scheme.FP8_TENSOR))
    assert not ok and "fp8-tensor" in reason


@pytest.mark.parametrize("m", [1, 3, 20])
@pytest.mark.usefixtures("untuned")
def test_an_activation_view_with_a_row_stride_is_read_as_its_values(seed, m):
    # Rows 600 apart in a 300-wide layer: the small-M kernel reads x in place.
    case = make_case(200, 300, B, device=DEVICE)
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(m, 600, device=DEVICE).half()[:, :300]
    assert rel_error(kernel.apply(case.layer, x), reference_w8a8(case, x)) < 1e-3


@pytest.mark.parametrize("path, m", [("small_m", 3), ("tiled", 20)])
def test_a_per_channel_scale_view_is_read_as_its_values(seed, path, m):
    from quantgate.kernels.triton.fp8_block_gemm import w8a8_linear

    case = make_case(200, 300, C, device=DEVICE)
    every_other = torch.zeros(2 * 200, device=DEVICE)
    every_other[::2] = case.scale.reshape(-1)
    x = torch.randn(m, 300, device=DEVICE).half()
    out = w8a8_linear(x, case.weight, every_other[::2], torch.float16, groupwise=False, path=path)
    assert rel_error(out, reference_w8a8(case, x)) < 1e-3


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
@pytest.mark.parametrize("m", [3, 20])
@pytest.mark.usefixtures("untuned")
def test_float32_activations_give_float32_outputs(seed, scheme, m):
    case = make_case(200, 300, scheme, act_dtype=torch.float32, device=DEVICE)
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(m, 300, device=DEVICE)
    out = kernel.apply(case.layer, x)
    assert out.dtype == torch.float32
    assert rel_error(out, reference_w8a8(case, x)) < 1e-3


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
@pytest.mark.usefixtures("untuned")
def test_an_empty_batch_gives_an_empty_output(scheme):
    case = make_case(72, 200, scheme, device=DEVICE)
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    assert kernel.apply(case.layer, torch.empty(2, 0, 200, device=DEVICE).half()).shape == (2, 0, 72)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
def test_the_bound_workspace_serves_split_k_over_the_narrowest_column_tiles(seed, scheme):
    """N = 232 is 7.25 tiles of MIN_BLOCK_N columns, and K < N: the processed layer's counters
    must cover every tile of the narrowest split launch."""
    from quantgate.kernels.triton.fp8_block_gemm import MIN_BLOCK_N, GemmConfig, w8a8_linear

    case = make_case(232, 160, scheme, device=DEVICE)
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    groupwise = scheme is B
    x = torch.randn(3, 160, device=DEVICE).half()
    out = w8a8_linear(x, case.layer.weight, getattr(case.layer, case.config.scale_name), torch.float16,
                      groupwise=groupwise, scale_block_n=128 if groupwise else 1, workspace=case.layer.workspace,
                      path="small_m", config=GemmConfig(16, MIN_BLOCK_N, 4, 3), split_k=2)
    assert rel_error(out, reference_w8a8(case, x)) < 1e-3
    assert case.layer.workspace.eq(0).all()


@pytest.mark.usefixtures("untuned")
def test_small_m_calls_split_k_over_the_bound_workspace(seed):
    """apply hands the layer's counters to the GEMM, so decode-sized calls may spread K: with
    float32 outputs the split's summation order shows in the bits."""
    from quantgate.kernels.triton.fp8_block_gemm import w8a8_linear

    case = make_case(200, 600, B, act_dtype=torch.float32, device=DEVICE)  # 5 K tiles: two slices
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(3, 600, device=DEVICE)

    def direct(workspace: torch.Tensor | None) -> torch.Tensor:
        return w8a8_linear(x, case.layer.weight, getattr(case.layer, case.config.scale_name), torch.float32,
                           groupwise=True, workspace=workspace)

    out = kernel.apply(case.layer, x)
    assert not torch.equal(direct(case.layer.workspace), direct(None))  # the default config splits here
    assert torch.equal(out, direct(case.layer.workspace))
    assert case.layer.workspace.eq(0).all()


def test_the_tma_path_runs_the_tma_kernel(seed, monkeypatch):
    from quantgate.kernels.triton import fp8_block_gemm
    from quantgate.kernels.triton.fp8_block_gemm import GemmConfig, w8a8_linear

    def no_pointer_tiles(*args: object, **kwargs: object) -> None:
        raise AssertionError("the TMA path launched the pointer-load kernel")

    if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("TMA tiles run on sm_90")
    monkeypatch.setattr(fp8_block_gemm, "_tiled_launch", no_pointer_tiles)
    case = make_case(208, 400, B, device=DEVICE)
    x = torch.randn(70, 400, device=DEVICE).half()
    out = w8a8_linear(x, case.weight, case.scale, torch.float16, groupwise=True, path="tma",
                      config=GemmConfig(64, 64, 4, 3))
    assert rel_error(out, reference_w8a8(case, x)) < 1e-3


def test_the_path_follows_the_rows_and_what_tma_can_describe(monkeypatch):
    """One row: GEMV or small-M; up to SMALL_M rows: in-kernel quantization; from TMA_MIN_M rows
    on a TMA device, TMA tiles if K and N rows are 16-byte multiples; else pointer tiles."""
    from quantgate.kernels.triton import fp8_block_gemm

    cpu = torch.device("cpu")
    monkeypatch.setattr(fp8_block_gemm, "tma_device", lambda device: True)
    paths = [fp8_block_gemm._default_path(m, 4096, 4096, cpu) for m in (1, 2, 16, 17, 256, 257, 4096)]
    assert paths == ["one_row", "small_m", "small_m", "tiled", "tiled", "tma", "tma"]
    assert fp8_block_gemm._default_path(300, 4104, 4096, cpu) == "tiled"  # K rows not 16-byte multiples
    assert fp8_block_gemm._default_path(300, 4096, 4104, cpu) == "tiled"  # nor N rows
    monkeypatch.setattr(fp8_block_gemm, "tma_device", lambda device: False)
    assert fp8_block_gemm._default_path(300, 4096, 4096, cpu) == "tiled"


def test_operands_the_gemms_cannot_read_are_refused():
    from quantgate.kernels.triton.fp8_block_gemm import w8a8_gemm, w8a8_linear

    w = torch.zeros(64, 256, device=DEVICE).to(quant.FP8_DTYPE)
    ws = torch.ones(1, 2, device=DEVICE)
    x = torch.zeros(2, 512, device=DEVICE).half()
    # The small-M path: no check in w8a8_gemm after this one.
    for bad_x, bad_w in ((x[:, ::2], w), (x[:, :256], w.t().contiguous().t()), (x[:, :256], w[:, :128].contiguous())):
        with pytest.raises(ValueError, match="unit K stride"):
            w8a8_linear(bad_x, bad_w, ws, torch.float16, groupwise=True, path="small_m")
    a = x.to(quant.FP8_DTYPE)
    xs = torch.ones(2, 2, device=DEVICE)
    for bad_a, bad_b in ((a[:, ::2], w), (a[:, :256], w.t().contiguous().t()), (a[:, :256], w[:, :128].contiguous())):
        with pytest.raises(ValueError, match="unit K stride"):
            w8a8_gemm(bad_a, xs, bad_b, ws, torch.float16, groupwise=True)
    # TMA: a row-strided a, or N rows not 16-byte multiples.
    for bad_a, bad_b in ((a[:, :256], w), (a[:, :256].contiguous(), w[:40].contiguous())):
        with pytest.raises(ValueError, match="TMA needs a contiguous a and K, N multiples of 16"):
            w8a8_gemm(bad_a, xs, bad_b, ws, torch.float16, groupwise=True, tma=True)
    with pytest.raises(ValueError, match="the one-row path takes one row, got 2"):
        w8a8_linear(x[:, :256], w, ws, torch.float16, groupwise=True, path="one_row")
    with pytest.raises(ValueError, match="up to 16 rows, got 17"):
        w8a8_linear(torch.zeros(17, 256, device=DEVICE).half(), w, ws, torch.float16, groupwise=True, path="small_m")


CUDA_CAPABILITY = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
GPU_CASES = [(scheme, dtype, m) for scheme in SCHEMES for dtype in (torch.bfloat16, torch.float16) for m in GPU_MS]


@pytest.mark.gpu
@pytest.mark.skipif(CUDA_CAPABILITY < (8, 9), reason="needs FP8 tensor cores (8.9+)")
@pytest.mark.parametrize("scheme, dtype, m", GPU_CASES, ids=str)
@pytest.mark.usefixtures("untuned")
def test_cuda_matches_float64_reference(seed, scheme, dtype, m):
    # M 1 and 16: in-kernel quantization; 300: TMA tiles on Hopper, pointer tiles on sm_89.
    # A long K and a bar of 5e-4 (correct kernels: ~1.3e-4 vs the rounded reference in bf16,
    # ~2.3e-4 raw in fp16) catch sums the FP8 tensor cores carry across K steps: Hopper's
    # reduced-precision accumulation cost the channel scheme ~1.1e-3 at K = 4096.
    k = 4 * GPU_K
    case = make_case(GPU_N, k, scheme, act_dtype=dtype, device="cuda")
    kernel = TritonBlockFp8LinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(m, k, device="cuda").to(dtype)
    out = kernel.apply(case.layer, x)
    assert out.shape == (m, GPU_N) and out.dtype == dtype
    assert rel_error(out, reference_w8a8(case, x), round_ref=dtype == torch.bfloat16) < 5e-4


@pytest.mark.gpu
@pytest.mark.skipif(CUDA_CAPABILITY < (8, 9), reason="needs FP8 tensor cores (8.9+)")
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
@pytest.mark.parametrize("path", ["tiled", "tma"])
@pytest.mark.usefixtures("untuned")
def test_cuda_launches_by_handle_follow_each_call(seed, scheme, path):
    """Prefill-sized launches go by the compiled kernel's handle after the first (launch.py):
    later calls with other row counts (and so other scale strides and transient scratch views),
    and with and without a bias, must each get their own result."""
    from quantgate.kernels.triton.fp8_block_gemm import w8a8_linear

    if path == "tma" and CUDA_CAPABILITY[0] != 9:
        pytest.skip("TMA tiles run on sm_90")
    case = make_case(GPU_N, GPU_K, scheme, bias=True, device="cuda")
    scale = getattr(case.layer, case.config.scale_name)
    groupwise = scheme is B
    for m, bias in ((300, case.bias), (333, case.bias), (300, None), (40, case.bias)):
        x = torch.randn(m, GPU_K, device="cuda").half()
        out = w8a8_linear(x, case.weight, scale if groupwise else scale.reshape(-1), torch.float16,
                          groupwise=groupwise, bias=bias, path=path)
        ref = reference_w8a8(case, x) - (0 if bias is not None else case.bias.double())
        assert rel_error(out, ref) < 1e-3, (m, bias is not None)


@pytest.mark.gpu
@pytest.mark.skipif(CUDA_CAPABILITY < (8, 9), reason="needs FP8 tensor cores (8.9+)")
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
def test_cuda_decode_candidates_compute_a_row_to_the_same_bits(seed, scheme):
    """At the tiny model's shapes, neither the tuner's pick in a decode bucket nor the rows
    sharing the batch may change a row's bits, or two runs that tune afresh answer differently.
    A 32-row tile (mma.sync) computed 511 of 512 values of a row to other float32 bits than the
    small-M kernel and the 64-row tile (wgmma) on the H200 (run 23). At K = 4096 candidates split
    K differently and do differ; the tiny configs never reach that."""
    from quantgate.kernels.triton.fp8_block_gemm import SMALL_M_CANDIDATES, TILED_CANDIDATES, w8a8_linear, workspace_size

    for n, k in ((512, 256), (256, 768)):
        case = make_case(n, k, scheme, device="cuda")
        scale = getattr(case.layer, case.config.scale_name)
        groupwise = scheme is B
        workspace = torch.zeros(workspace_size(n), dtype=torch.int32, device="cuda")
        x = torch.randn(64, k, device="cuda").to(torch.bfloat16)
        for path, candidates, ms in (("small_m", SMALL_M_CANDIDATES, (2, 9, 16)),
                                     ("tiled", TILED_CANDIDATES[64], (17, 40, 64))):
            rows = [w8a8_linear(x[:m], case.weight, scale if groupwise else scale.reshape(-1), torch.float32,
                                groupwise=groupwise, scale_block_n=128 if groupwise else 1, workspace=workspace,
                                path=path, config=config)[:2]
                    for config in candidates for m in ms]
            assert all(torch.equal(row, rows[0]) for row in rows), (n, k, path)
            assert rel_error(rows[0], reference_w8a8(case, x[:2])) < 1e-3
