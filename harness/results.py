"""Run artifacts (SPEC section 5): per config `<output-dir>/<name>/result.json`,
`samples.jsonl` and `server.log` (written by the launcher); per run `junit.xml` and
`summary.md`.

`result.json` is written for every config that was attempted, whatever happened: an ERROR
carries its cause and the server log's tail, an interrupted run says so. Other tools parse
these files: keys are only ever added, and `schema_version` changes when one changes meaning.
Every result.json has the whole SPEC section 5 shape whatever the verdict (see `result_shape`):
what was not measured is null, never a missing key or a missing object.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import reprlib
import shlex
import stat
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# Adding keys (with nulls where nothing is known) is compatible: readers of version 1 keep
# working, so it does not bump this. A key that disappears or changes meaning does.
SCHEMA_VERSION = 1
RESULT_FILE, SAMPLES_FILE, SERVER_LOG = "result.json", "samples.jsonl", "server.log"
PASS, FAIL, ERROR = "PASS", "FAIL", "ERROR"
EXIT_PASS, EXIT_FAIL, EXIT_ERROR, EXIT_USAGE = 0, 1, 2, 3


class ArtifactsUnwritable(OSError):
    """A file of a config's run (its folder, server.log, lm_eval.log, the task YAML) cannot be
    written: a full disk, a quota, a permission. That config is an ERROR (exit 2: it may pass once
    there is room), and the others still run."""

    @classmethod
    def of(cls, path: Path | str, exc: OSError) -> ArtifactsUnwritable:
        """The error naming `path`, the OS's own words and the fix."""
        said = f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc) or type(exc).__name__
        fix = ("make it writable or pass another --output-dir" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
               else "free space or pass another --output-dir")
        error = cls(f"artifacts cannot be written to {path} ({said}); {fix} and run again")
        error.errno = exc.errno  # what the OS said, for callers that tell a full disk from the rest
        return error


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
    usage_error: bool = False  # an ERROR the config itself causes (the server refused it): exit 3, never retried
    started_at: str = ""
    finished_at: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def exit_code(self) -> int:
        if self.verdict == ERROR and self.usage_error:
            return EXIT_USAGE
        return {PASS: EXIT_PASS, FAIL: EXIT_FAIL}.get(self.verdict, EXIT_ERROR)

    def to_dict(self) -> dict[str, Any]:
        """What result.json holds: the fields in SPEC section 5's full shape (`result_shape`).
        The record itself keeps None for what was never measured."""
        data = result_shape(asdict(self))
        return {"schema_version": data.pop("schema_version"), **data}


@dataclass(frozen=True)
class Skipped:
    """A config not run because this machine does not meet its `requires:` (run
    --skip-unmet-requires): no result.json, a skipped junit testcase and a summary line."""

    name: str
    path: str
    engine: str
    reason: str


# SPEC section 5, "result.json at least": the keys other tools rely on, present in every
# result.json (null when a run never got that far), besides whatever the run adds.
METRIC_KEYS = ("value", "metric", "strict_match", "flexible_extract", "stderr", "n", "invalid_rate")
GATE_KEYS = ("mode", "passed", "explanation")
TIMING_KEYS = ("server_start_s", "eval_s", "total_s")
VERSION_KEYS = ("quantgate", "lm_eval", "torch", "engine")
SERVER_KEYS = ("command", "startup_s", "exit_status", "log")
TASK_KEYS = ("file", "sha256")
DATASET_KEYS = ("sha256",)


def _configured(config: dict[str, Any], key: str) -> Any:
    """A setting of the record's config summary (`metric`, `gate`): the runner writes it at the
    top and in `data` (the whole validated config); hand-made records may have neither."""
    if config.get(key) is not None:
        return config[key]
    data = config.get("data")
    return data.get(key) if isinstance(data, dict) else None


def _with_keys(value: Any, keys: Sequence[str], **known: Any) -> dict[str, Any]:
    """`value` (a dict, or None for nothing) with every one of `keys`: missing or null ones
    become `known`'s value for them, else null. Content already there is kept as it is."""
    out = dict(value) if isinstance(value, dict) else {}
    for key in keys:
        if out.get(key) is None:
            out[key] = known.get(key)
    return out


