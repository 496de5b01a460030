"""Run artifacts: result.json (schema versioned, SPEC keys), samples.jsonl, junit.xml, summary.md."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from quantgate.harness.config import load_config
from quantgate.harness.gates import evaluate_gate
from quantgate.harness.results import (SCHEMA_VERSION, RunRecord, artifact_path_problems, load_result, load_samples,
                                       negative_check_verdict,
                                       summary_frame, summary_markdown, write_junit, write_result, write_samples)
from tests.harness import runner_fixtures

gsm8k_dir = runner_fixtures.gsm8k_dir  # the shared pytest fixture

# SPEC section 5, "result.json at least": what other tools may rely on, in every result.json
# whatever its verdict (null values where nothing was measured, never a missing key or object).
_NULLABLE_NUMBER = {"type": ["number", "null"]}
RESULT_SCHEMA = {
    "type": "object",
    "required": ["schema_version", "name", "verdict", "reason", "metrics", "gate", "kernels", "server", "timings",
                 "versions", "dataset", "task"],
    "properties": {
        "schema_version": {"type": "integer"},
        "name": {"type": "string"},
        "verdict": {"enum": ["PASS", "FAIL", "ERROR"]},
        "reason": {"type": "string"},
        "metrics": {
            "type": "object",
            "required": ["value", "metric", "strict_match", "flexible_extract", "stderr", "n", "invalid_rate"],
            "properties": {"value": _NULLABLE_NUMBER, "metric": {"type": ["string", "null"]},
                           "strict_match": _NULLABLE_NUMBER, "flexible_extract": _NULLABLE_NUMBER,
                           "stderr": _NULLABLE_NUMBER, "n": {"type": ["integer", "null"]},
                           "invalid_rate": _NULLABLE_NUMBER}},
        "gate": {"type": "object", "required": ["mode"], "properties": {"mode": {"type": ["string", "null"]}}},
        "kernels": {"type": "object"},
        "server": {"type": "object"},
        "versions": {"type": "object", "required": ["quantgate", "lm_eval", "torch", "engine"]},
        "dataset": {"type": "object", "required": ["sha256"]},
        "task": {"type": "object", "required": ["file", "sha256"]},
        "timings": {"type": "object", "required": ["server_start_s", "eval_s", "total_s"],
                    "properties": {k: _NULLABLE_NUMBER for k in ("server_start_s", "eval_s", "total_s")}},
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
    assert data["log_tail"].endswith("boom")
    assert set(data["metrics"].values()) == {None} and data["gate"]["mode"] is None and data["kernels"] == {}
    assert data["timings"] == {"total_s": 1.5, "server_start_s": None, "eval_s": None}


def test_filling_the_shape_keeps_what_was_measured(tmp_path: Path) -> None:
    """Partial objects get the missing keys; nothing already there changes, the record neither."""
    record = _record("p", "FAIL", metrics={"value": 0.5, "n": 40, "complete": True},
                     gate={"mode": "wilson", "passed": False, "lower": 0.4}, kernels={"modules": {}},
                     versions={"quantgate": "1.2", "engine": "0.9"}, timings={"total_s": 3.0, "server_busy_s": 1.0},
                     config={"metric": "exact_match,flexible-extract", "data": {"gate": {"mode": "absolute"}}})
    data = load_result(write_result(tmp_path / "p", record))
    jsonschema.validate(data, RESULT_SCHEMA)
    assert data["metrics"] == {"value": 0.5, "n": 40, "complete": True, "metric": "exact_match,flexible-extract",
                               "strict_match": None, "flexible_extract": None, "stderr": None, "invalid_rate": None}
    assert data["gate"] == {"mode": "wilson", "passed": False, "lower": 0.4, "explanation": None}  # measured wins
    assert data["kernels"] == {"modules": {}}
    assert data["versions"] == {"quantgate": "1.2", "engine": "0.9", "lm_eval": None, "torch": None}
    assert data["timings"] == {"total_s": 3.0, "server_busy_s": 1.0, "server_start_s": None, "eval_s": None}
    assert record.metrics == {"value": 0.5, "n": 40, "complete": True} and record.dataset is None


def _planned(tmp_path: Path, gsm8k_dir: Path, name: str, **server_flags):
    from quantgate.harness.runner import RunOptions, plan
    from tests.harness.runner_fixtures import write_config

    config = write_config(tmp_path, name, gsm8k_dir, server_flags, metric="exact_match,flexible-extract",
                          gate="wilson", reference={"value": 0.8})
    options = RunOptions(output_dir=tmp_path / "out")
    return plan([config], options), options


def _assert_full_error_shape(data: dict, server_started: bool) -> None:
    jsonschema.validate(data, RESULT_SCHEMA)
    assert data["verdict"] == "ERROR"
    assert data["metrics"] == {"value": None, "metric": "exact_match,flexible-extract", "strict_match": None,
                               "flexible_extract": None, "stderr": None, "n": None, "invalid_rate": None}
    assert data["gate"]["mode"] == "wilson" and data["kernels"] == {}
    assert data["versions"]["engine"] is None and data["versions"]["quantgate"] is not None
    assert data["dataset"] == {"sha256": None} and data["task"] == {"file": None, "sha256": None}
    assert data["timings"]["eval_s"] is None and data["timings"]["total_s"] is not None
    assert (data["timings"]["server_start_s"] is not None) == server_started


def test_a_server_that_did_not_start_writes_the_full_shape(tmp_path: Path, gsm8k_dir: Path) -> None:
    """The runner's own ERROR record (server exits during start-up), not a hand-made one."""
    from tests.harness.runner_fixtures import load_json, run_in_process

    _planned(tmp_path, gsm8k_dir, "crash", exit_during_startup=0.2)  # plans: the ERROR is the server's
    code, output = run_in_process([tmp_path / "crash.yaml"], tmp_path / "out")
    data = load_json(tmp_path / "out" / "crash" / "result.json")
    assert code == 2 and "server did not start" in data["reason"], output
    _assert_full_error_shape(data, server_started=True)
    assert data["server"]["exit_status"] == 1 and data["log_tail"]


