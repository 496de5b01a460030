"""bench_server's results file says what it measured: commit, date and command line."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx")
import bench_server  # noqa: E402 - benchmarks/ is put on the path by conftest.py


def test_results_are_stamped_with_commit_date_and_command(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTGATE_COMMIT", "abc1234")
    argv = ["benchmarks/bench_server.py", "--concurrency", "1", "32", "--out", str(tmp_path)]
    path = bench_server.write_results(tmp_path, [{"concurrency": 1, "total_tokens_per_s": 1.0}], argv)
    data = json.loads(path.read_text())
    assert data[0]["concurrency"] == 1
    record = data[-1]["provenance"]
    assert record["commit"] == "abc1234" and record["date"] and record["argv"] == argv
