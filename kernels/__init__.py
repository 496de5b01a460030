"""quantgate.kernels: FP8 linear and MoE kernels behind one contract, with explicit backend selection."""

from .base import IncompatibleBufferError, LinearKernel, MoEKernel, bind_processed
from .platform import Platform
from .registry import (
    LINEAR_BACKENDS,
    MOE_BACKENDS,
    KernelSelectionError,
    Selection,
    UnknownBackendError,
    normalize_backend,
    select_linear_kernel,
    select_moe_kernel,
)
from .schemes import LinearLayerConfig, MoELayerConfig, Scheme
from .triton.switches import switch_problem

__all__ = [
    "IncompatibleBufferError", "LinearKernel", "MoEKernel", "bind_processed", "Platform",
    "LINEAR_BACKENDS", "MOE_BACKENDS", "KernelSelectionError", "Selection", "UnknownBackendError",
    "normalize_backend", "select_linear_kernel", "select_moe_kernel",
    "LinearLayerConfig", "MoELayerConfig", "Scheme", "switch_problem",
]
