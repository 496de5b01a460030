"""A detected platform names the hardware a measurement ran on; a described one names none."""

from __future__ import annotations

import os

from quantgate.kernels.platform import Platform


def test_a_detected_cpu_names_its_model_and_the_cores_it_may_use() -> None:
    platform = Platform.detect("cpu")
    assert platform.device == "cpu" and platform.capability is None
    assert platform.name.endswith(f", {len(os.sched_getaffinity(0))} cores"), platform.name
    assert not platform.name.startswith(",") and platform.to_dict()["name"] == platform.name


def test_a_described_cpu_is_named_cpu() -> None:
    assert Platform.hypothetical("cpu").name == "cpu"
