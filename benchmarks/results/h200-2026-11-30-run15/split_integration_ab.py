"""Why marlin's integrated split path (kernels/triton/w8a16_split.py at 88ffb8d) measured 5-30%
slower than this run's sweep kernels (split_mma_sweep.py): the same configurations A/B, the split
kernel and the GEMM timed together and apart, bench_linear's graph timing, bf16, no PDL.

    python benchmarks/results/h200-2026-11-30-run15/split_integration_ab.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_linear  # noqa: E402
import split_mma_sweep as sweep  # noqa: E402
from quantgate.kernels import quant  # noqa: E402
from quantgate.kernels.triton import w8a16_split as ws  # noqa: E402
from quantgate.kernels.triton.pdl import launch_options  # noqa: E402
from quantgate.kernels.triton.w8a16_gemm import workspace_size  # noqa: E402


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for (k, n), m, groupwise in (((4096, 14336), 1, True), ((4096, 14336), 1, False), ((4096, 4096), 1, True),
                                 ((4096, 14336), 16, True), ((14336, 4096), 1, True)):
        dtype = torch.bfloat16
        w = torch.randn(n, k, device="cuda") * 0.02
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        wq, wsc = quant.quantize_weight_block(w) if groupwise else quant.quantize_weight_channel(w)
        copies = bench_linear._copies(k * n, l2)
        fp8 = [wq.clone() for _ in range(copies)]
        scale = (wsc.to(dtype).repeat_interleave(128, 0)[:n].contiguous() if groupwise  # [N, K groups]
                 else wsc.reshape(n, 1).to(dtype))
        packed = [ws.pack_weight_rows(q) for q in fp8]
        workspace = torch.zeros(workspace_size(n), dtype=torch.int32, device="cuda")
        o = torch.empty(m, n, dtype=dtype, device="cuda")
        for cfg in (ws.SplitConfig(16 if m == 1 else 32, 64, 4, 6, 2), ws.SplitConfig(16 if m == 1 else 32, 64, 4, 4, 4)):
            rec = {"k": k, "n": n, "m": m, "scheme": "block" if groupwise else "channel", "cfg": str(cfg)}
            full = [lambda p=p: ws.w8a16_split_gemm(x, p, scale, groupwise=groupwise, scale_block_n=128,
                                                    workspace=workspace, config=cfg) for p in packed]
            rec["integrated_us"] = bench_linear.graph_ms(full, 0.02) * 1e3
            # the GEMM alone, on the split the first call left in the scratch
            terms, k_pad = 2, k
            xs = ws.device_buffer(x.device, "w8a16_split_x", 1, torch.uint8)[:terms * m * k_pad]
            xs = xs.view(torch.float8_e4m3fn).view(terms * m, k_pad)
            xsc = ws.device_buffer(x.device, "w8a16_split_scales", 1, torch.float32)
            options = launch_options(x.device)
            gemm = [lambda p=p: ws._launch(x, p, xs, xsc, scale, o, None, workspace, groupwise, 128, cfg, None, options)
                    for p in packed]
            rec["integrated_gemm_us"] = bench_linear.graph_ms(gemm, 0.02) * 1e3
            layers = [sweep.SplitMMA(q, wsc, groupwise, m, dtype, cfg.block_n, cfg.num_stages, cfg.split_per_sm)
                      for q in fp8]
            rec["sweep_us"] = bench_linear.graph_ms([lambda l=l: l(x, o) for l in layers], 0.02) * 1e3
            rows.append(rec)
            print({key: (round(v, 2) if isinstance(v, float) else v) for key, v in rec.items()}, flush=True)
    (out / "split_integration_ab.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
