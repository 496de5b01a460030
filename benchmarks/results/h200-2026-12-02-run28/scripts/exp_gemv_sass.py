"""Experiment: dump the M=1 W8A16 GEMV's SASS / PTX / TTGIR (block and channel scales). GPU only."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from quantgate.kernels.triton import w8a16_gemm as base

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
k, n = 4096, 14336
w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
packed = base.pack_weight(w)
x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
ws = torch.zeros(base.workspace_size(n), dtype=torch.int32, device="cuda")
for groupwise in (True, False):
    scale = (torch.rand(k // 128 if groupwise else 1, n, device="cuda") + 0.5).to(torch.bfloat16) * 1e-2
    base.w8a16_gemm(x, packed, scale, groupwise=groupwise, workspace=ws, config=base.W8A16Config(1, 64, 4, 1, 5))
for i, (compiled, _) in enumerate(base._gemv_launch._compiled.values()):
    for kind in ("sass", "ptx", "ttgir"):
        (out / f"gemv{i}.{kind}").write_text(compiled.asm[kind])
    print(i, compiled.n_regs, compiled.n_spills)
