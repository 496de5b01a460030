"""Run 21 experiment: GPU time (CUDA graph, do_bench_cudagraph medians) of the activation
quantizers' variants, alone, at the bench_linear shapes, to choose between them (bench_linear's
whole-GEMM ratios move by +-0.04 between runs, more than these kernels' differences).

per-token: two passes (BLOCK 4096, 4 warps: the kernel before run 21) against one pass with
the row in registers at 4, 8 and 16 warps. per-tensor dynamic: torch's vector_norm + scale
(before run 21) against the one-launch scale kernel at 4-32 programs per SM, each followed by
the static row quantizer.
    python benchmarks/results/h200-2026-12-01-run21/act_quant_variants.py > variants.txt
"""

from __future__ import annotations

import math

import torch
from triton.testing import do_bench_cudagraph

from quantgate.kernels import quant
from quantgate.kernels.triton import act_quant as aq
from quantgate.kernels.triton.launch import next_power_of_2


def per_token(x, q, s, block, warps):
    m, k = x.shape
    aq._row_quant_kernel[(m,)](x, q, s, m, k, x.stride(0), k, STATIC=False, BLOCK=block, num_warps=warps)


def per_tensor_torch(x, q):
    scale = quant.scale_from_amax(torch.linalg.vector_norm(x, ord=math.inf, dtype=torch.float32))
    aq._row_quant_launch(x, q, scale, static=True)


def per_tensor_kernel(x, q, scale, per_sm):
    aq.TENSOR_SCALE_PER_SM = per_sm  # read at each launch; the grid is not part of the handle's key
    aq._tensor_scale_launch(x, scale)
    aq._row_quant_launch(x, q, scale, static=True)


def main() -> None:
    print(f"{'M':>5} {'K':>6}  variant                         us     GB/s (read + write)")
    for k in (4096, 14336):
        for m in (512, 2048, 8192):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            q = torch.empty(m, k, device="cuda", dtype=quant.FP8_DTYPE)
            s = torch.empty(m, 1, device="cuda", dtype=torch.float32)
            scale = torch.empty((), device="cuda", dtype=torch.float32)
            moved = m * k * 3
            variants = {"per-token two passes, 4 warps": lambda: per_token(x, q, s, 4096, 4)}
            for warps in (4, 8, 16):
                variants[f"per-token one pass, {warps} warps"] = (
                    lambda w=warps: per_token(x, q, s, next_power_of_2(k), w))
            variants["per-tensor torch amax + scale"] = lambda: per_tensor_torch(x, q)
            for per_sm in (4, 8, 16, 32):
                variants[f"per-tensor scale kernel, {per_sm}/SM"] = (
                    lambda p=per_sm: per_tensor_kernel(x, q, scale, p))
            ref_q, ref_s = quant.quantize_act_per_token(x)
            ref_tq, _ = quant.quantize_act_per_tensor(x, None)
            for name, fn in variants.items():
                q.zero_()
                fn()
                torch.cuda.synchronize()
                want = ref_q if name.startswith("per-token") else ref_tq
                assert torch.equal(q.view(torch.uint8), want.view(torch.uint8)), name
                if name.startswith("per-token"):
                    assert torch.equal(s, ref_s), name
                us = do_bench_cudagraph(fn, rep=100) * 1e3
                print(f"{m:>5} {k:>6}  {name:<30} {us:7.1f}  {moved / us / 1e3:7.0f}")


if __name__ == "__main__":
    main()
