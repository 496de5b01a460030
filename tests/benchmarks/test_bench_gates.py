"""bench_gates in a tiny configuration: the output's shape, and verdicts a deterministic model
makes certain. With no flaky questions two runs of the same model answer identically: the
paired gate sees no flips and PASSes every time; a 5-point drop on 200 questions is 10 answers
right->wrong and none back (exact McNemar p = 0.5^10), which it FAILs every time."""

from __future__ import annotations

import json

import pytest

import bench_gates  # benchmarks/ is put on the path by conftest.py

SCENARIOS = {"no_regression", "equivalent", "drop_1", "drop_5"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gates")
    assert bench_gates.main(["--out", str(out), "--trials", "20", "--binomial-trials", "50", "--ns", "200",
                             "--noise", "0", "0.01", "--drops", "0.01", "0.05", "--cond-baselines", "3",
                             "--cond-runs", "5", "--spot-checks", "3"]) == 0
    markdown = (out / "gates_oc.md").read_text()
    return json.loads((out / "gates_oc.json").read_text()), markdown


def rows(report, **where):
    return [r for r in report["results"] if all(r[k] == v for k, v in where.items())]


def test_output_shape(report):
    data, markdown = report
    assert data["provenance"]["commit"] and data["provenance"]["date"] and data["provenance"]["machine"]["cpus"]
    assert data["arguments"]["ns"] == [200] and data["assumptions"]
    modes = {g["mode"] for g in data["gates"]}
    assert modes == {"absolute", "relative", "hypothesis", "wilson", "paired", "recovery"}
    assert data["defaults"] == {"alpha": 0.05, "beta": 0.2, "rtol": 0.08, "recovery": 0.95, "tolerance": 0.08}
    # every mode at n=200, every scenario, both noise levels of the fixed set
    for mode in modes:
        for noise in (0.0, 0.01):
            got = {r["scenario"] for r in rows(data, mode=mode, model="fixed", noise=noise, n=200)}
            assert got == SCENARIOS, (mode, noise, got)
    for r in data["results"]:
        assert r["trials"] == (20 if r["model"] == "fixed" else 50)
        assert 0 <= r["ci95"][0] <= r["fail_rate"] <= r["ci95"][1] <= 1
    # the binomial model: reference modes only, with the exact rate
    binomial = rows(data, model="binomial")
    assert binomial and {r["mode"] for r in binomial} == {"absolute", "relative", "hypothesis", "wilson"}
    assert all(0 <= r["exact_fail_rate"] <= 1 for r in binomial)
    assert [s["n"] for s in data["question_sets"]] == [200, 200]
    assert data["question_sets"][0]["flaky_questions"] == 0
    assert data["question_sets"][1]["run_to_run_sd"] == pytest.approx(0.01, abs=0.001)
    assert {c["noise"] for c in data["conditional"]} == {0.01}
    assert data["spot_checks"] > 0 and data["calibrate_checks"] > 0
    # shipped configs are read from eval_configs/, the demo's tolerance among them
    assert any(g["id"] == "absolute-tolerance0.04" for g in data["gates"])
    for heading in ("## Assumptions", "## FAIL rates", "### n = 200", "## Smallest drop", "## Findings"):
        assert heading in markdown


def test_paired_deterministic_model_never_fails_without_regression_and_always_with_one(report):
    data, _ = report
    [paired] = rows(data, gate="paired", model="fixed", noise=0.0, scenario="no_regression")
    assert paired["fails"] == 0 and paired["discordant_mean"] == 0  # no flips, p = 1: PASS every time
    [drop] = rows(data, gate="paired", model="fixed", noise=0.0, scenario="drop_5")
    assert drop["fail_rate"] == 1.0 and drop["discordant_mean"] == 10


def test_hypothesis_in_its_own_model_is_near_alpha(report):
    # The exact binomial computation puts the no-regression FAIL rate of a two-sample z-test at
    # alpha 0.05 near 5% (not 0, not 50%): the benchmark measures the gate, not a constant.
    data, _ = report
    [row] = rows(data, gate="hypothesis", model="binomial", scenario="no_regression")
    assert 0.03 < row["exact_fail_rate"] < 0.09
