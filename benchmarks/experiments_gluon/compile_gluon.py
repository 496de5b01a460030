"""Compile the Gluon block-scaled FP8 GEMM for sm_90 without a GPU and report resources.

    python scratch_s6/gluon/compile_gluon.py [--dump DIR]

Per CANDIDATES config, bf16 and fp16 output, with and without bias: registers (launch limit and
the setmaxnreg value of each partition), spills, shared memory, SASS QGMMA count, ptxas warnings
(C7514/C7515 wgmma serialization must be absent) and the instruction order (Q = QGMMA batch,
WAIT = WARPGROUP.DEPBAR, BAR = bar.sync, MBAR = mbarrier op, F = FFMA/FMUL run).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

try:
    from quantgate.kernels.triton import fp8_block_gemm_gluon as g  # noqa: E402
except ImportError:
    from kernels.triton import fp8_block_gemm_gluon as g  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def source(cfg: g.GluonGemmConfig, out: str = "bf16", bias: bool = False) -> GluonASTSource:
    fp8 = gl.float8e4nv
    out_gl = gl.bfloat16 if out == "bf16" else gl.float16
    a_l = gl.NVMMASharedLayout.get_default_for([cfg.block_m, g.BLOCK_K], fp8)
    b_l = gl.NVMMASharedLayout.get_default_for([cfg.block_n, g.BLOCK_K], fp8)
    c_block = [g.CONSUMER_ROWS, cfg.block_n]
    c_l = gl.NVMMASharedLayout.get_default_for(c_block, out_gl)
    signature = {
        "a_desc": f"tensordesc<fp8e4nv[{cfg.block_m}, {g.BLOCK_K}],{a_l!r}>",
        "b_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {g.BLOCK_K}],{b_l!r}>",
        "c_desc": f"tensordesc<{out}[{c_block[0]}, {c_block[1]}],{c_l!r}>",
        "a_scale_ptr": "*fp32", "b_scale_ptr": "*fp32", "bias_ptr": f"*{out}",
        "M": "i32", "N": "i32", "K": "i32", "stride_asm": "i32", "stride_asg": "i32", "stride_bsn": "i32",
        "stride_bsg": "i32", "HAS_BIAS": "constexpr", "GROUP_M": "constexpr", "NUM_STAGES": "constexpr",
    }
    constexprs = {"HAS_BIAS": bias, "GROUP_M": cfg.group_m, "NUM_STAGES": cfg.num_stages}
    names = g._w8a8_block_gluon_kernel.arg_names
    attrs = {(names.index(p),): [["tt.divisibility", 16]]
             for p in ("a_scale_ptr", "b_scale_ptr", "bias_ptr", "N", "K")}
    return GluonASTSource(fn=g._w8a8_block_gluon_kernel, signature=signature, constexprs=constexprs, attrs=attrs)


def ptxas_warnings(ptx: str) -> list[str]:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k.ptx"
        p.write_text(ptx)
        r = subprocess.run([str(BIN / "ptxas"), "-arch=sm_90a", "-v", "--warn-on-spills", str(p), "-o",
                            str(Path(d) / "k.cubin")], capture_output=True, text=True)
    return [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]


def sass_of(cubin: bytes) -> tuple[str, str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                             text=True).stdout
        sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    return res, sass


def loop_order(sass: str) -> str:
    """The sequence of QGMMA batches, wgmma waits, barriers, TMA loads and FFMA runs in SASS order."""
    seq: list[str] = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if not m:
            continue
        ins = m.group(2)
        op = ins.split()[0] if not ins.startswith("@") else ins.split()[1]
        if op.startswith("QGMMA"):
            tag = "Q"
        elif op.startswith("WARPGROUP.DEPBAR"):
            tag = "WAIT" + (re.search(r"gsb0,\s*(\S+)", ins) or re.search(r"(0x\w+|\d+)$", ins) or [None, "?"])[1]
        elif op.startswith("WARPGROUP.ARRIVE"):
            tag = "ARR"
        elif op.startswith("BAR.SYNC") or op == "BAR":
            tag = "BAR"
        elif op.startswith("UTMALDG"):
            tag = "TMA"
        elif op.startswith("UTMASTG"):
            tag = "TMASTORE"
        elif op.startswith("SYNCS"):
            tag = "MBAR"
        elif op.startswith("FFMA") or op.startswith("FMUL"):
            tag = "F"
        elif op.startswith("BRA") or op.startswith("EXIT"):
            tag = f"{op}@{m.group(1)}"
        else:
            continue
        if seq and seq[-1].split("x")[0] == tag and tag in ("Q", "F", "MBAR"):
            n = int(seq[-1].split("x")[1]) + 1 if "x" in seq[-1] else 2
            seq[-1] = f"{tag}x{n}"
        else:
            seq.append(tag)
    return " ".join(seq)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", type=Path, help="write ttgir/ptx/sass per variant here")
    parser.add_argument("--order", action="store_true", help="print the SASS instruction order")
    args = parser.parse_args()
    variants = [(cfg, out, bias) for cfg in g.CANDIDATES for out in ("bf16", "fp16") for bias in (False, True)]
    failed = 0
    for cfg, out, bias in variants:
        name = f"bm{cfg.block_m}.bn{cfg.block_n}.s{cfg.num_stages}.w{cfg.num_warps}.g{cfg.group_m}.{out}{'.bias' if bias else ''}"
        try:
            k = triton.compile(source(cfg, out, bias), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": cfg.num_warps})
        except Exception as exc:  # report every variant
            failed += 1
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:2000]}")
            continue
        res, sass = sass_of(k.asm["cubin"])
        failed += bool(re.search(r"LOCAL:[1-9]", res))
        found = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", res))
        warns = [w for w in ptxas_warnings(k.asm["ptx"])
                 if "arn" in w or "serializ" in w.lower() or "spill" in w or "C751" in w]
        serialized = [w for w in warns if "C7514" in w or "C7515" in w or "serializ" in w.lower()]
        setmaxnreg = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", k.asm["ptx"])
        qgmma = len(re.findall(r"\bQGMMA\.", sass))
        print(f"{name}: regs {found.get('REG')} spill(local) {found.get('LOCAL', 0)} stack {found.get('STACK', 0)} "
              f"smem {k.metadata.shared} QGMMA {qgmma} bar.sync(ptx) {k.asm['ptx'].count('bar.sync')} "
              f"setmaxnreg {sorted({int(v) for _, v in setmaxnreg})} serialized {'YES' if serialized else 'no'}")
        for w in warns:
            print(f"   ptxas: {w}")
        if args.order:
            print(f"   order: {loop_order(sass)}")
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{name}.ttgir").write_text(k.asm["ttgir"])
            (args.dump / f"{name}.ptx").write_text(k.asm["ptx"])
            (args.dump / f"{name}.sass").write_text(sass)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