def test_a_config_never_started_writes_the_full_shape(tmp_path: Path, gsm8k_dir: Path) -> None:
    """The runner's record for a config an interrupt kept from starting: no server object at all."""
    from quantgate.harness.runner import _not_started

    items, options = _planned(tmp_path, gsm8k_dir, "later")
    record = _not_started(items[0], options, "SIGTERM")
    data = load_result(tmp_path / "out" / "later")
    assert data == json.loads(json.dumps(record.to_dict()))
    _assert_full_error_shape(data, server_started=False)
    assert set(data["server"]) >= {"command", "startup_s", "exit_status", "log"}
    assert set(data["server"].values()) == {None}
    # `repro` of this run reads the questions it was to evaluate from here (it had read the config's count).
    assert data["evaluation"] == {"limit": items[0].config.num_questions}
    again = _not_started(items[0], dataclasses.replace(options, limit=7), "SIGTERM")
    assert again.evaluation == {"limit": 7}


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "name": "x"}))
    with pytest.raises(ValueError, match="upgrade quantgate"):
        load_result(path)
    path.write_text(json.dumps({"name": "x"}))
    with pytest.raises(ValueError, match="not a quantgate result"):
        load_result(path)


def test_a_whole_runs_output_dir_names_its_per_config_folders(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps({"schema_version": 1, "name": name, "verdict": "PASS"}))
    with pytest.raises(ValueError, match=f"holds one run directory per config; pass one of them: {tmp_path / 'a'}, "):
        load_result(tmp_path)
    assert load_result(tmp_path / "b")["name"] == "b"


@pytest.mark.parametrize("change,message", [
    ({"name": None}, "'name' must be a string, got None"),
    ({"verdict": 1}, "'verdict' must be a string, got 1"),
    ({"schema_version": "1"}, "schema_version must be an integer, got '1'"),
    ({"schema_version": None}, "schema_version must be an integer, got None"),
    ({"schema_version": True}, "schema_version must be an integer, got True"),
    ({"metrics": [0.8]}, "'metrics' must be an object (or null), got [0.8]"),
    ({"started_at": 20261101}, "'started_at' must be a string, got 20261101"),
])
def test_a_result_json_of_the_wrong_shape_is_refused_naming_file_and_key(tmp_path: Path, change: dict,
                                                                        message: str) -> None:
    """Readers index these keys: a hand-made or foreign file must be one located message, not a
    KeyError or TypeError in report or compare."""
    write_result(tmp_path, _record("x", "PASS"))
    path = tmp_path / "result.json"
    data = {**json.loads(path.read_text()), **change}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"^{re.escape(message)}.*write it again with `quantgate run`$"):
        load_result(path)
    del data["name"]
    path.write_text(json.dumps({**data, "schema_version": 1}))
    with pytest.raises(ValueError, match="'name' must be a string, it is missing"):
        load_result(path)


