"""Experiment: the 1x128 group quantization with several rows per program (column-major scale
stores become contiguous runs, fewer and larger programs), against the shipped kernel (one row
per program when this ran, at 8d8671b; two since, act_quant.GROUP_QUANT_ROWS)."""
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import bench_linear as bl  # noqa: E402
from quantgate.kernels.triton import act_quant  # noqa: E402
from quantgate.kernels.triton.act_quant import _scale_from_amax, _to_fp8  # noqa: E402


@triton.jit(do_not_specialize=["M", "MP", "stride_sm", "stride_sg"])
def _rows_group_quant_kernel(x_ptr, q_ptr, s_ptr, M, MP, K, stride_xm, stride_qm, stride_sm, stride_sg,
                             GROUP: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1) * G + tl.arange(0, G)
    cols = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [G, GROUP]
    in_k = cols < K
    offs = rows[:, None, None] * stride_xm + cols[None, :, :]
    x = tl.load(x_ptr + offs, mask=in_k[None, :, :] & (rows < M)[:, None, None], other=0.0).to(tl.float32)
    scale = _scale_from_amax(tl.max(tl.abs(x), axis=2))  # [ROWS, G]
    qoffs = rows[:, None, None] * stride_qm + cols[None, :, :]
    tl.store(q_ptr + qoffs, _to_fp8(x, scale[:, :, None]), mask=in_k[None, :, :] & (rows < MP)[:, None, None])
    tl.store(s_ptr + rows[:, None] * stride_sm + g[None, :] * stride_sg, scale,
             mask=(g * GROUP < K)[None, :] & (rows < MP)[:, None])


def rows_quant(x, rows, g, warps, q, s):
    m, k = x.shape
    mp = q.shape[0]
    _rows_group_quant_kernel[(triton.cdiv(mp, rows), triton.cdiv(k // 128, g))](
        x, q, s, m, mp, k, x.stride(0), k, 1, mp, GROUP=128, G=g, ROWS=rows, num_warps=warps)


for k in (4096, 14336):
    for m in (512, 2048, 8192):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16) * 3
        x[::7, ::5] = 0
        ref_q, ref_s = act_quant.quantize_per_token_group(x, 128, column_major_scales=True, row_multiple=4)
        base = bl.graph_ms([lambda: act_quant.quantize_per_token_group(x, 128, column_major_scales=True, row_multiple=4,
                                                                      transient=True)], 0.01)
        line = f"K={k} M={m}: shipped {1e3 * base:.1f} us"
        for rows, g, warps in ((2, 8, 4), (4, 8, 4), (4, 8, 8), (8, 4, 4), (8, 8, 8), (16, 4, 8), (4, 4, 4), (8, 2, 4)):
            q = torch.empty_like(ref_q)
            s = torch.empty_strided(ref_s.shape, ref_s.stride(), dtype=torch.float32, device="cuda")
            rows_quant(x, rows, g, warps, q, s)
            same = torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)
            t = bl.graph_ms([lambda: rows_quant(x, rows, g, warps, q, s)], 0.01)
            line += f" | r{rows} g{g} w{warps} {1e3 * t:.1f}{'' if same else ' DIFF'}"
        print(line, flush=True)
