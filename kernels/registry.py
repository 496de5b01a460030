"""Kernel selection: a function of (platform, layer config, requested backend) and of the
kernels QUANTGATE_DISABLED_KERNELS disables (read from the environment unless `disabled` is given).

The priority lists below are data. `auto` takes the first kernel of the platform's row that
passes `is_supported` and `can_implement`; the candidates it reports are that row, in order,
then every other kernel that declares the layer's scheme, each with the reason it cannot serve
(or, when it could, that auto does not pick it on this platform). An explicit backend is
strict: if none of its kernels can serve the layer, selection raises with every candidate's
reason. Never a silent fallback.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Union

from .base import LinearKernel, MoEKernel
from .linear.emulation import EmulationLinearKernel
from .linear.marlin import MarlinFp8LinearKernel
from .linear.torch_scaled_mm import TorchBlockScaledMMLinearKernel, TorchScaledMMLinearKernel
from .linear.triton_block import TritonBlockFp8LinearKernel
from .linear.unquantized import UnquantizedLinearKernel
from .moe.emulation import EmulationMoEKernel
from .moe.marlin import MarlinMoEKernel
from .moe.triton import TritonFusedMoEKernel, TritonUnquantizedMoEKernel
from .platform import Platform
from .schemes import LinearLayerConfig, MoELayerConfig, Scheme

KernelClass = Union[type[LinearKernel], type[MoEKernel]]
DISABLED_ENV = "QUANTGATE_DISABLED_KERNELS"  # debugging only: comma-separated class names

B, C, T, U = Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR, Scheme.UNQUANTIZED
_lin_emul, _lin_torch, _lin_torch_block, _lin_triton, _lin_marlin, _lin_dense = (
    EmulationLinearKernel,
    TorchScaledMMLinearKernel,
    TorchBlockScaledMMLinearKernel,
    TritonBlockFp8LinearKernel,
    MarlinFp8LinearKernel,
    UnquantizedLinearKernel,
)

# (device, minimum capability) -> scheme -> kernels, fastest first. The first row whose
# device matches and whose capability the platform reaches applies. Rule for the CUDA rows: the
# order of the geometric mean of graph times (no host overhead) over bench_linear.py's M set
# {1, 16, 512, 2048, 8192} and its three Llama-sized (K, N), which bench_linear prints as
# "fastest <scheme>" and checks against this table ("auto on 9.0 ..."). 9.0, H200 run 18
# (benchmarks/results/h200-2026-11-30-run18), in us: block torch 67.3 < triton 72.5 < marlin
# 141.6; channel torch 73.4 < triton 80.8 < marlin 130.6; tensor torch 58.2 < marlin 130.6.
# Marlin is last though fastest at M = 1 (8.7 us against torch's 15.8 at 4096 x 4096): a layer
# has one kernel for every batch size, so batch-1 decode on Hopper is faster with an explicit
# --linear-backend marlin. 8.9: the same order without the Hopper-only block
# class. Every FP8 scheme ends in emulation, which runs anywhere. On 8.0 (no FP8 tensor cores)
# marlin serves every scheme. A row lists only what auto may pick; the kernels it leaves out are
# still judged and reported after it, never picked.
LINEAR_PRIORITY: list[tuple[str, tuple[int, int], dict[Scheme, list[type[LinearKernel]]]]] = [
    ("cuda", (9, 0), {
        B: [_lin_torch_block, _lin_triton, _lin_marlin, _lin_emul],
        C: [_lin_torch, _lin_triton, _lin_marlin, _lin_emul],
        T: [_lin_torch, _lin_marlin, _lin_emul],
        U: [_lin_dense, _lin_emul],
    }),
    ("cuda", (8, 9), {
        B: [_lin_triton, _lin_marlin, _lin_emul],
        C: [_lin_torch, _lin_triton, _lin_marlin, _lin_emul],
        T: [_lin_torch, _lin_marlin, _lin_emul],
        U: [_lin_dense, _lin_emul],
    }),
    ("cuda", (0, 0), {
        B: [_lin_marlin, _lin_emul],
        C: [_lin_marlin, _lin_emul],
        T: [_lin_marlin, _lin_emul],
        U: [_lin_dense, _lin_emul],
    }),
    # On CPU _scaled_mm is slower than emulation's dequantized float32 matmul (ANCHORS.md).
    ("cpu", (0, 0), {
        B: [_lin_emul],
        C: [_lin_emul, _lin_torch],
        T: [_lin_emul, _lin_torch],
        U: [_lin_dense, _lin_emul],
    }),
]

_moe_emul, _moe_triton, _moe_triton_dense, _moe_marlin = (
    EmulationMoEKernel,
    TritonFusedMoEKernel,
    TritonUnquantizedMoEKernel,
    MarlinMoEKernel,
)
# These rows also list kernels that cannot run on the row's platform (W8A8 triton needs FP8
# tensor cores, 8.9+; marlin, W8A16, serves every FP8 scheme from 8.0, below which, and on CPU,
# only emulation runs), so their is_supported refusal is all auto ever sees of them. `_select`
# would report them after the row anyway; they stay so that the order in which `quantgate
# kernels` and strict --moe-backend errors name the candidates is unchanged.
# H200 (results/h200-2026-11-29-run1, Qwen3-30B-A3B layer, ms in CUDA graphs): marlin leads only
# at 1 token (0.034 vs 0.037); triton from 16 tokens (0.123 vs 0.133) and by 3.5x at 2048. The
# choice is per scheme and the two backends differ in numerics (W8A8 vs W8A16), so triton stays first.
MOE_PRIORITY: list[tuple[str, tuple[int, int], dict[Scheme, list[type[MoEKernel]]]]] = [
    ("cuda", (8, 9), {
        B: [_moe_triton, _moe_marlin, _moe_emul],
        C: [_moe_triton, _moe_marlin, _moe_emul],
        T: [_moe_triton, _moe_marlin, _moe_emul],
        U: [_moe_triton_dense, _moe_emul],
    }),
    ("cuda", (0, 0), {
        B: [_moe_marlin, _moe_triton, _moe_emul],
        C: [_moe_marlin, _moe_triton, _moe_emul],
        T: [_moe_marlin, _moe_triton, _moe_emul],
        U: [_moe_triton_dense, _moe_emul],
    }),
    ("cpu", (0, 0), {
        B: [_moe_emul, _moe_triton, _moe_marlin],
        C: [_moe_emul, _moe_triton, _moe_marlin],
        T: [_moe_emul, _moe_triton, _moe_marlin],
        U: [_moe_emul, _moe_triton_dense],
    }),
]

ALL_LINEAR_KERNELS: list[type[LinearKernel]] = [
    _lin_emul, _lin_dense, _lin_torch, _lin_torch_block, _lin_triton, _lin_marlin,
]
ALL_MOE_KERNELS: list[type[MoEKernel]] = [_moe_emul, _moe_triton, _moe_triton_dense, _moe_marlin]

LINEAR_BACKENDS = ("auto",) + tuple(dict.fromkeys(k.backend for k in ALL_LINEAR_KERNELS))
MOE_BACKENDS = ("auto",) + tuple(dict.fromkeys(k.backend for k in ALL_MOE_KERNELS))


class UnknownBackendError(ValueError):
    pass


def normalize_backend(name: str, known: tuple[str, ...], flag: str) -> str:
    """'-' and '_' are equivalent and case is ignored; unknown names get a did-you-mean."""
    canon = name.strip().lower().replace("_", "-")
    if canon in known:
        return canon
    close = difflib.get_close_matches(canon, known, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownBackendError(f"unknown {flag} {name!r}{hint} (known: {', '.join(known)})")


@dataclass(frozen=True)
class Candidate:
    kernel: str
    backend: str
    supported: bool
    reason: str | None

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "backend": self.backend, "supported": self.supported, "reason": self.reason}


@dataclass(frozen=True)
class Selection:
    layer: str  # "linear" | "moe"
    scheme: Scheme
    requested: str
    kernel: KernelClass | None
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)
    error: str | None = None

    def require(self, module_name: str | None = None) -> KernelClass:
        """The selected kernel class, or KernelSelectionError naming every candidate's reason."""
        if self.kernel is None:
            raise KernelSelectionError(self, module_name)
        return self.kernel

    @property
    def rejected(self) -> list[Candidate]:
        return [c for c in self.candidates if not c.supported]

    def to_dict(self) -> dict:
        selected = None if self.kernel is None else {"kernel": self.kernel.kernel_name(), "backend": self.kernel.backend}
        return {
            "layer": self.layer,
            "scheme": self.scheme.value,
            "requested": self.requested,
            "selected": selected,
            "candidates": [c.to_dict() for c in self.candidates],
            "error": self.error,
        }