def test_a_torn_samples_line_is_named_by_its_line_number(tmp_path: Path) -> None:
    write_samples(tmp_path, [{"id": i, "correct": True} for i in range(5)])
    path = tmp_path / "samples.jsonl"
    path.write_text(path.read_text() + '\n{"id": 5, "corr')  # a blank line, then a killed writer's half line
    with pytest.raises(ValueError, match="^line 7 column 11: Unterminated string"):
        load_samples(tmp_path)


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


def test_junit_and_summary_say_how_to_reproduce_and_what_failed(tmp_path: Path) -> None:
    """A developer holding only a nightly's artifacts had no command to rebuild the run, and a
    kernel check's FAIL was typed GateFailed though its gate passed."""
    kernel = _record("kernel", "FAIL", gate={"mode": "absolute", "passed": True},
                     config={"path": "/c/kernel.yaml", "run_dir": "/out/kernel"})
    gate = _record("gate", "FAIL", gate={"mode": "absolute", "passed": False},
                   config={"path": "/c/gate.yaml", "run_dir": "/out/my gate"})
    cases = {c.get("name"): c for c in ET.parse(write_junit([kernel, gate], tmp_path / "junit.xml")).getroot().iter(
        "testcase")}
    assert cases["kernel"].find("failure").get("type") == "KernelCheckFailed"
    assert cases["gate"].find("failure").get("type") == "GateFailed"
    assert "reproduce: quantgate repro '/out/my gate/result.json'" in cases["gate"].find("failure").text
    text = summary_markdown([kernel, gate])
    assert "reproduce: quantgate repro /out/kernel/result.json (prints the server and lm-eval commands" in text


def test_junit_is_well_formed_whatever_the_text_holds(tmp_path: Path) -> None:
    """XML 1.0 cannot hold a coloured server log's escapes, a NUL or a lone surrogate, escaped or
    not: one of them made the whole file unreadable to CI."""
    tail = ("\x1b[1;32mINFO\x1b[0m starting\nLoading weights: 50%|##  | 1/2 \r\n"
            "\x1b[1;31mERROR\x1b[0m CUDA out of memory <alloc & free> \"x\"\x00\n\x1b]0;title\x07done \udc80\ufffe")
    records = [
        _record("died\x0b", "ERROR", reason="server did not start: \x08status 1", log_tail=tail),
        _record("weak", "FAIL", reason="gate failed\x1b[0m", gate={"mode": "absolute", "explanation": "0.6\x0c< 0.7"}),
        _record("ok", "PASS", gate={"mode": "absolute", "explanation": "\x7f0.8 >= 0.7"}),
    ]
    path = write_junit(records, tmp_path / "junit.xml", suite="quant\x01gate")
    root = ET.parse(path).getroot()
    error = root.find("testsuite/testcase/error")
    assert error is not None and error.get("message") == "server did not start: \ufffdstatus 1"
    text = error.text or ""
    assert "INFO starting" in text and "ERROR CUDA out of memory <alloc & free> \"x\"\ufffd" in text
    assert "done \ufffd\ufffd" in text and "title" not in text
    assert [c.get("name") for c in root.iter("testcase")] == ["died\ufffd", "weak", "ok"]
    assert root.find("testsuite/testcase/failure").get("message") == "gate failed"
    assert "\x1b" not in path.read_text()


def test_summary_table_rows_keep_their_cells_whatever_names_and_reasons_hold() -> None:
    """A `|` or a line break in a cell ended the cell or the row: GitHub dropped the rest (here,
    that the kernel check failed too)."""
    from markdown_it import MarkdownIt

    text = summary_markdown([
        _record("tiny|fp8", "FAIL", reason="gate absolute failed: x | y\nkernel check failed: z\r\nsee log"),
        _record("ok", "PASS"),
    ])
    table = MarkdownIt("commonmark").enable("table").render(text).split("</table>")[0]
    header = re.findall(r"<th[^>]*>(.*?)</th>", table)
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]]
    assert [len(row) for row in rows] == [len(header)] * 2
    failed = dict(zip(header, rows[0]))
    assert failed["config"] == "tiny|fp8"
    assert failed["reason"] == "gate absolute failed: x | y<br>kernel check failed: z<br>see log"


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


