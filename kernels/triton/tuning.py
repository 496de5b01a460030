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
  - when QUANTGATE_AUTOTUNE=0 (debugging).
Candidates differ only in the order of float32 additions, so all meet the same accuracy, but not
the same answers: two runs of one config on one H200, each tuning afresh, differed in 7 and 8 of
1000 GSM8K answers, and in nothing with tuning off (benchmarks/results/h200-2026-12-01-run22):
timings of a few microseconds vary by more than the margin below. So every choice is logged
(logger `quantgate.kernels`, INFO: the server's log), and with QUANTGATE_TUNING_FILE=PATH the
choices are replayed: a (GPU name, kernel, key) the file holds takes the file's configuration
untimed (also while capturing, and with QUANTGATE_AUTOTUNE=0), and what this process times is
added to the file. `quantgate run` points each built-in server at its run folder's tuning.json.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import triton
import triton.language as tl

from . import pdl
from .pdl import await_inputs
from .switches import AUTOTUNE_ENV, TUNING_FILE_ENV, switched_on

# A candidate replaces an earlier one only when it is this much faster: timing noise must not
# make the choice (and the summation order) flip between runs for configs that tie.
_MARGIN = 0.97

T = TypeVar("T")
logger = logging.getLogger("quantgate.kernels")
_TUNERS: list[Autotuner] = []
TUNING_FORMAT = "quantgate-tuning/1"


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
        if len(candidates) == 1 or device.type != "cuda":
            return candidates[0]
        file = tuning_file()
        gpu = torch.cuda.get_device_name(device)
        chosen = file.choice(gpu, self.name, key, candidates) if file is not None else None
        if chosen is not None:
            self.best[key] = chosen
            return chosen
        if not autotune_enabled() or torch.cuda.is_current_stream_capturing():
            return candidates[0]
        self.best[key] = chosen = self._time(key, candidates, run)
        if file is not None:
            file.add(gpu, self.name, key, chosen)
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


class TuningFile:
    """Launch configurations by GPU name, kernel and key, in a JSON file shared by the processes
    that name it: {"format": TUNING_FORMAT, "choices": {gpu: {kernel: {str(key): config}}}}."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.choices = read_tuning_file(path)

    def choice(self, gpu: str, kernel: str, key: tuple, candidates: Sequence[T]) -> T | None:
        """The file's configuration for (gpu, kernel, key), None when it holds none. One that is
        none of the candidates (written by another version) is reported and left to the tuner."""
        fields = self.choices.get(gpu, {}).get(kernel, {}).get(str(key))
        if fields is None:
            return None
        found = next((c for c in candidates if _as_json(c) == fields), None)
        if found is None:
            logger.warning("%s: %s for %s on %s is %s, none of this version's candidates: timing them instead",
                           self.path, kernel, key, gpu, fields)
        else:
            logger.info("tuned %s for %s: %s (replayed from %s)", kernel, key, found, self.path)
        return found

    def add(self, gpu: str, kernel: str, key: tuple, config: Any) -> None:
        """Add a timed choice: the file is re-read under a lock (other servers may share it) and
        replaced whole. A failed write is logged; the choice stands for this process."""
        try:
            folder = os.open(self.path.parent, os.O_RDONLY)  # the lock: no lock file left beside the record
            try:
                fcntl.flock(folder, fcntl.LOCK_EX)
                self.choices = read_tuning_file(self.path)
                self.choices.setdefault(gpu, {}).setdefault(kernel, {})[str(key)] = _as_json(config)
                body = json.dumps({"format": TUNING_FORMAT, "choices": self.choices}, indent=1, sort_keys=True)
                partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
                try:
                    partial.write_text(body + "\n")
                    os.replace(partial, self.path)
                finally:  # e.g. a full disk: no half-written copy left behind
                    partial.unlink(missing_ok=True)
            finally:
                os.close(folder)
        except (OSError, ValueError) as exc:
            logger.warning("could not add %s for %s to %s: %s", kernel, key, self.path, exc)


def read_tuning_file(path: Path) -> dict:
    """A tuning file's choices ({} when it does not exist); ValueError saying what is wrong."""
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot be read: {exc}") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if (not isinstance(body, dict) or body.get("format") != TUNING_FORMAT or not isinstance(choices, dict)
            or not all(isinstance(kernels, dict) and all(isinstance(keys, dict) for keys in kernels.values())
                       for kernels in choices.values())):
        raise ValueError(f"is not a tuning file (a JSON object with \"format\": \"{TUNING_FORMAT}\" and \"choices\": "
                         "{GPU name: {kernel: {key: configuration}}})")
    return choices


@functools.cache
def _open_tuning_file(path: str) -> TuningFile:
    return TuningFile(Path(path))


def tuning_file() -> TuningFile | None:
    """The file QUANTGATE_TUNING_FILE names (set but empty counts as unset), read once per process."""
    path = os.environ.get(TUNING_FILE_ENV, "").strip()
    return _open_tuning_file(os.path.abspath(path)) if path else None


def tuning_file_problem() -> str | None:
    """Why QUANTGATE_TUNING_FILE cannot be used (before a server loads a model), None when it can."""
    value = os.environ.get(TUNING_FILE_ENV, "").strip()
    if not value:
        return None
    path = Path(value)
    fix = f"point {TUNING_FILE_ENV} at a tuning file or at a new file in an existing folder, or unset it"
    if path.is_dir():
        return f"{TUNING_FILE_ENV}={value} is a folder: {fix}"
    if not path.parent.is_dir():
        return f"{TUNING_FILE_ENV}={value}: the folder {path.parent} does not exist: {fix}"
    try:
        read_tuning_file(path)
    except ValueError as exc:
        return f"{TUNING_FILE_ENV}={value} {exc}: {fix}"
    return None


def _as_json(config: Any) -> Any:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config


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
