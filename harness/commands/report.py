"""`quantgate report RESULTS...`: one table across runs (markdown and CSV, with pandas) and a
PNG trend chart of each config's measured value over time (matplotlib).

RESULTS are result.json files or directories searched for them (e.g. a nightly's archive of
output directories).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..results import EXIT_PASS, EXIT_USAGE, RESULT_FILE, artifact_path_problems, load_result, markdown_table, summary_frame


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULTS",
                        help="result.json files or directories holding them")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here (default: stdout)")
    parser.add_argument("--csv", type=Path, default=None, help="also write the table as CSV")
    parser.add_argument("--png", type=Path, default=None, help="also draw the trend chart here")


def find_results(paths: list[Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """Loaded results (with their path) and one message per path that is not one (a truncated
    result.json of a killed job does not hide the others)."""
    found: list[Path] = []
    problems: list[str] = []
    for path in paths:
        if path.is_dir():
            hits = sorted(path.rglob(RESULT_FILE))
            if not hits:
                problems.append(f"{path}: no {RESULT_FILE} below this directory")
            found += hits
        elif path.is_file():
            found.append(path)
        else:
            problems.append(f"{path}: no such file or directory")
    results = []
    for path in dict.fromkeys(found):
        try:
            results.append({**load_result(path), "path": str(path)})
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: {exc}")
    return results, problems


def report_frame(results: list[dict[str, Any]]):
    """One row per run, oldest first; `reason` is long, so only the CSV keeps it."""
    frame = summary_frame(results)
    frame.insert(0, "started_at", [r.get("started_at") or "" for r in results])
    frame["engine"] = [(r.get("config") or {}).get("engine") for r in results]
    frame["path"] = [r["path"] for r in results]
    return frame.sort_values(["started_at", "config"], kind="stable").reset_index(drop=True)


def trend_figure(frame):
    """Measured value per config over time; verdicts as marker colours, thresholds dashed. An
    ERROR run has no value, so it is a cross at the foot of the chart in its config's colour: a
    night that broke stays visible."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI machines
    import matplotlib.pyplot as plt
    import matplotlib.transforms as transforms
    import pandas as pd

    timed = frame.assign(when=pd.to_datetime(frame["started_at"], errors="coerce", utc=True)).dropna(subset=["when"])
    data = timed.dropna(subset=["measured"])
    errors = timed[timed["verdict"] == "ERROR"]
    colors = {"PASS": "tab:green", "FAIL": "tab:red", "ERROR": "tab:orange"}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    line_colors: dict[str, str] = {}
    for name, rows in data.groupby("config", sort=True):
        line, = ax.plot(rows["when"], rows["measured"], marker="", label=name)
        line_colors[name] = line.get_color()
        ax.scatter(rows["when"], rows["measured"], c=[colors.get(v, "gray") for v in rows["verdict"]], zorder=3)
        if rows["threshold"].notna().any():
            ax.plot(rows["when"], rows["threshold"], linestyle="--", marker="_", markersize=14,
                    color=line.get_color(), alpha=0.6)
    if len(errors):
        on_time_axis = transforms.blended_transform_factory(ax.transData, ax.transAxes)
        ax.scatter(errors["when"], [0.03] * len(errors), transform=on_time_axis, marker="x", s=60,
                   color=[line_colors.get(name, "gray") for name in errors["config"]], zorder=3, clip_on=False,
                   label=f"ERROR, no measurement ({len(errors)}; cross in the config's colour)")
    ax.set_ylabel("measured (gated metric)")
    ax.set_title("quantgate: measured accuracy per config over time (dashed: gate threshold)")
    ax.grid(alpha=0.3)
    if len(timed):
        ax.legend(fontsize="small", loc="best")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def trend_chart(frame, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig = trend_figure(frame)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(args: argparse.Namespace) -> int:
    unwritable = artifact_path_problems([("--markdown", args.markdown, False), ("--csv", args.csv, False),
                                         ("--png", args.png, False)])
    if args.png is not None and args.png.suffix.lower() != ".png":
        unwritable.append(f"--png {args.png}: the chart is a PNG image; give a path ending in .png")
    if unwritable:
        for problem in unwritable:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    results, problems = find_results(args.results)
    for problem in problems:  # reported, and the report is still made of the results that load
        print(f"error: {problem}", file=sys.stderr)
    if not results:
        return EXIT_USAGE
    frame = report_frame(results)
    table = markdown_table(frame.drop(columns=["reason"]))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(f"# quantgate report: {len(frame)} runs\n\n{table}\n")
    else:
        print(table)
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(args.csv, index=False)
    if args.png:
        trend_chart(frame, args.png)
    return EXIT_USAGE if problems else EXIT_PASS
