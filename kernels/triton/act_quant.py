"""Dynamic FP8 activation quantization on the GPU, bit-identical to `quantgate.kernels.quant`.

One launch per call (two for dynamic per-tensor), writing the FP8 values and float32 scales in
the layout the GEMM that follows reads. Divisions are IEEE-rounded (`div_rn`) so every FP8 value
and scale equals the torch reference's; tests compare them bit for bit. In CUDA graphs they
launch with PDL (pdl.py): batched W8A8 decode runs one before every GEMM (run 23: 3-8% of a
Qwen3-1.7B-shaped step at 32-128 sequences, with the tiled GEMMs').

`row_multiple` pads the row count with all-zero rows (scale = MIN_SCALE): cuBLAS block scaling
reads the 1x128 scales column-major with a leading dimension that must be 16-byte aligned.

The GEMM backends quantize with `transient=True`: the outputs are views of a per-device scratch
(scratch.py), cached per shape, valid until the next transient quantization on the device, and
the launch skips the JIT's dispatch (launch.py). An eager prefill-sized call is bound by host
time, and two output allocations and the JIT cost ~20 of its ~50 us on the H200's host.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton import knobs

from ..quant import FP8_DTYPE, FP8_MAX, MIN_SCALE
from .gemm_epilogue import target_programs
from .launch import DirectLaunch, aligned, cdiv, next_power_of_2
from .pdl import await_inputs, launch_options
from .scratch import device_buffer

_FP8_MAX = tl.constexpr(FP8_MAX)
_MIN_SCALE = tl.constexpr(MIN_SCALE)
_INTERPRETED = tl.constexpr(knobs.runtime.interpret)  # read when kernels are defined, as triton.jit does


@triton.jit
def _scale_from_amax(amax):
    return tl.maximum(tl.math.div_rn(amax, _FP8_MAX), _MIN_SCALE)


@triton.jit
def _to_fp8(x, scale):
    """x / scale rounded to e4m3 (nearest even, saturating), with the bits of quant.py: the
    quotient must be the IEEE one, so a division, not a multiplication by the reciprocal."""
    if not _INTERPRETED:
        # One division per scale (scale is broadcast: a row or group shares it), not per element:
        # r = RN(1/scale), q0 = RN(x r), then one FMA correction (Markstein) gives the correctly
        # rounded quotient. An exact q0 (zero residual) is kept as it is: the correction would
        # add +0 to a -0 quotient and lose the sign of x = -0 (on the H200, 91 of 1.6e9 values
        # in run 21, all of them -0). The cast is cvt.rn.satfinite: nearest even, saturating at
        # +-448 (the clamp of quant.to_fp8), one instruction per pair.
        r = tl.math.div_rn(1.0, scale)
        q0 = x * r
        residual = tl.math.fma(-q0, scale, x)
        return tl.where(residual == 0, q0, tl.math.fma(residual, r, q0)).to(tl.float8e4nv)
    q = tl.clamp(tl.math.div_rn(x, scale), -_FP8_MAX, _FP8_MAX)
    # The Triton 3.6 interpreter's cast does not round to nearest even (no ties-to-even, no carry
    # into the exponent), and CPU CI runs these kernels under it: round to the e4m3 grid in float32
    # first (add and remove a power of two whose ulp is the e4m3 spacing at q's exponent), so the
    # cast is exact and gives the hardware's bits.
    bits = q.to(tl.int32, bitcast=True)
    biased_exp = (bits >> 23) & 0xFF
    spacing_exp = tl.maximum(biased_exp, 127 - 6) - 3  # 3 mantissa bits; subnormal below 2^-6
    magic = ((spacing_exp + 23) << 23).to(tl.float32, bitcast=True)
    rounded = (tl.abs(q) + magic) - magic
    signed = rounded.to(tl.int32, bitcast=True) | (bits & -2147483648)
    fp8 = signed.to(tl.float32, bitcast=True).to(tl.float8e4nv).to(tl.int8, bitcast=True)
    # Its cast also turns NaN into 384, where satfinite keeps it NaN (e4m3's 0x7f).
    return tl.where(q != q, tl.full(q.shape, 0x7F, tl.int8), fp8).to(tl.float8e4nv, bitcast=True)


# The row count and the column-major scale strides vary with every batch: not specializing on
# them keeps one compilation per configuration.
@triton.jit(do_not_specialize=["M", "MP", "stride_sm", "stride_sg"])
def _group_quant_kernel(
    x_ptr, q_ptr, s_ptr, M, MP, K, stride_xm, stride_qm, stride_sm, stride_sg,
    GROUP: tl.constexpr, GROUPS_PER_PROGRAM: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr,
):
    """ROWS rows (of the MP written, the M read; the rest are padding) by GROUPS_PER_PROGRAM groups."""
    await_inputs(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1) * GROUPS_PER_PROGRAM + tl.arange(0, GROUPS_PER_PROGRAM)
    cols = (g[:, None] * GROUP + tl.arange(0, GROUP)[None, :])[None, :, :]
    in_k = cols < K
    written = (rows < MP)[:, None, None]
    x = tl.load(x_ptr + rows[:, None, None] * stride_xm + cols, mask=in_k & (rows < M)[:, None, None],
                other=0.0).to(tl.float32)
    scale = _scale_from_amax(tl.max(tl.abs(x), axis=2))
    tl.store(q_ptr + rows[:, None, None] * stride_qm + cols, _to_fp8(x, scale[:, :, None]), mask=in_k & written)
    tl.store(s_ptr + rows[:, None] * stride_sm + g[None, :] * stride_sg, scale,
             mask=(rows < MP)[:, None] & (g * GROUP < K)[None, :])


@triton.jit(do_not_specialize=["M"])
def _row_quant_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_qm,
    STATIC: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    """One row per program. STATIC: the scale is given (per tensor); else it is the row's amax.
    A row of at most BLOCK values is read once and kept in registers; a longer one is read twice
    (its amax, then its values)."""
    await_inputs(PDL)
    row = tl.program_id(0)
    live = row < M
    offs = tl.arange(0, BLOCK)
    if BLOCK >= K:
        x = tl.load(x_ptr + row * stride_xm + offs, mask=(offs < K) & live, other=0.0).to(tl.float32)
        if STATIC:
            scale = tl.load(s_ptr)
        else:
            scale = _scale_from_amax(tl.max(tl.abs(x), axis=0))
            tl.store(s_ptr + row, scale)
        tl.store(q_ptr + row * stride_qm + offs, _to_fp8(x, scale), mask=offs < K)
    else:
        if STATIC:
            scale = tl.load(s_ptr)
        else:
            amax = tl.zeros((BLOCK,), tl.float32)
            for k0 in range(0, K, BLOCK):
                x = tl.load(x_ptr + row * stride_xm + k0 + offs, mask=(k0 + offs < K) & live, other=0.0)
                amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
            scale = _scale_from_amax(tl.max(amax, axis=0))
            tl.store(s_ptr + row, scale)
        for k0 in range(0, K, BLOCK):
            x = tl.load(x_ptr + row * stride_xm + k0 + offs, mask=(k0 + offs < K) & live, other=0.0)
            tl.store(q_ptr + row * stride_qm + k0 + offs, _to_fp8(x.to(tl.float32), scale), mask=k0 + offs < K)


@triton.jit(do_not_specialize=["M"])
def _tensor_scale_kernel(x_ptr, s_ptr, amax_ptr, counter_ptr, M, K, stride_xm, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    """The dynamic per-tensor scale in one launch: programs take rows in turn and join their amax
    by an atomic max; the last to finish writes the scale and zeroes the amax and the counter
    for the next call (the device scratch starts at zero). The amax is kept as its int32 bits,
    which order as the non-negative floats do (integer atomics run everywhere, the interpreter
    included)."""
    await_inputs(PDL)
    programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    amax = tl.zeros((BLOCK,), tl.float32)
    for row in range(tl.program_id(0), M, programs):
        for k0 in range(0, K, BLOCK):
            x = tl.load(x_ptr + row * stride_xm + k0 + offs, mask=k0 + offs < K, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    tl.atomic_max(amax_ptr, tl.max(amax, axis=0).to(tl.int32, bitcast=True))
    # acq_rel: the last program's increment sees every other program's atomic max before it.
    if tl.atomic_add(counter_ptr, 1) == programs - 1:
        tl.store(s_ptr, _scale_from_amax(tl.atomic_xchg(amax_ptr, 0).to(tl.float32, bitcast=True)))
        tl.atomic_xchg(counter_ptr, 0)


def _padded_rows(m: int, row_multiple: int) -> int:
    return -(-m // row_multiple) * row_multiple


def _check_input(x: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"activation quantization needs a 2-D tensor with unit last stride, got {tuple(x.shape)} "
                         f"strides {x.stride()}")


_TRANSIENT_VIEWS: dict[tuple, tuple[torch.Tensor, torch.Tensor | None]] = {}
_MAX_TRANSIENT_VIEWS = 512  # distinct (rows, K, scale layout): prefill row counts vary per step


def _outputs(device: torch.device, mp: int, k: int, groups: int | None, column_major: bool,
             transient: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FP8 values [mp, k] and float32 scales [mp, groups] (none for groups None; strides (1, mp)
    if column_major), fresh or views of the device scratch."""
    if not transient:
        q = torch.empty((mp, k), dtype=FP8_DTYPE, device=device)
        if groups is None:
            return q, None
        if column_major:
            return q, torch.empty_strided((mp, groups), (1, mp), dtype=torch.float32, device=device)
        return q, torch.empty((mp, groups), dtype=torch.float32, device=device)
    key = (device, mp, k, groups, column_major)
    views = _TRANSIENT_VIEWS.get(key)
    if views is None:
        if len(_TRANSIENT_VIEWS) >= _MAX_TRANSIENT_VIEWS:
            _TRANSIENT_VIEWS.clear()
        q = device_buffer(device, "act_quant_values", mp * k, torch.uint8)[:mp * k].view(FP8_DTYPE).view(mp, k)
        scale = None
        if groups is not None:
            flat = device_buffer(device, "act_quant_scales", mp * groups, torch.float32)[:mp * groups]
            scale = flat.view(groups, mp).t() if column_major else flat.view(mp, groups)
        _TRANSIENT_VIEWS[key] = views = (q, scale)
    return views


