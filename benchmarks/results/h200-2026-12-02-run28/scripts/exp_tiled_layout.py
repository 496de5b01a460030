"""Experiment: does a column-tiled packed layout (each BLOCK_N-wide column tile's k-planes rows
contiguous, [N/BN, R, BN] int32) stream faster than the row-major k-planes [R, N]? Same kernels,
same configs and splits; only the weight pointer arithmetic differs. GPU only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from quantgate.kernels.triton import w8a16_gemm as base
from quantgate.kernels.triton.tuning import graph_time_ms

from common import bf16_peer_us, block_layer, edited_copy

REPL = [  # (old, new, occurrences)
    ("w_ptrs = w_ptr + (k_first * 32 + rj)[:, None] * N + rn_in[None, :]",
     "w_ptrs = w_ptr + pid_n * (k_tiles * 32 * BLOCK_N) + (k_first * 32 + rj)[:, None] * BLOCK_N"
     " + (rn_in % BLOCK_N)[None, :]", 2),
    ("following = tl.load(w_ptrs + 32 * TILES * N,", "following = tl.load(w_ptrs + 32 * TILES * BLOCK_N,", 1),
    ("w_ptrs += 32 * TILES * N", "w_ptrs += 32 * TILES * BLOCK_N", 1),
    ("w_ptrs += 32 * N\n", "w_ptrs += 32 * BLOCK_N\n", 1),
]
tiled = edited_copy("tiled", REPL)

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))  # (K, N)


def tile(packed: torch.Tensor, bn: int) -> torch.Tensor:
    r, n = packed.shape
    return packed.view(r, n // bn, bn).permute(1, 0, 2).contiguous().view(r, n)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda"
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(10):
        dst.copy_(src)
    ev[1].record()
    torch.cuda.synchronize()
    bw = 2 * src.numel() * 10 / (ev[0].elapsed_time(ev[1]) / 1e3)
    del src, dst
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    rows = []
    for k, n in SHAPES:
        w, packed, scale, ws = block_layer(k, n)
        for m in (1, 16):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            bf16_us = bf16_peer_us(x, n)
            rows.append(dict(m=m, k=k, n=n, kind="bf16", cfg="-", us=bf16_us))
            print(f"M={m:2d} {k}x{n} bf16 {bf16_us:6.1f} us")
            cands = [c for c in base.candidates_for(m, True) if not c.tma and c.prefetch == 0]
            cands += [c for c in base.candidates_for(m, True) if c.tma][:2]
            for cfg in cands:
                ref = base.w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws, config=cfg)
                t_row = 1e3 * graph_time_ms(lambda: base.w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws, config=cfg))
                line = dict(m=m, k=k, n=n, cfg=str(cfg), row_us=t_row, row_x_bf16=bf16_us / t_row,
                            row_bw=k * n / (t_row / 1e6) / bw)
                if not cfg.tma:
                    tp = tile(packed, cfg.block_n)
                    got = tiled.w8a16_gemm(x, tp, scale, groupwise=True, workspace=ws, config=cfg)
                    t_tile = 1e3 * graph_time_ms(lambda: tiled.w8a16_gemm(x, tp, scale, groupwise=True, workspace=ws, config=cfg))
                    line.update(tile_us=t_tile, tile_x_bf16=bf16_us / t_tile, tile_bw=k * n / (t_tile / 1e6) / bw,
                                same=bool(torch.equal(got, ref)), maxdiff=float((got.float() - ref.float()).abs().max()))
                    del tp
                rows.append(line)
                print(f"M={m:2d} {k}x{n} bn={cfg.block_n:3d} w={cfg.num_warps} s={cfg.split_per_sm:2d} t={cfg.tiles:2d} "
                      f"tma={int(cfg.tma)} row {t_row:6.1f} us ({bf16_us / t_row:.2f}x, bw {line['row_bw']:.3f})"
                      + (f"  tiled {line['tile_us']:6.1f} us ({line['tile_x_bf16']:.2f}x, bw {line['tile_bw']:.3f}) "
                         f"same={line['same']}" if 'tile_us' in line else ""), flush=True)
    (out / "exp_tiled.json").write_text(json.dumps(dict(copy_bw=bw, rows=rows), indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
