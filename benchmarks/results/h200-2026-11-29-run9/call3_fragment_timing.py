"""Call 3 of run 9: graph times of the Gluon fragment kernel against the tuner default and bf16
(runs at commit 2810cb8, where w8a16_mma.py and the fragment configs exist):
    QUANTGATE_COMMIT=2810cb8 bash -c "source benchmarks/gpu_env.sh; python <this file>"
"""
import sys, torch
sys.path.insert(0, ".")
from quantgate.kernels.triton.w8a16_gemm import CANDIDATES, pack_weight, w8a16_gemm, workspace_size
from quantgate.kernels.triton.tuning import graph_time_ms
torch.manual_seed(0)
for k, n in ((4096, 4096), (4096, 14336), (14336, 4096)):
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
    packed = pack_weight(w)
    scale = torch.rand(k // 128, n, device="cuda", dtype=torch.bfloat16) + 0.5
    ws = torch.zeros(workspace_size(n), dtype=torch.int32, device="cuda")
    wb = w.to(torch.bfloat16)
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = (x.double() @ (w.double() * scale.double().repeat_interleave(128, 0).t()).t())
        t_bf16 = graph_time_ms(lambda: x @ wb.t()) * 1e3
        row = [f"K={k} N={n} M={m} bf16 {t_bf16:.1f}"]
        for cfg in CANDIDATES[1 if m == 1 else 16]:
            if not cfg.fragments and cfg != CANDIDATES[1 if m == 1 else 16][0]:
                continue
            out = w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws, config=cfg)
            err = ((out.double() - ref).abs().mean() / ref.abs().mean()).item()
            t = graph_time_ms(lambda: w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws, config=cfg)) * 1e3
            row.append(f"{'F' if cfg.fragments else 'D'}{cfg.num_warps}/{cfg.split_per_sm} {t:.1f}us x{t_bf16 / t:.2f} e{err:.0e}")
        print(" | ".join(row), flush=True)
