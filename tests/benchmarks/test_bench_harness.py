"""bench_harness's JSON says when, where, at which commit and under which load it measured."""

from __future__ import annotations

import json

import bench_harness  # benchmarks/ is put on the path by conftest.py


def test_bench_harness_json_has_provenance_and_load(tmp_path, monkeypatch):
    run = {"config": "c", "verdict": "PASS", "n": 5, "wall_s": 10.0, "server_start_s": 1.0, "server_busy_s": 8.0,
           "eval_s": 8.5, "overhead_s": 1.0, "overhead_share": 0.1, "not_answering_share": 0.2, "cli_s": 0.5,
           "lm_eval_s": 0.5, "run_other_s": 0.0}
    monkeypatch.setattr(bench_harness, "measure", lambda config, limit, workdir: run)
    monkeypatch.setenv("QUANTGATE_COMMIT", "beef123")
    config = tmp_path / "c.yaml"
    config.write_text("name: c\n")
    assert bench_harness.main(["--config", str(config), "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench_harness.json").read_text())
    assert report["commit"] == "beef123" and report["date"]
    assert report["argv"][1:] == ["--config", str(config), "--out", str(tmp_path)]
    assert len(report["load_before"]) == 3 and len(report["load_after"]) == 3
    assert report["machine"]["cpus"] and report["median_overhead_share"] == 0.1
