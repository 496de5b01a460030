"""The launch-configuration tuner: defaults where nothing can be timed, GPU times under graphs."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels.triton.tuning import AUTOTUNE_ENV, Autotuner, graph_time_ms, m_bucket


def test_m_buckets_are_one_then_powers_of_four():
    assert [m_bucket(m) for m in (1, 2, 16, 17, 64, 65, 256, 4096, 4097, 10**6)] == [
        1, 16, 16, 64, 64, 256, 256, 4096, 16384, 16384]


def test_without_a_gpu_the_default_config_is_taken_untimed():
    calls = []
    tuner = Autotuner("test_default")
    chosen = tuner.pick(("key",), ["default", "other"], calls.append, torch.device("cpu"))
    assert chosen == "default" and calls == [] and tuner.timings == {}


@pytest.mark.gpu
def test_the_tuner_measures_gpu_time_and_keeps_the_faster_config(monkeypatch):
    monkeypatch.setenv(AUTOTUNE_ENV, "1")  # the GPU jobs run the other kernel tests with tuning off
    a = torch.randn(2048, 2048, device="cuda")
    work = {"small": lambda: a[:64] @ a[:, :64], "large": lambda: a @ a}
    assert 0 < graph_time_ms(work["small"]) < graph_time_ms(work["large"])
    tuner = Autotuner("test_gpu")
    assert tuner.pick(("k",), ["large", "small"], lambda name: work[name](), a.device) == "small"
    assert [config for config, ms, err in tuner.timings[("k",)]] == ["large", "small"]