class KernelSelectionError(RuntimeError):
    def __init__(self, selection: Selection, layer_name: str | None = None) -> None:
        self.selection = selection
        # The module first: the error ends with its fix, which must stay the last words.
        super().__init__(f"{layer_name}: {selection.error}" if layer_name else str(selection.error))


def disabled_kernels() -> frozenset[str]:
    """The kernel classes QUANTGATE_DISABLED_KERNELS names; a name that is no kernel class is an
    error (a typo would otherwise leave the kernel enabled and the debugging run testing it)."""
    names = frozenset(n.strip() for n in os.environ.get(DISABLED_ENV, "").split(",") if n.strip())
    known = {k.kernel_name() for k in (*ALL_LINEAR_KERNELS, *ALL_MOE_KERNELS)}
    for name in sorted(names - known):
        by_lower = {k.lower(): k for k in known}
        close = difflib.get_close_matches(name.lower(), by_lower, n=1, cutoff=0.6)
        hint = f"; did you mean {by_lower[close[0]]!r}?" if close else ""
        raise UnknownBackendError(f"{DISABLED_ENV} names {name!r}, which is no kernel class{hint} (known: "
                                  f"{', '.join(sorted(known))}; separate names with commas)")
    return names


def _priority(table: list, platform: Platform, scheme: Scheme) -> list:
    for device, minimum, by_scheme in table:
        if device == platform.device and (platform.capability or (0, 0)) >= minimum:
            return list(by_scheme.get(scheme, []))
    return []


