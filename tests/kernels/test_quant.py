"""FP8 quantization: the torch reference (quant.py) and the Triton activation quantizers, which
must reproduce it bit for bit (run under TRITON_INTERPRET=1 on CPU, natively on a GPU)."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import quant

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_block_weight_roundtrip_with_partial_blocks(seed):
    w = torch.randn(200, 300)
    q, scale = quant.quantize_weight_block(w)
    assert q.dtype == quant.FP8_DTYPE and q.shape == (200, 300) and scale.shape == (2, 3)
    # Each block's largest magnitude maps onto the FP8 maximum.
    assert q[:128, :128].float().abs().max() == quant.FP8_MAX
    assert q[128:, 256:].float().abs().max() == quant.FP8_MAX
    deq = quant.dequantize_weight(q, scale, (128, 128))
    # e4m3 keeps 3 mantissa bits: half an ulp is at most 1/16 relative.
    assert ((deq - w).abs() <= w.abs() / 16 + scale.max() * 2**-9).all()


@pytest.mark.parametrize("quantize", [quant.quantize_weight_channel, quant.quantize_weight_tensor])
def test_channel_and_tensor_roundtrip(seed, quantize):
    w = torch.randn(64, 96)
    q, scale = quantize(w)
    assert scale.shape == ((64, 1) if quantize is quant.quantize_weight_channel else ())
    assert ((quant.dequantize_weight(q, scale) - w).abs() <= w.abs() / 16 + scale.max() * 2**-9).all()


def test_weight_quantizers_match_their_definition_in_float64(seed):
    """The scales a checkpoint stores: amax|w| / 448 (one correctly rounded float32 division, as
    in float64 then rounded) per 128x128 block, output row or tensor. Edge blocks of N=200, K=300
    cover only the real values (never the padding); an all-zero block or row gets the floor scale
    and zero codes, not NaN; a negative outlier is the amax and maps onto -448; every value is within
    half an e4m3 step of w; dequantize_weight is the float64 product rounded once."""
    n, k = 200, 300
    w = (torch.randn(n, k, dtype=torch.float64) * 0.02).float()
    w[:128, 128:256] = 0  # an all-zero block (and, for the channel scheme, below: an all-zero row)
    w[199] = 0
    w[150, 290] = -0.5  # the negative amax of an edge block, of its row and of the tensor

    def definition(amax: torch.Tensor) -> torch.Tensor:
        return (amax.double() / 448).float().clamp(min=quant.MIN_SCALE)

    def check(q, scale, full_scale, block=None):
        deq = quant.fp8_to_float(q).double() * full_scale
        assert ((deq - w.double()).abs() <= w.double().abs() / 16 + full_scale * 2**-10).all()
        assert torch.equal(quant.dequantize_weight(q, scale, block), deq.float())
        assert q[150, 290].float() == -quant.FP8_MAX

    q, scale = quant.quantize_weight_block(w)
    amax = torch.stack([torch.stack([w[i:i + 128, j:j + 128].abs().amax() for j in range(0, k, 128)])
                        for i in range(0, n, 128)])
    assert scale.shape == (2, 3) and torch.equal(scale, definition(amax))
    assert scale[0, 1] == quant.MIN_SCALE and q[:128, 128:256].float().eq(0).all()
    check(q, scale, scale.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k], (128, 128))
    q, scale = quant.quantize_weight_channel(w)
    assert torch.equal(scale, definition(w.abs().amax(dim=1, keepdim=True)))
    assert scale[199, 0] == quant.MIN_SCALE and q[199].float().eq(0).all()
    check(q, scale, scale.double())
    q, scale = quant.quantize_weight_tensor(w)
    assert scale.shape == () and torch.equal(scale, definition(w.abs().amax()))
    check(q, scale, scale.double())


def test_zero_group_gets_floor_scale_and_zeros():
    x = torch.zeros(2, 256)
    x[1, :128] = 1.0
    q, scale = quant.quantize_act_per_token_group(x, 128)
    assert scale[0, 0] == quant.MIN_SCALE and scale[1, 1] == quant.MIN_SCALE
    assert q[0].float().abs().max() == 0 and q[1, :128].float().eq(quant.FP8_MAX).all()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_out_of_range_values_saturate_instead_of_nan(device):
    """A static scale meets values past 448 times it. torch's own float -> e4m3fn cast makes them
    NaN on CUDA (and on the CPU in torch 2.11; 2.13's CPU cast saturates): the clamp keeps them finite."""
    x, scale = torch.tensor([[1000.0, -1000.0, 1.0]], device=device), torch.tensor(1.0, device=device)
    q, _ = quant.quantize_act_per_tensor(x, scale)
    assert q.float().tolist() == [[quant.FP8_MAX, -quant.FP8_MAX, 1.0]]


def _activations(m: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(m, k, device=DEVICE) * 3
    x[0, 128:256] = 0  # an all-zero group
    x[-1, :40] *= 1e-4  # values that quantize to e4m3 subnormals
    x[-1, 40:48] = -0.0  # keeps its sign: FP8 0x80, not 0x00
    return x.to(dtype)


def _same_fp8(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_triton_group_quant_is_bit_exact(seed, dtype):
    from quantgate.kernels.triton.act_quant import quantize_per_token_group

    x = _activations(5, 300, dtype)
    ref_q, ref_s = quant.quantize_act_per_token_group(x, 128)
    q, s = quantize_per_token_group(x, 128)
    assert _same_fp8(q, ref_q) and torch.equal(s, ref_s)
    # cuBLAS layout: rows padded to a multiple of 4 with zeros, scales column-major.
    q, s = quantize_per_token_group(x, 128, column_major_scales=True, row_multiple=4)
    assert q.shape == (8, 300) and s.shape == (8, 3) and s.stride() == (1, 8)
    assert _same_fp8(q[:5], ref_q) and torch.equal(s[:5], ref_s)
    assert q[5:].float().abs().max() == 0 and (s[5:] == quant.MIN_SCALE).all()


def test_triton_quantizers_keep_a_nan_activation_nan(seed):
    """As cvt.rn.satfinite does on the GPU: a NaN stays NaN (e4m3 0x7f), never a finite FP8 value.
    (The interpreter reads an FP8 NaN back as 480, so CPU CI checks the quantizers' bits only.)"""
    from quantgate.kernels.triton.act_quant import quantize_per_token, quantize_per_token_group

    x = _activations(2, 256, torch.float16)
    x[1, 3] = float("nan")
    for q, _ in (quantize_per_token_group(x, 128), quantize_per_token(x)):
        assert q[1, 3].float().isnan() and not q[0].float().isnan().any()


def test_triton_per_token_and_per_tensor_quant_are_bit_exact(seed):
    from quantgate.kernels.triton.act_quant import quantize_per_tensor, quantize_per_token

    x = _activations(4, 200, torch.float16)
    q, s = quantize_per_token(x)
    ref_q, ref_s = quant.quantize_act_per_token(x)
    assert _same_fp8(q, ref_q) and torch.equal(s, ref_s)
    for static in (None, torch.tensor(0.01, device=DEVICE)):
        q, s = quantize_per_tensor(x, static)
        ref_q, ref_s = quant.quantize_act_per_tensor(x, static)
        assert _same_fp8(q, ref_q) and torch.equal(s, ref_s) and s.dim() == 0


def test_triton_row_quantizers_share_rows_out_and_reset_their_scratch(seed):
    """The dynamic per-tensor scale is one launch whose programs take rows in turn and share an
    amax and a counter in the device scratch, which the last program zeroes: a second call must
    not see the first one's amax. Rows read in two passes: see
    test_triton_row_quantizers_read_rows_longer_than_a_block_in_two_passes."""
    from quantgate.kernels.triton import act_quant

    x = _activations(21, 300, torch.bfloat16)  # more rows than programs (8 on CPU), K not a multiple of 128
    q, s = act_quant.quantize_per_token(x)
    ref_q, ref_s = quant.quantize_act_per_token(x)
    assert _same_fp8(q, ref_q) and torch.equal(s, ref_s)
    for scaled in (x, x / 64, torch.zeros_like(x)):  # a larger amax first, then smaller ones
        for transient in (False, True):
            q, s = act_quant.quantize_per_tensor(scaled, transient=transient)
            ref_q, ref_s = quant.quantize_act_per_tensor(scaled, None)
            assert _same_fp8(q, ref_q) and torch.equal(s, ref_s) and s.dim() == 0


def test_triton_quantizers_read_only_the_views_rows_and_columns(seed):
    """Each quantizer reads a view's M x K values and nothing past them: not the element after
    a row's last partial 128-group (K = 300), not the rows a row_multiple pads to (those are
    zeros with the floor scale). Here the memory past both is 1000, so any stray read shows."""
    from quantgate.kernels.triton.act_quant import quantize_per_tensor, quantize_per_token, quantize_per_token_group

    base = torch.full((8, 320), 1000.0, device=DEVICE).half()
    x = base[:5, :300]
    x.copy_(_activations(5, 300, torch.float16))
    x[4, 7] = 60.0  # the tensor's amax in its last row
    cpu = x.cpu()
    ref_q, ref_s = quant.quantize_act_per_token_group(cpu, 128)
    q, s = quantize_per_token_group(x, 128, row_multiple=4)
    assert _same_fp8(q[:5].cpu(), ref_q) and torch.equal(s[:5].cpu(), ref_s)
    assert q[5:].float().abs().max() == 0 and (s[5:] == quant.MIN_SCALE).all()
    ref_q, ref_s = quant.quantize_act_per_token(cpu)
    q, s = quantize_per_token(x, row_multiple=4)
    assert q.shape == (8, 300) and _same_fp8(q[:5].cpu(), ref_q) and torch.equal(s[:5].cpu(), ref_s)
    assert q[5:].float().abs().max() == 0 and (s[5:] == quant.MIN_SCALE).all()
    for static in (None, torch.tensor(0.02, device=DEVICE)):
        ref_q, ref_s = quant.quantize_act_per_tensor(cpu, None if static is None else static.cpu())
        q, s = quantize_per_tensor(x, static, row_multiple=4)
        assert _same_fp8(q[:5].cpu(), ref_q) and torch.equal(s.cpu(), ref_s) and q[5:].float().abs().max() == 0


@pytest.mark.parametrize("group", [128, 64])
def test_triton_group_quant_spreads_a_long_row_over_programs(seed, group):
    """A program takes at most 1024 values of a row (8 groups of 128, 16 of 64): K = 1100 needs
    two programs per row, the second one holding only the last, partial group."""
    from quantgate.kernels.triton.act_quant import quantize_per_token_group

    x = _activations(2, 1100, torch.float16)
    ref_q, ref_s = quant.quantize_act_per_token_group(x, group)
    q, s = quantize_per_token_group(x, group)
    assert s.shape == (2, -(-1100 // group)) and _same_fp8(q, ref_q) and torch.equal(s, ref_s)


def test_triton_row_quantizers_read_rows_longer_than_a_block_in_two_passes(seed, monkeypatch):
    """Past ROW_IN_REGISTERS a row is read 4096 values at a time: its amax in one pass, its values
    in a second, both ending in a partial block. The view's rows are 4400 apart and the columns
    past K hold 1000: a pass that read past K would take them into the amax."""
    from quantgate.kernels.triton import act_quant

    monkeypatch.setattr(act_quant, "ROW_IN_REGISTERS", 256)
    base = torch.full((3, 4400), 1000.0, device=DEVICE).half()
    x = base[:, :4396]
    x.copy_(_activations(3, 4396, torch.float16))
    x[1, 5] = 40.0
    x[2, 4390] = -50.0  # a row's amax in its last, partial block
    cpu = x.cpu()
    ref_q, ref_s = quant.quantize_act_per_token(cpu)
    q, s = act_quant.quantize_per_token(x)
    assert _same_fp8(q.cpu(), ref_q) and torch.equal(s.cpu(), ref_s)
    static = torch.tensor(0.05, device=DEVICE)
    ref_q, _ = quant.quantize_act_per_tensor(cpu, static.cpu())
    q, _ = act_quant.quantize_per_tensor(x, static)
    assert _same_fp8(q.cpu(), ref_q)


def test_triton_per_tensor_scale_of_an_empty_batch_is_the_floor():
    """No rows: no launch, and the scale of an all-zero tensor (a later dequantization stays finite)."""
    from quantgate.kernels.triton.act_quant import quantize_per_tensor

    for transient in (False, True):
        q, s = quantize_per_tensor(torch.zeros(0, 256, device=DEVICE, dtype=torch.float16), transient=transient)
        assert q.shape == (0, 256) and s.dim() == 0 and s == quant.MIN_SCALE


def test_transient_quantization_reuses_scratch_and_keeps_the_bits(seed):
    """The backends' path: outputs in the device scratch (one view per shape) and, on a GPU,
    launches by handle, cached per specialization. Rows that start off a 16-byte boundary and
    a second row count must not run a handle cached for other arguments."""
    from quantgate.kernels.triton.act_quant import quantize_per_tensor, quantize_per_token, quantize_per_token_group

    base = _activations(9, 264, torch.bfloat16)
    for x in (base[:6, :256], base[1:8, 3:259], base[:3, :256]):  # aligned, misaligned rows, another M
        cpu = x.cpu()
        ref_q, ref_s = quant.quantize_act_per_token_group(cpu, 128)
        q, s = quantize_per_token_group(x, 128, column_major_scales=True, row_multiple=4, transient=True)
        again = quantize_per_token_group(x, 128, column_major_scales=True, row_multiple=4, transient=True)
        assert again[0].data_ptr() == q.data_ptr() and again[1].data_ptr() == s.data_ptr()
        assert s.stride() == (1, q.shape[0]) and q.shape[0] % 4 == 0
        assert _same_fp8(q[:len(x)].cpu(), ref_q) and torch.equal(s[:len(x)].cpu(), ref_s)
        ref_q, ref_s = quant.quantize_act_per_token(cpu)
        q, s = quantize_per_token(x, transient=True)
        assert _same_fp8(q.cpu(), ref_q) and torch.equal(s.cpu(), ref_s)
        static = torch.tensor(0.02, device=x.device)
        ref_q, _ = quant.quantize_act_per_tensor(cpu, static.cpu())
        q, _ = quantize_per_tensor(x, static, transient=True)
        assert _same_fp8(q.cpu(), ref_q)


def test_triton_quant_rejects_strided_rows_and_odd_groups():
    from quantgate.kernels.triton.act_quant import quantize_per_token_group

    x = torch.randn(8, 256, device=DEVICE)
    with pytest.raises(ValueError, match="unit last stride"):
        quantize_per_token_group(x.t(), 128)
    with pytest.raises(ValueError, match="power of two"):
        quantize_per_token_group(x, 96)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_quantizers_are_bit_exact_at_scale(seed, dtype):
    """Every W8A8 result depends on these bits: a mismatch the interpreter cannot show (compiled
    division or rounding) moves all of them off the reference. The reference runs on the CPU,
    whose division is IEEE (torch on CUDA divides by a Python scalar through its reciprocal)."""
    from quantgate.kernels.triton.act_quant import quantize_per_tensor, quantize_per_token, quantize_per_token_group

    # Rows read once (4096, 14336) and in passes (20000); more rows than the per-tensor scale's programs.
    for m, k in ((257, 4096), (97, 14336), (1100, 20000)):
        x = (torch.randn(m, k, device="cuda") * 3).to(dtype)
        x[0, :128] = x[0, 5]  # a group of equal values: every one of them is the group's amax
        x[1, :64] = -0.0  # FP8 -0 (a reciprocal's correction step turned it into +0)
        cpu, static = x.cpu(), torch.tensor(0.02)
        for name, (q, s), (ref_q, ref_s) in (
            ("group", quantize_per_token_group(x, 128), quant.quantize_act_per_token_group(cpu, 128)),
            ("token", quantize_per_token(x), quant.quantize_act_per_token(cpu)),
            ("tensor", quantize_per_tensor(x), quant.quantize_act_per_tensor(cpu)),
            ("tensor/8", quantize_per_tensor(x / 8), quant.quantize_act_per_tensor(cpu / 8)),  # a smaller amax next
            ("static", quantize_per_tensor(x, static.cuda()), quant.quantize_act_per_tensor(cpu, static)),
        ):
            where = (m, k, name)
            assert torch.equal(s.cpu().reshape(ref_s.shape), ref_s), (where, s.flatten()[:4], ref_s.flatten()[:4])
            assert _same_fp8(q.cpu(), ref_q), (where, (q.cpu().view(torch.uint8) != ref_q.view(torch.uint8)).nonzero()[:4])


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_activation_quantizers_match_their_definition_in_float64(seed, static):
    """quant.py is both the reference and what the emulation backend and the Triton quantizers
    are checked against, so a wrong definition here passes every kernel test: check it against
    the definition itself. Scales: amax|x| / 448 per group, token or tensor (the largest magnitude
    negative here); every value within half an e4m3 step of x (relative 2^-4, or 2^-10 of the
    scale below the normal range)."""
    m, k = 7, 300  # a partial 128-group
    x = torch.randn(m, k, dtype=torch.float64) * 3
    x[torch.arange(m), torch.randint(0, k, (m,))] = -20.0 - torch.rand(m, dtype=torch.float64)  # negative amax
    x32 = x.float()

    def check(q, scale, full_scale, group=None):
        deq = q.double() * full_scale
        assert ((deq - x32.double()).abs() <= x32.double().abs() / 16 + full_scale * 2**-10 + 1e-12).all()
        assert torch.equal(quant.dequantize_act(q, scale, group), deq.float())  # the inverse, rounded once

    q, scale = quant.quantize_act_per_token_group(x32, 128)
    groups = torch.nn.functional.pad(x32.abs(), (0, 384 - k)).view(m, 3, 128).amax(dim=2)
    assert torch.equal(scale, groups / torch.tensor(448.0))
    check(q, scale, scale.double().repeat_interleave(128, dim=1)[:, :k], 128)
    q, scale = quant.quantize_act_per_token(x32)
    assert torch.equal(scale, x32.abs().amax(dim=1, keepdim=True) / torch.tensor(448.0))
    check(q, scale, scale.double())
    assert (q.float().min(dim=1).values == -quant.FP8_MAX).all()  # each row's amax is its negative outlier
    given = torch.tensor(0.05) if static else None
    q, scale = quant.quantize_act_per_tensor(x32, given)
    expected = given if static else x32.abs().amax() / torch.tensor(448.0)
    assert scale.shape == () and torch.equal(scale, expected)
    if not static:
        check(q, scale, scale.double())
        assert q.float().min() == -quant.FP8_MAX
