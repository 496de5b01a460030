"""Programmatic dependent launch (PDL): the next kernel starts while this one finishes.

A batch-1 decode step is ~260 short kernels in a CUDA graph, and between two kernels the GPU
idles for the launch of the next one (~1.9 us each on the H200, a quarter of the step). With
PDL (sm_90 and later) a kernel launched with `launch_pdl` may be scheduled as soon as every
program of the kernel before it has executed `griddepcontrol.launch_dependents`; it then runs
up to its own `griddepcontrol.wait`, which returns once that kernel has completed and its
writes are visible. So a GEMV can start streaming its weights (which no earlier kernel writes)
while the RMSNorm in front of it still runs, and only reads its activations after the wait.

Rule for a kernel launched with `**launch_options(device)`: call `await_inputs(PDL)` before
reading anything an earlier kernel writes and before its first store (a store before it could
overwrite what the earlier kernel still reads). It waits, then lets the next kernel launch.
Kernels launched without PDL (PyTorch's, cuBLAS's) wait for full completion as before, so
mixing is safe. Work before the wait must not depend on earlier kernels: index math, and
`prefetch_l2` of the weights.

PDL is on only inside `for_graph_capture()`, which the engine wraps around its CUDA graph
warm-up and capture: there the launch gaps are GPU time. Eagerly the step is bound by the host,
and PDL launches made it slower (H200, FP8 decode without graphs: 47 -> 28 tokens/s). Set
QUANTGATE_PDL=0 to capture without it (debugging, or measuring what it buys).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .switches import PDL_ENV, switched_on

_INTERPRETED = tl.constexpr(knobs.runtime.interpret)  # read when kernels are defined, as triton.jit does


@functools.cache
def _capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


_capturing = 0


@contextlib.contextmanager
def for_graph_capture() -> Iterator[None]:
    """Launches inside use PDL where `enabled` allows it."""
    global _capturing
    _capturing += 1
    try:
        yield
    finally:
        _capturing -= 1


def enabled(device: torch.device) -> bool:
    """PDL for kernels on `device`: inside `for_graph_capture`, CUDA sm_90+, compiled (not
    interpreted), not switched off by QUANTGATE_PDL=0."""
    if (not _capturing or device.type != "cuda" or not switched_on(PDL_ENV)
            or os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(device: torch.device) -> dict[str, bool]:
    """Keyword arguments for a launch of a kernel with a `PDL: tl.constexpr` parameter."""
    on = enabled(device)
    return {"PDL": on, "launch_pdl": on}


@triton.jit
def await_inputs(PDL: tl.constexpr):
    """Wait for the previous kernel's completion, then let the next kernel be scheduled (its
    programs run up to their own wait, so they cannot overtake this kernel's stores)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_l2(addresses):
    """Start loading the 128-byte lines at `addresses` into L2, without waiting or using a
    register for them: what a kernel can do with data no earlier kernel writes (its weights)
    before `await_inputs`. Nothing under the interpreter."""
    if not _INTERPRETED:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [addresses], dtype=tl.int32,
                                  is_pure=False, pack=1)
