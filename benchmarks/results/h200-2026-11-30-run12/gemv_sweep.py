"""marlin's M = 1 GEMV on issue 3's marlin shapes, every GEMV candidate: per-column block
scales (the tree before) against one scale per K tile for a column tile inside one weight block
(`scale_block_n=128`), each with one chunk and with two chunks in flight (`ahead=2`). Timing is
bench_linear's: a CUDA graph over rotating weight copies (out of L2), no PDL; the bf16 cuBLAS
peer and the copy bandwidth are measured in the same process. Runs at commit 63b3518 (the
options it sweeps were removed afterwards; see README.md).

    python benchmarks/results/h200-2026-11-30-run12/gemv_sweep.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import bench_linear  # noqa: E402
from quantgate.kernels import quant  # noqa: E402
from quantgate.kernels.triton import w8a16_gemm as w8  # noqa: E402

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))  # (K, N)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    bandwidth = bench_linear.copy_bandwidth()
    rows = []
    for k, n in SHAPES:
        w = torch.randn(n, k, device="cuda") * 0.02
        wq, ws = quant.quantize_weight_block(w)
        scale = ws.to(torch.bfloat16).repeat_interleave(128, 0)[:n].t().contiguous()  # marlin's layout
        w_ref = quant.dequantize_weight(wq, scale.double().t()[::128].contiguous(), (128, 128), torch.float64)
        copies = [w8.pack_weight(wq) for _ in range(bench_linear._copies(k * n, l2))]
        bf16 = [w.to(torch.bfloat16) for _ in range(bench_linear._copies(2 * k * n, l2))]
        workspace = torch.zeros(w8.workspace_size(n), dtype=torch.int32, device="cuda")
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ w_ref.t()
        bf16_us = bench_linear.graph_ms([lambda wb=wb: x @ wb.t() for wb in bf16], 0.03) * 1e3
        runs = [(cfg, sbn, None) for cfg in (None, *w8.candidates_for(1)) for sbn in (1, 128)]
        runs += [(replace(cfg, ahead=2), sbn, None) for cfg in w8.candidates_for(1) for sbn in (1, 128)]
        for cfg, sbn, split in runs:
            def call(p, cfg=cfg, sbn=sbn, split=split):
                return w8.w8a16_gemm(x, p, scale, groupwise=True, scale_block_n=sbn, workspace=workspace, config=cfg,
                                     split_k=split)
            o = call(copies[0])
            err = ((o.double() - ref).abs().mean() / ref.abs().mean()).item()
            us = bench_linear.graph_ms([lambda p=p: call(p) for p in copies], 0.02) * 1e3
            rows.append({"k": k, "n": n, "config": (str(cfg) if cfg else "tuner") + (f" split_k={split}" if split else ""),
                         "scale_block_n": sbn, "us": us,
                         "x_bf16": bf16_us / us, "copy_bw_frac": k * n / (us * 1e-6) / bandwidth, "err": err,
                         "bf16_us": bf16_us})
    regs = {f"{key[1][0]} tile_scale={key[1][-1]}": (c.n_regs, c.n_spills) for key, (c, _) in w8._gemv_launch._compiled.items()}
    (out / "gemv_tile_scale.json").write_text(json.dumps({"copy_bw": bandwidth, "rows": rows, "regs": regs}, indent=1))
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    best = {}
    for r in rows:
        key = (r["k"], r["n"], r["scale_block_n"])
        if r["config"] != "tuner" and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
        if r["config"] == "tuner":
            print(f"{r['k']:>6} x {r['n']:<6} sbn {r['scale_block_n']:>3} tuner  {r['us']:6.2f} us  "
                  f"x bf16 {r['x_bf16']:.3f}  bw {r['copy_bw_frac']:.3f}  err {r['err']:.2e}  (bf16 {r['bf16_us']:.1f})")
    for (k, n, sbn), r in sorted(best.items()):
        print(f"{k:>6} x {n:<6} sbn {sbn:>3} best   {r['us']:6.2f} us  x bf16 {r['x_bf16']:.3f}  "
              f"bw {r['copy_bw_frac']:.3f}  {r['config']}")
    tuner = {(r["k"], r["n"]): r["us"] for r in rows if r["config"] == "tuner" and r["scale_block_n"] == 1}
    for r in rows:  # everything within 5% of the tree before, or faster
        if r["config"] != "tuner" and r["us"] < 1.05 * tuner[(r["k"], r["n"])]:
            short = r["config"].replace("W8A16Config(block_m=1, ", "").replace(", tma=False", "").replace("num_", "")
            print(f"{r['k']:>6} x {r['n']:<6} sbn {r['scale_block_n']:>3} {r['us']:6.2f} us  {short}")
    for key, (nr, ns) in regs.items():
        print("regs", nr, "spills", ns, key)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
