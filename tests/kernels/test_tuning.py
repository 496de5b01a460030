"""The launch-configuration tuner: defaults where nothing can be timed, GPU times under graphs."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from quantgate.kernels.triton import tuning
from quantgate.kernels.triton.fp8_block_gemm import GemmConfig
from quantgate.kernels.triton.switches import TUNING_FILE_ENV
from quantgate.kernels.triton.tuning import (AUTOTUNE_ENV, TUNING_FORMAT, Autotuner, TuningFile, graph_time_ms,
                                             m_bucket)


def test_m_buckets_are_one_then_powers_of_four():
    assert [m_bucket(m) for m in (1, 2, 16, 17, 64, 65, 256, 4096, 4097, 10**6)] == [
        1, 16, 16, 64, 64, 256, 256, 4096, 16384, 16384]


def test_without_a_gpu_the_default_config_is_taken_untimed():
    calls = []
    tuner = Autotuner("test_default")
    chosen = tuner.pick(("key",), ["default", "other"], calls.append, torch.device("cpu"))
    assert chosen == "default" and calls == [] and tuner.timings == {}


def test_a_choice_needs_a_clear_margin_and_is_logged_with_every_candidates_time(monkeypatch, caplog):
    """Timing noise must not flip a tie between runs (the summation order would flip with it), and
    the server's log must say what was chosen: two runs that differ in a few answers may differ
    there."""
    times = {"default": 0.0100, "tie": 0.0098, "faster": 0.0090, "broken": None}

    def fake_graph_time_ms(fn):
        name = fn()
        if times[name] is None:
            raise RuntimeError("out of resources: shared memory")
        return times[name]

    monkeypatch.setattr(tuning, "graph_time_ms", fake_graph_time_ms)
    tuner = Autotuner("test_margin")
    with caplog.at_level(logging.INFO, logger="quantgate.kernels"):
        assert tuner._time(("tie",), ["default", "tie", "broken"], lambda name: name) == "default"
        assert tuner._time(("faster",), ["default", "tie", "faster"], lambda name: name) == "faster"
    assert [r.getMessage() for r in caplog.records] == [
        "tuned test_margin for ('tie',): default (10.0 us, 9.8 us, failed)",
        "tuned test_margin for ('faster',): faster (10.0 us, 9.8 us, 9.0 us)"]
    assert tuner.timings[("tie",)][2] == ("broken", None, "RuntimeError: out of resources: shared memory")


@pytest.mark.gpu
def test_the_tuner_measures_gpu_time_and_keeps_the_faster_config(monkeypatch):
    monkeypatch.setenv(AUTOTUNE_ENV, "1")  # the GPU jobs run the other kernel tests with tuning off
    a = torch.randn(2048, 2048, device="cuda")
    work = {"small": lambda: a[:64] @ a[:, :64], "large": lambda: a @ a}
    assert 0 < graph_time_ms(work["small"]) < graph_time_ms(work["large"])
    tuner = Autotuner("test_gpu")
    assert tuner.pick(("k",), ["large", "small"], lambda name: work[name](), a.device) == "small"
    assert [config for config, ms, err in tuner.timings[("k",)]] == ["large", "small"]


@pytest.mark.parametrize("value", ["false", "off", "2"])
def test_a_switch_set_to_neither_0_nor_1_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """QUANTGATE_AUTOTUNE=false left tuning on (only "0" turned it off), defeating a bit-for-bit
    reproduction without a word; quantgate serve refuses it before loading a model."""
    from quantgate.kernels import switch_problem
    from quantgate.kernels.triton.switches import PDL_ENV, switched_on

    for name in (AUTOTUNE_ENV, PDL_ENV):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"{name}='{value}' is neither 0 nor 1"):
            switched_on(name)
        assert name in switch_problem()
        monkeypatch.setenv(name, " 0 ")
        assert not switched_on(name) and switch_problem() is None
        monkeypatch.setenv(name, "")  # `NAME= cmd`: as unset
        assert switched_on(name)
        monkeypatch.delenv(name)
        assert switched_on(name)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Drive the tuner as on a GPU without one: the GPU's name, graph capture and the timings are
    stand-ins (a candidate's time is its block_n in microseconds)."""
    state = {"capturing": False, "timed": 0}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])

    def fake_graph_time_ms(fn):
        state["timed"] += 1
        return fn().block_n * 1e-3

    monkeypatch.setattr(tuning, "graph_time_ms", fake_graph_time_ms)
    monkeypatch.setenv(AUTOTUNE_ENV, "1")
    return state


CUDA = torch.device("cuda", 0)
KEY = (16, 256, 768, torch.bfloat16, True, 128)
CANDIDATES = [GemmConfig(16, 128, 4, 3), GemmConfig(16, 64, 4, 4, split_per_sm=4), GemmConfig(16, 256, 8, 3)]


def fresh_process(monkeypatch: pytest.MonkeyPatch, path) -> None:
    """As a new server process: QUANTGATE_TUNING_FILE read anew."""
    tuning._open_tuning_file.cache_clear()
    monkeypatch.setenv(TUNING_FILE_ENV, str(path))


