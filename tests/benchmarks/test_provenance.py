"""Provenance of benchmark results: the commit measured (QUANTGATE_COMMIT first, unverified
otherwise), the command line, and the engine benchmark writing it into its JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import provenance  # benchmarks/ is put on the path by conftest.py

REPO = Path(__file__).resolve().parents[2]


def test_commit_passed_by_the_job_wins(monkeypatch):
    monkeypatch.setenv("QUANTGATE_COMMIT", "unverified:abc1234-dirty")
    assert provenance.commit() == "unverified:abc1234-dirty"


def test_commit_from_git_marks_a_modified_tree_dirty(monkeypatch):
    monkeypatch.delenv("QUANTGATE_COMMIT", raising=False)
    answers = {("rev-parse", "--short=12", "HEAD"): "0123456789ab",
               ("status", "--porcelain", "--untracked-files=no"): " M kernels/quant.py"}
    monkeypatch.setattr(provenance, "_git", lambda *args: answers[args])
    assert provenance.commit() == "0123456789ab-dirty"
    answers[("status", "--porcelain", "--untracked-files=no")] = ""
    assert provenance.commit() == "0123456789ab"
    monkeypatch.setattr(provenance, "_git", lambda *args: None)
    assert provenance.commit() == "unknown"


def test_record_names_commit_date_argv_and_versions(monkeypatch):
    monkeypatch.setenv("QUANTGATE_COMMIT", "cafe123")
    record = provenance.record(["bench.py", "--x"], packages=("json", "no_such_package_here"))
    assert record["commit"] == "cafe123" and record["argv"] == ["bench.py", "--x"]
    assert record["date"].endswith("+00:00")
    assert record["no_such_package_here"] is None and "json" in record


def test_gpu_env_records_an_unpassed_commit_as_unverified():
    script = "unset QUANTGATE_COMMIT; PYTHON=true source benchmarks/gpu_env.sh; echo $QUANTGATE_COMMIT"
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip().startswith("unverified:")
    script = "export QUANTGATE_COMMIT=feed123; PYTHON=true source benchmarks/gpu_env.sh; echo $QUANTGATE_COMMIT"
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "feed123"


def test_bench_engine_results_end_with_provenance(tmp_path, monkeypatch):
    import bench_engine

    monkeypatch.setenv("QUANTGATE_COMMIT", "d00d123")
    record = provenance.record(["benchmarks/bench_engine.py", "decode"])
    path = bench_engine.write_results(tmp_path, "decode", [{"variant": "bf16"}, {"ratios": {}}], record)
    rows = json.loads(path.read_text())
    assert path.name == "bench_engine_decode.json"
    assert rows[:2] == [{"variant": "bf16"}, {"ratios": {}}]
    prov = rows[-1]["provenance"]
    assert prov["commit"] == "d00d123" and prov["argv"] == ["benchmarks/bench_engine.py", "decode"]
    assert prov["torch"] and "triton" in prov and prov["date"]
