"""`quantgate report` and `quantgate compare` on result files: tables, CSV, trend chart,
per-question flips."""

from __future__ import annotations

import csv as csv_module
import json
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from quantgate.harness.cli import main as cli
from quantgate.harness.commands.report import find_results, report_frame, trend_figure
from quantgate.harness.results import RunRecord, write_result, write_samples


def _result(root: Path, name: str, day: int, value: float | None, verdict: str = "PASS",
            correct: list[bool] | None = None) -> Path:
    metrics = None if value is None else {"metric": "exact_match,strict-match", "value": value, "n": 20,
                                          "invalid_rate": 0.0, "strict_match": value, "flexible_extract": value}
    record = RunRecord(name=name, verdict=verdict, reason=f"{name} {verdict}", config={"engine": "builtin"},
                       metrics=metrics, gate={"mode": "absolute", "threshold": 0.6} if metrics else None,
                       evaluation={"complete": value is not None}, timings={"total_s": 10.0},
                       started_at=f"2026-11-{day:02d}T03:00:00+00:00")
    run_dir = root / f"2026-11-{day:02d}" / name
    write_result(run_dir, record)
    if correct is not None:
        write_samples(run_dir, [{"id": i, "correct": ok, "extracted": str(i), "target": f"x #### {i}"}
                                for i, ok in enumerate(correct)])
    return run_dir


def test_report_tables_csv_and_trend_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "nightly"
    for day, (bf16, fp8) in enumerate([(0.80, 0.78), (0.81, 0.74), (0.80, None)], start=1):
        _result(archive, "tiny-bf16", day, bf16)
        _result(archive, "tiny-fp8", day, fp8, verdict="PASS" if fp8 else "ERROR")
    csv, png = tmp_path / "out" / "r.csv", tmp_path / "out" / "trend.png"
    assert cli(["report", str(archive), "--csv", str(csv), "--png", str(png)]) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| 2026")]
    assert len(rows) == 6
    assert rows[0].split("|")[2].strip() == "tiny-bf16" and "0.8000" in rows[0]
    error_row = next(r for r in rows if "ERROR" in r)
    assert "| -" in error_row  # an error has no measurement, not a zero
    frame = pd.read_csv(csv)
    assert len(frame) == 6 and set(frame["config"]) == {"tiny-bf16", "tiny-fp8"}
    assert frame.loc[frame["config"] == "tiny-fp8", "measured"].tolist()[:2] == [0.78, 0.74]
    assert frame.loc[frame["verdict"] == "ERROR", "reason"].tolist() == ["tiny-fp8 ERROR"]  # CSV keeps why
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    ax = trend_figure(report_frame(find_results([archive])[0])).axes[0]
    crosses = [c for c in ax.collections if c.get_label().startswith("ERROR")]
    assert len(crosses) == 1 and len(crosses[0].get_offsets()) == 1  # the night tiny-fp8 broke is drawn


def _trend_frame(configs: int, nights: int = 3) -> pd.DataFrame:
    rows = [{"started_at": f"2026-11-{night + 1:02d}T03:00:00+00:00", "config": f"tiny-qwen3-fp8-config-{i}",
             "verdict": "PASS", "measured": 0.8 + 0.001 * i + 0.01 * night, "threshold": 0.7}
            for night in range(nights) for i in range(configs)]
    rows[-1].update(verdict="ERROR", measured=None)
    return pd.DataFrame(rows)


@pytest.mark.parametrize("configs", [3, 24, 30, 60])
def test_trend_chart_legend_is_beside_the_plot_and_every_config_has_its_own_line(configs: int) -> None:
    """A nightly tier has ~40 configs: a legend inside the axes covered the plot and squashed it,
    and the 10-colour cycle gave configs 0 and 10 the same line."""
    fig = trend_figure(_trend_frame(configs))
    ax = fig.axes[0]
    assert ax.get_legend() is None and len(fig.legends) == 1
    fig.canvas.draw()
    legend, plot = fig.legends[0].get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= plot.x1  # beside the plot, not over it
    assert legend.x1 <= fig.bbox.x1 and legend.y0 >= 0 and legend.y1 <= fig.bbox.y1  # the figure holds it
    assert plot.width >= 7 * fig.dpi and plot.height >= 3 * fig.dpi  # and the plot keeps its room
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == configs + 1 and labels[-1].startswith("ERROR")
    looks = {(to_rgba(line.get_color()), line.get_linestyle()) for line in ax.get_lines()
             if not line.get_label().startswith("_")}  # threshold lines are unlabelled
    assert len(looks) == configs and all(style != "--" for _, style in looks)  # dashed is the threshold's