def test_a_timed_choice_goes_into_the_tuning_file_and_a_later_process_replays_it_untimed(fake_gpu, tmp_path,
                                                                                            monkeypatch):
    """Two runs that each tune afresh can choose differently (the timings are noisy) and then
    differ in answers: a run's choices, replayed, reproduce it, also with tuning off and for a
    first use inside a graph capture."""
    path = tmp_path / "tuning.json"
    fresh_process(monkeypatch, path)
    assert Autotuner("test_replay").pick(KEY, CANDIDATES, lambda c: c, CUDA) == CANDIDATES[1]
    assert fake_gpu["timed"] == 3
    assert json.loads(path.read_text()) == {"format": TUNING_FORMAT, "choices": {"Fake GPU": {"test_replay": {
        str(KEY): {"block_m": 16, "block_n": 64, "num_warps": 4, "num_stages": 4, "group_m": 8, "split_per_sm": 4}}}}}

    fresh_process(monkeypatch, path)
    monkeypatch.setenv(AUTOTUNE_ENV, "0")
    fake_gpu["capturing"] = True
    assert Autotuner("test_replay").pick(KEY, CANDIDATES, lambda c: c, CUDA) == CANDIDATES[1]
    assert fake_gpu["timed"] == 3
    # Another GPU's choices are not this one's: the default, as without a file.
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Other GPU")
    assert Autotuner("test_replay").pick(KEY, CANDIDATES, lambda c: c, CUDA) == CANDIDATES[0]


def test_servers_sharing_a_tuning_file_keep_each_others_choices(tmp_path):
    path = tmp_path / "tuning.json"
    first, second = TuningFile(path), TuningFile(path)  # both read the file before either wrote
    first.add("Fake GPU", "w8a8_tma", (1024, 4096, 4096), CANDIDATES[0])
    second.add("Fake GPU", "w8a8_tma", (16384, 4096, 4096), CANDIDATES[2])
    third = TuningFile(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuning.json"]  # no lock or temporary file left
    assert third.choice("Fake GPU", "w8a8_tma", (1024, 4096, 4096), CANDIDATES) == CANDIDATES[0]
    assert third.choice("Fake GPU", "w8a8_tma", (16384, 4096, 4096), CANDIDATES) == CANDIDATES[2]


def test_a_choice_that_is_no_longer_a_candidate_is_timed_anew_and_replaced(fake_gpu, tmp_path, monkeypatch, caplog):
    path = tmp_path / "tuning.json"
    stale = {"block_m": 16, "block_n": 32, "num_warps": 2, "num_stages": 2, "group_m": 8, "split_per_sm": 0}
    path.write_text(json.dumps({"format": TUNING_FORMAT, "choices": {"Fake GPU": {"test_stale": {str(KEY): stale}}}}))
    fresh_process(monkeypatch, path)
    with caplog.at_level(logging.WARNING, logger="quantgate.kernels"):
        assert Autotuner("test_stale").pick(KEY, CANDIDATES, lambda c: c, CUDA) == CANDIDATES[1]
    assert "none of this version's candidates: timing them instead" in caplog.text
    assert fake_gpu["timed"] == 3
    assert json.loads(path.read_text())["choices"]["Fake GPU"]["test_stale"][str(KEY)]["block_n"] == 64


def test_an_unwritable_tuning_file_costs_the_record_not_the_choice(fake_gpu, tmp_path, monkeypatch, caplog):
    path = tmp_path / "gone" / "tuning.json"  # its folder removed after the server started
    fresh_process(monkeypatch, path)
    with caplog.at_level(logging.WARNING, logger="quantgate.kernels"):
        assert Autotuner("test_unwritable").pick(KEY, CANDIDATES, lambda c: c, CUDA) == CANDIDATES[1]
    assert f"could not add test_unwritable for {KEY} to {path}" in caplog.text


@pytest.mark.parametrize("make, why", [
    (lambda p: p.mkdir(), "is a folder"),
    (lambda p: None, "does not exist"),
    (lambda p: p.write_text("{not json"), "cannot be read"),
    (lambda p: p.write_text('{"choices": {}}'), "is not a tuning file"),
    (lambda p: p.write_text('{"format": "quantgate-tuning/1", "choices": []}'), "is not a tuning file"),
    (lambda p: p.write_text('{"format": "quantgate-tuning/1", "choices": {"NVIDIA H200": {"w8a8_tma": []}}}'),
     "is not a tuning file"),
])
def test_a_tuning_file_that_cannot_be_used_is_refused_before_a_model_loads(tmp_path, monkeypatch, make, why):
    from quantgate.kernels import switch_problem

    path = tmp_path / "tuning.json" if why != "does not exist" else tmp_path / "missing" / "tuning.json"
    make(path)
    monkeypatch.setenv(TUNING_FILE_ENV, str(path))
    problem = switch_problem()
    assert problem is not None and why in problem and f"{TUNING_FILE_ENV}={path}" in problem
    assert "or unset it" in problem


def test_a_new_or_valid_tuning_file_is_no_problem(tmp_path, monkeypatch):
    from quantgate.kernels import switch_problem

    monkeypatch.setenv(TUNING_FILE_ENV, str(tmp_path / "new.json"))
    assert switch_problem() is None
    (tmp_path / "new.json").write_text(json.dumps({"format": TUNING_FORMAT, "choices": {}}))
    assert switch_problem() is None
