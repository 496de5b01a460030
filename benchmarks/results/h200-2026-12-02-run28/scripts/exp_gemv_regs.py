"""Experiment: the M=1 W8A16 GEMV with fewer registers (so more programs stay resident and more
weight bytes are in flight). Variants by source edits; n_regs / spills printed. GPU only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from quantgate.kernels.triton import w8a16_gemm as base
from quantgate.kernels.triton.tuning import graph_time_ms

from common import edited_copy, one_row_case

FMA = "            t += (x.to(tl.float32) * X_MUL)[:, None] * _plane(packed, p, 0)\n"
TZERO = "        t = tl.zeros((32 * TILES, BLOCK_N), dtype=tl.float32)\n"
TADD = "        if GROUPWISE:\n            acc += t * s\n        else:\n            acc += t\n"
ACC0 = "acc = tl.zeros((32 * TILES, BLOCK_N), dtype=tl.float32)"
SLOAD = "s = tl.load(s_ptrs, mask=live[:, None], other=0.0).to(tl.float32)"
OUT = "out = tl.sum(acc, axis=0) * S_MUL"
VARIANTS = {
    "base": [],
    "no_t": [(TZERO, "", 1), (TADD, "", 1),
             (FMA, "            xs = (x.to(tl.float32) * X_MUL)[:, None]\n            if GROUPWISE:\n"
                   "                xs = xs * s\n            acc += xs * _plane(packed, p, 0)\n", 1)],
    "rowsum": [(ACC0, "acc = tl.zeros((BLOCK_N,), dtype=tl.float32)", 1),
               (SLOAD, "s = tl.load(s_ptr + kt * stride_sg + rn_in).to(tl.float32)", 1),
               (TADD, "        if GROUPWISE:\n            acc += tl.sum(t, axis=0) * s\n        else:\n"
                      "            acc += tl.sum(t, axis=0)\n", 1),
               (OUT, "out = acc * S_MUL", 1)],
    "fold8": [(ACC0, "acc = tl.zeros((8, BLOCK_N), dtype=tl.float32)", 1),
              (SLOAD, "s = tl.load(s_ptr + kt * stride_sg + (tl.arange(0, 8) * 0)[:, None] + rn_in[None, :]).to(tl.float32)", 1),
              (TADD, "        if GROUPWISE:\n            acc += tl.sum(tl.reshape(t, (4, 8, BLOCK_N)), axis=0) * s\n"
                     "        else:\n            acc += tl.sum(tl.reshape(t, (4, 8, BLOCK_N)), axis=0)\n", 1)],
}

SHAPES = ((4096, 14336), (14336, 4096), (4096, 4096))  # (K, N)
CONFIGS = ([base.W8A16Config(1, 64, 4, 1, s) for s in (4, 5, 6, 7, 8, 10, 12)]
           + [base.W8A16Config(1, 32, 4, 1, s) for s in (8, 10, 12, 16)]
           + [base.W8A16Config(1, 128, 4, 1, s) for s in (3, 4, 5, 6)]
           + [base.W8A16Config(1, 128, 8, 1, s) for s in (2, 3, 4)])


def regs(mod) -> str:
    compiled = list(mod._gemv_launch._compiled.values())[-1][0]
    return f"{compiled.n_regs}r{compiled.n_spills}s"


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    mods = {name: edited_copy(name, edits) for name, edits in VARIANTS.items()}
    rows = []
    for k, n in SHAPES:
        w, packed, scale, ws, x, bf16 = one_row_case(k, n)
        ref = (x.double() @ (w.double() * scale.double().repeat_interleave(128, 0).t()).t()).float()
        print(f"{k}x{n}: bf16 {bf16:.1f} us; 1.6x needs {bf16 / 1.6:.1f} us", flush=True)
        for cfg in CONFIGS:
            line = f"  bn={cfg.block_n:3d} w={cfg.num_warps} s={cfg.split_per_sm:2d}"
            for name, mod in mods.items():
                got = mod.w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws, config=cfg)
                err = float((got.float() - ref).abs().mean() / ref.abs().mean())
                us = 1e3 * graph_time_ms(lambda: mod.w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws, config=cfg))
                rows.append(dict(k=k, n=n, cfg=str(cfg), variant=name, us=us, err=err, regs=regs(mod), bf16=bf16))
                line += f" | {name} {us:5.1f} {regs(mod)} e{err:.0e}"
            print(line, flush=True)
    (out / "exp_regs.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
