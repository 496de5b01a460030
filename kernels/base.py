"""The kernel contract (SPEC section 7).

A kernel class answers two questions before it is chosen, `is_supported(platform)` and
`can_implement(config)`, each `(ok, reason)`, so a refusal can always be explained. One
instance serves one layer: `process_weights_after_loading(layer)` turns checkpoint tensors
into the kernel's layout, `apply(layer, ...)` runs it.

Re-running `process_weights_after_loading` after a weight reload must keep the storage of
every processed tensor (captured CUDA graphs read those addresses). `bind_processed` does
that for all kernels: the first call binds, later calls copy into the bound storage and
raise on an incompatible shape, dtype or device instead of reallocating.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from .platform import Platform
from .schemes import LinearLayerConfig, MoELayerConfig, Scheme

Verdict = tuple[bool, str | None]
OK: Verdict = (True, None)

_PROCESSED = "_quantgate_processed"


class IncompatibleBufferError(RuntimeError):
    """A reload produced a tensor that cannot be copied into the storage bound before."""


def bind_processed(layer: torch.nn.Module, name: str, value: torch.Tensor) -> torch.Tensor:
    """Set `layer.<name>` to the processed `value`, keeping storage bound by an earlier run."""
    bound: dict[str, torch.Tensor] = layer.__dict__.setdefault(_PROCESSED, {})
    old = bound.get(name)
    if old is None:
        value = value.detach()
        bound[name] = value
    else:
        if old.shape != value.shape or old.dtype != value.dtype or old.device != value.device:
            raise IncompatibleBufferError(
                f"reload of {type(layer).__name__}.{name}: new tensor {tuple(value.shape)} {value.dtype} "
                f"on {value.device} does not fit the bound buffer {tuple(old.shape)} {old.dtype} on {old.device}; "
                "a reload must keep the checkpoint's shapes and dtypes (restart the server for a new model)"
            )
        old.copy_(value)
        value = old
    _set_tensor(layer, name, value)
    return value


def _set_tensor(layer: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    if name in layer._parameters:
        del layer._parameters[name]
    if name in layer._buffers:
        layer._buffers[name] = value
    else:
        layer.__dict__.pop(name, None)
        layer.register_buffer(name, value, persistent=False)


def processed_names(layer: torch.nn.Module) -> list[str]:
    return list(layer.__dict__.get(_PROCESSED, {}))


class _Kernel(ABC):
    backend: ClassVar[str]
    schemes: ClassVar[frozenset[Scheme]]
    # Whether `apply` can be captured in a CUDA graph: no host synchronization, no copies from
    # the host. The engine decodes eagerly when a selected kernel cannot be.
    cuda_graphs: ClassVar[bool] = True

    @classmethod
    def kernel_name(cls) -> str:
        return cls.__name__

    @classmethod
    @abstractmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        """Can this kernel run at all on `platform` (device, capability, libraries)?"""

    @classmethod
    def _scheme_verdict(cls, scheme: Scheme) -> Verdict:
        if scheme in cls.schemes:
            return OK
        names = ", ".join(sorted(s.value for s in cls.schemes))
        return False, f"scheme {scheme.value} not handled (handles: {names})"


class LinearKernel(_Kernel):
    def __init__(self, config: LinearLayerConfig) -> None:
        self.config = config

    @classmethod
    @abstractmethod
    def can_implement(cls, config: LinearLayerConfig) -> Verdict:
        """Can this kernel serve a layer with these shapes, scheme and dtypes?"""

    @abstractmethod
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Checkpoint tensors on `layer` -> kernel layout, bound with `bind_processed`."""

    @abstractmethod
    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] in config.act_dtype -> [..., N] in config.act_dtype."""


class MoEKernel(_Kernel):
    """Stacked experts on the layer: `w13_weight` [E, 2I, H] (gate rows then up rows),
    `w2_weight` [E, H, I], scales `w13_<scale_name>` / `w2_<scale_name>` (block: [E, ceil(2I/bn),
    ceil(H/bk)] / [E, ceil(H/bn), ceil(I/bk)]; channel: [E, 2I, 1] / [E, H, 1]; tensor: [E, 2]
    (gate, up) / [E]), optional `w13_input_scale` / `w2_input_scale` [E]."""

    def __init__(self, config: MoELayerConfig) -> None:
        self.config = config

    @classmethod
    @abstractmethod
    def can_implement(cls, config: MoELayerConfig) -> Verdict:
        """Can this kernel serve a MoE layer with these sizes, scheme and dtypes?"""

    @abstractmethod
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Stacked checkpoint tensors on `layer` -> kernel layout, bound with `bind_processed`."""

    @abstractmethod
    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """x [T, H], routing from `routing.select_experts` -> [T, H] in config.act_dtype."""
