"""Run artifacts: result.json (schema versioned, SPEC keys), samples.jsonl, junit.xml, summary.md."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from quantgate.harness.results import (SCHEMA_VERSION, RunRecord, load_result, load_samples, summary_markdown,
                                       write_junit, write_result, write_samples)

# SPEC section 5, "result.json at least": what other tools may rely on.
RESULT_SCHEMA = {
    "type": "object",
    "required": ["schema_version", "name", "verdict", "reason", "metrics", "gate", "kernels", "server", "timings"],
    "properties": {
        "schema_version": {"type": "integer"},
        "name": {"type": "string"},
        "verdict": {"enum": ["PASS", "FAIL", "ERROR"]},
        "reason": {"type": "string"},
        "metrics": {"anyOf": [{"type": "null"}, {
            "type": "object",
            "required": ["value", "metric", "strict_match", "flexible_extract", "n", "invalid_rate"]}]},
        "gate": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["mode"]}]},
        "timings": {"type": "object", "required": ["total_s"]},
    },
}


def _record(name: str, verdict: str, **fields) -> RunRecord:
    base = dict(name=name, verdict=verdict, reason=f"{name} is {verdict}", config={"path": f"/c/{name}.yaml"},
                timings={"total_s": 1.5})
    base.update(fields)
    return RunRecord(**base)


def test_result_json_round_trips_with_the_spec_keys(tmp_path: Path) -> None:
    metrics = {"metric": "exact_match,strict-match", "value": 0.75, "strict_match": 0.75,
               "flexible_extract": float("nan"), "stderr": 0.04, "n": 100, "invalid_rate": 0.01}
    record = _record("a", "PASS", metrics=metrics, gate={"mode": "absolute", "threshold": 0.7, "explanation": "ok"})
    path = write_result(tmp_path / "a", record)
    data = load_result(path.parent)
    jsonschema.validate(data, RESULT_SCHEMA)
    assert data["schema_version"] == SCHEMA_VERSION and list(data)[0] == "schema_version"
    assert data["metrics"]["flexible_extract"] is None  # NaN is not JSON
    assert data["metrics"]["value"] == 0.75
    assert not list((tmp_path / "a").glob(".*tmp"))  # written atomically, nothing left over


def test_an_error_record_is_valid_too(tmp_path: Path) -> None:
    path = write_result(tmp_path / "e", _record("e", "ERROR", log_tail="Traceback...\nboom"))
    data = load_result(path)
    jsonschema.validate(data, RESULT_SCHEMA)
    assert data["log_tail"].endswith("boom") and data["metrics"] is None


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "name": "x"}))
    with pytest.raises(ValueError, match="upgrade quantgate"):
        load_result(path)
    path.write_text(json.dumps({"name": "x"}))
    with pytest.raises(ValueError, match="not a quantgate result"):
        load_result(path)


def test_samples_jsonl_round_trips(tmp_path: Path) -> None:
    rows = [{"id": i, "correct": i % 2 == 0, "response": f"#### {i}"} for i in range(5)]
    write_samples(tmp_path, rows)
    assert load_samples(tmp_path / "result.json") == rows
    assert load_samples(tmp_path / "nowhere" / "result.json") is None


def test_junit_has_one_testcase_per_config(tmp_path: Path) -> None:
    records = [
        _record("ok", "PASS", gate={"mode": "absolute", "explanation": "0.8 >= 0.7"}),
        _record("bad", "FAIL", gate={"mode": "absolute", "explanation": "0.6 < 0.7"}),
        _record("broke", "ERROR", log_tail="server died"),
        _record("stopped", "ERROR", interrupted="SIGTERM"),
    ]
    root = ET.parse(write_junit(records, tmp_path / "junit.xml")).getroot()
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "4"
    assert suite.get("failures") == "1" and suite.get("errors") == "2"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == ["ok", "bad", "broke", "stopped"]
    assert cases["ok"].find("failure") is None and cases["ok"].find("error") is None
    failure = cases["bad"].find("failure")
    assert failure is not None and "0.6 < 0.7" in (failure.text or "")
    error = cases["broke"].find("error")
    assert error is not None and "server died" in (error.text or "")
    assert cases["stopped"].find("error").get("type") == "Interrupted"


def test_summary_markdown_tables_every_config_and_details_the_others() -> None:
    text = summary_markdown([
        _record("ok", "PASS", metrics={"value": 0.81, "n": 50}, gate={"mode": "absolute", "threshold": 0.7}),
        _record("bad", "FAIL", gate={"mode": "wilson", "explanation": "lower bound 0.61 < 0.69"}),
    ])
    assert text.startswith("# quantgate run: 1 PASS, 1 FAIL, 0 ERROR")
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len(lines) == 2 + 2  # header, rule, two configs
    assert "0.8100" in text and "### bad: FAIL" in text and "lower bound 0.61 < 0.69" in text
    assert "### ok" not in text
