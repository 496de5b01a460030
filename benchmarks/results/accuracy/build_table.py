"""Build accuracy.json and accuracy.md from `quantgate calibrate` output directories.

    python benchmarks/results/accuracy/build_table.py CALIBRATIONS_DIR [--machine TEXT] [--out DIR]

CALIBRATIONS_DIR holds one directory per config file, named after its stem, each written by
`quantgate calibrate eval_configs/tiny/<stem>.yaml --runs 2 --output-dir CALIBRATIONS_DIR/<stem>`
(`calibration.json`, `run-<i>/<config name>/{result.json,samples.jsonl}`). Each row is one config:
its checkpoint's format and scheme (from models/MANIFEST.json), the backends it ran, the
accuracy of its runs, the delta and McNemar flips against the bf16 model measured the same
way (`<base>-bf16-emulation`, same questions), and the wall time of each run. The calibrate
proposals are copied to calibrations/<name>.json, the provenance of the configs' `reference:`.
Everything is written to --out (default: this folder).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
from pathlib import Path

import pandas as pd

from quantgate.harness.config import load_config
from quantgate.harness.gates import paired
from quantgate.harness.results import markdown_table
from quantgate.harness.config import resolve_model
from quantgate.kernels.platform import Platform

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TINY = REPO / "eval_configs" / "tiny"
ACCEPTED_DROP = 0.03  # issue 6: every FP8 variant within 3 points of its bf16 model


def _machine(result: dict) -> str:
    """The GPU or CPU the run's engine reported, else (results of engines that named a CPU just
    "cpu") this machine's CPU: pass --machine when the table is built on another machine."""
    device = (result.get("kernels") or {}).get("platform") or {}
    if device.get("device") == "cuda":
        return f"{device.get('name')} (compute capability {device.get('capability')})"
    if device.get("name") not in (None, "", "cpu"):
        return str(device["name"])
    return f"{Platform.detect('cpu').name}, {platform.system()} {platform.machine()}"


def _manifest_entry(folder: str) -> tuple[str, dict]:
    manifest = json.loads((REPO / "models" / "MANIFEST.json").read_text())
    for base, entry in manifest["models"].items():
        if folder == base:
            return base, {"scheme": "unquantized", "format": entry.get("dtype", "bfloat16")}
        if folder in entry.get("variants", {}):
            return base, entry["variants"][folder]
    raise SystemExit(f"error: {folder} is not in models/MANIFEST.json")


def _runs(directory: Path, name: str) -> list[tuple[dict, dict[str, bool]]]:
    """(result.json, correctness by question id) of each run, in run order."""
    out = []
    for run in sorted(directory.glob("run-*"), key=lambda p: int(p.name.split("-")[1])):
        result = json.loads((run / name / "result.json").read_text())
        samples = [json.loads(line) for line in (run / name / "samples.jsonl").read_text().splitlines() if line]
        out.append((result, {str(s["id"]): bool(s["correct"]) for s in samples}))
    return out


def build(calibrations: Path, machine: str | None, out: Path) -> list[dict]:
    rows, correct = [], {}
    for directory in sorted(p for p in calibrations.iterdir() if (p / "calibration.json").is_file()):
        path = TINY / f"{directory.name}.yaml"
        if not path.is_file():
            raise SystemExit(f"error: {directory} is not named after a config file in {TINY}")
        config = load_config(path)
        name = config.name
        proposal = json.loads((directory / "calibration.json").read_text())
        runs = _runs(directory, name)
        first = runs[0][0]
        folder = Path(resolve_model(config)).name
        base, variant = _manifest_entry(folder)
        flags = config.backend_flags()
        correct[name] = runs[0][1]
        rows.append({
            "config": name,
            "model": base,
            "variant": folder,
            "format": variant["format"],
            "scheme": variant["scheme"],
            "linear_backend": flags.get("--linear-backend", "auto"),
            "moe_backend": flags.get("--moe-backend"),
            "n": first["metrics"]["n"],
            "dataset": str(config.dataset.test.resolve().relative_to(REPO)) if config.dataset else config.task,
            "strict": statistics.fmean(r["metrics"]["strict_match"] for r, _ in runs),
            "flexible": statistics.fmean(r["metrics"]["flexible_extract"] for r, _ in runs),
            "runs": len(runs),
            "run_values": [r["metrics"]["value"] for r, _ in runs],
            "identical_runs": all(c == runs[0][1] for _, c in runs[1:]),
            "seconds": [r["timings"]["total_s"] for r, _ in runs],
            "server_start_s": [r["timings"]["server_start_s"] for r, _ in runs],
            "date": proposal["reference"]["date"],
            "commit": proposal["reference"]["commit"],
            "machine": machine or _machine(first),
            "versions": first["versions"],
            "command": f"quantgate calibrate eval_configs/tiny/{path.name} --runs {len(runs)}",
        })
        shutil.copyfile(directory / "calibration.json", out / "calibrations" / f"{name}.json")
    by_name = {row["config"]: row for row in rows}
    for row in rows:
        bf16 = by_name.get(f"{row['model']}-bf16-emulation")
        if bf16 is None or bf16["n"] != row["n"] or row["scheme"] == "unquantized":
            row.update(bf16_strict=None, delta_vs_bf16=None, within_3_points=None, flips_vs_bf16=None)
            continue
        _, numbers, _ = paired(correct[row["config"]], correct[bf16["config"]])
        row.update(bf16_strict=bf16["strict"], delta_vs_bf16=row["strict"] - bf16["strict"],
                   within_3_points=row["strict"] >= bf16["strict"] - ACCEPTED_DROP - 1e-12,
                   flips_vs_bf16={k: numbers[k] for k in ("flips_right_to_wrong", "flips_wrong_to_right",
                                                          "p_value_worse")})
    return rows


