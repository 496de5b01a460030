"""HTTP throughput of `quantgate serve`: one fixed request set sent one at a time, then by many clients.

    python benchmarks/bench_server.py --concurrency 1 32 [--out DIR]

Starts a real `quantgate serve` process on a randomly initialised Qwen3 (the checkpoint writer
of bench_engine.py, so both benchmarks measure the same model) and sends the same requests
(token-id prompts, greedy, `ignore_eos` so every answer has the same length) through HTTP at
each concurrency. The issue's target: total tokens/s at concurrency 32 at least 4x the rate at
concurrency 1, on CPU. Prints a table; with --out writes the full results as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import DTYPES, SHAPES, param_count, write_random_checkpoint  # noqa: E402
import provenance  # noqa: E402 - benchmarks/provenance.py, next to this script

TARGET_SPEEDUP = 4.0


def start_server(model: Path, args: argparse.Namespace, log_path: Path) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "quantgate.harness.cli", "serve", str(model), "--port", "0",
               "--device", args.device, "--dtype", "auto", "--max-num-seqs", str(max(args.concurrency)),
               "--max-model-len", str(args.prompt_len + args.gen_tokens), "--log-level", "warning"]
    log = log_path.open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = re.search(r"ready at (http://\S+)", log_path.read_text())
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"quantgate serve exited {proc.returncode}:\n{log_path.read_text()}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"quantgate serve was not ready in 300 s:\n{log_path.read_text()}")


async def send_all(url: str, prompts: list[list[int]], gen_tokens: int, concurrency: int) -> dict:
    """Every prompt once, at most `concurrency` requests in flight (a new one starts as one ends)."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(prompt: list[int]) -> None:
            async with gate:
                start = time.perf_counter()
                response = await client.post("/v1/completions", json={
                    "prompt": prompt, "max_tokens": gen_tokens, "temperature": 0, "ignore_eos": True})
                response.raise_for_status()
                latencies.append(time.perf_counter() - start)
                for key in usage:
                    usage[key] += response.json()["usage"][key]

        start = time.perf_counter()
        await asyncio.gather(*(one(p) for p in prompts))
        seconds = time.perf_counter() - start
    total = usage["prompt_tokens"] + usage["completion_tokens"]
    return {
        "concurrency": concurrency, "requests": len(prompts), "seconds": seconds, **usage,
        "total_tokens_per_s": total / seconds, "generated_tokens_per_s": usage["completion_tokens"] / seconds,
        "requests_per_s": len(prompts) / seconds,
        "latency_p50_s": statistics.median(latencies), "latency_max_s": max(latencies),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=700)
    parser.add_argument("--gen-tokens", type=int, default=80)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="directory for results JSON and the server log")
    args = parser.parse_args(argv)

    shape = SHAPES[args.shape]
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(1, shape["vocab_size"], (args.prompt_len,), generator=gen).tolist()
               for _ in range(args.requests)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = write_random_checkpoint(Path(tmp) / "model", shape, DTYPES[args.dtype], False, "cpu", args.seed)
        log_path = (args.out or Path(tmp)) / "bench_server.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        proc, url = start_server(model, args, log_path)
        try:
            asyncio.run(send_all(url, prompts[:4], 4, 4))  # warm-up
            for concurrency in args.concurrency:
                rows.append(asyncio.run(send_all(url, prompts, args.gen_tokens, concurrency)))
        finally:
            proc.terminate()
            proc.wait(timeout=60)

    base = next((r for r in rows if r["concurrency"] == 1), None)
    for r in rows:
        r.update(shape=args.shape, params=param_count(shape), dtype=args.dtype, device=args.device,
                 speedup_vs_concurrency_1=r["total_tokens_per_s"] / base["total_tokens_per_s"] if base else None)
    print(f"\nquantgate serve over HTTP: {args.shape} ({param_count(shape) / 1e6:.1f}M params, {args.dtype}, "
          f"{args.device}), {args.requests} requests x ({args.prompt_len} prompt + {args.gen_tokens} generated) tokens")
    print(f"{'concurrency':>11} {'seconds':>8} {'total tok/s':>12} {'gen tok/s':>10} {'req/s':>7} "
          f"{'p50 s':>7} {'vs c=1':>7}")
    for r in rows:
        ratio = f"{r['speedup_vs_concurrency_1']:.2f}x" if r["speedup_vs_concurrency_1"] else "-"
        print(f"{r['concurrency']:>11} {r['seconds']:>8.2f} {r['total_tokens_per_s']:>12.0f} "
              f"{r['generated_tokens_per_s']:>10.0f} {r['requests_per_s']:>7.2f} {r['latency_p50_s']:>7.2f} {ratio:>7}")
    best = max((r["speedup_vs_concurrency_1"] or 0 for r in rows), default=0)
    if base and len(rows) > 1:
        verdict = "met" if best >= TARGET_SPEEDUP else "NOT met"
        print(f"best speedup {best:.2f}x (target >= {TARGET_SPEEDUP}x: {verdict})")
    if args.out:
        write_results(args.out, rows, sys.argv[:] if argv is None else ["benchmarks/bench_server.py", *argv])
    return 0


def write_results(out: Path, rows: list[dict], argv: list[str]) -> Path:
    """DIR/bench_server.json: the rows, then their provenance (commit, date, argv, versions) as
    the last entry, as bench_engine writes its results."""
    path = out / "bench_server.json"
    path.write_text(json.dumps([*rows, {"provenance": provenance.record(argv)}], indent=2))
    return path


if __name__ == "__main__":
    sys.exit(main())
