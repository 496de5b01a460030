"""W8A16 without converting weights: the bf16/fp16 activation split exactly into FP8 terms.

A bf16 value v (8 significant bits) scaled by a power of two s into e4m3's range is exactly
hi + lo with hi = fp8(v / s) and lo = fp8(v / s - hi) (fp16: four terms); only values below
e4m3's subnormal step lose bits (2^-10 of a group's scale, 2^-18 of its largest value). So
W x = s * (W hi + W lo): FP8 tensor-core products of the FP8 weights as stored, no weight
conversion at all, with the split activation as 2M (fp16: 4M) columns of the MMA's narrow side.
Issue 3's marlin GEMV spends ~5 instructions per weight byte converting; this spends none.

Timing is bench_linear's graph time (a CUDA graph over rotating weight copies, out of L2), the
split kernel included; bf16 cuBLAS, FP8 cuBLAS tensor-wise (`torch._scaled_mm`) and the tree's
marlin (tuned) in the same process, and the copy bandwidth.

    python benchmarks/results/h200-2026-11-30-run15/split_mma_sweep.py OUT_DIR [--interpret]
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from quantgate.kernels import quant  # noqa: E402
from quantgate.kernels.triton import w8a16_gemm as w8  # noqa: E402
from quantgate.kernels.triton.gemm_epilogue import choose_split_k, split_k_buffers, store_tile, target_programs  # noqa: E402

TERMS = {torch.bfloat16: 2, torch.float16: 4}


@triton.jit
def _split_kernel(x_ptr, xs_ptr, sc_ptr, K, stride_xm, stride_xs, NC: tl.constexpr, TERMS: tl.constexpr):
    """Row m, K tile kt of x -> rows m*TERMS + t of xs (fp8) and their scale sc[kt, m*TERMS + t]."""
    m = tl.program_id(0)
    kt = tl.program_id(1)
    rk = kt * 128 + tl.arange(0, 128)
    x = tl.load(x_ptr + m * stride_xm + rk, mask=rk < K, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-30)
    # The power of two at or above amax (round the mantissa up), then 2^8 below it: |v| <= 256.
    p2 = ((amax.to(tl.int32, bitcast=True) + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
    v = x * (256.0 / p2)
    for t in tl.static_range(TERMS):
        q = v.to(tl.float8e4nv)
        tl.store(xs_ptr + (m * TERMS + t) * stride_xs + rk, q, mask=rk < K)
        v = v - q.to(tl.float32)
        tl.store(sc_ptr + kt * NC + m * TERMS + t, p2 * (1.0 / 256.0))


@triton.jit(do_not_specialize=["split_k"])
def _split_mma_kernel(w_desc, xs_desc, sc_ptr, ws_ptr, c_ptr, partial_ptr, counter_ptr, M, N, K, split_k,
                      stride_wsn, stride_wsg, NC: tl.constexpr, TERMS: tl.constexpr, BLOCK_N: tl.constexpr,
                      STAGES: tl.constexpr, GROUPWISE: tl.constexpr, SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    rn = n0 + tl.arange(0, BLOCK_N)
    rc = tl.arange(0, NC)
    k_tiles = tl.cdiv(K, 128)
    per_split = tl.cdiv(k_tiles, split_k)
    k_first = pid_k * per_split
    k_last = tl.minimum(k_first + per_split, k_tiles)
    acc = tl.zeros((BLOCK_N, NC), dtype=tl.float32)
    for kt in tl.range(k_first, k_last, num_stages=STAGES):
        w = w_desc.load([n0, kt * 128])
        xs = xs_desc.load([0, kt * 128])
        part = tl.dot(w, xs.T)
        xsc = tl.load(sc_ptr + kt * NC + rc)
        if GROUPWISE:
            wsc = tl.load(ws_ptr + (n0 // 128) * stride_wsn + kt * stride_wsg)
            acc += part * (xsc * wsc)[None, :]
        else:
            acc += part * xsc[None, :]
    comb = tl.sum(tl.reshape(acc, (BLOCK_N, NC // TERMS, TERMS)), axis=2)
    if not GROUPWISE:
        comb = comb * tl.load(ws_ptr + rn, mask=rn < N, other=0.0)[:, None]
    store_tile(tl.trans(comb), c_ptr, c_ptr, partial_ptr, counter_ptr, tl.arange(0, NC // TERMS), rn, M, N, N,
               pid_k, split_k, pid_n, False, SPLIT)


class SplitMMA:
    """One layer: FP8 weight [N, K] (K a multiple of 128 here), float32 scales."""

    def __init__(self, wq: torch.Tensor, ws: torch.Tensor, groupwise: bool, m: int, dtype: torch.dtype,
                 block_n: int, stages: int, split_per_sm: int, num_warps: int = 4) -> None:
        self.n, self.k = wq.shape
        self.m, self.terms, self.groupwise = m, TERMS[dtype], groupwise
        self.nc = max(16, triton.next_power_of_2(self.terms * m))
        self.block_n, self.stages, self.num_warps = block_n, stages, num_warps
        self.ws = ws.float().contiguous() if groupwise else ws.float().reshape(-1).contiguous()
        dev = wq.device
        self.xs = torch.zeros(self.terms * m, self.k, dtype=torch.float8_e4m3fn, device=dev)
        self.sc = torch.zeros(self.k // 128, self.nc, dtype=torch.float32, device=dev)
        self.w_desc = TensorDescriptor(wq, [self.n, self.k], [self.k, 1], [block_n, 128])
        self.xs_desc = TensorDescriptor(self.xs, [self.terms * m, self.k], [self.k, 1], [self.nc, 128])
        tiles = triton.cdiv(self.n, block_n)
        self.split = choose_split_k(tiles, self.k // 128, target_programs(dev, split_per_sm), m, self.n) \
            if split_per_sm else 1
        self.workspace = torch.zeros(tiles, dtype=torch.int32, device=dev)
        self.partial, self.counters = split_k_buffers(self.split, m, self.n, tiles, self.workspace, dev)

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        _split_kernel[(self.m, self.k // 128)](x, self.xs, self.sc, self.k, x.stride(0), self.k, NC=self.nc,
                                               TERMS=self.terms, num_warps=1)
        stride_wsn, stride_wsg = (self.ws.stride(0), self.ws.stride(1)) if self.groupwise else (0, 0)
        _split_mma_kernel[(triton.cdiv(self.n, self.block_n), self.split)](
            self.w_desc, self.xs_desc, self.sc, self.ws, out, self.partial, self.counters, self.m, self.n, self.k,
            self.split, stride_wsn, stride_wsg, NC=self.nc, TERMS=self.terms, BLOCK_N=self.block_n,
            STAGES=self.stages, GROUPWISE=self.groupwise, SPLIT=self.split > 1, num_warps=self.num_warps,
            num_stages=self.stages)
        return out


def _reference(x, wq, ws, groupwise, n, k):
    full = quant.expand_block_scale(ws.double(), n, k, (128, 128)) if groupwise else ws.double().reshape(n, 1)
    return x.double() @ (quant.fp8_to_float(wq).double() * full).t()


def _err(out, ref) -> float:
    return ((out.double() - ref).abs().mean() / ref.abs().mean()).item()


def check_interpreted() -> None:
    """Correctness on CPU under TRITON_INTERPRET=1, small shapes (no timing)."""
    torch.manual_seed(0)
    for dtype, groupwise, m, (k, n) in itertools.product((torch.bfloat16, torch.float16), (True, False), (1, 3),
                                                         ((256, 128), (384, 256))):
        w = torch.randn(n, k) * 0.02
        wq, ws = quant.quantize_weight_block(w) if groupwise else quant.quantize_weight_channel(w)
        x = (torch.randn(m, k) * torch.logspace(-3, 1, k)).to(dtype)  # wide range inside each group
        layer = SplitMMA(wq, ws, groupwise, m, dtype, 64, 2, 0)
        out = layer(x, torch.empty(m, n, dtype=torch.float32))
        print(dtype, "block" if groupwise else "channel", m, k, n, f"err(float32 out) {_err(out, _reference(x, wq, ws, groupwise, n, k)):.2e}")


def sweep(out_dir: Path) -> None:
    import bench_linear  # benchmarks/, needs CUDA

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    bandwidth = bench_linear.copy_bandwidth()
    rows = []
    configs = [(bn, st, sp) for bn in (64, 128) for st in (4, 6) for sp in (2, 4, 8)]
    for (k, n), m, groupwise in itertools.product(((4096, 4096), (4096, 14336), (14336, 4096)), (1, 16), (True, False)):
        dtype = torch.bfloat16
        w = torch.randn(n, k, device="cuda") * 0.02
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        wq, ws = quant.quantize_weight_block(w) if groupwise else quant.quantize_weight_channel(w)
        ref = _reference(x, wq, ws, groupwise, n, k)
        row = {"k": k, "n": n, "m": m, "scheme": "block" if groupwise else "channel"}
        bf16 = [w.to(dtype) for _ in range(bench_linear._copies(2 * k * n, l2))]
        row["bf16_us"] = bench_linear.graph_ms([lambda wb=wb: x @ wb.t() for wb in bf16], 0.03) * 1e3
        fp8 = [wq.clone() for _ in range(bench_linear._copies(k * n, l2))]
        if not groupwise:  # cuBLAS FP8 tensor-wise: the peer that reads the same bytes
            one = torch.ones((), device="cuda")
            xq = x.to(torch.float8_e4m3fn)
            row["cublas_fp8_tensor_us"] = bench_linear.graph_ms(
                [lambda q=q: torch._scaled_mm(xq, q.t(), scale_a=one, scale_b=one, out_dtype=dtype) for q in fp8], 0.02) * 1e3
        # the tree's marlin (tuned), on its own layout and bf16 scales
        scale = (ws.to(dtype).repeat_interleave(128, 0)[:n].t().contiguous() if groupwise
                 else ws.reshape(1, n).to(dtype))
        packed = [w8.pack_weight(wq) for _ in range(len(fp8))]
        wsp = torch.zeros(w8.workspace_size(n), dtype=torch.int32, device="cuda")
        call = lambda p: w8.w8a16_gemm(x, p, scale, groupwise=groupwise, workspace=wsp)  # noqa: E731
        row["marlin_us"] = bench_linear.graph_ms([lambda p=p: call(p) for p in packed], 0.02) * 1e3
        row["marlin_err"] = _err(call(packed[0]), ref)
        best = None
        for bn, st, sp in configs:
            try:
                layers = [SplitMMA(q, ws, groupwise, m, dtype, bn, st, sp) for q in fp8]
                o = torch.empty(m, n, dtype=dtype, device="cuda")
                err = _err(layers[0](x, o), ref)
                us = bench_linear.graph_ms([lambda l=l: l(x, o) for l in layers], 0.02) * 1e3
            except Exception as exc:  # noqa: BLE001
                print(k, n, m, bn, st, sp, "failed:", str(exc).splitlines()[0][:200])
                continue
            rows.append({**row, "cfg": [bn, st, sp, layers[0].split], "us": us, "err": err})
            if best is None or us < best["us"]:
                best = rows[-1]
        if best:
            print(f"{k}x{n} M={m} {row['scheme']:7s} bf16 {row['bf16_us']:6.2f} | marlin {row['marlin_us']:6.2f} "
                  f"({row['bf16_us'] / row['marlin_us']:.2f}x) | split {best['us']:6.2f} ({row['bf16_us'] / best['us']:.2f}x, "
                  f"bw {k * n / (best['us'] * 1e-6) / bandwidth:.2f}) cfg {best['cfg']} err {best['err']:.2e} "
                  f"(marlin {row['marlin_err']:.2e})"
                  + (f" | cuBLAS fp8 {row['cublas_fp8_tensor_us']:6.2f}" if 'cublas_fp8_tensor_us' in row else ""))
    # The split itself on the GPU (cvt.rn): exact except below e4m3's subnormal step (|v| < 1/4 of 256)
    for dtype in (torch.bfloat16, torch.float16):
        x = (torch.randn(4, 4096, device="cuda") * torch.logspace(-3, 1, 4096, device="cuda")).to(dtype)
        layer = SplitMMA(torch.zeros(128, 4096, device="cuda").to(torch.float8_e4m3fn), torch.ones(128, 1, device="cuda"),
                         False, 4, dtype, 64, 2, 0)
        layer(x, torch.empty(4, 128, dtype=dtype, device="cuda"))
        t = layer.terms
        rec = sum(layer.xs.float().view(4, t, 4096)[:, i] * layer.sc[:, i::t][:, :4].t().repeat_interleave(128, 1)
                  for i in range(t))
        big = x.float().abs() >= layer.sc[:, ::t][:, :4].t().repeat_interleave(128, 1) * 0.25
        print(f"split {dtype}: inexact values >= 1/4 scaled: {int(((rec - x.float()) != 0)[big].sum())} of {int(big.sum())}; "
              f"max error below: {(rec - x.float()).abs().max().item():.2e}")
    # fp16 correctness (four terms) at one shape
    for groupwise in (True, False):
        k, n, m = 4096, 4096, 16
        w = torch.randn(n, k, device="cuda") * 0.02
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        wq, ws = quant.quantize_weight_block(w) if groupwise else quant.quantize_weight_channel(w)
        o = SplitMMA(wq, ws, groupwise, m, torch.float16, 128, 4, 4)(x, torch.empty(m, n, dtype=torch.float16, device="cuda"))
        print(f"fp16 M=16 {'block' if groupwise else 'channel'} err {_err(o, _reference(x, wq, ws, groupwise, n, k)):.2e}")
    (out_dir / "split_mma.json").write_text(json.dumps({"copy_bw": bandwidth, "rows": rows}, indent=1))
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")


if __name__ == "__main__":
    if "--interpret" in sys.argv or os.environ.get("TRITON_INTERPRET") == "1":
        check_interpreted()
    else:
        sweep(Path(sys.argv[1]))
