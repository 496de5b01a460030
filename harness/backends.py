"""Known backend and kernel names per engine, for checking configs before anything runs.

The built-in engine's names come from the kernel registry itself (`LINEAR_BACKENDS`,
`MOE_BACKENDS` and the kernel classes), so they can never drift from what `quantgate serve`
accepts. vLLM is never imported here (it never shares this venv): its names are recorded
from its public sources below and must be refreshed when the vLLM pinned by CI moves.

Names compare with `-` and `_` equivalent and case ignored, as both engines parse them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cache
from typing import Literal

Engine = Literal["builtin", "vllm"]
Layer = Literal["linear", "moe"]
ENGINES: tuple[Engine, ...] = ("builtin", "vllm")

# vllm-project/vllm, vllm/config/kernel.py: the `LinearBackend` and `MoEBackend` Literal types
# behind `--linear-backend` and `--moe-backend` (KernelConfig.linear_backend / moe_backend;
# the field validators lower-case and map '-' to '_'). Read from main, 2026.
VLLM_LINEAR_BACKENDS: tuple[str, ...] = (
    "auto", "cutlass", "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm",
    "flashinfer_cudnn", "flashinfer_b12x", "b12x", "marlin", "humming", "triton", "deep_gemm",
    "torch", "aiter", "machete", "fbgemm", "conch", "exllama", "emulation", "xpu", "xpu_woq",
)
VLLM_MOE_BACKENDS: tuple[str, ...] = (
    "auto", "triton", "batched_triton", "deep_gemm", "deep_gemm_mega_moe", "cutlass",
    "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_b12x", "b12x",
    "flashinfer_moe_ep_mega_deep_gemm", "flashinfer_moe_ep_mega_cutedsl", "marlin", "humming",
    "triton_unfused", "aiter", "aiter_triton_mxfp4_bf16", "flydsl", "hpc", "emulation",
)

# vLLM's MoE oracles log `Using <NAME> Fp8 MoE backend out of potential backends: [...]` (and
# likewise for NvFp4 and the other formats) with the names of their backend enums
# (vllm/model_executor/layers/fused_moe/oracle/, vllm-project/vllm PR 32414). The `--moe-backend`
# value each one corresponds to, so an `expect: {moe_kernel: deep_gemm}` can be checked against
# that log line.
VLLM_MOE_LOG_NAMES: dict[str, str] = {
    "deepgemm": "deep_gemm",
    "batched_deepgemm": "deep_gemm",
    "flashinfer_cutlass": "flashinfer_cutlass",
    "flashinfer_trtllm": "flashinfer_trtllm",
    "flashinfer_cutedsl": "flashinfer_cutedsl",
    "marlin": "marlin",
    "triton": "triton",
    "batched_triton": "batched_triton",
    "aiter": "aiter",
    "vllm_cutlass": "cutlass",
    "batched_vllm_cutlass": "cutlass",
    "flashinfer_cutedsl_batched": "flashinfer_cutedsl",  # NvFp4MoeBackend
    "batched_marlin": "marlin",  # WNA16MoEBackend (oracle/int_wna16.py)
    "cutlass": "cutlass",  # W4A8MoeBackend (oracle/w4a8.py)
    "humming": "humming",  # HummingBackend (oracle/humming.py)
    "emulation": "emulation",
    "rocm_aiter": "aiter",  # the unquantized oracle's `ROCm AITER`
}

# The `--linear-backend` value of each linear kernel class vLLM's `Selected <Class> for ...` and
# `Using <Class> for ...` lines name: `_LINEAR_BACKEND_KERNEL_MAP` in
# vllm/model_executor/kernels/linear/__init__.py (vllm-project/vllm main at 006fc89, 2026), the
# table `--linear-backend` itself filters by. A class maps through this table alone: names share
# words across backends (FlashInferFp8DeepGEMMDynamicBlockScaledKernel is flashinfer_cutlass, not
# deep_gemm), so no backend is guessed from a spelling. A class missing here (a newer vLLM, a
# CPU/ROCm kernel) has no backend, and only an expectation naming that class matches it.
VLLM_LINEAR_KERNEL_BACKENDS: dict[str, str] = {kernel: backend for backend, kernels in {
    "b12x": ("B12xFp8BlockScaledMMKernel", "B12xMxFp4LinearKernel", "B12xMxfp8LinearKernel",
             "B12xNvFp4LinearKernel", "B12xTensorFP8ScaledMMLinearKernel"),
    "cutlass": ("CutlassInt8ScaledMMLinearKernel", "CutlassFP8ScaledMMLinearKernel", "CutlassFp8BlockScaledMMKernel",
                "CutlassW4A8LinearKernel", "CutlassNvFp4LinearKernel"),
    "flashinfer_cutlass": ("FlashInferFP8ScaledMMLinearKernel", "FlashInferFp8DeepGEMMDynamicBlockScaledKernel",
                           "FlashInferCutlassMxfp8LinearKernel", "FlashInferCutlassNvFp4LinearKernel",
                           "FlashInferMxFp4LinearKernel"),
    "flashinfer_cutedsl": ("FlashInferCuteDslNvFp4LinearKernel", "FlashInferCuteDslNvFp4W4A16LinearKernel",
                           "FlashInferCutedslMxfp8LinearKernel"),
    "flashinfer_trtllm": ("FlashInferTrtllmMxfp8LinearKernel", "FlashInferTrtllmNvFp4LinearKernel"),
    "flashinfer_cudnn": ("FlashInferCudnnNvFp4LinearKernel",),
    "flashinfer_b12x": ("FlashInferB12xNvFp4LinearKernel",),
    "humming": ("HummingFP8ScaledMMLinearKernel", "HummingInt8ScaledMMLinearKernel", "HummingLinearKernel",
                "HummingMxfp8LinearKernel", "HummingMxFp4LinearKernel", "HummingMxFp6LinearKernel",
                "HummingNvFp4LinearKernel"),
    "marlin": ("MarlinFP8ScaledMMLinearKernel", "MarlinLinearKernel", "MarlinMxfp8LinearKernel",
               "MarlinNvFp4LinearKernel", "MarlinMxFp4LinearKernel"),
    "triton": ("TritonInt8ScaledMMLinearKernel", "TritonFp8BlockScaledMMKernel", "TritonW4A16LinearKernel"),
    "deep_gemm": ("DeepGemmFp8BlockScaledMMKernel", "DeepGemmMxfp8BmmLinearKernel"),
    "torch": ("PerTensorTorchFP8ScaledMMLinearKernel", "ChannelWiseTorchFP8ScaledMMLinearKernel",
              "RowWiseTorchFP8ScaledMMLinearKernel", "BlockWiseTorchFP8ScaledMMLinearKernel", "TorchNvFp4LinearKernel"),
    "aiter": ("AiterInt8ScaledMMLinearKernel", "AiterFp8BlockScaledMMKernel", "AiterPerTokenFp8ScaledMMLinearKernel",
              "AiterPreshuffledPerTokenFp8ScaledMMLinearKernel", "AiterMxfp4LinearKernel"),
    "machete": ("MacheteLinearKernel",),
    "fbgemm": ("FbgemmNvFp4LinearKernel",),
    "conch": ("ConchLinearKernel",),
    "exllama": ("ExllamaLinearKernel",),
    "emulation": ("EmulationMxfp8LinearKernel", "EmulationNvFp4LinearKernel", "EmulationMxfp6LinearKernel",
                  "EmulationMxfp4LinearKernel"),
    "xpu": ("XPUW8A8FP8LinearKernel", "XPUFp8BlockScaledMMKernel"),
    "xpu_woq": ("XPUW8A16FP8LinearKernel",),
}.items() for kernel in kernels}

# MoE backends whose vLLM experts class picks its kernel per call and says so only in DEBUG lines:
# `deep_gemm` is TritonOrDeepGemmExperts (fused_moe/experts/triton_deep_gemm_moe.py), which runs
# Triton whenever `_valid_deep_gemm` (experts/deep_gemm_moe.py) refuses a shape, logging
# `DeepGemm disabled ...` with `debug_once`. The log level that makes those lines visible.
VLLM_MOE_DEBUG_PROOF: frozenset[str] = frozenset({"deep_gemm"})
VLLM_DEBUG_ENV = ("VLLM_LOGGING_LEVEL", "DEBUG")

FLAGS: dict[Layer, str] = {"linear": "--linear-backend", "moe": "--moe-backend"}


def canonical(name: str) -> str:
    """The comparison form of a backend name: lower case, '_' for '-'."""
    return name.strip().lower().replace("-", "_")


@dataclass(frozen=True)
class UnknownName:
    """Why a name is not accepted, worded for a config author."""

    message: str


@cache
def _builtin_registry() -> tuple[dict[Layer, tuple[str, ...]], dict[Layer, tuple[str, ...]]]:
    # Deferred: quantgate.kernels imports torch (~2 s); only configs that name a backend pay it.
    from quantgate.kernels import LINEAR_BACKENDS, MOE_BACKENDS
    from quantgate.kernels.registry import ALL_LINEAR_KERNELS, ALL_MOE_KERNELS

    backends: dict[Layer, tuple[str, ...]] = {"linear": tuple(LINEAR_BACKENDS), "moe": tuple(MOE_BACKENDS)}
    kernels: dict[Layer, tuple[str, ...]] = {
        "linear": tuple(k.kernel_name() for k in ALL_LINEAR_KERNELS),
        "moe": tuple(k.kernel_name() for k in ALL_MOE_KERNELS),
    }
    return backends, kernels


def known_backends(engine: Engine, layer: Layer) -> tuple[str, ...]:
    """Accepted values of `--linear-backend` / `--moe-backend` for `engine`, `auto` first."""
    if engine == "builtin":
        return _builtin_registry()[0][layer]
    return VLLM_LINEAR_BACKENDS if layer == "linear" else VLLM_MOE_BACKENDS


def known_kernel_classes(engine: Engine, layer: Layer) -> tuple[str, ...]:
    """Kernel class names that can appear in the engine's selection report.

    Empty for vLLM: its class names change between releases, so any CamelCase linear class
    name is accepted there and checked against the server log at run time instead (its MoE
    choices are logged by backend name only).
    """
    if engine == "builtin":
        return _builtin_registry()[1][layer]
    return ()


def check_backend(engine: Engine, layer: Layer, name: str) -> UnknownName | None:
    """None when `name` is a backend `engine` accepts for `layer`, else the reason with a hint."""
    known = known_backends(engine, layer)
    wanted = canonical(name)
    if wanted in {canonical(k) for k in known}:
        return None
    return UnknownName(_unknown_message(engine, layer, name, known, what=f"{FLAGS[layer]} value"))


def check_expected_kernel(engine: Engine, layer: Layer, name: str) -> UnknownName | None:
    """None when `name` is a backend or kernel class of `engine` for `layer` (not `auto`)."""
    backends = tuple(b for b in known_backends(engine, layer) if b != "auto")
    classes = known_kernel_classes(engine, layer)
    if canonical(name) in {canonical(b) for b in backends} or name in classes:
        return None
    if engine == "vllm" and _looks_like_class_name(name):
        if layer == "linear":
            return None
        return UnknownName(f"expect.moe_kernel {name!r} can never be checked on engine vllm: vLLM logs its MoE choice "
                           f"by backend (`Using <NAME> Fp8 MoE backend`), never by class; name a --moe-backend value "
                           f"(known: {', '.join(backends)})")
    hint = " (`auto` is a request, not a kernel: name the backend that must run)" if canonical(name) == "auto" else ""
    return UnknownName(
        _unknown_message(engine, layer, name, backends + classes, what=f"{layer} backend or kernel class") + hint
    )


def vllm_linear_backend(kernel_class: str) -> str | None:
    """The vLLM `--linear-backend` a linear kernel class belongs to (VLLM_LINEAR_KERNEL_BACKENDS)."""
    return VLLM_LINEAR_KERNEL_BACKENDS.get(kernel_class)


def log_name_to_backend(name: str) -> str | None:
    """The `--moe-backend` value of a vLLM `Using <NAME> <FORMAT> MoE backend` log name."""
    return VLLM_MOE_LOG_NAMES.get(canonical(name).replace(" ", "_"))  # `FlashInfer CUTLASS` too


def _looks_like_class_name(name: str) -> bool:
    return name.isidentifier() and name[:1].isupper() and any(c.islower() for c in name)


def _unknown_message(engine: Engine, layer: Layer, name: str, known: tuple[str, ...], what: str) -> str:
    by_canon = {canonical(k): k for k in known}
    close = difflib.get_close_matches(canonical(name), list(by_canon), n=1, cutoff=0.6)
    hint = f"; did you mean {by_canon[close[0]]!r}?" if close else ""
    message = f"unknown {what} {name!r} for engine {engine}{hint} (known: {', '.join(known)})"
    other: Engine = "vllm" if engine == "builtin" else "builtin"
    if canonical(name) != "auto" and canonical(name) in {canonical(k) for k in known_backends(other, layer)}:
        message += f". {name!r} is a backend of engine {other}: set `engine: {other}` or pass --engine {other}"
    return message
