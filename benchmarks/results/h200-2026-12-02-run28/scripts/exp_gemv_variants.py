"""Experiment: what bounds the M=1 W8A16 GEMV at the issue's shapes. Variants of the kernel
built by source edits (same configs, splits), a plain read of the bytes, and peers. GPU only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from quantgate.kernels.triton import w8a16_gemm as base
from quantgate.kernels.triton.tuning import graph_time_ms

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
from bench_gemv_floor import read_words  # noqa: E402
from common import edited_copy, one_row_case  # noqa: E402

LOAD0 = "packed = tl.load(w_ptrs, mask=(k_first + tile < k_last)[:, None], other=0)"
NEXT = "following = tl.load(w_ptrs + 32 * TILES * N, mask=(kt + TILES + tile < k_last)[:, None], other=0)"
FMA = "t += (x.to(tl.float32) * X_MUL)[:, None] * _plane(packed, p, 0)"
VARIANTS = {
    "base": [],
    "nocompute": [(FMA, "t += packed.to(tl.float32, bitcast=True)", 1)],
    "depth2": [
        (LOAD0, LOAD0 + "\n    nxt = tl.load(w_ptrs + 32 * TILES * N, "
                        "mask=(k_first + TILES + tile < k_last)[:, None], other=0)", 1),
        (NEXT, "following = tl.load(w_ptrs + 64 * TILES * N, mask=(kt + 2 * TILES + tile < k_last)[:, None], other=0)", 1),
        ("packed = following\n", "packed = nxt\n        nxt = following\n", 1)],
    "cg": [(LOAD0, LOAD0.replace("other=0)", "other=0, cache_modifier='.cg')"), 1),
           (NEXT, NEXT.replace("other=0)", "other=0, cache_modifier='.cg')"), 1)],
    "evict_first": [(LOAD0, LOAD0.replace("other=0)", "other=0, eviction_policy='evict_first')"), 1),
                    (NEXT, NEXT.replace("other=0)", "other=0, eviction_policy='evict_first')"), 1)],
}


def variant(name: str):
    return edited_copy(name, VARIANTS[name])

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))  # (K, N)
CONFIGS = [base.W8A16Config(1, 64, 4, 1, s) for s in (3, 4, 5, 6, 8, 10)] + [
    base.W8A16Config(1, 32, 4, 1, s) for s in (5, 10)] + [base.W8A16Config(1, 128, 4, 1, s) for s in (3, 5)]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda"
    mods = {name: variant(name) for name in VARIANTS}
    rows = []
    for k, n in SHAPES:
        w, packed, scale, ws, x, bf16 = one_row_case(k, n)
        peers = {"bf16": bf16}
        xq = x.to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        peers["scaled_mm_tensor"] = 1e3 * graph_time_ms(lambda: torch._scaled_mm(xq, w.t(), one, one, out_dtype=torch.bfloat16))
        words = packed.view(-1)
        for programs in (1056, 2112):
            sink = torch.empty(programs, dtype=torch.int32, device=dev)
            peers[f"read_{programs}"] = 1e3 * graph_time_ms(lambda: read_words(words, sink))
        print(f"{k}x{n}: " + ", ".join(f"{a} {b:.1f} us" for a, b in peers.items()), flush=True)
        rows.append(dict(k=k, n=n, peers=peers))
        ref = None
        for cfg in CONFIGS:
            line = f"  bn={cfg.block_n:3d} s={cfg.split_per_sm:2d}"
            for name, mod in mods.items():
                got = mod.w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws, config=cfg)
                if name != "nocompute":
                    ref = got if ref is None else ref
                    assert torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=1e-3), name
                us = 1e3 * graph_time_ms(lambda: mod.w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws, config=cfg))
                rows.append(dict(k=k, n=n, cfg=str(cfg), variant=name, us=us))
                line += f" | {name} {us:5.1f}"
            print(line, flush=True)
    (out / "exp_gemv.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