def _tensor_scale_output(device: torch.device, transient: bool) -> torch.Tensor:
    """A 0-d float32 for a dynamic per-tensor scale: fresh, or the device scratch's."""
    if transient:
        return device_buffer(device, "act_quant_tensor_scale", 1, torch.float32)[0]
    return torch.empty((), dtype=torch.float32, device=device)


_group_quant = DirectLaunch(_group_quant_kernel)
_row_quant = DirectLaunch(_row_quant_kernel)
_tensor_scale = DirectLaunch(_tensor_scale_kernel)
# The longest row read once (kept in registers: 128 values a thread at 4 warps; 8 or 16 warps
# were 10-50% slower on the H200, run 21); a longer one is read twice, 4096 values at a time.
ROW_IN_REGISTERS = 16384
# Rows per program of the group quantization: two were 8-20% faster than one at M = 512-8192 and
# K = 4096 / 14336 (run 28: 8192 x 4096 29.4 -> 26.5 us), and no slower than 4, 8 or 16 (each
# column-major scale store then writes a pair of neighbours).
GROUP_QUANT_ROWS = 2
TENSOR_SCALE_PER_SM = 8  # programs of the per-tensor scale kernel (run 21: 4 per SM left HBM idle, 16 no faster)


def quantize_per_token_group(
    x: torch.Tensor, group: int = 128, *, column_major_scales: bool = False, row_multiple: int = 1,
    transient: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [Mp, K], float32 scales [Mp, ceil(K/group)]), Mp = M rounded up to row_multiple.
    `group` must be a power of two. column_major_scales: scales stored with strides (1, Mp).
    transient: outputs in the device scratch (module docstring)."""
    _check_input(x)
    if group & (group - 1):
        raise ValueError(f"group size must be a power of two, got {group}")
    m, k = x.shape
    mp = _padded_rows(m, row_multiple)
    groups = math.ceil(k / group)
    q, scale = _outputs(x.device, mp, k, groups, column_major_scales, transient)
    if mp == 0 or k == 0:
        return q, scale
    per_program = min(next_power_of_2(groups), max(1, 1024 // group))
    # q and scale are fresh or scratch views at offset 0: aligned, with the strides below.
    stride_xm = x.stride(0)
    scale_strides = (1, mp) if column_major_scales else (groups, 1)
    options = launch_options(x.device)
    key = (x.dtype, aligned(x.data_ptr()), stride_xm, k, group, per_program, options["PDL"])
    _group_quant(key, (cdiv(mp, GROUP_QUANT_ROWS), cdiv(groups, per_program)),
                 (x, q, scale, m, mp, k, stride_xm, k, *scale_strides),
                 GROUP=group, GROUPS_PER_PROGRAM=per_program, ROWS=GROUP_QUANT_ROWS, num_warps=4, **options)
    return q, scale


def _row_quant_launch(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, static: bool) -> None:
    m, k = x.shape
    stride_xm = x.stride(0)
    block = next_power_of_2(k) if k <= ROW_IN_REGISTERS else 4096
    options = launch_options(x.device)
    key = (x.dtype, aligned(x.data_ptr()), stride_xm, k, aligned(scale.data_ptr()), static, block, options["PDL"])
    _row_quant(key, (q.shape[0],), (x, q, scale, m, k, stride_xm, k),  # q: [Mp, K] contiguous
               STATIC=static, BLOCK=block, num_warps=4, **options)


def _tensor_scale_launch(x: torch.Tensor, scale: torch.Tensor) -> None:
    m, k = x.shape
    stride_xm = x.stride(0)
    amax = device_buffer(x.device, "act_quant_amax_bits", 1, torch.int32)
    counter = device_buffer(x.device, "act_quant_amax_counter", 1, torch.int32)
    block = min(4096, next_power_of_2(k))
    options = launch_options(x.device)
    key = (x.dtype, aligned(x.data_ptr()), stride_xm, k, aligned(scale.data_ptr()), options["PDL"])
    # Programs read rows in turn: a fixed grid keeps the atomics few (one per program).
    _tensor_scale(key, (min(m, target_programs(x.device, TENSOR_SCALE_PER_SM)),),
                  (x, scale, amax, counter, m, k, stride_xm), BLOCK=block, num_warps=4, **options)


def quantize_per_token(
    x: torch.Tensor, *, row_multiple: int = 1, transient: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [Mp, K], float32 scales [Mp, 1]): one dynamic scale per row.
    transient: outputs in the device scratch (module docstring)."""
    _check_input(x)
    m, k = x.shape
    mp = _padded_rows(m, row_multiple)
    q, scale = _outputs(x.device, mp, k, 1, False, transient)
    if mp and k:
        _row_quant_launch(x, q, scale, static=False)
    return q, scale


def quantize_per_tensor(
    x: torch.Tensor, scale: torch.Tensor | None = None, *, row_multiple: int = 1, transient: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [Mp, K], 0-d float32 scale): the given static scale, else amax / 448.
    transient: the FP8 values in the device scratch (module docstring)."""
    _check_input(x)
    m, k = x.shape
    if scale is None:
        scale = _tensor_scale_output(x.device, transient)
        if x.numel():
            _tensor_scale_launch(x, scale)
        else:
            scale.fill_(MIN_SCALE)  # the scale of an all-zero tensor
    elif scale.dtype != torch.float32 or scale.dim():  # a checkpoint's static scale is bound as 0-d float32
        scale = scale.to(torch.float32).reshape(())
    mp = _padded_rows(m, row_multiple)
    q, _ = _outputs(x.device, mp, k, None, False, transient)
    if mp and k:
        _row_quant_launch(x, q, scale, static=True)
    return q, scale