def test_summary_table_tells_apart_a_measured_value_and_threshold_that_round_alike() -> None:
    # recovery(968/1319 against 1019/1319, 0.95) FAILs by 4e-5: at .4f its row read 0.7339 | 0.7339.
    failed = _record("close", "FAIL", metrics={"value": 968 / 1319, "n": 1319},
                     gate={"mode": "recovery", "measured_threshold": 0.95 * 1019 / 1319})
    other = _record("ok", "PASS", metrics={"value": 0.81, "n": 50}, gate={"mode": "absolute", "threshold": 0.7})
    errored = _record("err", "ERROR")
    lines = [line for line in summary_markdown([failed, other, errored]).splitlines() if line.startswith("| ")]
    cells = {row[0]: row for row in ([cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:])}
    assert cells["close"][3:5] == ["0.73389", "0.73393"]
    assert cells["ok"][3:5] == ["0.81000", "0.70000"] and cells["err"][3:5] == ["-", "-"]
    assert summary_frame([failed]).loc[0, "measured"] == 968 / 1319  # the frame keeps the numbers themselves


def test_artifact_paths_of_an_earlier_run_are_written_over(tmp_path: Path) -> None:
    """A developer re-running a config locally passes the same --junit and --output-dir again."""
    junit, out = tmp_path / "junit.xml", tmp_path / "out"
    junit.write_text("<testsuites/>")
    out.mkdir()
    assert artifact_path_problems([("--output-dir", out, True), ("--junit", junit, False),
                                   ("--markdown", tmp_path / "new" / "summary.md", False)]) == []
    assert artifact_path_problems([("--junit", junit / "x.xml", False)]) == [
        f"--junit {junit / 'x.xml'}: {junit} is a file, so the path cannot be created; pass another path"]


