"""Run 23: does a row's output depend on how many rows share its batch, or on the tuner's choice?

For each dense FP8 GEMM (triton W8A8 block and channel, marlin W8A16 block and channel), each
launch path and each candidate configuration the tuner may pick, compute the first rows of
x[:M] @ W^T for M across the decode and prefill buckets, and sort the results for row 0 into
classes of equal bits (A = the class of the small-M default at M = 2), with the number of its N
values that differ from class A. W8A8 rows are compared in float32 (the GEMM's accumulator),
W8A16 rows in bf16 (its only output). The 32-row tile that run 22 removed from the 17-64-row
bucket is timed as "removed". Shapes: the tiny model's four projections and one 4096 x 4096.
Writes row_bits.txt (tables) and row_bits.json.

    python benchmarks/results/h200-2026-12-01-run23/row_bits.py OUTDIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from quantgate.kernels import quant
from quantgate.kernels.triton import fp8_block_gemm as w8a8, fp8_gemv, w8a16_gemm as w8a16
from quantgate.kernels.triton.tuning import m_bucket

SHAPES = [(256, 512), (256, 256), (256, 1536), (768, 256), (4096, 4096)]  # (K, N)
MS = [1, 2, 3, 8, 16, 17, 24, 40, 64, 65, 128, 256, 257, 512]
DEVICE = torch.device("cuda")


def in_bucket(bucket: int | None, low: int = 2) -> list[int]:
    return [m for m in MS if m >= low and (bucket is None or m_bucket(m) == bucket)]


def w8a8_launches(groupwise: bool, scale_block_n: int):
    for cfg in fp8_gemv.candidates(groupwise, scale_block_n):
        yield "gemv", cfg, [1]
    for cfg in w8a8.SMALL_M_CANDIDATES:
        yield "small_m", cfg, [m for m in MS if m <= w8a8.SMALL_M]
    for bucket, cfgs in w8a8.TILED_CANDIDATES.items():
        for cfg in cfgs:
            yield "tiled", cfg, in_bucket(bucket, w8a8.SMALL_M + 1)
    yield "removed", w8a8.GemmConfig(32, 64, 4, 4, group_m=1, split_per_sm=2), in_bucket(64, w8a8.SMALL_M + 1)
    for cfg in w8a8.TILED_LARGE:
        yield "tiled", cfg, [m for m in MS if m > 256]
    for cfg in w8a8.TMA_CANDIDATES:
        yield "tma", cfg, [m for m in MS if m >= w8a8.TMA_MIN_M]


def w8a16_launches(n: int):
    seen = set()
    for m in MS:
        for cfg in w8a16.candidates_for(m, w8a16.tma_capable(DEVICE, n)):
            if cfg not in seen:
                seen.add(cfg)
                bucket = m_bucket(m)
                yield "w8a16", cfg, [1] if cfg.block_m == 1 else (in_bucket(bucket) if bucket <= 256 else in_bucket(None, 257))


def classes(rows: dict[tuple, torch.Tensor]) -> dict[tuple, str]:
    reps: list[torch.Tensor] = []
    out = {}
    for key, row in rows.items():
        for i, rep in enumerate(reps):
            if torch.equal(rep, row):
                out[key] = chr(65 + i)
                break
        else:
            reps.append(row)
            out[key] = chr(65 + len(reps) - 1)
    return out


def differing(row: torch.Tensor, reference: torch.Tensor) -> str:
    count = int((row != reference).sum())
    return f"({count})" if count else ""


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    lines, records = [], []
    for (k, n) in SHAPES:
        w = torch.randn(n, k, device=DEVICE) * 0.05
        x = torch.randn(max(MS), k, device=DEVICE).to(torch.bfloat16)
        workspace = torch.zeros(max(w8a8.workspace_size(n), w8a16.workspace_size(n)), dtype=torch.int32, device=DEVICE)
        for scheme in ("block", "channel"):
            if scheme == "block":
                wq, ws = quant.quantize_weight_block(w)
                lin_scale, sbn = ws, 128
                columns = ws.repeat_interleave(128, 0)[:n].t()
            else:
                wq, ws = quant.quantize_weight_channel(w)
                lin_scale, sbn = ws.reshape(-1), 1
                columns = ws.reshape(1, n)
            groupwise = scheme == "block"
            for kernel in ("triton", "marlin"):
                results: dict[tuple, torch.Tensor] = {}
                if kernel == "triton":
                    for path, cfg, ms in w8a8_launches(groupwise, sbn):
                        for m in ms:
                            out = w8a8.w8a8_linear(x[:m], wq, lin_scale, torch.float32, groupwise=groupwise,
                                                   scale_block_n=sbn, workspace=workspace,
                                                   path="tiled" if path == "removed" else path, config=cfg)
                            results[(path, str(cfg), m)] = out[0].cpu()
                    reference = ("small_m", str(w8a8.SMALL_M_CANDIDATES[0]), 2)
                else:
                    packed = w8a16.pack_weight(wq)
                    scale = columns.to(torch.bfloat16).contiguous()
                    for path, cfg, ms in w8a16_launches(n):
                        for m in ms:
                            out = w8a16.w8a16_gemm(x[:m], packed, scale, groupwise=groupwise, workspace=workspace,
                                                   config=cfg)
                            results[(path, str(cfg), m)] = out[0].cpu()
                    reference = next(key for key in results if key[2] == 2)
                assert workspace.eq(0).all()
                # reference first so that it is class A
                ordered = {reference: results[reference], **results}
                cls = classes(ordered)
                lines.append(f"== {kernel} {scheme} K={k} N={n}: row 0's bits by launch and M (values differing from A); "
                             f"A = {reference[0]} {reference[1]} at M = {reference[2]}")
                configs = list(dict.fromkeys((p, c) for p, c, _ in results))
                for p, c in configs:
                    cells = " ".join(f"{m}:{cls[(p, c, m)]}{differing(results[(p, c, m)], results[reference])}"
                                     for (pp, cc, m) in results if (pp, cc) == (p, c))
                    lines.append(f"  {p:7s} {c:90s} {cells}")
                records.append({"kernel": kernel, "scheme": scheme, "k": k, "n": n,
                                "classes": [[p, c, m, cls[(p, c, m)], int((row != results[reference]).sum())]
                                            for (p, c, m), row in results.items()]})
    (out_dir / "row_bits.txt").write_text("\n".join(lines) + "\n")
    (out_dir / "row_bits.json").write_text(json.dumps(records, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
