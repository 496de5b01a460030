"""Compile the dense FP8 Triton kernels for given CUDA targets, without a GPU.

Triton bundles ptxas, so `python benchmarks/compile_check.py --targets 80 89 90` proves the
sm_80 path (W8A16, no FP8 instructions) really compiles, and reports per variant: registers,
spill bytes, shared memory, which matrix instructions the PTX uses (wgmma / mma.sync) and which
the SASS has (QGMMA: FP8 warpgroup MMA on sm_90), and whether TMA loads are used.
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
        elif isinstance(value, str) and value.startswith("tensordesc"):
            signature[name] = value
        elif value in ("i32", "i32/16"):
            signature[name] = "i32"
            if value == "i32/16":
                attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "constexpr"
            constexprs[name] = value
    return ASTSource(fn=v.kernel, signature=signature, constexprs=constexprs, attrs=attrs)


def _resources(cubin: bytes) -> dict:
    """Registers and spills, and the SASS matrix instructions (QGMMA: Hopper FP8 warpgroup MMA,
    HGMMA: its 16-bit form, QMMA/HMMA: mma.sync) and whether TMA loads (UTMALDG) are used."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True).stdout
    found = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text))
    sass_mma = sorted(set(re.findall(r"\b([QH]GMMA|QMMA|HMMA)\.", sass)))
    return {"registers": int(found.get("REG", -1)), "spill_bytes": int(found.get("LOCAL", 0)) + int(found.get("STACK", 0)),
            "sass_mma": "+".join(sass_mma) or "-", "tma": "UTMALDG" in sass}


def compile_variant(v: Variant, capability: int) -> dict:
    try:
        compiled = triton.compile(_source(v), target=GPUTarget("cuda", capability, 32), options=v.options)
    except Exception as exc:  # report and continue: one broken variant must not hide the others
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    ptx = compiled.asm["ptx"]
    return {"ok": True, **_resources(compiled.asm["cubin"]), "shared_bytes": compiled.metadata.shared,
            "wgmma": "wgmma" in ptx, "mma_sync": "mma.sync" in ptx}