def result_shape(data: dict[str, Any]) -> dict[str, Any]:
    """A record's fields (`asdict`) in SPEC section 5's full shape: metrics, gate, kernels,
    server, versions, dataset, task and timings are objects with their keys, whether or not the
    run got far enough to fill them. The metric name and gate mode come from the config when
    nothing was measured."""
    config = data.get("config") or {}
    gate_spec = _configured(config, "gate")
    mode = gate_spec.get("mode") if isinstance(gate_spec, dict) else gate_spec if isinstance(gate_spec, str) else None
    return {
        **data,
        "metrics": _with_keys(data.get("metrics"), METRIC_KEYS, metric=_configured(config, "metric")),
        "gate": _with_keys(data.get("gate"), GATE_KEYS, mode=mode),
        "kernels": data.get("kernels") if isinstance(data.get("kernels"), dict) else {},
        "server": _with_keys(data.get("server"), SERVER_KEYS),
        "versions": _with_keys(data.get("versions"), VERSION_KEYS),
        "dataset": _with_keys(data.get("dataset"), DATASET_KEYS),
        "task": _with_keys(data.get("task"), TASK_KEYS),
        "timings": _with_keys(data.get("timings"), TIMING_KEYS),
    }


def artifact_path_problems(targets: Sequence[tuple[str, Path | None, bool]]) -> list[str]:
    """Why each (flag, path, is a folder) could not be written, checked before anything runs;
    two flags naming one path clash too. None paths are not given."""
    problems = []
    for flag, path, is_dir in targets:
        if path is None:
            continue
        try:
            path.exists()
        except OSError as exc:  # a name too long, a loop of links
            problems.append(f"{flag} {path}: {exc.strerror or exc}; pass another path")
            continue
        if path.exists() and path.is_dir() != is_dir:
            kind = "a file" if is_dir else "a folder"
            problems.append(f"{flag} {path} is {kind}; pass a {'folder' if is_dir else 'file'} path")
            continue
        if path.exists():  # written over, as a re-run does: a file in place (report) or by a rename
            # (write_atomic), which needs its folder writable too
            writable = os.access(path, os.W_OK | os.X_OK) if is_dir else (
                os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK))
            if not writable:
                problems.append(f"{flag} {path} is not writable (or its folder is not); pass a path you can write to")
            continue
        ancestor = path.parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            problems.append(f"{flag} {path}: {ancestor} is a file, so the path cannot be created; pass another path")
        elif not os.access(ancestor, os.W_OK | os.X_OK):
            problems.append(f"{flag} {path}: {ancestor} is not writable; pass a path you can write to")
    given = [(flag, path.resolve()) for flag, path, _ in targets if path is not None]
    for i, (flag, path) in enumerate(given):
        problems += [f"{flag} and {other} are the same path {path}; pass different paths"
                     for other, other_path in given[i + 1:] if other_path == path]
    return problems


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


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write-then-rename: a reader (or a second Ctrl-C) never sees half a file, and a write that
    fails (a full disk) leaves the old one whole. A file written over keeps its mode; a symlink
    keeps pointing at the file, which is what is rewritten."""
    target = path.resolve() if path.is_symlink() else path
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        if target.exists():
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        os.replace(tmp, target)
    finally:  # a full disk must not leave half a temp file behind
        tmp.unlink(missing_ok=True)


def write_result(run_dir: Path, record: RunRecord) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RESULT_FILE
    text = json.dumps(_finite(json.loads(json.dumps(record.to_dict(), default=_json_default))), indent=2)
    write_atomic(path, text + "\n")
    return path


def write_samples(run_dir: Path, samples: Sequence[dict[str, Any]]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SAMPLES_FILE
    write_atomic(path, "".join(json.dumps(s, default=_json_default) + "\n" for s in samples))
    return path


def load_result(path: Path) -> dict[str, Any]:
    """A result.json (or the run directory holding one); ValueError for one that is not a
    result.json this quantgate can read (its message leaves naming the file to the caller, as
    json's own errors do)."""
    if path.is_dir() and not (path / RESULT_FILE).is_file():
        runs = sorted(p.parent.name for p in path.glob(f"*/{RESULT_FILE}"))
        if runs:  # a whole run's --output-dir: one folder per config
            raise ValueError("this folder holds one run directory per config; pass one of them: "
                             + ", ".join(str(path / name) for name in runs[:5]) + (", ..." if len(runs) > 5 else ""))
    path = path / RESULT_FILE if path.is_dir() else path
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ValueError("not a quantgate result.json (no schema_version)")
    version = data["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"schema_version must be an integer, got {version!r}; it is not a result.json "
                         "quantgate wrote: write it again with `quantgate run`")
    if version > SCHEMA_VERSION:
        raise ValueError(f"schema_version {version}; this quantgate reads up to "
                         f"{SCHEMA_VERSION}: upgrade quantgate")
    # What readers (report, compare, cached baselines) rely on, checked once here: a hand-made or
    # foreign file is one clear message, not a KeyError or TypeError deep in one of them.
    objects = ("config", "metrics", "gate", "expect", "evaluation", "dataset", "timings")
    for key, kind, required in (("name", str, True), ("verdict", str, True), ("reason", str, False),
                                ("started_at", str, False), *((key, dict, False) for key in objects)):
        if data.get(key) is None and not required:
            continue
        if not isinstance(data.get(key), kind):
            what = "a string" if kind is str else "an object (or null)"
            got = "it is missing" if key not in data else f"got {reprlib.repr(data[key])}"
            raise ValueError(f"{key!r} must be {what}, {got}; it is not a result.json quantgate wrote: "
                             "write it again with `quantgate run`")
    return data


def load_samples(result_path: Path) -> list[dict[str, Any]] | None:
    """samples.jsonl beside a result.json, or None when there is none."""
    run_dir = result_path if result_path.is_dir() else result_path.parent
    path = run_dir / SAMPLES_FILE
    if not path.is_file():
        return None
    rows = []
    # Split at newlines only, as editors number lines: splitlines() also splits at U+2028 and
    # \x0c, which a JSON string may hold raw.
    for number, line in enumerate(path.read_text().split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:  # parsed alone, every line would be "line 1"
            raise ValueError(f"line {number} column {exc.colno}: {exc.msg}") from None
    return rows


# ---------------------------------------------------------------------------- summaries


def summary_frame(records: Sequence[RunRecord | dict[str, Any]]):
    """One row per run: the table printed after a run and written to summary.md."""
    import pandas as pd

    rows = []
    for rec in records:
        data = rec.to_dict() if isinstance(rec, RunRecord) else rec
        metrics, gate = data.get("metrics") or {}, data.get("gate") or {}
        expect = data.get("expect") or {}
        metric, measured, threshold = _shown_comparison(metrics, gate)
        rows.append({
            "config": data["name"],
            "verdict": data["verdict"],
            "metric": metric,
            "measured": measured,
            "threshold": threshold,
            "gate": gate.get("mode"),
            "n": metrics.get("n"),
            "invalid_rate": metrics.get("invalid_rate"),
            "kernels": _kernels_cell(expect),
            "failed_on": _failed_on(data["verdict"], gate, expect),
            "total_s": (data.get("timings") or {}).get("total_s"),
            "reason": data.get("reason", ""),
        })
    frame = pd.DataFrame(rows, columns=["config", "verdict", "metric", "measured", "threshold", "gate", "n",
                                        "invalid_rate", "kernels", "failed_on", "total_s", "reason"])
    # A count stays an integer when a row has none (an ERROR): pandas would make the column float.
    frame["n"] = pd.array([_count(v) for v in frame["n"]], dtype="Int64")
    return frame


def _shown_comparison(metrics: dict[str, Any], gate: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The metric, measured value and threshold of a row: the gated metric's, or, when only a
    gen-1 file's other listed metric failed, the first failing one's, so that measured vs
    threshold never contradicts the verdict. Thresholds are on the measured scale (wilson's lower
    bound and recovery's ratio have their own)."""
    gated = metrics.get("metric") or gate.get("metric")
    failed = _failed_metrics(gate)
    other = next((o for o in gate.get("other_metrics") or [] if o.get("metric") in failed), None)
    if other is not None and gate.get("metric") not in failed:
        return other["metric"], other.get("measured"), _threshold_of(other)
    measured = metrics.get("value") if metrics.get("complete", True) else None  # partial: no score
    return gated, measured, _threshold_of(gate)


def _threshold_of(numbers: dict[str, Any]) -> Any:
    return numbers["measured_threshold"] if "measured_threshold" in numbers else numbers.get("threshold")


def _failed_metrics(gate: dict[str, Any]) -> list[str]:
    """The gen-1 metrics that failed: `failed_metrics`, or for a result.json written before it
    existed, the other metrics marked failed and the gated one when its measured value is below
    its threshold (no other mode lists several)."""
    if "failed_metrics" in gate or not gate.get("other_metrics"):
        return list(gate.get("failed_metrics") or [])
    measured, threshold = gate.get("measured"), _threshold_of(gate)
    below = isinstance(measured, (int, float)) and isinstance(threshold, (int, float)) and measured < threshold
    return [gate["metric"]] * bool(below and gate.get("metric")) + [
        o["metric"] for o in gate["other_metrics"] if o.get("passed") is False]


def _kernels_cell(expect: dict[str, Any]) -> str:
    """The kernel check in a word: MISMATCH when another kernel ran, UNVERIFIED when nothing showed
    which one did (no report, no module of the layer); "-" without a check."""
    if not expect:
        return "-"
    if expect.get("passed"):
        return "ok"
    return "MISMATCH" if expect.get("mismatches") else "UNVERIFIED"


def _failed_on(verdict: str, gate: dict[str, Any], expect: dict[str, Any]) -> str:
    """What a FAIL rests on, in a few words: the metrics that failed, an invalid rate above its
    maximum, the kernel check; empty for a PASS or an ERROR (the reason says why)."""
    if verdict != "FAIL":
        return ""
    accuracy_failed = gate.get("accuracy_passed", gate.get("passed")) is False  # the key exists with max_invalid_rate
    causes = (_failed_metrics(gate) or [gate.get("metric") or "accuracy"]) if accuracy_failed else []
    if gate.get("invalid_rate_passed") is False:
        causes.append(f"invalid_rate > {gate['max_invalid_rate']:g}")
    if expect and expect.get("passed") is False:
        causes.append("kernels")
    return ", ".join(causes)


def negative_check_verdict(result: dict[str, Any]) -> str:
    """A negative check's verdict as its CI step reads it: "FAIL" only when the run failed on the
    check it exercises, `expect:` (which kernel ran) when it names a kernel other than the one its
    server_args choose, else the accuracy gate; "FAIL on ..., not on ..." when it failed on
    another; else the verdict (PASS, ERROR, ""). A check whose FAIL came from elsewhere no longer
    shows that its own check catches its case."""
    verdict = result.get("verdict") or ""
    if verdict != FAIL:
        return verdict
    gate, expect = result.get("gate") or {}, result.get("expect") or {}
    exercised = "kernels" if _expects_another_kernel(result) else "accuracy"
    failed = _failed_on(verdict, gate, expect)
    if exercised == "kernels" and expect.get("passed") is False and not expect.get("mismatches"):
        # "cannot be verified" (no kernel report) FAILs too, but proves nothing about catching a
        # wrong kernel: the report this check relies on is what went missing.
        return "FAIL on kernels UNVERIFIED, not on a kernel mismatch"
    caught = expect.get("passed") is False if exercised == "kernels" else \
        gate.get("accuracy_passed", gate.get("passed")) is False
    return FAIL if caught else f"FAIL on {failed or 'nothing recorded'}, not on {exercised}"


def _expects_another_kernel(result: dict[str, Any]) -> bool:
    """Whether the run's `expect:` names, for some layer, a kernel other than the backend its
    server_args choose there: the mismatch a kernel negative check is built on. An expectation
    that restates server_args' backend (`--linear-backend emulation` with `linear_kernel:
    emulation`, or one server_args implied) only confirms which kernel served a faulty checkpoint,
    whose check is the accuracy gate (negative-check-paired-scale-480)."""
    from .backends import FLAGS, canonical
    from .config import backend_flags_of

    expect = result.get("expect") or {}
    implied = set(expect.get("from_server_args") or [])
    args = (result.get("config") or {}).get("server_args") or []
    chosen = backend_flags_of([str(a) for a in args]) if isinstance(args, list) else {}
    return any(layer not in implied and canonical(str(name)) != canonical(str(chosen.get(FLAGS.get(layer, ""), "")))
               for layer, name in (expect.get("expected") or {}).items())


def _count(value: Any) -> int | None:
    """A question count as an int; None for a missing (or non-integral, non-finite) one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value)


def _markdown_cell(value: Any) -> Any:
    """A `|` in a name or reason would end its cell early and a line break its row: the rendered
    table would drop what follows."""
    if not isinstance(value, str):
        return value
    return re.sub(r"\r\n|\r|\n", "<br>", value.replace("|", "\\|"))


def markdown_table(frame) -> str:
    """A pandas frame as a GitHub markdown table, missing values as '-'."""
    import pandas as pd

    from .gates import distinct_places  # the gates' config import is not for every reader of results

    if not len(frame):
        return "(no runs)"
    cleaned = frame.astype(object).where(frame.notna(), None)
    # Built cell by cell as objects: pandas' map would infer dtypes again (20 -> 20.0, None -> NaN).
    escaped = pd.DataFrame([[_markdown_cell(v) for v in row] for row in cleaned.to_numpy()], columns=frame.columns,
                           dtype=object)
    floatfmt: str | list[str] = ".4f"
    if "measured" in frame.columns and "threshold" in frame.columns:
        # Both columns to as many places as tell every row's pair apart: a FAIL row must never read
        # 0.7339 | 0.7339 (summary_frame's promise). A column, not a cell: tabulate formats text
        # that reads as a number with the column's format again.
        places = max((distinct_places(float(m), float(t)) for m, t in zip(cleaned["measured"], cleaned["threshold"])
                      if is_finite_number(m) and is_finite_number(t)), default=4)
        floatfmt = [f".{places}f" if column in ("measured", "threshold") else ".4f" for column in frame.columns]
    return escaped.to_markdown(index=False, floatfmt=floatfmt, missingval="-")


def is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# quantgate's own tree when it runs from a checkout (editable install); the installed package's
# folder otherwise, which holds no configs.
_SOURCE_TREE = Path(__file__).resolve().parents[1]


def checkout_commit(where: Path, file: Path | None = None) -> str | None:
    """HEAD of the git checkout holding `where`, `-dirty` when tracked files differ from it,
    `-untracked` when `file` is not in it (a config not committed yet: no commit holds what ran);
    None outside git or before a first commit.

    QUANTGATE_COMMIT, when set, names the commit of quantgate's own tree and wins for configs
    inside it: a copied tree (the device machine's) keeps a stale .git whose HEAD is not what
    ran. Configs of other checkouts keep their git's answer."""
    passed = os.environ.get("QUANTGATE_COMMIT")
    if passed and Path(where).resolve().is_relative_to(_SOURCE_TREE):
        return passed

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        # No optional locks: `git status` would take the index lock a user's own `git add` needs.
        return subprocess.run(["git", "--no-optional-locks", "-C", str(where), *args], capture_output=True, text=True,
                              timeout=10)

    try:
        head = git("rev-parse", "--short=12", "HEAD").stdout.strip()
        if not head:
            return None
        if file is not None and git("ls-files", "--error-unmatch", str(file)).returncode != 0:
            return f"{head}-untracked"
        changed = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head + "-dirty" if changed else head


def _repro_line(rec: RunRecord) -> str | None:
    run_dir = rec.config.get("run_dir")
    return f"reproduce: quantgate repro {shlex.quote(str(Path(run_dir) / RESULT_FILE))}" if run_dir else None


def summary_markdown(records: Sequence[RunRecord], skipped: Sequence[Skipped] = ()) -> str:
    frame = summary_frame(records)
    counts = frame["verdict"].value_counts()
    head = ", ".join(f"{counts.get(v, 0)} {v}" for v in (PASS, FAIL, ERROR)) + (
        f", {len(skipped)} skipped" if skipped else "")
    table = markdown_table(frame)
    details = []
    for rec in records:
        if rec.verdict != PASS:
            details.append(f"### {rec.name}: {rec.verdict}\n\n{rec.reason}\n")
            if _repro_line(rec):  # not a code span: a name may hold a backtick
                details.append(f"{_repro_line(rec)} (prints the server and lm-eval commands of this run)\n")
            if rec.gate and rec.gate.get("explanation"):
                details.append(f"```\n{rec.gate['explanation']}\n```\n")
            if rec.log_tail:
                details.append(f"<details><summary>server log tail</summary>\n\n```\n{rec.log_tail}\n```\n"
                               "</details>\n")
    if skipped:
        details.append("### Skipped: this machine does not meet their `requires:`\n\n"
                       + "\n".join(f"- {s.name} ({s.path}): {s.reason}" for s in skipped) + "\n")
    return f"# quantgate run: {head}\n\n{table}\n\n" + "\n".join(details)


def write_summary(records: Sequence[RunRecord], path: Path, skipped: Sequence[Skipped] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, summary_markdown(records, skipped))
    return path


# XML 1.0 has no way to write these, escaped or not: one of them (the ESC of a coloured server
# log, a NUL in a reason) makes the whole junit.xml unreadable to CI.
_NOT_XML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")
# Terminal escapes (colours, cursor moves) of a server's log: CSI and OSC sequences, and the
# two-character ones.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def _xml_text(text: str) -> str:
    """`text` as XML 1.0 can hold it: terminal escapes removed, other forbidden characters shown
    as U+FFFD so that something visibly stood there."""
    return _NOT_XML.sub("\ufffd", _ANSI.sub("", text))


def write_junit(records: Sequence[RunRecord], path: Path, suite: str = "quantgate",
                skipped: Sequence[Skipped] = ()) -> Path:
    """One testcase per config: FAIL is a <failure>, ERROR an <error>, a config skipped for its
    `requires:` a <skipped>."""
    failures = sum(r.verdict == FAIL for r in records)
    errors = sum(r.verdict == ERROR for r in records)
    total = sum((r.timings.get("total_s") or 0.0) for r in records)
    counts = {"tests": str(len(records) + len(skipped)), "failures": str(failures), "errors": str(errors),
              "skipped": str(len(skipped)), "time": f"{total:.3f}"}
    root = ET.Element("testsuites", name=suite, **counts)
    tsuite = ET.SubElement(root, "testsuite", name=suite, **counts, timestamp=now_iso())
    for skip in skipped:
        case = ET.SubElement(tsuite, "testcase", classname=f"{suite}.{skip.engine}", name=skip.name, time="0.000",
                             file=skip.path)
        ET.SubElement(case, "skipped", message=skip.reason)
    for rec in records:
        case = ET.SubElement(tsuite, "testcase", classname=f"{suite}.{rec.config.get('engine', 'builtin')}",
                             name=rec.name, time=f"{rec.timings.get('total_s') or 0.0:.3f}",
                             file=str(rec.config.get("path", "")))
        body = [rec.reason]
        if rec.gate and rec.gate.get("explanation"):
            body.append(rec.gate["explanation"])
        if rec.log_tail:
            body.append("server log tail:\n" + rec.log_tail)
        if _repro_line(rec):
            body.append(str(_repro_line(rec)))
        if rec.verdict == FAIL:
            kind = "GateFailed" if (rec.gate or {}).get("passed") is False else "KernelCheckFailed"
            ET.SubElement(case, "failure", message=rec.reason, type=kind).text = "\n\n".join(body)
        elif rec.verdict == ERROR:
            kind = "Interrupted" if rec.interrupted else "RunError"
            ET.SubElement(case, "error", message=rec.reason, type=kind).text = "\n\n".join(body)
        elif rec.gate and rec.gate.get("explanation"):
            ET.SubElement(case, "system-out").text = rec.gate["explanation"]
    for element in root.iter():  # every string that went in: names, reasons, explanations, log tails
        element.attrib = {key: _xml_text(value) for key, value in element.attrib.items()}
        if element.text:
            element.text = _xml_text(element.text)
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")
    return path
