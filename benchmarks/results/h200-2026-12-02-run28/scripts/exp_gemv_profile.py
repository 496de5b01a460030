"""Experiment: one eager launch each of the M=1 W8A16 GEMV (base, s=5) and its no-compute
variant (s=8) at 4096x14336, for Nsight Compute. GPU only."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from exp_gemv_variants import variant  # noqa: E402
from quantgate.kernels.triton import w8a16_gemm as base  # noqa: E402

k, n = 4096, 14336
w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
packed = base.pack_weight(w)
scale = (torch.rand(k // 128, n, device="cuda") + 0.5).to(torch.bfloat16) * 1e-2
ws = torch.zeros(base.workspace_size(n), dtype=torch.int32, device="cuda")
x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
flush = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
for name, s in (("base", 5), ("nocompute", 8), ("base", 8)):
    mod = variant(name)
    for _ in range(2):
        flush.zero_()
        mod.w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws, config=base.W8A16Config(1, 64, 4, 1, s))
torch.cuda.synchronize()