def test_a_write_that_fails_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantgate.harness import results

    def no_space(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(results.os, "replace", no_space)
    with pytest.raises(OSError, match="No space"):
        write_result(tmp_path, RunRecord(name="x", verdict="PASS", reason="", config={}))
    assert list(tmp_path.iterdir()) == []


def test_summary_threshold_is_on_the_measured_scale(tmp_path: Path) -> None:
    """wilson gates the lower bound and recovery the ratio: the table shows the measured accuracy
    each needed, so that measured vs threshold never contradicts the verdict."""
    (tmp_path / "w.yaml").write_text("model_name: m\nreference: {value: 0.755}\ngate: wilson\n")
    (tmp_path / "a.yaml").write_text("model_name: m\naccuracy_threshold: 0.8\n")
    records = []
    for name, metrics in (("w", {"value": 0.72, "n": 100}), ("a", {"value": 0.75, "n": 100})):
        gate = evaluate_gate(load_config(tmp_path / f"{name}.yaml"), metrics)
        records.append(RunRecord(name=name, verdict="PASS" if gate.passed else "FAIL", reason="",
                                 config={}, metrics=metrics, gate=gate.to_dict()))
    frame = summary_frame(records).set_index("config")
    assert frame.loc["w", "verdict"] == "FAIL" and frame.loc["w", "measured"] < frame.loc["w", "threshold"]
    assert frame.loc["w", "threshold"] == pytest.approx(records[0].gate["measured_threshold"])
    assert frame.loc["a", "threshold"] == pytest.approx(0.72)


def test_summary_row_shows_what_a_fail_rests_on(tmp_path: Path) -> None:
    """A gen-1 FAIL on its other listed metric, and an invalid-rate FAIL, read as passes when the
    row showed the gated metric's passing comparison and nothing named the cause."""
    (tmp_path / "g.yaml").write_text("model_name: m\ntasks:\n- name: gsm8k\n  metrics:\n  - {name: 'exact_match,strict-match', "
                                     "value: 0.8}\n  - {name: 'exact_match,flexible-extract', value: 0.99}\n")
    (tmp_path / "i.yaml").write_text("model_name: m\naccuracy_threshold: 0.5\ngate: {mode: absolute, "
                                     "max_invalid_rate: 0.2}\n")
    runs = (("other", "g", {"value": 0.825, "strict_match": 0.825, "flexible_extract": 0.825, "n": 40}),
            ("both", "g", {"value": 0.5, "strict_match": 0.5, "flexible_extract": 0.825, "n": 40}),
            ("passes", "g", {"value": 0.825, "strict_match": 0.825, "flexible_extract": 0.99, "n": 40}),
            ("invalid", "i", {"value": 0.675, "n": 40, "invalid_rate": 0.3}))
    records = []
    for name, file, metrics in runs:
        gate = evaluate_gate(load_config(tmp_path / f"{file}.yaml"), metrics)
        records.append(RunRecord(name=name, verdict="PASS" if gate.passed else "FAIL", reason="", config={},
                                 metrics={"metric": "exact_match,strict-match", **metrics}, gate=gate.to_dict()))
    frame = summary_frame(records).set_index("config")
    row = frame.loc["other"]
    assert (row["verdict"], row["metric"], row["failed_on"]) == ("FAIL", "exact_match,flexible-extract",
                                                                  "exact_match,flexible-extract")
    assert row["measured"] == 0.825 and row["threshold"] == pytest.approx(0.99 * 0.92)
    row = frame.loc["both"]
    assert row["metric"] == "exact_match,strict-match" and row["measured"] < row["threshold"]
    assert row["failed_on"] == "exact_match,strict-match, exact_match,flexible-extract"
    assert frame.loc["passes", "verdict"] == "PASS" and frame.loc["passes", "failed_on"] == ""
    assert frame.loc["passes", "metric"] == "exact_match,strict-match"  # a passing row shows the gated metric
    assert frame.loc["passes", "threshold"] == pytest.approx(0.8 * 0.92)
    row = frame.loc["invalid"]
    assert (row["verdict"], row["measured"], row["failed_on"]) == ("FAIL", 0.675, "invalid_rate > 0.2")
    # result.json written before `failed_metrics` existed: the same rows.
    for record in records[:2]:
        old = record.to_dict()
        del old["gate"]["failed_metrics"]
        assert summary_frame([old]).iloc[0].to_dict() == summary_frame([record]).iloc[0].to_dict()


def test_the_kernels_column_tells_another_kernel_from_no_proof() -> None:
    # A check that failed for want of a kernel line said MISMATCH, as if another kernel had run.
    wrong = {"passed": False, "mismatches": [{"module": "m", "layer": "linear", "expected": "marlin",
                                              "kernel": "CutlassFp8", "backend": "cutlass"}]}
    unproven = {"passed": False, "mismatches": [], "message": "expect.linear_kernel 'marlin' cannot be verified"}
    records = [_record(name, verdict, expect=expect) for name, verdict, expect in
               [("wrong", "FAIL", wrong), ("unproven", "FAIL", unproven), ("fine", "PASS", {"passed": True}),
                ("none", "PASS", None)]]
    frame = summary_frame(records)
    assert list(frame["kernels"]) == ["MISMATCH", "UNVERIFIED", "ok", "-"]


@pytest.mark.parametrize("result, shown", [
    ({"verdict": "FAIL", "gate": {"passed": True}, "expect": {"expected": {"linear": "marlin"}, "passed": False,
                                                              "mismatches": [{"module": "m", "expected": "marlin"}]}},
     "FAIL"),
    # no kernel report: the check FAILs "cannot be verified", which proves nothing about catching a wrong kernel
    ({"verdict": "FAIL", "gate": {"passed": True}, "expect": {"expected": {"linear": "marlin"}, "passed": False,
                                                              "mismatches": []}},
     "FAIL on kernels UNVERIFIED, not on a kernel mismatch"),
    ({"verdict": "FAIL", "gate": {"passed": False, "metric": "exact_match,strict-match"},
      "expect": {"expected": {"linear": "marlin"}, "passed": True}},
     "FAIL on exact_match,strict-match, not on kernels"),
    ({"verdict": "FAIL", "gate": {"passed": False, "metric": "exact_match,strict-match"}}, "FAIL"),
    ({"verdict": "FAIL", "gate": {"passed": True, "accuracy_passed": True, "invalid_rate_passed": False,
                                  "max_invalid_rate": 0.1}}, "FAIL on invalid_rate > 0.1, not on accuracy"),
    # as run writes it: an invalid rate above its maximum fails the gate (passed false), accuracy passed
    ({"verdict": "FAIL", "gate": {"passed": False, "accuracy_passed": True, "invalid_rate_passed": False,
                                  "max_invalid_rate": 0.1}}, "FAIL on invalid_rate > 0.1, not on accuracy"),
    # an accuracy check (expect: restates server_args' backend) caught by its gate, its kernel report missing
    ({"verdict": "FAIL", "config": {"server_args": ["--linear-backend", "emulation"]},
      "gate": {"passed": False, "accuracy_passed": False, "metric": "exact_match,strict-match"},
      "expect": {"expected": {"linear": "emulation"}, "passed": False, "mismatches": []}}, "FAIL"),
    ({"verdict": "PASS"}, "PASS"),
    ({"verdict": "ERROR"}, "ERROR"),
])
def test_a_negative_check_counts_as_caught_only_on_the_check_it_exercises(result: dict, shown: str) -> None:
    """A negative check whose FAIL came from another check (accuracy for an expect: check) no
    longer shows that its own check still catches its case; CI took any FAIL."""
    assert negative_check_verdict(result) == shown


def test_write_atomic_keeps_the_mode_and_the_link_of_what_it_writes_over(tmp_path: Path) -> None:
    from quantgate.harness.results import write_atomic

    target = tmp_path / "c.yaml"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    write_atomic(link, b"new")
    assert link.is_symlink() and target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "link.yaml"]


