"""Where a batch-1 decode step's time goes on the host, with CUDA graphs (GPU only).

bench_engine.py decode reports a step's wall time and the GPU time of one graph replay; this
splits the rest: the host call of `graph.replay()` alone (launching the graph's kernels), and a
cProfile of `engine.step()` (scheduling, input copy, sampling, detokenizing, outputs).

    python benchmarks/bench_decode_host.py [--variants bf16 fp8-block] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import tempfile
import time
from pathlib import Path

import torch

from bench_engine import DTYPES, SHAPES, graph_gpu_ms, write_random_checkpoint
from quantgate.engine import LLMEngine, SamplingParams, load_model

PROMPT, TOKENS = 64, 256


def measure(engine: LLMEngine) -> dict:
    engine.add_request("warm", list(range(1, PROMPT + 1)), SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    engine.add_request("timed", list(range(1, PROMPT + 1)),
                       SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True))
    engine.step()
    start, steps = time.perf_counter(), 0
    profiler = cProfile.Profile()
    while engine.has_unfinished() and steps < TOKENS // 2:
        engine.step()
        steps += 1
    step_ms = 1e3 * (time.perf_counter() - start) / steps
    profiler.enable()
    while engine.has_unfinished():
        engine.step()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)

    graph = engine.graphs.graphs[engine.graphs.buckets(1, PROMPT + TOKENS // 2)][0]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        graph.replay()  # host call only: returns once the launch is queued
    launch_ms = 1e3 * (time.perf_counter() - start) / 20
    torch.cuda.synchronize()
    return {"step_ms": step_ms, "gpu_ms": graph_gpu_ms(engine, PROMPT + TOKENS // 2), "replay_call_ms": launch_ms,
            "profile": text.getvalue()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["bf16", "fp8-block"])
    parser.add_argument("--linear-backend", default="marlin")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            path = write_random_checkpoint(Path(tmp) / variant, SHAPES["qwen3-1.7b"], DTYPES["bf16"],
                                           variant == "fp8-block", "cuda")
            loaded = load_model(path, device="cuda", linear_backend=args.linear_backend if variant != "bf16" else "auto")
            engine = LLMEngine(loaded, max_num_seqs=1, max_model_len=PROMPT + TOKENS + 1, kv_cache_memory=2**30)
            rows.append({"variant": variant, **measure(engine)})
            del engine, loaded
            torch.cuda.empty_cache()
    for r in rows:
        print(f"{r['variant']}: step {r['step_ms']:.3f} ms, GPU {r['gpu_ms']:.3f} ms, "
              f"host call of graph.replay() {r['replay_call_ms']:.3f} ms")
    for r in rows:
        print(f"\n== {r['variant']}: engine.step() for {TOKENS // 2} steps, by own time\n{r['profile']}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_decode_host.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
