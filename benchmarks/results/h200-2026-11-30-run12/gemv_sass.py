"""Compile marlin's W8A16 GEMV for sm_90 on a machine without a GPU (Triton's bundled ptxas) and
print where its main loop issues the weight loads: the SASS offsets of the loop and of each
128-bit global load, plus instruction counts. Default config (64 columns, 4 warps, one K tile).

    python benchmarks/results/h200-2026-11-30-run12/gemv_sass.py [CONSTEXPR=VALUE ...]

Extra arguments override the kernel's constexprs (e.g. TILES=2) for kernels of other commits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from quantgate.kernels.triton import w8a16_gemm as w8

RUNTIME = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*bf16", "c_ptr": "*bf16", "bias_ptr": "*bf16",
           "partial_ptr": "*fp32", "counter_ptr": "*i32", "N": "i32", "K": "i32", "split_k": "i32", "stride_sg": "i32"}
CONSTEXPRS = {"X_MUL": 2.0**64, "S_MUL": 2.0**56, "GROUPWISE": True, "HAS_BIAS": False, "SPLIT": True,
              "EVEN_K": True, "BLOCK_N": 64, "TILES": 1, "PDL": False}


def main(overrides: list[str]) -> None:
    consts = dict(CONSTEXPRS)
    for item in overrides:
        name, value = item.split("=")
        consts[name] = int(value) if value.lstrip("-").isdigit() else value == "True"
    signature = {**RUNTIME, **{name: "constexpr" for name in consts}}
    divisible = [i for i, name in enumerate(RUNTIME) if name not in ("split_k",)]  # pointers, N, K, stride: 16
    attrs = {(i,): [["tt.divisibility", 16]] for i in divisible}
    kernel = triton.compile(ASTSource(w8._w8a16_gemv_kernel, signature, consts, attrs),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 1})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "gemv.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
        sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    lines = [line.strip() for line in sass.splitlines() if line.strip().startswith("/*")]
    for op in ("LDG", "FFMA", "LOP3", "SHF", "PRMT"):
        print(f"{op:5s} {sum(op in line for line in lines)}")
    for line in lines:
        if "LDG.E.128" in line or "BRA" in line and "0x" in line.split("BRA")[1][:8]:
            print(line.split(";")[0].strip())


if __name__ == "__main__":
    main(sys.argv[1:])
