"""Device check of the Gluon block-scaled FP8 GEMM: correctness per config, then CUDA-graph times
against the Triton TMA kernel (tuned) and cuBLAS's block-wise F.scaled_mm.

    source benchmarks/gpu_env.sh && python scratch_s6/gluon/check_gluon.py

Writes $OUT/gluon_check.json when OUT is set. Compile or launch errors are printed per config
and do not stop the run. The kernel is warp-specialized (mbarrier handshakes between a producer
warp and two consumer warpgroups), so a protocol bug would hang rather than fail: every config
first runs on small shapes in a child process with a timeout, and a hang stops the script there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from quantgate.kernels.quant import expand_block_scale, quantize_weight_block
from quantgate.kernels.triton import act_quant, fp8_block_gemm, tuning
from quantgate.kernels.triton import fp8_block_gemm_gluon as G

CHECK_SHAPES = [(512, 4096, 4096), (2048, 4096, 14336), (8192, 14336, 4096), (300, 4096, 4224), (129, 4224, 4096)]
TIME_MS = [512, 2048, 8192]
TIME_KN = [(4096, 4096), (4096, 14336), (14336, 4096)]
SMOKE_SHAPES = [(77, 384, 272), (300, 4096, 4224), (1024, 1024, 1024)]
SMOKE_TIMEOUT_S = 150
TOL = 1e-3
T0 = time.monotonic()


def cfg_name(cfg) -> str:
    return f"bm{cfg.block_m}_bn{cfg.block_n}_s{cfg.num_stages}_w{cfg.num_warps}_g{cfg.group_m}"


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1][:400] if text else ''}"


def operands(m: int, k: int, n: int, seed: int = 0):
    """Quantized as the engine does: activations 1x128 (column-major scales, rows padded to 4 for
    cuBLAS), weights 128x128. Returns the unpadded views for the Triton/Gluon kernels too."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = (torch.randn(n, k, device="cuda", dtype=torch.float32, generator=g) * 0.02).to(torch.bfloat16)
    wq, ws = quantize_weight_block(w)
    xq, xs = act_quant.quantize_per_token_group(x, 128, column_major_scales=True, row_multiple=4)
    return {"xq_pad": xq, "xs_pad": xs, "a": xq[:m], "a_scale": xs[:m], "b": wq, "b_scale": ws}


def reference(ops: dict, k: int, n: int) -> torch.Tensor:
    a = ops["a"].double() * ops["a_scale"].double().repeat_interleave(128, dim=1)[:, :k]
    b = ops["b"].double() * expand_block_scale(ops["b_scale"].double(), n, k, (128, 128))
    return a @ b.t()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    # Against the float64 result rounded to the output dtype, as bench_linear.py does.
    return ((out.double() - ref.to(out.dtype).double()).abs().mean() / ref.abs().mean()).item()


def check(results: dict) -> None:
    for m, k, n in CHECK_SHAPES:
        ops = operands(m, k, n)
        ref = reference(ops, k, n)
        bias = torch.randn(n, device="cuda", dtype=torch.float32)
        for cfg in G.CANDIDATES:
            row = {"m": m, "k": k, "n": n, "config": cfg.__dict__}
            for dt, tag in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
                try:
                    out = G.w8a8_block_gemm_gluon(ops["a"], ops["a_scale"], ops["b"], ops["b_scale"], dt, config=cfg)
                    torch.cuda.synchronize()
                    row[f"err_{tag}"] = rel_err(out, ref)
                    row[f"finite_{tag}"] = bool(torch.isfinite(out).all())
                except Exception as exc:  # noqa: BLE001 - report and go on
                    row[f"error_{tag}"] = first_line(exc)
                    if "--trace" in sys.argv:
                        traceback.print_exc()
            if cfg == G.CANDIDATES[0]:
                try:
                    out = G.w8a8_block_gemm_gluon(ops["a"], ops["a_scale"], ops["b"], ops["b_scale"], torch.float16,
                                                  bias=bias.half(), config=cfg)
                    row["err_fp16_bias"] = rel_err(out, ref + bias.half().double()[None, :])
                except Exception as exc:  # noqa: BLE001
                    row["error_fp16_bias"] = first_line(exc)
            ok = row.get("err_fp16", 1.0) < TOL and row.get("finite_fp16", False)
            row["ok"] = ok
            results["check"].append(row)
            errs = " ".join(f"{key}={row[key]:.2e}" for key in ("err_fp16", "err_bf16", "err_fp16_bias") if key in row)
            fails = " ".join(f"{key}={row[key]}" for key in row if key.startswith("error_"))
            log(f"check M={m:<5} K={k:<5} N={n:<5} {cfg_name(cfg)}: {'OK ' if ok else 'BAD'} {errs} {fails}")
        # The Triton kernel on the same operands: the error level the Gluon one should match.
        try:
            out = fp8_block_gemm.w8a8_gemm(ops["a"], ops["a_scale"], ops["b"], ops["b_scale"], torch.float16,
                                           groupwise=True, tma=True)
            log(f"      triton tma fp16 err={rel_err(out, ref):.2e}")
        except Exception as exc:  # noqa: BLE001
            log(f"      triton tma: {first_line(exc)}")
        del ops, ref
        torch.cuda.empty_cache()