# -- mutation survivors (session 17) ------------------------------------------------------------------


def test_unwritable_artifact_paths_are_named_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As root every os.access check passes, so the permissions are simulated: a --junit file
    whose folder cannot be written (write_atomic renames into it) and a new path under a folder
    that cannot be written must be refused up front, not after the run when its results are lost."""
    import os

    from quantgate.harness import results

    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "junit.xml").write_text("<testsuites/>")
    real_access = os.access
    monkeypatch.setattr(results.os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    assert artifact_path_problems([("--junit", locked / "junit.xml", False)]) == [
        f"--junit {locked / 'junit.xml'} is not writable (or its folder is not); pass a path you can write to"]
    assert artifact_path_problems([("--markdown", locked / "new" / "summary.md", False)]) == [
        f"--markdown {locked / 'new' / 'summary.md'}: {locked} is not writable; pass a path you can write to"]
    assert artifact_path_problems([("--junit", tmp_path / "junit.xml", False)]) == []


def test_the_full_shape_fills_keys_written_as_null_and_drops_a_kernels_value_that_is_no_object() -> None:
    from quantgate.harness.results import result_shape

    data = result_shape({"config": {"metric": "exact_match,strict-match", "gate": {"mode": "wilson"}},
                         "metrics": {"metric": None, "value": 0.5}, "gate": {"mode": None}, "kernels": ["x"]})
    assert data["metrics"]["metric"] == "exact_match,strict-match" and data["metrics"]["value"] == 0.5
    assert data["gate"]["mode"] == "wilson" and data["kernels"] == {}


def test_a_partial_runs_score_is_not_shown_as_measured() -> None:
    """An aborted run's metrics hold the mean over the questions answered so far (complete false):
    the summary must not show it as the measured value against the threshold."""
    aborted = _record("aborted", "ERROR", metrics={"value": 0.9, "n": 40, "complete": False},
                      gate={"mode": "absolute", "threshold": 0.7})
    row = summary_frame([aborted]).iloc[0]
    assert row["measured"] is None and row["threshold"] == 0.7


@pytest.mark.parametrize("names, ending", [("abcdef", "e, ..."), ("abcde", "e")])
def test_an_output_dir_of_many_runs_names_five_and_says_whether_there_are_more(tmp_path: Path, names: str,
                                                                                 ending: str) -> None:
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(json.dumps({"schema_version": 1, "name": name, "verdict": "PASS"}))
    with pytest.raises(ValueError) as error:
        load_result(tmp_path)
    assert str(error.value).endswith(f"{tmp_path / ending}") and str(tmp_path / "f") not in str(error.value)
    # A run directory whose config ran sub-runs of its own is still read as the run directory.
    write_result(tmp_path, _record("top", "PASS"))
    assert load_result(tmp_path)["name"] == "top"


def test_samples_lines_split_at_newlines_only_and_blank_ones_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    # A raw U+2028 inside a JSON string (another tool's writer) and a whitespace-only line.
    path.write_text('{"id": 1, "correct": true, "answer": "a\u2028b"}\n   \n{"id": 2, "correct": false}\n',
                    encoding="utf-8")
    assert load_samples(tmp_path) == [{"id": 1, "correct": True, "answer": "a\u2028b"}, {"id": 2, "correct": False}]


def test_summary_details_an_error_with_its_server_log_tail_and_junit_counts_the_skipped(tmp_path: Path) -> None:
    from quantgate.harness.results import Skipped

    crashed = _record("crashed", "ERROR", reason="server exited with status 1 during start-up",
                      log_tail="Traceback ...\nRuntimeError: CUDA out of memory")
    skipped = [Skipped(name="big", path="eval_configs/big.yaml", engine="vllm", reason="requires 8 GPU(s)")]
    text = summary_markdown([crashed, _record("fine", "PASS")], skipped)
    assert text.startswith("# quantgate run: 1 PASS, 0 FAIL, 1 ERROR, 1 skipped")
    assert "### crashed: ERROR\n\nserver exited with status 1 during start-up" in text
    assert "<summary>server log tail</summary>" in text and "RuntimeError: CUDA out of memory" in text
    assert "### fine" not in text and "- big (eval_configs/big.yaml): requires 8 GPU(s)" in text
    suite = ET.parse(write_junit([crashed, _record("fine", "PASS")], tmp_path / "junit.xml", skipped=skipped)).getroot()
    counts = tuple(suite.get(key) for key in ("tests", "errors", "failures", "skipped"))
    assert counts == ("3", "1", "0", "1")


def test_the_n_column_holds_counts_only() -> None:
    rows = [_record(name, "ERROR", metrics={"n": n}) for name, n in (("bool", True), ("half", 10.5), ("ten", 10.0))]
    assert list(summary_frame(rows)["n"].astype(object).where(lambda v: v.notna(), None)) == [None, None, 10]


def test_quantgate_commit_names_configs_of_quantgate_tree_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device machine runs a copied tree whose .git is stale: result.json named that stale
    HEAD. QUANTGATE_COMMIT (passed with the job) wins for quantgate's own configs, and only for
    them: a config in another checkout keeps its git's answer."""
    from quantgate.harness import results

    tree = Path(results.__file__).resolve().parents[1]
    config = tree / "eval_configs" / "tiny" / "demo.yaml"
    monkeypatch.setenv("QUANTGATE_COMMIT", "feed1234")
    assert results.checkout_commit(config.parent, config) == "feed1234"
    assert results.checkout_commit(tmp_path, tmp_path / "x.yaml") is None  # tmp_path is in no checkout
    monkeypatch.delenv("QUANTGATE_COMMIT")
    assert results.checkout_commit(config.parent, config) != "feed1234"


