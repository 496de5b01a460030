"""Run 10, call 6: one launch each of the marlin kernels the tuner picks at 4096x14336 (the TMA dot
kernel at M = 16, split target 7; the GEMV at M = 1), for Nsight Compute:
    ncu --clock-control none -k regex:w8a16 --launch-skip 3 --launch-count 1 --section ... \
        python <this file> {dot|gemv}
"""
import sys

import torch

from quantgate.kernels.triton.w8a16_gemm import CANDIDATES, SM90_CANDIDATES, pack_weight, w8a16_gemm, workspace_size

kind = sys.argv[1]
k, n = 4096, 14336
w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
packed = pack_weight(w)
scale = torch.rand(k // 128, n, device="cuda", dtype=torch.bfloat16) + 0.5
ws = torch.zeros(workspace_size(n), dtype=torch.int32, device="cuda")
m, config = (16, SM90_CANDIDATES[16][2]) if kind == "dot" else (1, CANDIDATES[1][0])
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws, config=config)
torch.cuda.synchronize()
print(kind, config)
