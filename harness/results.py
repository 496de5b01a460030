"""Run artifacts (SPEC section 5): per config `<output-dir>/<name>/result.json`,
`samples.jsonl` and `server.log` (written by the launcher); per run `junit.xml` and
`summary.md`.

`result.json` is written for every config that was attempted, whatever happened: an ERROR
carries its cause and the server log's tail, an interrupted run says so. Other tools parse
these files: keys are only ever added, and `schema_version` changes when one changes meaning.
"""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
RESULT_FILE, SAMPLES_FILE, SERVER_LOG = "result.json", "samples.jsonl", "server.log"
PASS, FAIL, ERROR = "PASS", "FAIL", "ERROR"
EXIT_PASS, EXIT_FAIL, EXIT_ERROR, EXIT_USAGE = 0, 1, 2, 3


@dataclass
class RunRecord:
    """Everything result.json says about one config's run."""

    name: str
    verdict: str  # PASS | FAIL | ERROR
    reason: str
    config: dict[str, Any]
    metrics: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    expect: dict[str, Any] | None = None
    kernels: dict[str, Any] | None = None
    server: dict[str, Any] | None = None
    evaluation: dict[str, Any] | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    dataset: dict[str, Any] | None = None
    task: dict[str, Any] | None = None
    timings: dict[str, float | None] = field(default_factory=dict)
    interrupted: str | None = None  # the signal that stopped the run, if one did
    log_tail: str | None = None  # the server log's tail, for errors
    started_at: str = ""
    finished_at: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def exit_code(self) -> int:
        return {PASS: EXIT_PASS, FAIL: EXIT_FAIL}.get(self.verdict, EXIT_ERROR)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {"schema_version": data.pop("schema_version"), **data}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def harness_versions() -> dict[str, str | None]:
    """Read from package metadata: importing torch or lm-eval just to ask costs seconds."""
    return {"quantgate": package_version("quantgate"), "lm_eval": package_version("lm_eval"),
            "torch": package_version("torch")}


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # numpy scalars from lm-eval
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _finite(value: Any) -> Any:
    """NaN and infinities are not JSON; they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _write_atomic(path: Path, text: str) -> None:
    """Write-then-rename: a reader (or a second Ctrl-C) never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_result(run_dir: Path, record: RunRecord) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RESULT_FILE
    text = json.dumps(_finite(json.loads(json.dumps(record.to_dict(), default=_json_default))), indent=2)
    _write_atomic(path, text + "\n")
    return path


def write_samples(run_dir: Path, samples: Sequence[dict[str, Any]]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SAMPLES_FILE
    _write_atomic(path, "".join(json.dumps(s, default=_json_default) + "\n" for s in samples))
    return path


def load_result(path: Path) -> dict[str, Any]:
    """A result.json (or the run directory holding one)."""
    path = path / RESULT_FILE if path.is_dir() else path
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ValueError(f"{path} is not a quantgate result.json (no schema_version)")
    if data["schema_version"] > SCHEMA_VERSION:
        raise ValueError(f"{path} has schema_version {data['schema_version']}; this quantgate reads up to "
                         f"{SCHEMA_VERSION}: upgrade quantgate")
    return data


def load_samples(result_path: Path) -> list[dict[str, Any]] | None:
    """samples.jsonl beside a result.json, or None when there is none."""
    run_dir = result_path if result_path.is_dir() else result_path.parent
    path = run_dir / SAMPLES_FILE
    if not path.is_file():
        return None
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------- summaries


def summary_frame(records: Sequence[RunRecord | dict[str, Any]]):
    """One row per run: the table printed after a run and written to summary.md."""
    import pandas as pd

    rows = []
    for rec in records:
        data = rec.to_dict() if isinstance(rec, RunRecord) else rec
        metrics, gate = data.get("metrics") or {}, data.get("gate") or {}
        expect = data.get("expect") or {}
        rows.append({
            "config": data["name"],
            "verdict": data["verdict"],
            "metric": metrics.get("metric") or gate.get("metric"),
            "measured": metrics.get("value") if metrics.get("complete", True) else None,  # partial: no score
            "threshold": gate.get("threshold"),
            "gate": gate.get("mode"),
            "n": metrics.get("n"),
            "invalid_rate": metrics.get("invalid_rate"),
            "kernels": "ok" if expect.get("passed") else ("MISMATCH" if expect else "-"),
            "total_s": (data.get("timings") or {}).get("total_s"),
            "reason": data.get("reason", ""),
        })
    return pd.DataFrame(rows, columns=["config", "verdict", "metric", "measured", "threshold", "gate", "n",
                                       "invalid_rate", "kernels", "total_s", "reason"])


def markdown_table(frame) -> str:
    """A pandas frame as a GitHub markdown table, missing values as '-'."""
    if not len(frame):
        return "(no runs)"
    cleaned = frame.astype(object).where(frame.notna(), None)
    return cleaned.to_markdown(index=False, floatfmt=".4f", missingval="-")


def summary_markdown(records: Sequence[RunRecord]) -> str:
    frame = summary_frame(records)
    counts = frame["verdict"].value_counts()
    head = ", ".join(f"{counts.get(v, 0)} {v}" for v in (PASS, FAIL, ERROR))
    table = markdown_table(frame)
    details = []
    for rec in records:
        if rec.verdict != PASS:
            details.append(f"### {rec.name}: {rec.verdict}\n\n{rec.reason}\n")
            if rec.gate and rec.gate.get("explanation"):
                details.append(f"```\n{rec.gate['explanation']}\n```\n")
            if rec.log_tail:
                details.append(f"<details><summary>server log tail</summary>\n\n```\n{rec.log_tail}\n```\n"
                               "</details>\n")
    return f"# quantgate run: {head}\n\n{table}\n\n" + "\n".join(details)


def write_summary(records: Sequence[RunRecord], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, summary_markdown(records))
    return path


def write_junit(records: Sequence[RunRecord], path: Path, suite: str = "quantgate") -> Path:
    """One testcase per config: FAIL is a <failure>, ERROR an <error> (the retryable class)."""
    failures = sum(r.verdict == FAIL for r in records)
    errors = sum(r.verdict == ERROR for r in records)
    total = sum((r.timings.get("total_s") or 0.0) for r in records)
    root = ET.Element("testsuites", name=suite, tests=str(len(records)), failures=str(failures),
                      errors=str(errors), time=f"{total:.3f}")
    tsuite = ET.SubElement(root, "testsuite", name=suite, tests=str(len(records)), failures=str(failures),
                           errors=str(errors), time=f"{total:.3f}", timestamp=now_iso())
    for rec in records:
        case = ET.SubElement(tsuite, "testcase", classname=f"{suite}.{rec.config.get('engine', 'builtin')}",
                             name=rec.name, time=f"{rec.timings.get('total_s') or 0.0:.3f}",
                             file=str(rec.config.get("path", "")))
        body = [rec.reason]
        if rec.gate and rec.gate.get("explanation"):
            body.append(rec.gate["explanation"])
        if rec.log_tail:
            body.append("server log tail:\n" + rec.log_tail)
        if rec.verdict == FAIL:
            ET.SubElement(case, "failure", message=rec.reason, type="GateFailed").text = "\n\n".join(body)
        elif rec.verdict == ERROR:
            kind = "Interrupted" if rec.interrupted else "RunError"
            ET.SubElement(case, "error", message=rec.reason, type=kind).text = "\n\n".join(body)
        elif rec.gate and rec.gate.get("explanation"):
            ET.SubElement(case, "system-out").text = rec.gate["explanation"]
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")
    return path