# -- mutation survivors (session 24) ------------------------------------------------------------------


def test_exit_code_of_each_verdict_and_of_an_error_the_config_causes() -> None:
    assert [_record("x", verdict).exit_code for verdict in ("PASS", "FAIL", "ERROR")] == [0, 1, 2]
    assert _record("x", "ERROR", usage_error=True).exit_code == 3  # never retried
    # usage_error is an ERROR's: a verdict keeps its own code
    assert [_record("x", verdict, usage_error=True).exit_code for verdict in ("PASS", "FAIL")] == [0, 1]


def test_result_json_is_strict_json_whatever_the_run_measured(tmp_path: Path) -> None:
    """Paths as strings, numpy scalars (lm-eval's) as numbers, NaN and infinities as null at any
    depth, even inside a numpy scalar: another tool's strict JSON parser must read every file."""
    import numpy as np

    record = _record("s", "FAIL", config={"path": tmp_path / "s.yaml"},
                     metrics={"value": np.float64(0.5), "n": np.int64(40), "stderr": np.float64("nan"),
                              "invalid_rate": float("inf"), "flexible_extract": np.float32("nan")},
                     gate={"mode": "absolute", "numbers": [1.0, float("-inf"), {"ratio": float("nan")}]})
    path = write_result(tmp_path / "s", record)
    text = path.read_text()
    assert text.endswith("}\n")

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in result.json")

    data = json.loads(text, parse_constant=refuse)
    assert data["config"]["path"] == str(tmp_path / "s.yaml")
    assert (data["metrics"]["value"], data["metrics"]["n"], data["metrics"]["stderr"]) == (0.5, 40, None)
    assert data["metrics"]["invalid_rate"] is None and data["metrics"]["flexible_extract"] is None  # float32: no float
    assert data["gate"]["numbers"] == [1.0, None, {"ratio": None}]
    assert load_result(path) == data


def test_a_value_json_cannot_hold_is_an_error_not_a_result_json(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="^cannot write object to JSON$"):
        write_result(tmp_path / "x", _record("x", "PASS", evaluation={"odd": object()}))
    assert not (tmp_path / "x" / "result.json").exists()


def test_the_metric_and_gate_mode_come_from_the_config_summary_or_its_data() -> None:
    from quantgate.harness.results import result_shape

    nested = result_shape({"config": {"data": {"metric": "acc", "gate": "absolute"}}})
    assert nested["metrics"]["metric"] == "acc" and nested["gate"]["mode"] == "absolute"  # a gate given by name
    top = result_shape({"config": {"metric": "top", "gate": {"mode": "wilson"},
                                   "data": {"metric": "inner", "gate": {"mode": "absolute"}}}})
    assert top["metrics"]["metric"] == "top" and top["gate"]["mode"] == "wilson"
    bare = result_shape({"config": {"data": "not a mapping"}})
    assert bare["metrics"]["metric"] is None and bare["gate"]["mode"] is None
    assert bare["server"] == {"command": None, "startup_s": None, "exit_status": None, "log": None}
    assert bare["gate"] == {"mode": None, "passed": None, "explanation": None}


def test_the_record_keeps_none_for_what_result_json_fills(tmp_path: Path) -> None:
    record = _record("k", "ERROR", gate={"mode": None}, server={"command": "x"})
    data = record.to_dict()
    assert data["gate"] == {"mode": None, "passed": None, "explanation": None}
    assert record.gate == {"mode": None} and record.server == {"command": "x"}


