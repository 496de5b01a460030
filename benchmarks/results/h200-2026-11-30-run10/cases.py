"""What the run-10 timing scripts (tma_stream.py, w8a16_tma_mma.py) share: issue 3's marlin
shapes with random block-scaled FP8 weights, each with its peers timed in the same process (bf16
cuBLAS and the tuner's pick of today's marlin kernels), and the timing of a list of candidate
launches against the float64 reference. Graph times: tuning.graph_time_ms (cold L2, a kernel
before, PDL), in us."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from quantgate.kernels.triton.tuning import graph_time_ms
from quantgate.kernels.triton.w8a16_gemm import pack_weight, w8a16_gemm, workspace_size

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))  # (K, N)


@dataclass
class Case:
    k: int
    n: int
    m: int
    x: torch.Tensor  # [M, K] bf16
    packed: torch.Tensor  # k-planes int32
    scale: torch.Tensor  # [K / 128, N] bf16 block scales, per column
    workspace: torch.Tensor
    ref: torch.Tensor  # float64 [M, N]
    bf16_us: float
    today_us: float
    today_err: float

    def err(self, out: torch.Tensor) -> float:
        """Mean |out - ref| / mean |ref|."""
        return ((out.double() - self.ref).abs().mean() / self.ref.abs().mean()).item()


def cases(ms: Iterable[int]) -> Iterator[Case]:
    """Every (K, N) of SHAPES and M of `ms`, one weight per (K, N); seeded, so runs see the same data."""
    torch.manual_seed(0)
    for k, n in SHAPES:
        w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
        packed = pack_weight(w)
        scale = torch.rand(k // 128, n, device="cuda", dtype=torch.bfloat16) + 0.5
        ws = torch.zeros(workspace_size(n), dtype=torch.int32, device="cuda")
        wb = w.to(torch.bfloat16)
        w_ref = w.double() * scale.double().repeat_interleave(128, 0).t()
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            case = Case(k, n, m, x, packed, scale, ws, x.double() @ w_ref.t(), 0.0, 0.0, 0.0)
            case.bf16_us = graph_time_ms(lambda: x @ wb.t()) * 1e3
            case.today_err = case.err(w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws))
            case.today_us = graph_time_ms(lambda: w8a16_gemm(x, packed, scale, groupwise=True, workspace=ws)) * 1e3
            yield case


def time_candidates(case: Case, candidates: Iterable[tuple[dict, Callable[[], torch.Tensor]]]) -> list[dict]:
    """One row per candidate (its fields, then us and err) that ran; failures are printed."""
    rows = []
    for fields, launch in candidates:
        try:
            err = case.err(launch())
            us = graph_time_ms(launch) * 1e3
        except Exception as exc:  # noqa: BLE001 - e.g. a config that needs more shared memory than there is
            print(f"  K={case.k} N={case.n} M={case.m} {fields}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        rows.append(dict(k=case.k, n=case.n, m=case.m, **fields, us=us, err=err, bf16_us=case.bf16_us,
                         today_us=case.today_us, today_err=case.today_err))
    return rows


def report(case: Case, rows: list[dict], label: str, keys: Iterable[str]) -> None:
    """The fastest row against bf16 and today's kernels."""
    head = (f"K={case.k} N={case.n} M={case.m}: bf16 {case.bf16_us:.1f} today {case.today_us:.1f} "
            f"(x{case.bf16_us / case.today_us:.2f}, err {case.today_err:.1e})")
    if not rows:
        print(f"{head} | {label}: nothing ran", flush=True)
        return
    best = min(rows, key=lambda r: r["us"])
    config = " ".join(f"{key}={best[key]}" for key in keys)
    print(f"{head} | {label} best {best['us']:.1f} (x{case.bf16_us / best['us']:.2f}, err {best['err']:.1e}) {config}",
          flush=True)
