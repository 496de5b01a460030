"""Launching a compiled Triton kernel by its handle, without the JIT's per-call dispatch.

`kernel[grid](...)` binds and specializes every argument, hashes a cache key and checks the
kernel's globals on every call. On the H200's host that is ~9 us of a ~15 us launch (the 1x128
activation quantization: 14.6 -> 5.6 us, benchmarks/results/h200-2026-11-29-run8), and eager
prefill-sized GEMMs are bound by host time, not GPU time. A `DirectLaunch` keeps the compiled
kernel per key its caller gives and calls the launcher itself. The first launch for a key goes
through the JIT (compiling or finding the kernel), so compilation, its cache and its errors stay
Triton's. Under the interpreter (CPU) every launch goes through the JIT.

The caller's key must determine everything Triton specializes a compilation on: constexprs and
launch options, argument dtypes, whether each pointer is 16-byte aligned, and the value class
(1, multiple of 16, other) of every integer not in `do_not_specialize`. A key that misses one
runs a kernel compiled for other arguments.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

import torch
from triton import knobs
from triton.knobs import HookChain
from triton.compiler import CompiledKernel
from triton.runtime import JITFunction, driver


# triton.cdiv and triton.next_power_of_2 are constexpr functions in Triton 3.6: called from host
# code they go through the JIT's callable wrapper, ~2.6 us each, several per eager GEMM call.
def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers, on the host."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for 0), on the host."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@functools.cache
def tma_device(device: torch.device) -> bool:
    """Whether the TMA kernels (host tensor descriptors) run on `device`: Hopper, the GPU they
    are tuned on."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def aligned(ptr: int) -> bool:
    """Whether Triton would specialize a pointer argument as 16-byte aligned."""
    return ptr % 16 == 0


class DirectLaunch:
    """Launches of one @triton.jit kernel whose runtime arguments precede its constexprs."""

    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel
        self._by_handle = isinstance(kernel, JITFunction)  # not an InterpretedFunction
        self._compiled: dict[Hashable, tuple[CompiledKernel, tuple]] = {}

    def __call__(self, key: Hashable, grid: tuple[int, ...], args: tuple, **meta: Any) -> None:
        """Launch with runtime `args` (in parameter order) and `meta` (constexprs by name, and
        options such as num_warps, num_stages, launch_pdl), all of them determined by `key`."""
        if not self._by_handle:
            self._kernel[grid](*args, **meta)
            return
        device = driver.active.get_current_device()
        entry = self._compiled.get((device, key))
        if entry is None:
            compiled = self._kernel[grid](*args, **meta)
            if isinstance(compiled, CompiledKernel):
                tail = tuple(meta[p.name] if p.name in meta else p.default for p in self._kernel.params[len(args):])
                self._compiled[(device, key)] = (compiled, tail)
            return
        compiled, tail = entry
        stream = driver.active.get_current_stream(device)
        enter_hook, exit_hook = _active(knobs.runtime.launch_enter_hook), _active(knobs.runtime.launch_exit_hook)
        metadata = compiled.launch_metadata(grid, stream, *args, *tail) if enter_hook is not None else None
        compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                     compiled.function, compiled.packed_metadata, metadata, enter_hook, exit_hook, *args, *tail)


def _active(hook: Any) -> Any:
    """The launch hook to pass, None when none is installed. Triton 3.6's hooks are chains, never
    None: passed as they are, every launch builds its metadata and calls two empty chains. With
    a hook installed (profilers, proton) launches by handle report as the JIT's do."""
    return None if isinstance(hook, HookChain) and not hook.calls else hook
