"""What bounds a batch-1 decode GEMV on this GPU: GPU times (CUDA graph, L2 evicted before each
call, tuning.graph_time_ms) of an empty kernel, a plain read of the FP8 weight bytes, bf16
cuBLAS, cuBLAS FP8 tensor-wise `torch._scaled_mm` (peers), and the project's W8A16 GEMV
configurations, at the decode shapes of Qwen3-1.7B (merged qkv, o, merged gate_up, down).

    python benchmarks/bench_gemv_floor.py --out DIR     # GPU only; prints a table, writes DIR/gemv_floor.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from quantgate.kernels.triton.tuning import graph_time_ms
from quantgate.kernels.triton.w8a16_gemm import CANDIDATES, pack_weight, w8a16_gemm, workspace_size

SHAPES = ((4096, 2048), (2048, 2048), (12288, 2048), (2048, 6144))  # (N, K)


@triton.jit
def _empty(x):
    pass


@triton.jit
def _read(w_ptr, out_ptr, n_words, n_per, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    end = tl.minimum(pid * n_per + n_per, n_words)
    for i in range(0, n_per, BLOCK):
        idx = pid * n_per + i + tl.arange(0, BLOCK)
        acc += tl.load(w_ptr + idx, mask=idx < end, other=0)
    tl.store(out_ptr + pid, tl.sum(acc))


def read_words(words: torch.Tensor, out: torch.Tensor, block: int = 1024, num_warps: int = 4) -> None:
    """Every int32 word of `words` read once, split over out.numel() programs (the last ones
    masked): the rate is then of the bytes actually read. (Rounding each program's share down to
    whole blocks skipped up to 4 KB per program: at 1056 programs a 2048 x 2048 weight was not
    read at all.)"""
    programs = out.numel()
    per = triton.cdiv(triton.cdiv(words.numel(), programs), block) * block
    _read[(programs,)](words, out, words.numel(), per, BLOCK=block, num_warps=num_warps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = "cuda"
    rows = [{"case": "empty kernel", "us": 1e3 * graph_time_ms(lambda: _empty[(1,)](torch.zeros(1, device=dev)))}]
    for n, k in SHAPES:
        w = torch.randint(-100, 100, (n, k), dtype=torch.int8, device=dev).view(torch.float8_e4m3fn)
        words = w.view(torch.int32).reshape(-1)

        def add(case: str, fn) -> None:
            us = 1e3 * graph_time_ms(fn)
            rows.append({"case": case, "n": n, "k": k, "us": us, "fp8_bytes_tb_per_s": n * k / us / 1e6})

        for programs in (264, 1056):
            out = torch.empty(programs, dtype=torch.int32, device=dev)
            add(f"read the FP8 bytes, {programs} programs", lambda: read_words(words, out))
        xb = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        wb = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        one = torch.ones(1, device=dev)
        x8, wt = xb.to(torch.float8_e4m3fn), w.t()
        add("bf16 cuBLAS (peer)", lambda: xb @ wb.t())
        add("_scaled_mm FP8 tensor-wise (peer)", lambda: torch._scaled_mm(x8, wt, one, one, out_dtype=torch.bfloat16))
        scale = torch.ones(triton.cdiv(k, 128), n, dtype=torch.bfloat16, device=dev)
        packed = pack_weight(w)
        workspace = torch.zeros(workspace_size(n), dtype=torch.int32, device=dev)
        for cfg in CANDIDATES[1]:
            add(f"w8a16 {cfg}", lambda: w8a16_gemm(xb, packed, scale, groupwise=True, workspace=workspace, config=cfg))
    (args.out / "gemv_floor.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        shape = f"{r['n']:>6} x {r['k']:<5}" if "n" in r else " " * 14
        rate = f"{r['fp8_bytes_tb_per_s']:5.2f} TB/s of FP8 bytes" if "n" in r else ""
        print(f"{shape} {r['us']:6.1f} us  {rate:>24}  {r['case']}")


if __name__ == "__main__":
    main()