def test_trend_chart_of_too_many_configs_for_a_legend_says_so() -> None:
    fig = trend_figure(_trend_frame(61, nights=2))
    ax = fig.axes[0]
    assert not fig.legends and ax.get_legend() is None
    assert any("61 configs: too many for a legend" in t.get_text() for t in ax.texts)
    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert len({to_rgba(line.get_color()) for line in lines}) == 61


def test_report_prints_n_as_an_integer_and_empty_for_an_error(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """pandas makes an int column float as soon as one row has none (an ERROR): not printed so."""
    _result(tmp_path, "ok", 1, 0.8)
    _result(tmp_path, "broke", 2, None, verdict="ERROR")
    csv, md = tmp_path / "r.csv", tmp_path / "r.md"
    assert cli(["report", str(tmp_path), "--csv", str(csv)]) == 0
    assert cli(["report", str(tmp_path), "--markdown", str(md)]) == 0
    for text in (capsys.readouterr().out, md.read_text()):
        lines = [line for line in text.splitlines() if line.startswith("|")]
        n = [c.strip() for c in lines[0].split("|")].index("n")
        cells = {row.split("|")[2].strip(): row.split("|")[n].strip() for row in lines[2:]}
        assert cells == {"ok": "20", "broke": "-"}, text
    cells = {row["config"]: row["n"] for row in csv_module.DictReader(csv.read_text().splitlines())}
    assert cells == {"ok": "20", "broke": ""}, csv.read_text()


def test_report_markdown_file_and_missing_inputs(tmp_path: Path) -> None:
    run_dir = _result(tmp_path, "a", 1, 0.7)
    md = tmp_path / "report.md"
    assert cli(["report", str(run_dir / "result.json"), "--markdown", str(md)]) == 0
    assert md.read_text().startswith("# quantgate report: 1 runs") and "| a " in md.read_text()
    assert cli(["report", str(tmp_path / "missing")]) == 3
    (tmp_path / "empty").mkdir()
    assert cli(["report", str(tmp_path / "empty")]) == 3


def test_report_output_paths_are_checked_first_and_a_broken_result_does_not_hide_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _result(tmp_path / "runs", "good", 1, 0.7)
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    for flag, path, message in (("--markdown", "afile/x.md", "afile is a file"), ("--csv", "adir", "is a folder"),
                                ("--png", "chart.txt", "give a path ending in .png")):
        assert cli(["report", str(tmp_path / "runs"), flag, str(tmp_path / path)]) == 3
        assert message in capsys.readouterr().err
    torn = tmp_path / "runs" / "2026-11-02" / "killed"
    torn.mkdir(parents=True)
    (torn / "result.json").write_text('{"schema_version": 1, "name": "kil')
    md = tmp_path / "r.md"
    assert cli(["report", str(tmp_path / "runs"), "--markdown", str(md)]) == 3  # said, and not hidden
    assert "killed/result.json" in capsys.readouterr().err and "| good " in md.read_text()
    md.write_text("yesterday's report")
    csv = tmp_path / "r.csv"
    csv.write_text("old")
    (torn / "result.json").unlink()
    (torn / "result.json").symlink_to(tmp_path / "archive-gone" / "result.json")  # a link to a pruned archive
    assert cli(["report", str(tmp_path / "runs"), "--markdown", str(md)]) == 3
    assert f"{torn / 'result.json'}: [Errno 2] No such file or directory" in capsys.readouterr().err
    (torn / "result.json").unlink()
    assert cli(["report", str(tmp_path / "runs"), "--markdown", str(md), "--csv", str(csv)]) == 0  # written over
    assert "| good " in md.read_text() and csv.read_text().startswith("started_at")


def test_compare_with_a_run_that_errored_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _result(tmp_path, "base", 1, 1.0, correct=[True] * 20)
    broke = _result(tmp_path, "broke", 2, None, verdict="ERROR", correct=[])
    assert cli(["compare", str(base), str(broke)]) == 3
    assert "that run ended in ERROR (broke ERROR)" in capsys.readouterr().err


def test_compare_lists_flips_and_fails_when_significantly_worse(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    base = _result(tmp_path, "base", 1, 1.0, correct=[True] * 20)
    worse = _result(tmp_path, "worse", 2, 0.5, correct=[i % 2 == 0 for i in range(20)])
    same = _result(tmp_path, "same", 3, 0.95, correct=[i != 3 for i in range(20)])
    assert cli(["compare", str(base), str(worse)]) == 1
    out = capsys.readouterr().out
    assert "10 right->wrong" in out and "right -> wrong (10):" in out and "question 1: candidate answered '1'" in out
    assert "and 0 more" not in out and "... and" not in out
    assert cli(["compare", str(base), str(same)]) == 0
    assert "right -> wrong (1):" in capsys.readouterr().out
    no_samples = _result(tmp_path, "nosamples", 4, 0.9)
    assert cli(["compare", str(base), str(no_samples)]) == 3
    assert "no samples.jsonl" in capsys.readouterr().err


def test_compare_pairs_only_the_same_questions_read_as_the_gate_reads_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _result(tmp_path, "base", 1, 1.0, correct=[True] * 20)
    base_rows = [json.loads(line) for line in (base / "samples.jsonl").read_text().splitlines()]
    (base / "samples.jsonl").write_text("".join(json.dumps({**r, "prompt_hash": "same"}) + "\n" for r in base_rows))

    def candidate(name: str, rows: list[dict]) -> Path:
        run_dir = _result(tmp_path, name, 2, 0.5, correct=[])
        (run_dir / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return run_dir

    rows = [{"id": i, "correct": True, "extracted": str(i), "target": f"x #### {i}"} for i in range(20)]
    cases = [
        # a duplicate's last copy won: 20 wrong answers then 20 right ones compared as "no flip"
        ([{**r, "correct": False} for r in rows] + rows, "samples.jsonl: row 21: question id '0' appears twice"),
        ([{**r, "correct": "false"} for r in rows], "samples.jsonl: row 1 (question id '0'): 'correct' must be "
                                                    "true or false, got 'false'"),
        ([{**r, "correct": None} for r in rows], "got None"),
        (rows[:1] + [{**r, "id": 1000 + r["id"]} for r in rows[1:]],
         "19 only in the candidate, 19 only in the baseline, 1 in both; evaluate both on the same data set"),
        ([{**r, "target": f"x #### {100 + r['id']}"} for r in rows], "different targets for 20 question id(s)"),
        # asked with other prompts (another num_fewshot, gen_prefix, ...): rows without a hash are not compared
        ([{**r, "prompt_hash": "other" if r["id"] < 3 else "same"} for r in rows],
         "were sent different prompts for 3 of 20 question id(s) (first: '0')"),
        ([], "samples.jsonl has no rows"),
    ]
    for index, (cand_rows, message) in enumerate(cases):
        assert cli(["compare", str(base), str(candidate(f"c{index}", cand_rows))]) == 3, message
        err = capsys.readouterr().err
        assert message in err, err
    other = candidate("other-metric", rows)
    data = json.loads((other / "result.json").read_text())
    data["metrics"]["metric"] = "exact_match,flexible-extract"
    (other / "result.json").write_text(json.dumps(data))
    assert cli(["compare", str(base), str(other / "result.json")]) == 3
    assert "their per-question results are not comparable" in capsys.readouterr().err
    lines = "".join(json.dumps(row) + "\n" for row in rows[:5])
    for torn, message in ((lines + '{"id": 5, "correct": tr\n', "not JSON lines (line 6 column 22: Expecting value)"),
                          ("[1, 2]\n", "must be a JSON object")):
        (other / "samples.jsonl").write_text(torn)
        assert cli(["compare", str(base), str(other)]) == 3
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("change,message", [  # `...`: the key is deleted
    ({"name": ...}, "'name' must be a string, it is missing"),
    ({"verdict": ...}, "'verdict' must be a string, it is missing"),
    ({"schema_version": "1"}, "schema_version must be an integer, got '1'"),
    ({"schema_version": None}, "schema_version must be an integer, got None"),
])
def test_report_and_compare_refuse_a_result_json_of_the_wrong_shape_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, message: str) -> None:
    """A hand-made or foreign result.json was a KeyError or TypeError traceback (exit 1), and one
    such file took the whole report down."""
    good = _result(tmp_path, "good", 1, 0.8, correct=[True] * 20)
    bad = _result(tmp_path, "bad", 2, 0.8, correct=[True] * 20)
    data = json.loads((bad / "result.json").read_text())
    for key, value in change.items():
        if value is ...:
            del data[key]
        else:
            data[key] = value
    (bad / "result.json").write_text(json.dumps(data))
    assert cli(["report", str(tmp_path)]) == 3
    captured = capsys.readouterr()
    assert f"error: {bad / 'result.json'}: {message}" in captured.err, captured.err
    assert "| good " in captured.out and "| bad " not in captured.out  # the others are still reported
    assert cli(["compare", str(good), str(bad)]) == 3
    assert f"error: candidate {bad}: {message}" in capsys.readouterr().err


def test_trend_chart_keeps_an_error_after_the_last_measurement_on_the_axis() -> None:
    """The ERROR cross is drawn in axes coordinates vertically, which does not widen the time axis:
    the usual broken night, after the last measurement, fell off the chart."""
    import matplotlib.dates as mdates

    def result(verdict: str, day: int, value: float | None) -> dict:
        return {"schema_version": 1, "name": "nightly-a", "verdict": verdict, "reason": "", "path": str(day),
                "started_at": f"2026-11-{day:02d}T00:00:00+00:00", "config": {"engine": "builtin"},
                "metrics": {"value": value, "metric": "m", "n": 100}, "gate": {"mode": "absolute", "threshold": 0.7}}

    for results in ([result("PASS", 1, 0.8), result("PASS", 2, 0.81), result("ERROR", 10, None)],
                    [result("ERROR", 3, None), result("ERROR", 10, None)]):
        low, high = trend_figure(report_frame(results)).axes[0].get_xlim()
        for day in (3, 10):
            assert low < mdates.date2num(pd.Timestamp(f"2026-11-{day:02d}", tz="UTC")) < high


# -- from mutation testing: what the table and the exit status say about the inputs -------------


def _table(text: str) -> tuple[list[str], list[list[str]]]:
    """(header cells, row cells) of a printed markdown table."""
    lines = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("|")]
    return lines[0], lines[2:]


def test_report_names_each_input_that_holds_no_result_and_still_reports_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _result(tmp_path / "runs", "good", 1, 0.7)
    (tmp_path / "empty").mkdir()
    assert cli(["report", str(good), str(tmp_path / "empty"), str(tmp_path / "missing")]) == 3
    captured = capsys.readouterr()
    assert captured.err == (f"error: {tmp_path / 'empty'}: no result.json below this directory\n"
                            f"error: {tmp_path / 'missing'}: no such file or directory\n")
    assert [row[1] for row in _table(captured.out)[1]] == ["good"]


def test_report_of_no_loadable_result_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Yesterday's report is not written over by an empty one when today's archive is missing."""
    md, png = tmp_path / "r.md", tmp_path / "r.png"
    md.write_text("yesterday's report")
    assert cli(["report", str(tmp_path / "missing"), "--markdown", str(md), "--png", str(png)]) == 3
    assert capsys.readouterr().out == "" and md.read_text() == "yesterday's report" and not png.exists()


def test_report_lists_one_result_named_twice_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _result(tmp_path, "a", 1, 0.7)
    md = tmp_path / "r.md"
    assert cli(["report", str(tmp_path), str(run_dir / "result.json"), "--markdown", str(md)]) == 0
    assert md.read_text().startswith("# quantgate report: 1 runs\n")
    assert len(_table(md.read_text())[1]) == 1


def _refuse_reading(monkeypatch: pytest.MonkeyPatch, locked: Path) -> None:
    """Reading `locked` fails as for a user without read permission (simulated: tests may run as root)."""
    read_text = Path.read_text

    def refuse(path: Path, *args, **kwargs) -> str:
        if path == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refuse)


def test_report_of_an_unreadable_result_says_why_and_reports_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A result.json this user may not read (CI runners are not root; here, as root, the
    permission error is simulated) is an OSError, not a ValueError: it must not be a traceback."""
    _result(tmp_path, "good", 1, 0.7)
    locked = _result(tmp_path, "locked", 2, 0.7) / "result.json"
    _refuse_reading(monkeypatch, locked)
    assert cli(["report", str(tmp_path)]) == 3
    captured = capsys.readouterr()
    assert captured.err == f"error: {locked}: [Errno 13] Permission denied: '{locked}'\n"
    assert [row[1] for row in _table(captured.out)[1]] == ["good"]


def test_report_table_columns_and_order_oldest_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Named in an order that is neither time nor name order: the table is by time, then name."""
    paths = [_result(tmp_path, name, day, 0.7) for name, day in (("b-late", 3), ("c-early", 1), ("a-early", 1))]
    assert cli(["report", *map(str, paths)]) == 0
    header, rows = _table(capsys.readouterr().out)
    # reason is long: only the CSV keeps it
    assert header == ["started_at", "config", "verdict", "metric", "measured", "threshold", "gate", "n",
                      "invalid_rate", "kernels", "failed_on", "total_s", "engine", "path"]
    assert [(row[0][:10], row[1]) for row in rows] == [("2026-11-01", "a-early"), ("2026-11-01", "c-early"),
                                                        ("2026-11-03", "b-late")]
    assert {row[12] for row in rows} == {"builtin"}
    assert [row[13] for row in rows] == [str(paths[2] / "result.json"), str(paths[1] / "result.json"),
                                         str(paths[0] / "result.json")]


def test_report_outputs_go_into_folders_that_do_not_exist_yet(tmp_path: Path) -> None:
    run_dir = _result(tmp_path, "a", 1, 0.7)
    md, png = tmp_path / "new" / "report.md", tmp_path / "other" / "trend.PNG"  # the suffix in any case
    assert cli(["report", str(run_dir), "--markdown", str(md), "--png", str(png)]) == 0
    assert md.read_text().startswith("# quantgate report: 1 runs")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trend_chart_colours_each_verdict_and_crosses_only_errors_without_a_value() -> None:
    def result(verdict: str, day: int, value: float | None, threshold: float | None = 0.7) -> dict:
        gate = {"mode": "absolute", "threshold": threshold} if threshold is not None else {"mode": "paired"}
        return {"schema_version": 1, "name": "a", "verdict": verdict, "reason": "", "path": str(day),
                "started_at": f"2026-11-{day:02d}T00:00:00+00:00", "config": {"engine": "builtin"},
                "metrics": {"value": value, "metric": "m", "n": 100}, "gate": gate}

    # An ERROR that measured (the server died after the evaluation) is an orange point, not a cross.
    ax = trend_figure(report_frame([result("PASS", 1, 0.8), result("FAIL", 2, 0.6), result("ERROR", 3, 0.75),
                                    result("PASS", 4, 0.8, threshold=None), result("ERROR", 5, None)])).axes[0]
    [points, crosses] = ax.collections
    assert [to_rgba(c) for c in points.get_facecolors()] == [to_rgba(c) for c in
                                                             ("tab:green", "tab:red", "tab:orange", "tab:green")]
    assert crosses.get_label() == "ERROR, no measurement (1)" and len(crosses.get_offsets()) == 1
    # The threshold is drawn although one run (another gate) has none.
    assert [line.get_linestyle() for line in ax.get_lines()] == ["-", "--"]


def test_trend_chart_of_one_broken_night_alone_has_a_time_axis_around_it() -> None:
    """One ERROR and nothing measured: the axis spans nothing, and matplotlib warns of a singular one."""
    import warnings

    import matplotlib.dates as mdates

    only = {"schema_version": 1, "name": "a", "verdict": "ERROR", "reason": "", "path": "1",
            "started_at": "2026-11-03T00:00:00+00:00", "config": {}, "metrics": None, "gate": None}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low, high = trend_figure(report_frame([only])).axes[0].get_xlim()
    night = mdates.date2num(pd.Timestamp("2026-11-03", tz="UTC"))
    assert low <= night - 0.5 and night + 0.5 <= high


def _compared_pair(tmp_path: Path) -> tuple[Path, Path]:
    """base right on all but questions 12 and 19; the candidate turns 0-10 wrong (one more flip than
    is listed), keeps 12 wrong, and gets 19 right. Each run's own answers, and targets with their worked solution."""
    def run(name: str, day: int, verdict: str, wrong: set[int], tag: str) -> Path:
        run_dir = _result(tmp_path, name, day, (20 - len(wrong)) / 20, verdict=verdict)
        write_samples(run_dir, [{"id": i, "correct": i not in wrong, "extracted": f"{tag}{i}",
                                 "target": f"{i} + 0 = {i}\n#### {i}"} for i in range(20)])
        return run_dir

    return run("base", 1, "PASS", {12, 19}, "b"), run("worse", 2, "FAIL", {*range(11), 12}, "c")


def test_compare_prints_each_run_and_every_flip_both_ways(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = _compared_pair(tmp_path)
    assert cli(["compare", str(base), str(cand)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["base: base (PASS): exact_match,strict-match 0.9000 (n 20)",
                         "cand: worse (FAIL): exact_match,strict-match 0.4000 (n 20)"]
    assert lines[2].startswith("paired: exact McNemar on 20 common questions; flips: 11 right->wrong "), lines[2]
    # the first ten of the 11 flips, then how many more; the candidate's answer and the target's final answer
    assert lines[3:] == (["right -> wrong (11):"]
                         + [f"  question {i}: candidate answered 'c{i}' (target '{i}')" for i in range(10)]
                         + ["  ... and 1 more", "wrong -> right (1):",
                            "  question 19: candidate answered 'c19' (target '19')"])


def test_compare_alpha_decides_what_is_significantly_worse(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # 11 right->wrong against 1 wrong->right: p = 13 / 2^12 = 0.0032, below 0.05 and 0.01, not below 0.001
    base, cand = _compared_pair(tmp_path)
    assert cli(["compare", str(base), str(cand), "--alpha", "0.01"]) == 1
    assert "< alpha 0.01 -> FAIL" in capsys.readouterr().out
    assert cli(["compare", str(base), str(cand), "--alpha", "0.001"]) == 0
    assert ">= alpha 0.001 -> PASS" in capsys.readouterr().out


def test_compare_names_the_samples_file_a_problem_is_in(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    base, cand = _compared_pair(tmp_path)
    samples = cand / "samples.jsonl"
    good_line = samples.read_text().splitlines()[0]
    samples.write_text(f"{good_line}\n[1, 2]\n")  # one question, then a line that is none
    assert cli(["compare", str(base), str(cand)]) == 3
    assert capsys.readouterr().err == \
        f"error: candidate {samples}: every line must be a JSON object (one question)\n"
    # Unreadable (CI runners are not root; simulated here): said so, not "not JSON lines".
    _refuse_reading(monkeypatch, samples)
    assert cli(["compare", str(base), str(cand / "result.json")]) == 3
    assert capsys.readouterr().err == f"error: candidate {samples}: cannot be read: Permission denied\n"


def test_compare_shows_a_value_of_zero_as_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint that answers nothing right measured 0: not "-", which reads as no measurement."""
    base = _result(tmp_path, "base", 1, 1.0, correct=[True] * 20)
    zero = _result(tmp_path, "zero", 2, 0.0, verdict="FAIL", correct=[False] * 20)
    assert cli(["compare", str(base), str(zero)]) == 1
    assert "cand: zero (FAIL): exact_match,strict-match 0.0000 (n 20)\n" in capsys.readouterr().out