def _judge(kernel: KernelClass, platform: Platform, config, disabled: frozenset[str]) -> Candidate:
    name = kernel.kernel_name()
    if name in disabled:
        return Candidate(name, kernel.backend, False, f"disabled by {DISABLED_ENV}")
    for ok, reason in (kernel.is_supported(platform), kernel.can_implement(config)):
        if not ok:
            return Candidate(name, kernel.backend, False, reason)
    return Candidate(name, kernel.backend, True, None)


def _judge_unlisted(kernel: KernelClass, platform: Platform, config, disabled: frozenset[str], where: str,
                    flag: str) -> Candidate:
    """A kernel `auto` does not consider here: its own refusal if it has one, else why auto passes it over."""
    candidate = _judge(kernel, platform, config, disabled)
    if not candidate.supported:
        return candidate
    return Candidate(candidate.kernel, candidate.backend, False,
                     f"could run here, but auto picks only from the priority list for {where} (kernels/registry.py, "
                     f"in benchmark order), which leaves it out as slower or unmeasured on this platform; "
                     f"request it with {flag} {kernel.backend}")


def _select(layer: str, table: list, every: list, platform: Platform, config, requested: str, known, flag,
            disabled: frozenset[str] | None) -> Selection:
    requested = normalize_backend(requested, known, flag)
    disabled = disabled_kernels() if disabled is None else disabled
    where = platform.device + (f" {platform.capability_str}" if platform.capability else "")
    ordered = _priority(table, platform, config.scheme)
    if requested != "auto":
        # Strict: every kernel of the backend is a candidate, priority order first.
        ordered = [k for k in ordered + [k for k in every if k not in ordered] if k.backend == requested]
    candidates = tuple(_judge(k, platform, config, disabled) for k in ordered)
    chosen = next((k for k, c in zip(ordered, candidates) if c.supported), None)
    if requested == "auto":
        # Shown, never chosen: the other kernels that declare the scheme, each with the reason it
        # cannot serve here (or, if it could, that auto only picks from the priority list).
        unlisted = [k for k in every if k not in ordered and config.scheme in k.schemes]
        candidates += tuple(_judge_unlisted(k, platform, config, disabled, where, flag) for k in unlisted)
    error = None
    if chosen is None:
        reasons = "; ".join(f"{c.kernel}: {c.reason}" for c in candidates) or "no kernel is registered for it"
        error = (f"no {layer} kernel for scheme {config.scheme.value} on {where} with {flag} {requested}: {reasons}")
        if requested != "auto":
            error += f". Choose another {flag} (see `quantgate kernels`) or 'auto'"
    return Selection(layer, config.scheme, requested, chosen, candidates, error)


def select_linear_kernel(platform: Platform, config: LinearLayerConfig, requested: str = "auto",
                         disabled: frozenset[str] | None = None) -> Selection:
    return _select("linear", LINEAR_PRIORITY, ALL_LINEAR_KERNELS, platform, config, requested,
                   LINEAR_BACKENDS, "--linear-backend", disabled)


def select_moe_kernel(platform: Platform, config: MoELayerConfig, requested: str = "auto",
                      disabled: frozenset[str] | None = None) -> Selection:
    return _select("moe", MOE_PRIORITY, ALL_MOE_KERNELS, platform, config, requested,
                   MOE_BACKENDS, "--moe-backend", disabled)