def markdown(rows: list[dict]) -> str:
    frame = pd.DataFrame([{
        "config": r["config"], "format": r["format"], "scheme": r["scheme"],
        "backend": r["linear_backend"] + (f" / moe {r['moe_backend']}" if r["moe_backend"] else ""),
        "n": r["n"], "strict": r["strict"], "flexible": r["flexible"],
        "delta vs bf16": r["delta_vs_bf16"],
        "within 3 points": r["within_3_points"],
        "flips vs bf16 (R->W / W->R, p worse)": None if r["flips_vs_bf16"] is None else
        f"{r['flips_vs_bf16']['flips_right_to_wrong']} / {r['flips_vs_bf16']['flips_wrong_to_right']}, "
        f"p={r['flips_vs_bf16']['p_value_worse']:.3g}",
        "runs identical": r["identical_runs"],
        "seconds per run": " / ".join(f"{s:.0f}" for s in r["seconds"]),
    } for r in rows])

    def each(key: str) -> str:
        return ", ".join(dict.fromkeys(str(r[key]) for r in rows))

    versions = ", ".join(dict.fromkeys(f"torch {r['versions'].get('torch')}, lm-eval {r['versions'].get('lm_eval')}"
                                       for r in rows))
    datasets = ", ".join(f"`{d}`" for d in dict.fromkeys(r["dataset"] for r in rows))
    return (f"# Accuracy of the tiny models and their FP8 variants (built-in engine)\n\n"
            f"Strict-match (`exact_match,strict-match`, lm-eval gsm8k 5-shot) on the first n questions of "
            f"{datasets}.\nMeasured {each('date')} on {each('machine')} (shared with "
            f"other jobs: seconds are indicative), {versions}; commits (HEAD when each calibration ran): "
            f"{each('commit')}.\n"
            f"Each row: `quantgate calibrate eval_configs/tiny/<config>.yaml --runs 2`; seconds per run are "
            f"server start to verdict.\nDelta and flips are against the bf16 model measured the same way "
            f"(`<model>-bf16-emulation`, same questions); p is the exact one-sided McNemar p-value that the "
            f"variant is worse.\n\n" + markdown_table(frame) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("calibrations", type=Path)
    parser.add_argument("--machine", default=None, help="machine description (default: the run's GPU, else the CPU)")
    parser.add_argument("--out", type=Path, default=HERE, help="where the table goes (default: this folder)")
    args = parser.parse_args()
    (args.out / "calibrations").mkdir(parents=True, exist_ok=True)
    rows = build(args.calibrations, args.machine, args.out)
    if not rows:
        print(f"error: no calibrate output (<name>/calibration.json) in {args.calibrations}")
        return 1
    sys.path.insert(0, str(REPO / "benchmarks"))
    from provenance import commit  # QUANTGATE_COMMIT on the device, whose .git may be stale

    (args.out / "accuracy.json").write_text(json.dumps({"table_built_at_commit": commit(), "rows": rows}, indent=2) + "\n")
    (args.out / "accuracy.md").write_text(markdown(rows))
    print((args.out / "accuracy.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
