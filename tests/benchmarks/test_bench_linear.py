"""bench_linear's verdicts on CPU, from rows as the GPU run records them: every check reads graph
times, a wrong or unchecked timed output fails as wrong output, a failed graph stays visible,
and unrequested rows are not failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("triton")
import bench_linear as bl  # noqa: E402 - benchmarks/ is put on the path by conftest.py

K, N = 4096, 4096


def row(m: int, backend: str, scheme: str, graph_ms: float | None, eager_ms: float | None = None, **extra) -> dict:
    r = {"m": m, "k": K, "n": N, "backend": backend, "scheme": scheme, "graph_ms": graph_ms,
         "eager_ms": eager_ms if eager_ms is not None else graph_ms, "host_ms": None, "copies": 3, "error": None}
    if scheme.startswith("fp8"):
        r["check_error"] = 1e-4
    r.update(extra)
    return r


def checks_by_name(rows: list[dict], ms=(512,), shapes=((K, N),)) -> dict[str, dict]:
    bl._add_derived(rows, 4.2e12)
    return {c["check"]: c for c in bl.acceptance(rows, [], ms, shapes)}


TORCH_CHANNEL_512 = f"torch fp8-channel M=512 K={K} N={N}: time / bare scaled_mm_rowwise"


def test_large_m_checks_read_graph_times_not_eager():
    # Run 16's numbers: eager says the torch backend beats its bare peer (0.75), graph says 1.17.
    rows = [row(512, "torch", "fp8-channel", 0.01789, eager_ms=0.0327),
            row(512, "scaled_mm_rowwise", "peer", 0.01530, eager_ms=0.0437)]
    check = checks_by_name(rows)[TORCH_CHANNEL_512]
    assert check["timing"] == "graph"
    assert check["value"] == pytest.approx(0.01789 / 0.01530)
    assert check["status"] == "FAIL" and check["pass"] is False
    assert rows[0]["ms"] == rows[0]["graph_ms"] and rows[0]["timing"] == "graph"


def test_wrong_timed_output_fails_as_wrong_output_not_as_slow():
    rows = [row(512, "torch", "fp8-channel", 0.001, check_error=0.5), row(512, "scaled_mm_rowwise", "peer", 0.015)]
    check = checks_by_name(rows)[TORCH_CHANNEL_512]
    assert check["status"] == "FAIL" and check["value"] is None
    assert "wrong output" in check["reason"] and "5.00e-01" in check["reason"]


MISSING = object()


@pytest.mark.parametrize("check_error, raised", [(MISSING, None), (None, "RuntimeError: x"), (float("nan"), None)])
def test_unchecked_or_nan_output_fails_as_wrong_output(check_error, raised):
    backend = row(512, "torch", "fp8-channel", 0.001, check_raised=raised)
    if check_error is MISSING:  # a backend row of a run that never checked it
        del backend["check_error"]
    else:
        backend["check_error"] = check_error
    check = checks_by_name([backend, row(512, "scaled_mm_rowwise", "peer", 0.015)])[TORCH_CHANNEL_512]
    assert check["status"] == "FAIL" and "wrong output" in check["reason"]


def test_graph_failure_fails_the_check_and_is_listed_by_fastest():
    failed = row(512, "torch", "fp8-channel", None, eager_ms=0.02, graph_error="RuntimeError: capture failed",
                 host_ms=0.04, check_error=1e-4)
    rows = [failed, row(512, "scaled_mm_rowwise", "peer", 0.015), row(512, "triton", "fp8-channel", 0.03)]
    check = checks_by_name(rows)[TORCH_CHANNEL_512]
    assert check["status"] == "FAIL" and "capture failed" in check["reason"]
    best = bl.fastest(rows)["fp8-channel"]
    assert best["order_by_geomean"] == ["triton"]
    assert best["fastest_at_m"][512] == "triton"
    assert "capture failed" in best["failed"]["torch"][0]


def test_measure_keeps_every_timing_error(monkeypatch):
    def capture_fails(calls, estimate):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(bl, "eager_ms", lambda fn: 0.02)
    monkeypatch.setattr(bl, "graph_ms", capture_fails)
    monkeypatch.setattr(bl, "host_ms", lambda fn: 0.04)
    r = bl._measure(None, None, 512, K, N, "bf16", "peer", [lambda: None], None, {})
    assert r["graph_ms"] is None and r["host_ms"] == 0.04 and r["eager_ms"] == 0.02
    assert "stream is capturing" in r["graph_error"]
    assert r["error"].startswith("graph: RuntimeError: operation not permitted")
    assert bl.row_failure(r).startswith("no graph time: RuntimeError")


def test_measure_records_why_the_output_check_raised(monkeypatch):
    monkeypatch.setattr(bl, "eager_ms", lambda fn: 0.02)
    monkeypatch.setattr(bl, "graph_ms", lambda calls, estimate: 0.01)

    def check_raises(*args):
        raise ValueError("shape mismatch")

    monkeypatch.setattr(bl, "_check", check_raises)
    r = bl._measure(None, None, 16, K, N, "triton", "fp8-block", [lambda: None], None, {})
    assert r["check_error"] is None and "shape mismatch" in r["check_raised"]
    assert "output check: ValueError: shape mismatch" in r["error"]
    assert bl.row_failure(r).startswith("wrong output")


def test_unrequested_checks_are_not_measured_and_not_failures():
    rows = [row(1, "marlin", "fp8-block", 0.005), row(1, "bf16", "peer", 0.010)]
    bl._add_derived(rows, 4.2e12)
    checks = bl.acceptance(rows, [], ms=(1,), shapes=((K, N),))
    by_name = {c["check"]: c for c in checks}
    assert by_name[f"marlin M=1 K={K} N={N}: x bf16 cuBLAS"]["status"] == "pass"
    assert by_name[f"marlin M=16 K={K} N={N}: x bf16 cuBLAS"]["reason"].startswith("not requested")
    assert by_name[f"marlin M=16 K={K} N={N}: x bf16 cuBLAS"]["pass"] is None
    counts = bl.count_checks(checks)
    assert counts == {"pass": 1, "FAIL": 0, "not measured": len(checks) - 1}


def test_requested_row_missing_after_a_stop_is_not_measured_with_its_reason():
    checks = {c["check"]: c for c in bl.acceptance([], [], ms=(1,), shapes=((K, N),))}
    check = checks[f"marlin M=1 K={K} N={N}: x bf16 cuBLAS"]
    assert check["status"] == "not measured" and "stopped" in check["reason"]


def test_dry_run_writes_argv_requested_and_counts(tmp_path, capsys):
    argv = ["--dry-run", "--ms", "1", "16", "--shapes", "4096x14336", "--out", str(tmp_path)]
    assert bl.main(argv) == 0
    report = json.loads((tmp_path / "bench_linear.json").read_text())
    assert report["argv"][1:] == argv
    assert report["requested"] == {"ms": [1, 16], "shapes": [[4096, 14336]]}
    counts = report["acceptance_counts"]
    assert counts["not measured"] > 0 and sum(counts.values()) == len(report["acceptance"])
    assert all(c["timing"] in ("graph", "-") for c in report["acceptance"])
    # the dry run's wrong-output row (marlin fp8-block M=1 4096x14336) fails its checks as such
    marlin = [c for c in report["acceptance"] if c["check"].startswith("marlin M=1 K=4096 N=14336")]
    assert marlin and all(c["status"] == "FAIL" and "wrong output" in c["reason"] for c in marlin)
    markdown = (tmp_path / "bench_linear.md").read_text()
    assert "eager us (info)" in markdown and "Acceptance uses graph at M <= 16" not in markdown
    assert "not measured" in capsys.readouterr().out


def test_old_results_without_per_timing_errors_still_read():
    old = row(512, "torch", "fp8-block", None, error="RuntimeError: from an older run")
    del old["check_error"]
    assert "older run" in bl.row_failure(old)
    assert bl._status({"pass": True}) == "pass" and bl._status({"pass": False}) == "FAIL"


RUN16 = (Path(__file__).resolve().parents[2]
         / "benchmarks/results/h200-2026-11-30-run16/call1_cb93bb2/lin/bench_linear.json")
MEASURED = ("m", "k", "n", "backend", "scheme", "eager_ms", "graph_ms", "host_ms", "copies", "error", "check_error")


@pytest.mark.skipif(not RUN16.is_file(), reason="run 16's results are not in this checkout")
def test_committed_run_verdicts_do_not_depend_on_eager_times():
    report = json.loads(RUN16.read_text())

    def verdicts(eager_scale: float) -> list[tuple]:
        rows = [{key: r[key] for key in MEASURED if key in r} for r in report["rows"]]
        for r in rows:
            r["eager_ms"] = r["eager_ms"] and r["eager_ms"] * eager_scale
        bl._add_derived(rows, report["copy_bandwidth_bytes_per_s"])
        return [(c["check"], c["status"], c["value"]) for c in bl.acceptance(rows, report["correctness"])]

    assert verdicts(1.0) == verdicts(0.1) == verdicts(10.0)
    # The 71 checks the run recorded are all still made; added since: torch at M=1 (9), auto's
    # pick (3) and torch fp8-channel's bfloat16-only correctness (3).
    recorded = {c["check"] for c in report["acceptance"]}
    now = {name for name, _, _ in verdicts(1.0)}
    assert len(recorded) == 71 and recorded <= now and len(now) == 86


def full_rows(times: dict[str, float]) -> list[dict]:
    """Every M and shape of fp8-block's backends (and the other schemes'), graph time per backend."""
    rows = []
    for m in bl.MS:
        for k, n in bl.SHAPES:
            for label, _, scheme in bl.BACKENDS:
                r = row(m, label, scheme.value, times.get(label, 0.05) if scheme is bl.B else 0.05)
                r.update(k=k, n=n)
                rows.append(r)
    return rows


AUTO_BLOCK = "auto on 9.0 fp8-block: selects the fastest backend (geomean graph time / fastest's)"


def test_auto_check_fails_when_auto_does_not_pick_the_fastest_backend():
    assert bl.auto_pick(bl.B, K, N) == "torch"  # the registry's 9.0 row
    rows = full_rows({"triton": 0.02, "torch": 0.03, "marlin": 0.04})
    checks = {c["check"]: c for c in bl.acceptance(rows, [])}
    check = checks[AUTO_BLOCK]
    assert check["status"] == "FAIL" and check["value"] == pytest.approx(1.5)
    assert "auto picks torch; fastest triton < torch < marlin" in check["reason"]
    rows = full_rows({"triton": 0.03, "torch": 0.02, "marlin": 0.04})
    assert {c["check"]: c for c in bl.acceptance(rows, [])}[AUTO_BLOCK]["status"] == "pass"


def test_auto_check_fails_when_auto_picks_a_backend_with_failed_rows():
    rows = full_rows({"triton": 0.03, "torch": 0.02, "marlin": 0.04})
    next(r for r in rows if r["backend"] == "torch" and r["scheme"] == "fp8-block")["check_error"] = 0.5
    check = {c["check"]: c for c in bl.acceptance(rows, [])}[AUTO_BLOCK]
    assert check["status"] == "FAIL" and "wrong output" in check["reason"]


def test_auto_check_is_not_measured_on_a_restricted_or_stopped_run():
    rows = full_rows({"torch": 0.02})
    assert {c["check"]: c for c in bl.acceptance(rows, [], ms=(1,))}[AUTO_BLOCK]["status"] == "not measured"
    rows.remove(next(r for r in rows if r["m"] == 8192 and r["backend"] == "marlin" and r["scheme"] == "fp8-block"))
    check = {c["check"]: c for c in bl.acceptance(rows, [])}[AUTO_BLOCK]
    assert check["status"] == "not measured" and "stopped" in check["reason"]


@pytest.mark.parametrize("scheme", ["fp8-block", "fp8-channel", "fp8-tensor"])
def test_torch_at_one_row_must_work(scheme):
    name = f"torch {scheme} M=1 K={K} N={N}: works (graph us)"
    broken = row(1, "torch", scheme, None, build_error="RuntimeError: no M=1", error="build: RuntimeError: no M=1")
    check = checks_by_name([broken], ms=(1,))[name]
    assert check["status"] == "FAIL" and "no M=1" in check["reason"]
    assert checks_by_name([row(1, "torch", scheme, 0.01)], ms=(1,))[name]["status"] == "pass"
    assert checks_by_name([], ms=(16,))[name]["status"] == "not measured"


def test_correctness_not_reached_is_not_measured_not_absent():
    checks = [c for c in bl.acceptance([], [], ms=(1,), shapes=((K, N),)) if c["check"].startswith("correctness")]
    assert len(checks) == len(bl.CORRECTNESS_SHAPES) * len(bl.BACKENDS)
    assert all(c["status"] == "not measured" and "stopped" in c["reason"] for c in checks)


def test_a_backend_without_float16_output_is_checked_in_bfloat16():
    m, k, n = bl.CORRECTNESS_SHAPES[0]
    bf16 = {"m": m, "k": k, "n": n, "dtype": "bfloat16", "backend": "torch", "scheme": "fp8-channel",
            "rel_error": 1.4e-3, "rel_error_vs_rounded": 5e-3, "rounding_floor": 1.4e-3, "error": None}
    checks = [c for c in bl.acceptance([], [bf16], ms=(1,), shapes=((K, N),))
              if c["check"].startswith(f"correctness torch fp8-channel bfloat16 M={m} ")]
    assert len(checks) == 1 and checks[0]["status"] == "FAIL" and checks[0]["value"] == 5e-3
