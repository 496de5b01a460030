"""A detected platform names the hardware a measurement ran on; a described one names none."""

from __future__ import annotations

import os

import pytest
import torch

from quantgate.kernels.platform import Platform


def test_a_detected_cpu_names_its_model_and_the_cores_it_may_use() -> None:
    platform = Platform.detect("cpu")
    assert platform.device == "cpu" and platform.capability is None
    assert platform.name.endswith(f", {len(os.sched_getaffinity(0))} cores"), platform.name
    assert not platform.name.startswith(",") and platform.to_dict()["name"] == platform.name


def test_a_described_cpu_is_named_cpu() -> None:
    assert Platform.hypothetical("cpu").name == "cpu"


_GPUS = [((9, 0), "NVIDIA H200"), ((8, 0), "NVIDIA A100")]


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch seeing an H200 as cuda:0 and an A100 as cuda:1."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(_GPUS))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: _GPUS[index][0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: _GPUS[index][1])


@pytest.mark.parametrize("device", [None, "auto", "cuda", "cuda:0"])
@pytest.mark.usefixtures("two_gpus")
def test_auto_and_an_unindexed_cuda_detect_the_first_gpu(device) -> None:
    platform = Platform.detect(device)
    assert (platform.device, platform.capability, platform.name) == ("cuda", (9, 0), "NVIDIA H200")
    assert platform.libraries == {"cuda", "triton"}  # triton is installed here (the CPU runs its interpreter)


@pytest.mark.usefixtures("two_gpus")
def test_an_indexed_device_is_that_gpu() -> None:
    platform = Platform.detect("cuda:1")
    assert (platform.capability, platform.name) == ((8, 0), "NVIDIA A100")


@pytest.mark.parametrize("count, device, says", [(2, "cuda:2", "this machine has 2 CUDA device(s), cuda:0 to cuda:1"),
                                                 (1, "cuda:1", "this machine has 1 CUDA device(s), cuda:0")])
@pytest.mark.usefixtures("two_gpus")
def test_a_gpu_index_the_machine_does_not_have_is_refused_naming_the_ones_it_has(monkeypatch, count, device, says):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(RuntimeError) as err:
        Platform.detect(device)
    assert str(err.value) == f"--device {device}: {says}"


def test_cuda_without_a_gpu_says_what_to_do_instead(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="; use --device cpu or install a CUDA build of torch$"):
        Platform.detect("cuda")


@pytest.mark.parametrize("args, says", [(("tpu",), "unknown device 'tpu': expected 'cpu' or 'cuda'"),
                                        (("cuda",), "needs a compute capability, e.g. 8.0 or 9.0")])
def test_a_described_platform_must_be_one_selection_knows(args, says) -> None:
    with pytest.raises(ValueError, match=says):
        Platform.hypothetical(*args)


def test_a_detected_cpu_has_the_libraries_a_described_one_has() -> None:
    """The pinned torch takes a scale per row on CPU (the torch backend's channel and tensor
    layers need it), and pyproject installs triton on Linux x86-64, where its interpreter runs
    on the CPU."""
    import platform as host
    import sys

    from quantgate.kernels.platform import CPU_ROWWISE_SCALED_MM

    triton = {"triton-interpreter"} if sys.platform == "linux" and host.machine() == "x86_64" else set()
    assert Platform.detect("cpu").libraries == {CPU_ROWWISE_SCALED_MM} | triton
    assert Platform.hypothetical("cpu").libraries == {CPU_ROWWISE_SCALED_MM}


def test_a_cpu_name_counts_the_cores_this_process_may_use_not_the_machines(monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert Platform.detect("cpu").name.endswith(", 1 cores")


def test_a_cpu_without_a_model_name_is_named_by_its_architecture(monkeypatch) -> None:
    import platform as host
    from pathlib import Path

    def unreadable(self, *args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr(Path, "read_text", unreadable)
    monkeypatch.setattr(host, "processor", lambda: "")
    monkeypatch.setattr(host, "machine", lambda: "aarch64")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert Platform.detect("cpu").name == "aarch64, 2 cores"