def test_result_json_read_errors_say_what_is_wrong(tmp_path: Path) -> None:
    from quantgate.harness.results import load_result

    path = tmp_path / "result.json"
    for not_an_object in ([{"schema_version": 1}], "schema_version: 1"):
        path.write_text(json.dumps(not_an_object))
        with pytest.raises(ValueError, match=r"^not a quantgate result.json \(no schema_version\)$"):
            load_result(path)
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "name": "x", "verdict": "PASS"}))
    with pytest.raises(ValueError) as error:
        load_result(path)
    assert str(error.value) == (f"schema_version {SCHEMA_VERSION + 1}; this quantgate reads up to {SCHEMA_VERSION}: "
                                "upgrade quantgate")
    base = {"schema_version": SCHEMA_VERSION, "name": "x", "verdict": "PASS"}
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "name": "x"}))
    with pytest.raises(ValueError, match="^'verdict' must be a string, it is missing; "):
        load_result(path)
    path.write_text(json.dumps({**base, "timings": [1.5]}))
    with pytest.raises(ValueError, match=re.escape("'timings' must be an object (or null), got [1.5]; it is not")):
        load_result(path)
    path.write_text(json.dumps({**base, "reason": 3}))
    with pytest.raises(ValueError, match="^'reason' must be a string, got 3; "):
        load_result(path)
    # What a run never got to is null or absent: both are read.
    nulls = {**base, "reason": None, "started_at": None, "config": None, "metrics": None, "gate": None,
             "expect": None, "evaluation": None, "dataset": None, "timings": None}
    path.write_text(json.dumps(nulls))
    assert load_result(path) == nulls
    path.write_text(json.dumps(base))
    assert load_result(path) == base
    path.write_text("{")
    with pytest.raises(json.JSONDecodeError):
        load_result(path)
    with pytest.raises(FileNotFoundError):
        load_result(tmp_path / "missing" / "result.json")


def test_unwritable_artifacts_name_the_path_the_os_error_and_the_fix(tmp_path: Path) -> None:
    import errno

    from quantgate.harness.results import ArtifactsUnwritable

    full = ArtifactsUnwritable.of(tmp_path / "a", OSError(errno.ENOSPC, "No space left on device"))
    assert str(full) == (f"artifacts cannot be written to {tmp_path / 'a'} ([Errno {errno.ENOSPC}] No space left on "
                         "device); free space or pass another --output-dir and run again")
    assert full.errno == errno.ENOSPC and isinstance(full, OSError)
    for code in (errno.EACCES, errno.EPERM, errno.EROFS):
        denied = ArtifactsUnwritable.of(tmp_path, OSError(code, "denied"))
        assert "; make it writable or pass another --output-dir and run again" in str(denied) and denied.errno == code
    assert "(odd)" in str(ArtifactsUnwritable.of(tmp_path, OSError("odd")))
    assert "(OSError)" in str(ArtifactsUnwritable.of(tmp_path, OSError()))


def test_artifact_paths_of_the_wrong_kind_or_named_twice_are_refused(tmp_path: Path) -> None:
    folder, file = tmp_path / "out", tmp_path / "junit.xml"
    folder.mkdir()
    file.write_text("<testsuites/>")
    assert artifact_path_problems([("--junit", folder, False), ("--output-dir", file, True)]) == [
        f"--junit {folder} is a folder; pass a file path", f"--output-dir {file} is a file; pass a folder path"]
    assert artifact_path_problems([("--junit", tmp_path / "r.xml", False), ("--markdown", None, False),
                                   ("--markdown", folder / ".." / "r.xml", False)]) == [
        f"--junit and --markdown are the same path {tmp_path / 'r.xml'}; pass different paths"]


def test_timestamps_and_versions_of_a_result_json() -> None:
    from quantgate.harness.results import harness_versions, now_iso, package_version

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", now_iso())
    assert package_version("no-such-package-quantgate-test") is None
    versions = harness_versions()
    assert set(versions) == {"quantgate", "lm_eval", "torch"} and versions["quantgate"] is not None
    assert versions["torch"] == package_version("torch") and versions["lm_eval"] == package_version("lm_eval")


def test_result_json_is_schema_version_1(tmp_path: Path) -> None:
    """Other tools parse result.json: SCHEMA_VERSION changes only with a key that disappears or
    changes meaning (then readers of 1 must be told), never by accident."""
    assert json.loads(write_result(tmp_path, _record("v", "PASS")).read_text())["schema_version"] == 1
