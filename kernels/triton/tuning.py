"""Launch configurations chosen by timing a few candidates once per shape.

The fastest tile, warp count and split-K of a Triton GEMM depend on the GPU and on (M, N, K);
a table written for one GPU is wrong on the next. So each GEMM launcher offers a short list of
candidate configurations, its heuristic default first, and `Autotuner.pick` times them once
per key (M bucket, N, K, dtypes, scheme) on first use and keeps the fastest for the process.
Times are GPU times inside a CUDA graph with the L2 evicted before each call, after a small
kernel as a decode GEMV follows an RMSNorm, with programmatic dependent launch where the engine
uses it (`graph_time_ms`): what a decode step pays, without the host launch cost that eager
timing adds to every call, and with the weight loads a kernel issues before its PDL wait
overlapping the kernel before it, as they do in the engine's graphs.
The engine's first use of a shape is its eager warm-up pass, before CUDA graphs are captured,
so tuning costs start-up time (compiling each candidate once, then tens of milliseconds per
key), never a decode step. It does not time, and takes the cached choice or else the default:
  - on CPU (the interpreter has nothing to time),
  - while a CUDA graph is being captured (timing needs synchronization),
  - when QUANTGATE_AUTOTUNE=0 (debugging, or runs that must answer alike: below).
Candidates differ only in the order of float32 additions, so all meet the same accuracy, but not
always the same answers: a row's bits can depend on which M bucket's config computes it, and
which requests share a decode batch depends on timing. On the H200 two runs of a tiny W8A8
config tuning afresh differed in 4-14 of 1000 GSM8K answers (as many when both replayed one
run's choices; none with QUANTGATE_AUTOTUNE=0) until the 17-64-row bucket lost its 32-row tile
(fp8_block_gemm.TILED_CANDIDATES, mma.sync among wgmma tiles); since, fresh tunings of the
channel and block configs answered alike (benchmarks/results/h200-2026-12-01-run22, 23). Within
a bucket the split-K is the same for every M (gemm_epilogue.automatic_split_k); at the tiny
model's shapes every decode candidate also computes a row to the same bits, at K = 4096 those
that split K differently do not (run 23). Each choice is logged (logger `quantgate.kernels`, INFO: the
server's log), to compare two runs' choices when their answers differ.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import triton
import triton.language as tl

from . import pdl
from .pdl import await_inputs
from .switches import AUTOTUNE_ENV, switched_on

# A candidate replaces an earlier one only when it is this much faster: timing noise must not
# make the choice (and the summation order) flip between runs for configs that tie.
_MARGIN = 0.97

T = TypeVar("T")
logger = logging.getLogger("quantgate.kernels")
_TUNERS: list[Autotuner] = []


def m_bucket(m: int) -> int:
    """Rows are tuned in buckets: 1 (GEMV), then powers of four up to 4096, then everything above."""
    bucket = 1
    while bucket < m and bucket < 8192:
        bucket *= 4 if bucket > 1 else 16
    return bucket


def autotune_enabled() -> bool:
    return switched_on(AUTOTUNE_ENV)


class Autotuner:
    """Per-process choice among candidate configs, keyed by whatever decides the best one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.best: dict[tuple, Any] = {}
        self.timings: dict[tuple, list[tuple[Any, float | None, str | None]]] = {}
        _TUNERS.append(self)

    def pick(self, key: tuple, candidates: Sequence[T], run: Callable[[T], None], device: torch.device) -> T:
        """The config to launch with for `key`; `run(config)` launches once (and may be called
        repeatedly to time it). candidates[0] is the default."""
        chosen = self.best.get(key)
        if chosen is not None:
            return chosen
        if (len(candidates) == 1 or device.type != "cuda" or not autotune_enabled()
                or torch.cuda.is_current_stream_capturing()):
            return candidates[0]
        self.best[key] = chosen = self._time(key, candidates, run)
        return chosen

    def _time(self, key: tuple, candidates: Sequence[T], run: Callable[[T], None]) -> T:
        results: list[tuple[Any, float | None, str | None]] = []
        for config in candidates:
            try:
                results.append((config, graph_time_ms(lambda: run(config)), None))
            except Exception as exc:  # noqa: BLE001 - e.g. a tile that needs more shared memory than this GPU has
                first_line = str(exc).splitlines()[0][:200] if str(exc) else ""
                results.append((config, None, f"{type(exc).__name__}: {first_line}"))
        self.timings[key] = results
        timed = [(config, ms) for config, ms, _ in results if ms is not None]
        if not timed:
            raise RuntimeError(f"{self.name}: no candidate config ran for {key}: {results[0][2]}")
        best, best_ms = timed[0]
        for config, ms in timed[1:]:
            if ms < best_ms * _MARGIN:
                best, best_ms = config, ms
        logger.info("tuned %s for %s: %s (%s)", self.name, key, best,
                    ", ".join(f"{ms * 1e3:.1f} us" if ms is not None else "failed" for _, ms, _ in results))
        return best