def timed(fn) -> tuple[float | None, str | None]:
    try:
        return tuning.graph_time_ms(fn) * 1e3, None
    except Exception as exc:  # noqa: BLE001
        return None, first_line(exc)


def bench(results: dict) -> None:
    names = [f"gluon_{cfg_name(c)}" for c in G.CANDIDATES]
    print(f"{'M':>5} {'K':>5} {'N':>5} {'cublas_us':>9} {'triton_us':>16} " +
          " ".join(f"{n[6:].replace('bm128_bn128_', ''):>18}" for n in names), flush=True)
    for m in TIME_MS:
        for k, n in TIME_KN:
            ops = operands(m, k, n)
            row = {"m": m, "k": k, "n": n}
            row["cublas_us"], row["cublas_error"] = timed(lambda: F.scaled_mm(
                ops["xq_pad"], ops["b"].t(), ops["xs_pad"], F.ScalingType.BlockWise1x128, ops["b_scale"].t(),
                F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16))
            row["triton_us"], row["triton_error"] = timed(lambda: fp8_block_gemm.w8a8_gemm(
                ops["a"], ops["a_scale"], ops["b"], ops["b_scale"], torch.bfloat16, groupwise=True, tma=True))
            for name, cfg in zip(names, G.CANDIDATES):
                row[f"{name}_us"], row[f"{name}_error"] = timed(lambda cfg=cfg: G.w8a8_block_gemm_gluon(
                    ops["a"], ops["a_scale"], ops["b"], ops["b_scale"], torch.bfloat16, config=cfg))
            peer = row["cublas_us"]

            def cell(us: float | None) -> str:
                if us is None:
                    return "err"
                return f"{us:8.1f}" + (f" ({peer / us:4.2f}x)" if peer else "")

            results["bench"].append(row)
            print(f"{m:>5} {k:>5} {n:>5} {cell(peer)[:9]:>9} {cell(row['triton_us']):>16} " +
                  " ".join(f"{cell(row[f'{nm}_us']):>18}" for nm in names), flush=True)
            for key, val in row.items():
                if key.endswith("_error") and val:
                    print(f"      {key}: {val}", flush=True)
            del ops
            torch.cuda.empty_cache()
    print("(x): cuBLAS time / this time; > 1 is faster than F.scaled_mm", flush=True)


def smoke() -> int:
    """Child process: every config on small shapes, bf16 + fp16 + bias; prints one line each."""
    bad = 0
    for m, k, n in SMOKE_SHAPES:
        try:
            ops = operands(m, k, n)
            ref = reference(ops, k, n)
        except Exception as exc:  # noqa: BLE001 - the quantizers may not take every shape
            log(f"smoke M={m} K={k} N={n}: operands failed ({first_line(exc)}), skipped")
            continue
        bias = torch.randn(n, device="cuda", dtype=torch.float32).half()
        for cfg in G.CANDIDATES:
            try:
                e16 = rel_err(G.w8a8_block_gemm_gluon(ops["a"], ops["a_scale"], ops["b"], ops["b_scale"],
                                                      torch.float16, config=cfg), ref)
                e16b = rel_err(G.w8a8_block_gemm_gluon(ops["a"], ops["a_scale"], ops["b"], ops["b_scale"],
                                                       torch.float16, bias=bias, config=cfg),
                               ref + bias.double()[None, :])
                torch.cuda.synchronize()
                ok = e16 < TOL and e16b < TOL
                bad += not ok
                log(f"smoke M={m} K={k} N={n} {cfg_name(cfg)}: {'OK ' if ok else 'BAD'} fp16 {e16:.2e} bias {e16b:.2e}")
            except Exception as exc:  # noqa: BLE001
                bad += 1
                log(f"smoke M={m} K={k} N={n} {cfg_name(cfg)}: ERROR {first_line(exc)}")
    return 1 if bad else 0


def run_smoke_child() -> bool:
    """False when the child hung (a deadlocked kernel cannot be stopped from inside the process)."""
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--smoke"], timeout=SMOKE_TIMEOUT_S,
                           capture_output=True, text=True)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        print(out, flush=True)
        log(f"SMOKE HUNG after {SMOKE_TIMEOUT_S}s (the last line above is the last config that finished): "
            "mbarrier protocol deadlock suspected; not running the rest")
        return False
    print(r.stdout + r.stderr[-3000:], flush=True)
    log(f"smoke child rc={r.returncode}")
    return True


def main() -> int:
    if "--smoke" in sys.argv:
        return smoke()
    torch.backends.cuda.matmul.allow_tf32 = False
    log(f"{torch.cuda.get_device_name()} torch {torch.__version__} "
        f"triton {__import__('triton').__version__}")
    results: dict = {"device": torch.cuda.get_device_name(), "check": [], "bench": []}
    if "--no-smoke" not in sys.argv and not run_smoke_child():
        return 1
    try:
        check(results)
    except Exception:  # noqa: BLE001 - still time what runs
        traceback.print_exc()
    if "--check-only" not in sys.argv:
        bench(results)
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "gluon_check.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
