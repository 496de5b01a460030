"""PLACEHOLDER: replaced by the MoE kernel work (issue 4)."""

from __future__ import annotations

from ..base import MoEKernel, Verdict
from ..platform import Platform
from ..schemes import MoELayerConfig, Scheme


class EmulationMoEKernel(MoEKernel):
    backend = "emulation"
    schemes = frozenset(Scheme)

    @classmethod
    def is_supported(cls, platform: Platform) -> Verdict:
        return False, "not built yet"

    @classmethod
    def can_implement(cls, config: MoELayerConfig) -> Verdict:
        return cls._scheme_verdict(config.scheme)

    def process_weights_after_loading(self, layer):
        raise NotImplementedError

    def apply(self, layer, x, topk_weights, topk_ids):
        raise NotImplementedError