def time_ms(fn: Callable[[], object], rep_ms: float, warmup_ms: float = 2.0) -> float:
    """Median time of `fn`, launched one call at a time, each after evicting the L2 by reading
    a buffer twice its size. (triton.testing.do_bench zeroes one instead: the L2 is then full of
    dirty lines, and each timed call also pays for writing them back, tens of MB, which at small
    M is as much traffic as the weights.) Host launch time is included: see `graph_time_ms`."""
    device = torch.device("cuda", torch.cuda.current_device())
    flush = _flush_buffer(device)
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 3, 1e-3)
    for _ in range(round(warmup_ms / estimate)):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(max(5, min(300, round(rep_ms / estimate))))]
    for begin, finish in events:
        flush.amax()
        begin.record()
        fn()
        finish.record()
    torch.cuda.synchronize()
    times = sorted(begin.elapsed_time(finish) for begin, finish in events)
    return times[len(times) // 2]


@triton.jit
def _predecessor_kernel(row_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Stands for the RMSNorm in front of a decode GEMV: one program reads a row, reduces it
    and writes it back."""
    await_inputs(PDL)
    cols = tl.arange(0, BLOCK)
    x = tl.load(row_ptr + cols, mask=cols < n, other=0.0)
    tl.store(row_ptr + cols, x / tl.sqrt(tl.sum(x * x, axis=0) / n + 1.0), mask=cols < n)


def graph_time_ms(fn: Callable[[], object], calls: int = 16, replays: int = 7) -> float:
    """GPU time of one call of `fn` with a cold L2 and no host in the way, as inside the engine's
    CUDA graphs: `calls` x (L2 eviction, a one-program kernel, fn) captured in a graph with PDL
    where the engine uses it, minus the same graph without fn, median over replays. A small-M
    GEMM runs for a few microseconds where its eager launch costs tens on the host: timed
    eagerly, the launch decided which configuration won."""
    device = torch.device("cuda", torch.cuda.current_device())
    flush = _flush_buffer(device)
    row = torch.ones(2048, dtype=torch.float32, device=device)

    def predecessor() -> None:
        _predecessor_kernel[(1,)](row, row.numel(), BLOCK=row.numel(), **pdl.launch_options(device))

    def capture_ms(with_fn: bool) -> float:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                flush.amax()
                predecessor()
                if with_fn:
                    fn()
        return replay_ms(graph, replays)

    with pdl.for_graph_capture():
        predecessor()
        fn()  # compiles, and allocates what fn keeps (scratch buffers) outside the capture
        torch.cuda.synchronize()
        return max((capture_ms(True) - capture_ms(False)) / calls, 0.0)


def replay_ms(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Median time of one replay of a captured graph (after one untimed replay)."""
    graph.replay()
    times = []
    for _ in range(replays):
        begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        finish.record()
        finish.synchronize()
        times.append(begin.elapsed_time(finish))
    return sorted(times)[len(times) // 2]


def _flush_buffer(device: torch.device) -> torch.Tensor:
    """Twice the L2 in float32, read (never written) to evict it."""
    l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20)
    return torch.empty(l2_bytes // 2, dtype=torch.float32, device=device)


def tuning_report() -> list[dict]:
    """Every timed choice of this process: kernel, key, chosen config, and each candidate's time."""
    rows = []
    for tuner in _TUNERS:
        for key, results in tuner.timings.items():
            rows.append({"kernel": tuner.name, "key": key, "chosen": tuner.best.get(key),
                         "candidates": [{"config": c, "ms": ms, "error": err} for c, ms, err in results]})
    return rows
