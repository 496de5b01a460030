"""The launch-configuration tuner: defaults where nothing can be timed, GPU times under graphs."""

from __future__ import annotations

import logging

import pytest
import torch

from quantgate.kernels.triton import tuning
from quantgate.kernels.triton.tuning import AUTOTUNE_ENV, Autotuner, graph_time_ms, m_bucket


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


def _fake_timing(monkeypatch, times):
    """graph_time_ms replaced by `times[name]` for the config `name` (an exception is raised), on a
    CUDA device that is only named: pick's conditions and bookkeeping run without a GPU."""
    timed = []

    def fake_graph_time_ms(fn):
        name = fn()
        timed.append(name)
        if isinstance(times[name], Exception):
            raise times[name]
        return times[name]

    monkeypatch.setattr(tuning, "graph_time_ms", fake_graph_time_ms)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setenv(AUTOTUNE_ENV, "1")
    return timed


def test_a_key_is_timed_once_and_its_choice_reported(monkeypatch):
    timed = _fake_timing(monkeypatch, {"default": 0.010, "fast": 0.005, "only": 0.001})
    cuda = torch.device("cuda")
    tuner = Autotuner("test_once")
    assert tuner.pick(("a",), ["default", "fast"], lambda name: name, cuda) == "fast"
    assert tuner.pick(("a",), ["default", "fast"], lambda name: name, cuda) == "fast"
    assert timed == ["default", "fast"]
    assert tuner.pick(("b",), ["fast", "default"], lambda name: name, cuda) == "fast"
    assert tuner.pick(("c",), ["only"], lambda name: name, cuda) == "only"  # nothing to choose: untimed
    assert timed == ["default", "fast", "fast", "default"]
    rows = [row for row in tuning.tuning_report() if row["kernel"] == "test_once"]
    assert rows == [
        {"kernel": "test_once", "key": ("a",), "chosen": "fast", "candidates": [
            {"config": "default", "ms": 0.010, "error": None}, {"config": "fast", "ms": 0.005, "error": None}]},
        {"kernel": "test_once", "key": ("b",), "chosen": "fast", "candidates": [
            {"config": "fast", "ms": 0.005, "error": None}, {"config": "default", "ms": 0.010, "error": None}]}]


def test_nothing_is_timed_when_tuning_is_off_during_capture_or_off_cuda(monkeypatch):
    timed = _fake_timing(monkeypatch, {"default": 0.010, "fast": 0.005})
    tuner = Autotuner("test_untimed")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert tuner.pick(("capture",), ["default", "fast"], lambda name: name, torch.device("cuda")) == "default"
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert tuner.pick(("meta",), ["default", "fast"], lambda name: name, torch.device("meta")) == "default"
    monkeypatch.setenv(AUTOTUNE_ENV, "0")
    assert tuner.pick(("off",), ["default", "fast"], lambda name: name, torch.device("cuda")) == "default"
    assert timed == [] and tuner.best == {} and tuner.timings == {}
    monkeypatch.setenv(AUTOTUNE_ENV, "1")  # untimed defaults were not kept: the key is tuned when it can be
    assert tuner.pick(("off",), ["default", "fast"], lambda name: name, torch.device("cuda")) == "fast"


def test_the_margin_is_measured_against_the_config_kept_so_far(monkeypatch):
    """Candidates each a little faster than the one before must not add up to a switch that no
    step earned; a slow default is replaced by the faster of the others."""
    _fake_timing(monkeypatch, {"default": 0.0100, "fast": 0.0090, "slightly_faster": 0.0088, "slow": 0.0200})
    tuner, cuda = Autotuner("test_chain"), torch.device("cuda")
    assert tuner.pick(("k",), ["default", "fast", "slightly_faster"], lambda name: name, cuda) == "fast"
    assert tuner.pick(("j",), ["slow", "default", "fast"], lambda name: name, cuda) == "fast"


def test_when_every_candidate_fails_the_first_ones_error_is_raised(monkeypatch):
    """The error names the tuner, the key and the default's failure; each failure is recorded by its
    first line, at most 200 characters, and one without a message by its type."""
    long_line = "x" * 300
    _fake_timing(monkeypatch, {"default": ValueError(f"{long_line}\nsecond line"),
                               "two_lines": OSError("first line\nsecond line"), "bare": RuntimeError()})
    tuner = Autotuner("test_failing")
    with pytest.raises(RuntimeError, match=f"^test_failing: no candidate config ran for \\('k',\\): "
                                           f"ValueError: {'x' * 200}$"):
        tuner.pick(("k",), ["default", "two_lines", "bare"], lambda name: name, torch.device("cuda"))
    assert tuner.timings[("k",)] == [("default", None, f"ValueError: {'x' * 200}"),
                                     ("two_lines", None, "OSError: first line"), ("bare", None, "RuntimeError: ")]
    assert ("k",) not in tuner.best  # nothing kept: the next call tries again


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