def variants() -> list[Variant]:
    """Every kernel variant the dense linear backends launch: each candidate config of the tuning
    tables, block and channel scales, bf16 and fp16 activations."""
    out: list[Variant] = []
    dtypes = ((torch.bfloat16, "bf16"), (torch.float16, "fp16"))
    for dtype, tag in dtypes:
        out.append(Variant(f"act_quant.group128.{tag}", act_quant._group_quant_kernel, {
            "x_ptr": dtype, "q_ptr": torch.float8_e4m3fn, "s_ptr": torch.float32, "M": "i32", "K": "i32/16",
            "stride_xm": "i32/16", "stride_qm": "i32/16", "stride_sm": "i32", "stride_sg": "i32",
            "GROUP": 128, "GROUPS_PER_PROGRAM": 8, "PDL": False}, 89, {"num_warps": 4}))
        for static in (False, True):
            out.append(Variant(f"act_quant.row.{'static' if static else 'dynamic'}.{tag}", act_quant._row_quant_kernel, {
                "x_ptr": dtype, "q_ptr": torch.float8_e4m3fn, "s_ptr": torch.float32, "M": "i32", "K": "i32/16",
                "stride_xm": "i32/16", "stride_qm": "i32/16", "STATIC": static, "BLOCK": 4096, "PDL": False}, 89,
                {"num_warps": 4}))

    def scales(groupwise: bool) -> dict:
        return {"SCALE_BLOCK_N": 128 if groupwise else 1, "GROUPWISE": groupwise}

    def name(kind: str, groupwise: bool, tag: str, cfg, extra: str = "") -> str:
        return (f"{kind}.{tag}.{'block' if groupwise else 'channel'}.bm{cfg.block_m}.bn{cfg.block_n}"
                f".w{cfg.num_warps}.s{cfg.num_stages}{extra}")

    g = fp8_block_gemm
    for dtype, tag in dtypes:
        for cfg in g.SMALL_M_CANDIDATES:
            for groupwise in (True, False):
                out.append(Variant(name("w8a8.small_m", groupwise, tag, cfg), g._w8a8_small_m_kernel, {
                    "x_ptr": dtype, "w_ptr": torch.float8_e4m3fn, "ws_ptr": torch.float32, "c_ptr": dtype,
                    "bias_ptr": dtype, "partial_ptr": torch.float32, "counter_ptr": torch.int32, "M": "i32",
                    "N": "i32/16", "K": "i32/16", "split_k": "i32", "stride_xm": "i32/16", "stride_wn": "i32/16",
                    "stride_cm": "i32/16", "stride_wsn": "i32", "stride_wsg": "i32", **scales(groupwise),
                    "HAS_BIAS": False, "SPLIT": True, "EVEN_K": True, "BLOCK_M": cfg.block_m,
                    "BLOCK_N": cfg.block_n, "BLOCK_K": g.BLOCK_K, "PDL": False, "STAGES": cfg.num_stages}, 89,
                    {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}))
    tiled = {c for cands in g.TILED_CANDIDATES.values() for c in cands} | set(g.TILED_LARGE)
    for cfg in sorted(tiled, key=lambda c: (c.block_m, c.block_n, c.num_warps, c.num_stages, c.split_per_sm)):
        for groupwise in (True, False):
            out.append(Variant(name("w8a8.tiled", groupwise, "bf16", cfg, f".split{int(bool(cfg.split_per_sm))}"),
                               g._w8a8_gemm_kernel, {
                "a_ptr": torch.float8_e4m3fn, "b_ptr": torch.float8_e4m3fn, "c_ptr": torch.bfloat16,
                "a_scale_ptr": torch.float32, "b_scale_ptr": torch.float32, "bias_ptr": torch.bfloat16,
                "partial_ptr": torch.float32, "counter_ptr": torch.int32, "M": "i32", "N": "i32/16",
                "K": "i32/16", "split_k": "i32", "stride_am": "i32/16", "stride_bn": "i32/16", "stride_cm": "i32/16",
                "stride_asm": "i32", "stride_asg": "i32", "stride_bsn": "i32", "stride_bsg": "i32", **scales(groupwise),
                "HAS_BIAS": False, "SPLIT": bool(cfg.split_per_sm), "EVEN_K": True, "BLOCK_M": cfg.block_m,
                "BLOCK_N": cfg.block_n, "BLOCK_K": g.BLOCK_K, "GROUP_M": cfg.group_m, "STAGES": cfg.num_stages,
                "PDL": False}, 89,
                {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}))
    for cfg in g.TMA_CANDIDATES:
        for groupwise in (True, False):
            out.append(Variant(name("w8a8.tma", groupwise, "bf16", cfg), g._w8a8_tma_kernel, {
                "a_desc": f"tensordesc<fp8e4nv[{cfg.block_m}, {g.BLOCK_K}]>",
                "b_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {g.BLOCK_K}]>", "c_ptr": torch.bfloat16,
                "a_scale_ptr": torch.float32, "b_scale_ptr": torch.float32, "bias_ptr": torch.bfloat16,
                "M": "i32", "N": "i32/16", "K": "i32/16", "stride_cm": "i32/16", "stride_asm": "i32",
                "stride_asg": "i32", "stride_bsn": "i32", "stride_bsg": "i32", **scales(groupwise),
                "HAS_BIAS": False, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": g.BLOCK_K,
                "GROUP_M": cfg.group_m, "STAGES": cfg.num_stages, "PDL": False}, 90,
                {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}))

    w = w8a16_gemm
    common = {"w_ptr": torch.int32, "partial_ptr": torch.float32, "counter_ptr": torch.int32, "K": "i32/16",
              "split_k": "i32", "stride_sg": "i32/16", "X_MUL": 2.0 ** 64, "S_MUL": 2.0 ** 56, "HAS_BIAS": False,
              "EVEN_K": True}
    configs = ({c for cands in w.CANDIDATES.values() for c in cands} | set(w.LARGE_M)
               | {c for cands in w.SM90_CANDIDATES.values() for c in cands})
    for dtype, tag in dtypes:
        ptrs = {"x_ptr": dtype, "s_ptr": dtype, "c_ptr": dtype, "bias_ptr": dtype}
        for cfg in sorted(configs, key=lambda c: (c.block_m, c.block_n, c.num_warps, c.num_stages, c.tiles,
                                                  c.split_per_sm, c.tma, c.prefetch)):
            split = bool(cfg.split_per_sm)
            for groupwise in (True, False):
                if cfg.block_m == 1:
                    out.append(Variant(name("w8a16.gemv", groupwise, tag, cfg, f".split{int(split)}.t{cfg.tiles}"),
                                       w._w8a16_gemv_kernel, {
                        **common, **ptrs, "N": "i32/16", "GROUPWISE": groupwise, "SPLIT": split,
                        "BLOCK_N": cfg.block_n, "TILES": cfg.tiles, "PDL": False}, 80,
                        {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}))
                else:
                    tma = f".tma.pf{cfg.prefetch}" if cfg.tma else ""
                    out.append(Variant(name("w8a16.dot", groupwise, tag, cfg, f".split{int(split)}{tma}"),
                                       w._w8a16_gemm_kernel, {
                        **common, **ptrs, "M": "i32", "N": "i32/16", "stride_xm": "i32/16", "stride_cm": "i32/16",
                        "w_desc": f"tensordesc<i32[{w.PLANE_K}, {cfg.block_n}]>" if cfg.tma else None,
                        "GROUPWISE": groupwise, "OUT": 1 if dtype == torch.bfloat16 else 2, "SPLIT": split,
                        "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "PDL": cfg.tma, "TMA": cfg.tma,
                        "PREFETCH": cfg.prefetch, "STAGES": cfg.num_stages}, 90 if cfg.tma else 80,
                        {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}))
    # The PDL variant (sm_90: griddepcontrol) of the GEMV default.
    cfg = w.CANDIDATES[1][0]
    out.append(Variant(name("w8a16.gemv", True, "bf16", cfg, ".split1.pdl"), w._w8a16_gemv_kernel, {
        **common, "x_ptr": torch.bfloat16, "s_ptr": torch.bfloat16, "c_ptr": torch.bfloat16, "bias_ptr": torch.bfloat16,
        "N": "i32/16", "GROUPWISE": True, "SPLIT": True, "BLOCK_N": cfg.block_n, "TILES": cfg.tiles, "PDL": True},
        90, {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}))
    # Deduplicate configs that differ only in what the compiled kernel does not see (split target).
    return list({v.name: v for v in out}.values())


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
    print(f"{'variant':<62} {'sm':>3} {'ok':>3} {'regs':>5} {'spill':>6} {'smem':>7} {'ptx mma':<8} sass", flush=True)
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
              f"{row['shared_bytes']:>7} {mma:<8} {row['sass_mma']}{' TMA' if row['tma'] else ''}", flush=True)
    else:
        print(f"{name:<62} {cap:>3}  NO {row['error']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
