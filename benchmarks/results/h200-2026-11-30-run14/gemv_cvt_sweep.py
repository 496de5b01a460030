"""marlin's M = 1 GEMV on issue 3's marlin shapes: weights converted by moving bits (the tree
before) against the e4m3x2 -> f16x2 conversion instruction (`CVT`), for every GEMV candidate
plus splits the CVT kernel's lower register count allows (6 programs per SM). Block-scaled and
per-channel. Timing is bench_linear's: a CUDA graph over rotating weight copies (out of L2), no
PDL; the bf16 cuBLAS peer and the copy bandwidth are measured in the same process.

    python benchmarks/results/h200-2026-11-30-run14/gemv_cvt_sweep.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import bench_linear  # noqa: E402
from quantgate.kernels import quant  # noqa: E402
from quantgate.kernels.triton import w8a16_gemm as w8  # noqa: E402

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))  # (K, N)
EXTRA = (w8.W8A16Config(1, 64, 4, 1, 6), w8.W8A16Config(1, 64, 4, 1, 12), w8.W8A16Config(1, 64, 4, 1, 3),
         w8.W8A16Config(1, 128, 4, 1, 6), w8.W8A16Config(1, 32, 4, 1, 6), w8.W8A16Config(1, 64, 4, 1, 6, tiles=2))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    bandwidth = bench_linear.copy_bandwidth()
    rows = []
    for k, n in SHAPES:
        w = torch.randn(n, k, device="cuda") * 0.02
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        bf16 = [w.to(torch.bfloat16) for _ in range(bench_linear._copies(2 * k * n, l2))]
        bf16_us = bench_linear.graph_ms([lambda wb=wb: x @ wb.t() for wb in bf16], 0.03) * 1e3
        for groupwise in (True, False):
            wq, ws = quant.quantize_weight_block(w) if groupwise else quant.quantize_weight_channel(w)
            # marlin keeps the scales in bf16, per column: the reference takes them as the kernel does.
            if groupwise:
                scale = ws.to(torch.bfloat16).repeat_interleave(128, 0)[:n].t().contiguous()  # [K/128, N]
                full = scale.double().t().repeat_interleave(128, 1)[:, :k]
            else:
                scale = ws.reshape(1, n).to(torch.bfloat16)
                full = scale.double().t()
            w_ref = quant.fp8_to_float(wq).double() * full
            ref = x.double() @ w_ref.t()
            copies = [w8.pack_weight(wq) for _ in range(bench_linear._copies(k * n, l2))]
            workspace = torch.zeros(w8.workspace_size(n), dtype=torch.int32, device="cuda")
            for cvt in (0, 2, 4):
                w8.GEMV_CVT = cvt
                for cfg in (None, *w8.candidates_for(1), *EXTRA):
                    def call(p, cfg=cfg):
                        return w8.w8a16_gemm(x, p, scale, groupwise=groupwise, workspace=workspace, config=cfg)
                    o = call(copies[0])
                    err = ((o.double() - ref).abs().mean() / ref.abs().mean()).item()
                    us = bench_linear.graph_ms([lambda p=p: call(p) for p in copies], 0.02) * 1e3
                    rows.append({"k": k, "n": n, "scheme": "block" if groupwise else "channel", "cvt": cvt,
                                 "config": str(cfg) if cfg else "tuner", "us": us, "x_bf16": bf16_us / us,
                                 "copy_bw_frac": k * n / (us * 1e-6) / bandwidth, "err": err, "bf16_us": bf16_us})
    regs = {str(key[-1]) + " " + str(key[0]): (c.n_regs, c.n_spills) for key, (c, _) in w8._gemv_launch._compiled.items()}
    (out / "gemv_cvt.json").write_text(json.dumps({"copy_bw": bandwidth, "rows": rows, "regs": regs}, indent=1))
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print("K x N scheme cvt | tuner us x_bf16 bw | best us x_bf16 bw config | max err")
    for k, n in SHAPES:
        for scheme in ("block", "channel"):
            for cvt in (0, 2, 4):
                sel = [r for r in rows if (r["k"], r["n"], r["scheme"], r["cvt"]) == (k, n, scheme, cvt)]
                tuner = next(r for r in sel if r["config"] == "tuner")
                best = min((r for r in sel if r["config"] != "tuner"), key=lambda r: r["us"])
                short = best["config"].replace("W8A16Config(block_m=1, ", "").replace(", tma=False, prefetch=0)", "")
                print(f"{k}x{n} {scheme:7s} {cvt} | {tuner['us']:6.2f} {tuner['x_bf16']:.3f} "
                      f"{tuner['copy_bw_frac']:.3f} | {best['us']:6.2f} {best['x_bf16']:.3f} {best['copy_bw_frac']:.3f} "
                      f"{short} | {max(r['err'] for r in sel):.2e}")
    for key, (nr, ns) in sorted(regs.items()):
        print("regs", nr, "spills", ns, key[:140])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
