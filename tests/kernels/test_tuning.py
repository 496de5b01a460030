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
