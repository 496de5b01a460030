"""PLACEHOLDER: replaced by the kernel work (issue 3)."""

from __future__ import annotations

from ..base import LinearKernel, Verdict
from ..platform import Platform
from ..schemes import LinearLayerConfig, Scheme


class TorchScaledMMLinearKernel(LinearKernel):
    backend = "torch"
    schemes = frozenset({Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR})

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        return False, "not built yet"

    @classmethod
    def can_implement(cls, config: LinearLayerConfig) -> Verdict:
        return cls._scheme_verdict(config.scheme)

    def process_weights_after_loading(self, layer):
        raise NotImplementedError

    def apply(self, layer, x, bias=None):
        raise NotImplementedError
