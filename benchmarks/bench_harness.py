"""The harness's own overhead: time to verdict that is neither the server starting nor the
server answering, as a share of wall time. Target: under 10% for the embedded default.

  python benchmarks/bench_harness.py                          # eval_configs/tiny/demo.yaml
  python benchmarks/bench_harness.py --config C.yaml --repeats 3 --out benchmarks/results/harness

Each repeat is a full `quantgate run` process (Python start-up, imports, config loading,
server launch, lm-eval, gate, artifacts, teardown), timed from the outside. From its
result.json: `server_start_s` (launch to /health: the engine loading the model) and
`server_busy_s` (time with at least one request in flight: the server answering). Overhead
is the rest: wall - server_start_s - server_busy_s. Also reported: the share of wall time
the server was not answering at all (start-up included).

The JSON also says what was measured where: date, commit (benchmarks/provenance.py: `-dirty`
when tracked files differ from it), the command line, the machine (platform, CPU count) and
the 1/5/15-minute load averages before and after the runs (other jobs on the machine slow the
server and the harness alike, but not by the same share).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import provenance  # noqa: E402 - benchmarks/provenance.py, next to this script

REPO = Path(__file__).resolve().parents[1]
TARGET_SHARE = 0.10


def measure(config: Path, limit: int | None, workdir: Path) -> dict:
    out = workdir / "out"
    command = [sys.executable, "-m", "quantgate.harness.cli", "run", str(config), "--output-dir", str(out)]
    if limit is not None:
        command += ["--limit", str(limit)]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - started
    results = sorted(out.glob("*/result.json"))
    if proc.returncode not in (0, 1) or len(results) != 1:
        raise SystemExit(f"quantgate run exited {proc.returncode} (want a verdict for one config):\n"
                         f"{proc.stdout}{proc.stderr}")
    result = json.loads(results[0].read_text())
    timings = result["timings"]
    start, busy = timings["server_start_s"], timings["server_busy_s"]
    overhead = wall - start - busy
    return {"config": result["name"], "verdict": result["verdict"], "n": result["metrics"]["n"], "wall_s": wall,
            "server_start_s": start, "server_busy_s": busy, "eval_s": timings["eval_s"],
            "overhead_s": overhead, "overhead_share": overhead / wall,
            "not_answering_share": (wall - busy) / wall,
            # where the overhead goes: the CLI around the run (Python, imports, config loading,
            # summary), lm-eval's own work around the requests, and the rest of the run (kernel
            # report, gate, artifacts, teardown)
            "cli_s": wall - timings["total_s"], "lm_eval_s": timings["eval_s"] - busy,
            "run_other_s": timings["total_s"] - start - timings["eval_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "eval_configs" / "tiny" / "demo.yaml")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="questions per run (default: the config's)")
    parser.add_argument("--out", type=Path, default=None, help="write the full results as JSON here")
    args = parser.parse_args(argv)
    if not args.config.is_file():
        print(f"error: {args.config} does not exist; pass --config", file=sys.stderr)
        return 3
    context = run_context(argv)
    print(f"start {context['date']} commit {context['commit']} load {context['load_before']}")
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(measure(args.config.resolve(), args.limit, Path(tmp)))
    context["load_after"] = load_average()
    print(f"{'run':>3} {'n':>5} {'wall s':>8} {'start s':>8} {'busy s':>8} {'overhead s':>10} {'overhead':>9} "
          f"{'not answering':>13} {'cli s':>6} {'lm-eval s':>9} {'other s':>7}")
    for i, r in enumerate(runs, start=1):
        print(f"{i:>3} {r['n']:>5} {r['wall_s']:>8.2f} {r['server_start_s']:>8.2f} {r['server_busy_s']:>8.2f} "
              f"{r['overhead_s']:>10.2f} {r['overhead_share']:>9.1%} {r['not_answering_share']:>13.1%} "
              f"{r['cli_s']:>6.2f} {r['lm_eval_s']:>9.2f} {r['run_other_s']:>7.2f}")
    share = statistics.median(r["overhead_share"] for r in runs)
    verdict = "meets" if share < TARGET_SHARE else "MISSES"
    print(f"median harness overhead {share:.1%} of wall time: {verdict} the {TARGET_SHARE:.0%} target "
          f"(load after {context['load_after']})")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "bench_harness.json"
        path.write_text(json.dumps({**context, "config": str(args.config), "runs": runs,
                                    "median_overhead_share": share, "target_share": TARGET_SHARE}, indent=2) + "\n")
        print(f"written to {path}")
    return 0


def load_average() -> list[float] | None:
    """1, 5 and 15-minute load averages (None where the OS has none)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def run_context(argv: list[str] | None) -> dict:
    """Provenance and the machine's state before the runs (harness packages only: no torch)."""
    record = provenance.record(sys.argv[:] if argv is None else ["benchmarks/bench_harness.py", *argv],
                               packages=())
    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "python": record.pop("python"), "host": record.pop("host")}
    return {**record, "machine": machine, "load_before": load_average()}


if __name__ == "__main__":
    sys.exit(main())
