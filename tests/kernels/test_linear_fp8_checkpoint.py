"""The checkpoint tensors every FP8 linear backend starts from: read in the forms the kernels
compute with, or refused with the layer attribute, what it must be and what it is."""

from __future__ import annotations

import re

import pytest
import torch

from quantgate.kernels import Scheme
from quantgate.kernels.linear.fp8_checkpoint import fp8_weight, static_input_scale, weight_scale

from .linear_cases import make_case

B, C, T = Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR


def _case(scheme: Scheme):
    # 200 x 300: block scales [2, 3], a partial block on each side
    return make_case(200, 300, scheme, scale_name="weight_scale_inv" if scheme is B else "weight_scale",
                     static_input_scale=scheme is T)


@pytest.mark.parametrize("scheme, stored, shape", [
    (B, lambda s: s.t().contiguous().t(), (2, 3)),  # the right shape in a transposed layout
    (C, lambda s: s.reshape(-1).bfloat16(), (200,)),  # [N] as some exports save it, in bf16
    (T, lambda s: s.reshape(1).half(), ()),  # compressed-tensors saves [1]
], ids=lambda v: getattr(v, "value", None))
def test_scales_are_read_as_contiguous_float32_in_the_kernels_shapes(seed, scheme, stored, shape):
    """Whatever float dtype and layout the layer holds a scale in, its values come back as float32
    block [ceil(N/bn), ceil(K/bk)], channel [N] or tensor 0-d; a static input scale as 0-d float32."""
    case = _case(scheme)
    name = case.config.scale_name
    setattr(case.layer, name, stored(getattr(case.layer, name)))
    scale = weight_scale(case.layer, case.config)
    assert (tuple(scale.shape), scale.dtype, scale.is_contiguous()) == (shape, torch.float32, True)
    assert torch.equal(scale.double(), getattr(case.layer, name).double().reshape(shape))
    if scheme is T:
        case.layer.input_scale = torch.tensor([0.02], dtype=torch.bfloat16)
        input_scale = static_input_scale(case.layer, case.config)
        assert (tuple(input_scale.shape), input_scale.dtype) == ((), torch.float32)
        assert input_scale.item() == torch.tensor(0.02, dtype=torch.bfloat16).item()


def test_the_scale_is_read_under_the_configs_name_only():
    # A layer may hold both names (a checkpoint exporting either); the config's name is the scale.
    case = _case(B)
    case.layer.weight_scale = torch.ones(7)
    assert torch.equal(weight_scale(case.layer, case.config), case.layer.weight_scale_inv.float())


def _set(attr: str, value):
    def edit(layer: torch.nn.Module) -> None:
        stored = value(getattr(layer, attr))
        setattr(layer, attr, torch.nn.Parameter(stored, requires_grad=False) if attr == "weight" else stored)
    return edit


def _remove(attr: str):
    return lambda layer: delattr(layer, attr)


@pytest.mark.parametrize("scheme, edit, message", [
    pytest.param(C, _set("weight", lambda w: w[:64].contiguous()),
                 "Module.weight must be the checkpoint's torch.float8_e4m3fn tensor of shape [200, 300], got "
                 "torch.float8_e4m3fn [64, 300]; if this layer was processed already, load the checkpoint tensors "
                 "again before processing it again", id="weight rows"),
    pytest.param(B, _remove("weight_scale_inv"),
                 "Module has no `weight_scale_inv`: an fp8-block checkpoint stores its weight scale there (native "
                 "FP8: weight_scale_inv, compressed-tensors: weight_scale)", id="no scale"),
    pytest.param(B, _set("weight_scale_inv", lambda s: s.t().contiguous()),
                 "Module.weight_scale_inv: block [128, 128] scales of a [200, 300] weight have shape [2, 3], got "
                 "[3, 2]", id="block transposed"),
    pytest.param(C, _set("weight_scale", lambda s: s[:199]),
                 "Module.weight_scale: per-channel scales need 200 values ([N, 1]), got shape [199, 1]",
                 id="channel short"),
    pytest.param(T, _set("weight_scale", lambda s: s.reshape(1).repeat(2)),
                 "Module.weight_scale: a per-tensor scale is one value, got shape [2]", id="tensor two values"),
    pytest.param(T, _set("input_scale", lambda s: s.reshape(1).repeat(2)),
                 "Module.input_scale: the checkpoint declares a static activation scale, expected one value, got [2]",
                 id="input two values"),
])
def test_a_checkpoint_tensor_unlike_the_config_is_refused_naming_it(scheme, edit, message):
    """Refused here with the attribute named, not deep inside a GEMM or as a bare reshape error."""
    case = _case(scheme)
    edit(case.layer)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        for read in (fp8_weight, weight_scale, static_input_scale):
            read(case.layer, case.config)
