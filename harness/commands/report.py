"""`quantgate report RESULTS...`: one table across runs (markdown and CSV, with pandas) and a
PNG trend chart of each config's measured value over time (matplotlib).

RESULTS are result.json files or directories searched for them (e.g. a nightly's archive of
output directories).
"""

from __future__ import annotations

import argparse
import os
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
            # os.walk, not rglob: rglob skips a result.json whose link is broken, and that run
            # would be missing from the report without a word.
            hits = sorted(Path(root) / RESULT_FILE for root, _, files in os.walk(path, followlinks=True)
                          if RESULT_FILE in files)
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


# Lines told apart in a legend: tab20's colours, each solid, dotted and dash-dot (dashed is the
# threshold's). Past that many configs a legend is a wall no one reads: the lines take one colour
# map's colours, and the table names the configs.
_LINE_STYLES = ("-", ":", "-.")
_LEGEND_ROWS = 25  # per column: the legend is beside the plot, about as tall as it
_LEGEND_ROW_IN = 0.18  # inches per legend row at fontsize "small"
_LEGEND_CHAR_IN = 0.07  # inches per character of a label, and 0.8 for the line sample and gaps


def trend_figure(frame):
    """Measured value per config over time; verdicts as marker colours, thresholds dashed. An
    ERROR run has no value, so it is a cross at the foot of the chart in its config's colour: a
    night that broke stays visible. The legend sits beside the plot, in columns, and the figure
    grows with it."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CI machines
    import matplotlib.pyplot as plt
    import matplotlib.transforms as transforms
    import pandas as pd

    timed = frame.assign(when=pd.to_datetime(frame["started_at"], errors="coerce", utc=True)).dropna(subset=["when"])
    data = timed.dropna(subset=["measured"])
    errors = timed[(timed["verdict"] == "ERROR") & timed["measured"].isna()]  # one that measured is an orange point
    colors = {"PASS": "tab:green", "FAIL": "tab:red", "ERROR": "tab:orange"}
    names = sorted(set(data["config"]))
    looks = [(color, style) for style in _LINE_STYLES for color in matplotlib.colormaps["tab20"].colors]
    legend = len(names) <= len(looks)
    if not legend:
        looks = [(matplotlib.colormaps["turbo"](i / (len(names) - 1)), "-") for i in range(len(names))]
    look = dict(zip(names, looks))
    error_label = f"ERROR, no measurement ({len(errors)})"
    labels = names + [error_label] * bool(len(errors))
    columns = -(-len(labels) // _LEGEND_ROWS) if legend and labels else 0
    legend_rows = -(-len(labels) // columns) if columns else 0
    # The plot keeps its 9 x 4.5 inches: the figure grows by the legend beside it.
    legend_width = columns * (0.8 + _LEGEND_CHAR_IN * max(map(len, labels), default=0))
    fig, ax = plt.subplots(figsize=(9 + legend_width, max(4.5, 1.0 + _LEGEND_ROW_IN * legend_rows)),
                           layout="constrained")
    for name, rows in data.groupby("config", sort=True):
        color, style = look[name]
        ax.plot(rows["when"], rows["measured"], color=color, linestyle=style, label=name)
        ax.scatter(rows["when"], rows["measured"], c=[colors.get(v, "gray") for v in rows["verdict"]], zorder=3)
        if rows["threshold"].notna().any():
            ax.plot(rows["when"], rows["threshold"], linestyle="--", marker="_", markersize=14, color=color, alpha=0.6)
    if len(errors):
        on_time_axis = transforms.blended_transform_factory(ax.transData, ax.transAxes)
        ax.scatter(errors["when"], [0.03] * len(errors), transform=on_time_axis, marker="x", s=60,
                   color=[look.get(name, ("gray",))[0] for name in errors["config"]], zorder=3, clip_on=False,
                   label=error_label)
        # The blended transform does not widen the time axis, and a night that broke after the
        # last measurement (or every run an ERROR) must still lie on it.
        span = pd.concat([data["when"], errors["when"]])
        pad = max((span.max() - span.min()) * 0.05, pd.Timedelta(hours=12))
        ax.set_xlim(span.min() - pad, span.max() + pad)
    ax.set_ylabel("measured (gated metric)")
    ax.set_title("quantgate: measured accuracy per config over time\n(dashed: gate threshold; x at the foot: an ERROR, "
                 "in its config's colour)", fontsize="medium")
    ax.grid(alpha=0.3)
    if columns:
        fig.legend(loc="outside right upper", fontsize="small", ncols=columns)
    elif not legend:
        ax.text(0.99, 0.98, f"{len(names)} configs: too many for a legend; the table names them",
                transform=ax.transAxes, ha="right", va="top", fontsize="small")
    fig.autofmt_xdate()
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
