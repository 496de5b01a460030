"""Compile the dense FP8 Triton kernels for given CUDA targets, without a GPU.

Triton bundles ptxas, so `python benchmarks/compile_check.py --targets 80 89 90` proves the
sm_80 path (W8A16, no FP8 instructions) really compiles, and reports per variant: registers,
spill bytes, shared memory and which matrix instructions the PTX uses (wgmma / mma.sync).
Exit status 1 if a variant that should compile for a target does not.

    python benchmarks/compile_check.py [--targets 80 90] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# Real targets even when called from a shell set up for CPU tests (read when kernels are defined).
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from quantgate.kernels.triton import act_quant, fp8_block_gemm, w8a16_gemm  # noqa: E402

_PTR_TYPES = {torch.float8_e4m3fn: "*fp8e4nv", torch.bfloat16: "*bf16", torch.float16: "*fp16",
              torch.float32: "*fp32", torch.int32: "*i32"}


@dataclass
class Variant:
    name: str
    kernel: object
    args: dict  # param -> torch dtype (pointer) | "i32" | "i32/16" (divisible by 16) | constexpr value
    min_capability: int
    options: dict = field(default_factory=dict)


def _source(v: Variant) -> ASTSource:
    signature, constexprs, attrs = {}, {}, {}
    for index, name in enumerate(v.kernel.arg_names):
        value = v.args[name]
        if isinstance(value, torch.dtype):
            signature[name] = _PTR_TYPES[value]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif value in ("i32", "i32/16"):
            signature[name] = "i32"
            if value == "i32/16":
                attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "constexpr"
            constexprs[name] = value
    return ASTSource(fn=v.kernel, signature=signature, constexprs=constexprs, attrs=attrs)


def _resources(cubin: bytes) -> dict:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text))
    return {"registers": int(found.get("REG", -1)), "spill_bytes": int(found.get("LOCAL", 0)) + int(found.get("STACK", 0))}


def compile_variant(v: Variant, capability: int) -> dict:
    try:
        compiled = triton.compile(_source(v), target=GPUTarget("cuda", capability, 32), options=v.options)
    except Exception as exc:  # report and continue: one broken variant must not hide the others
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    ptx = compiled.asm["ptx"]
    return {"ok": True, **_resources(compiled.asm["cubin"]), "shared_bytes": compiled.metadata.shared,
            "wgmma": "wgmma" in ptx, "mma_sync": "mma.sync" in ptx}


def variants() -> list[Variant]:
    out: list[Variant] = []
    for dtype in (torch.bfloat16, torch.float16):
        tag = "bf16" if dtype == torch.bfloat16 else "fp16"
        out.append(Variant(f"act_quant.group128.{tag}", act_quant._group_quant_kernel, {
            "x_ptr": dtype, "q_ptr": torch.float8_e4m3fn, "s_ptr": torch.float32, "M": "i32", "K": "i32/16",
            "stride_xm": "i32/16", "stride_qm": "i32/16", "stride_sm": "i32", "stride_sg": "i32",
            "GROUP": 128, "GROUPS_PER_PROGRAM": 8}, 89, {"num_warps": 4}))
        for static in (False, True):
            out.append(Variant(f"act_quant.row.{'static' if static else 'dynamic'}.{tag}", act_quant._row_quant_kernel, {
                "x_ptr": dtype, "q_ptr": torch.float8_e4m3fn, "s_ptr": torch.float32, "M": "i32", "K": "i32/16",
                "stride_xm": "i32/16", "stride_qm": "i32/16", "STATIC": static, "BLOCK": 4096}, 89, {"num_warps": 4}))
    w8a8_common = {"a_ptr": torch.float8_e4m3fn, "b_ptr": torch.float8_e4m3fn, "c_ptr": torch.bfloat16,
                   "a_scale_ptr": torch.float32, "b_scale_ptr": torch.float32, "bias_ptr": torch.bfloat16,
                   "partial_ptr": torch.float32, "counter_ptr": torch.int32, "M": "i32", "N": "i32/16",
                   "K": "i32/16", "split_k": "i32", "stride_am": "i32/16", "stride_bn": "i32/16", "stride_cm": "i32/16",
                   "stride_asm": "i32", "stride_asg": "i32", "stride_bsn": "i32", "stride_bsg": "i32",
                   "HAS_BIAS": False, "EVEN_K": True, "BLOCK_K": fp8_block_gemm.BLOCK_K}
    for largest, cfg in fp8_block_gemm.CONFIGS:
        for groupwise in (True, False):
            split = 4 if largest <= 16 else 1
            out.append(Variant(
                f"w8a8.{'block' if groupwise else 'channel'}.bm{cfg.block_m}.bn{cfg.block_n}.w{cfg.num_warps}"
                f".s{cfg.num_stages}.split{split}", fp8_block_gemm._w8a8_gemm_kernel,
                {**w8a8_common, "SCALE_BLOCK_N": 128 if groupwise else 1, "GROUPWISE": groupwise,
                 "SPLIT": split > 1, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "GROUP_M": cfg.group_m},
                89, {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}))
    for dtype in (torch.bfloat16, torch.float16):
        tag = "bf16" if dtype == torch.bfloat16 else "fp16"
        for largest, cfg in w8a16_gemm.CONFIGS:
            out_kind = 0 if not cfg.use_dot else (1 if dtype == torch.bfloat16 else 2)
            for groupwise in (True, False):
                split = 4 if largest <= 16 else 1
                out.append(Variant(
                    f"w8a16.{tag}.{'block' if groupwise else 'channel'}.out{out_kind}.bm{cfg.block_m}.bn{cfg.block_n}"
                    f".w{cfg.num_warps}.split{split}", w8a16_gemm._w8a16_gemm_kernel,
                    {"x_ptr": dtype, "w_ptr": torch.int32, "s_ptr": dtype, "c_ptr": dtype, "bias_ptr": dtype,
                     "partial_ptr": torch.float32, "counter_ptr": torch.int32, "M": "i32", "N": "i32/16",
                     "K": "i32/16", "split_k": "i32", "stride_xm": "i32/16", "stride_cm": "i32/16", "stride_sg": "i32/16",
                     "X_MUL": 2.0 ** 64, "S_MUL": 2.0 ** 56, "GROUPWISE": groupwise, "OUT": out_kind,
                     "HAS_BIAS": False, "SPLIT": split > 1, "EVEN_K": True, "BLOCK_M": cfg.block_m,
                     "BLOCK_N": cfg.block_n}, 80, {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}))
    return out


def _compile_job(job: tuple[str, int]) -> dict:
    name, capability = job
    variant = next(v for v in variants() if v.name == name)
    return {"variant": name, "capability": capability, **compile_variant(variant, capability)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[80, 89, 90], help="compute capabilities, e.g. 80 90")
    parser.add_argument("--only", default="", help="substring filter on variant names")
    parser.add_argument("--json", type=Path, help="write the full report here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel compilations")
    args = parser.parse_args(argv)
    jobs = [(v, cap) for v in variants() if args.only in v.name for cap in args.targets if cap >= v.min_capability]
    # Compilations are independent; one process each keeps ptxas and the MLIR passes in parallel.
    report, failed = [], 0
    print(f"{'variant':<62} {'sm':>3} {'ok':>3} {'regs':>5} {'spill':>6} {'smem':>7} mma", flush=True)
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = pool.map(_compile_job, [(v.name, cap) for v, cap in jobs])
        for (v, cap), row in zip(jobs, results):
            _print_row(v.name, cap, row)
            report.append(row)
            failed += not row["ok"]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(f"{len(report) - failed}/{len(report)} variants compiled")
    return 1 if failed else 0


def _print_row(name: str, cap: int, row: dict) -> None:
    if row["ok"]:
        mma = "wgmma" if row["wgmma"] else ("mma.sync" if row["mma_sync"] else "-")
        print(f"{name:<62} {cap:>3} {'yes':>3} {row['registers']:>5} {row['spill_bytes']:>6} "
              f"{row['shared_bytes']:>7} {mma}", flush=True)
    else:
        print(f"{name:<62} {cap:>3}  NO {row['error']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
