"""What the kernels run on: device, compute capability, libraries.

Selection reads the device only through a Platform, so `Platform.hypothetical("cuda", (8, 0))`
answers "what would an A100 pick?" on a CPU-only machine.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform as host
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Compute capabilities run from 1.0 (Tesla) to 12.x (Blackwell) today, minors 0-9; the major
# bound leaves room for future GPUs while refusing values no GPU reports (0.0, -1.0, 90.0).
CAPABILITY_MAJORS = range(1, 21)
CAPABILITY_MINORS = range(10)


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


# torch's CPU `_scaled_mm` with a scale per row and per column (torch 2.11 took one scale per
# operand only, and asserted on rows); the torch backend scales rows on CPU.
CPU_ROWWISE_SCALED_MM = "cpu-rowwise-scaled-mm"


@functools.cache
def _cpu_scaled_mm_takes_row_scales() -> bool:
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def _cpu_name() -> str:
    """The CPU model and the cores this process may use: CPU results differ between CPUs (their
    matmul kernels round differently), so a measurement names the one it ran on."""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        model = ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model or host.processor() or host.machine() or 'cpu'}, {cores} cores"


@dataclass(frozen=True)
class Platform:
    device: str  # "cpu" | "cuda"
    capability: tuple[int, int] | None = None  # None on CPU
    name: str = ""
    libraries: frozenset[str] = field(default_factory=frozenset)

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"

    def has_capability(self, minimum: tuple[int, int]) -> bool:
        return self.capability is not None and self.capability >= minimum

    @property
    def capability_str(self) -> str | None:
        return None if self.capability is None else f"{self.capability[0]}.{self.capability[1]}"

    def to_dict(self) -> dict:
        return {"device": self.device, "capability": self.capability_str, "name": self.name}

    @classmethod
    def detect(cls, device: str | None = None) -> Platform:
        """The platform this process would run on (`device`: auto/None, cpu, cuda)."""
        if device in (None, "auto"):
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise RuntimeError(
                    "--device cuda was requested but torch sees no CUDA device "
                    f"(torch {torch.__version__}); use --device cpu or install a CUDA build of torch"
                )
            index = torch.device(device).index or 0
            count = torch.cuda.device_count()
            if index >= count:  # torch asserts (a traceback) on an index it does not have
                raise RuntimeError(f"--device {device}: this machine has {count} CUDA device(s), "
                                   f"{'cuda:0' if count == 1 else f'cuda:0 to cuda:{count - 1}'}")
            cap = torch.cuda.get_device_capability(index)
            libs = {"cuda"} | ({"triton"} if _has_module("triton") else set())
            return cls("cuda", (cap[0], cap[1]), torch.cuda.get_device_name(index), frozenset(libs))
        libs = ({"triton-interpreter"} if _has_module("triton") else set()) | (
            {CPU_ROWWISE_SCALED_MM} if _cpu_scaled_mm_takes_row_scales() else set())
        return cls("cpu", None, _cpu_name(), frozenset(libs))

    @classmethod
    def hypothetical(cls, device: str, capability: str | tuple[int, int] | None = None) -> Platform:
        """A platform described rather than detected: a CPU runs the torch this project pins (row-wise
        CPU `_scaled_mm`), a GPU has triton."""
        if device == "cpu":
            return cls("cpu", None, "cpu", frozenset({CPU_ROWWISE_SCALED_MM}))
        if device != "cuda":
            raise ValueError(f"unknown device {device!r}: expected 'cpu' or 'cuda'")
        if capability is None:
            raise ValueError("a hypothetical CUDA platform needs a compute capability, e.g. 8.0 or 9.0")
        if isinstance(capability, str):
            try:
                major, minor = (int(p) for p in capability.split("."))
            except ValueError:
                raise ValueError(f"capability {capability!r} is not of the form X.Y (e.g. 9.0)") from None
            capability = (major, minor)
        return cls("cuda", capability, f"cuda sm_{capability[0]}{capability[1]}", frozenset({"cuda", "triton"}))
