"""The emulation backend: the reference every fast backend is compared with."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import LinearLayerConfig, Scheme
from quantgate.kernels.linear.emulation import EmulationLinearKernel
from quantgate.kernels.schemes import SCALE_NAMES

from .linear_cases import SCHEMES, make_case, reference_w8a8, rel_error


# Block cases: square blocks, and (64, 128) blocks, whose activation groups are the block's K
# side (128), not its N side: a 64-wide grouping rounds the activations differently (~1e-2).
CASES = [(Scheme.FP8_BLOCK, (128, 128)), (Scheme.FP8_BLOCK, (64, 128)),
         *((scheme, None) for scheme in SCHEMES if scheme is not Scheme.FP8_BLOCK)]


def _case_id(value) -> str:
    return value.value if isinstance(value, Scheme) else "x".join(map(str, value)) if value else "-"


@pytest.mark.parametrize("scheme, block", CASES, ids=_case_id)
@pytest.mark.parametrize("scale_name", SCALE_NAMES)
def test_matches_float64_reference(seed, scheme, block, scale_name):
    """Against float64 on fresh inputs; the (64, 128) blocks guard against activation groups taken
    from the block's N side (block_size[0]) instead of its K side."""
    case = make_case(200, 300, scheme, scale_name=scale_name, block=block or (128, 128), bias=True,
                     static_input_scale=scheme is Scheme.FP8_TENSOR)
    kernel = EmulationLinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(3, 5, 300).half()
    out = kernel.apply(case.layer, x, case.layer.bias)
    assert out.shape == (3, 5, 200) and out.dtype == torch.float16
    assert rel_error(out, reference_w8a8(case, x)) < 1e-3
    # Results go back under the name the checkpoint used, and only there.
    other = next(n for n in SCALE_NAMES if n != scale_name)
    assert hasattr(case.layer, scale_name) and not hasattr(case.layer, other)


def test_the_static_input_scale_follows_the_config_not_the_layer(seed):
    """As the torch backend: a declared static scale must be there; an undeclared one is unused."""
    dynamic = make_case(72, 200, Scheme.FP8_TENSOR)
    dynamic.layer.register_buffer("input_scale", torch.tensor(1e-3))  # a stray buffer, not in the config
    kernel = EmulationLinearKernel(dynamic.config)
    kernel.process_weights_after_loading(dynamic.layer)
    x = torch.randn(3, 200).half()
    assert rel_error(kernel.apply(dynamic.layer, x), reference_w8a8(dynamic, x)) < 1e-3
    static = make_case(72, 200, Scheme.FP8_TENSOR, static_input_scale=True)
    del static.layer.input_scale
    with pytest.raises(ValueError, match="declares a static activation scale"):
        EmulationLinearKernel(static.config).process_weights_after_loading(static.layer)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
def test_an_empty_batch_gives_an_empty_output(scheme):
    case = make_case(72, 200, scheme)
    kernel = EmulationLinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    assert kernel.apply(case.layer, torch.empty(2, 0, 200).half()).shape == (2, 0, 72)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
def test_bf16_single_row(seed, scheme):
    case = make_case(130, 256, scheme, act_dtype=torch.bfloat16)
    kernel = EmulationLinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(1, 256).bfloat16()
    assert rel_error(kernel.apply(case.layer, x), reference_w8a8(case, x), round_ref=True) < 1e-3


def test_an_unquantized_layer_is_a_float32_matmul(seed):
    """`--linear-backend emulation` on a bf16 checkpoint: the weight kept in float32, as FP8 ones."""
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(72, 200).bfloat16(), requires_grad=False)
    weight = layer.weight.detach().double()
    kernel = EmulationLinearKernel(LinearLayerConfig(200, 72, Scheme.UNQUANTIZED, act_dtype=torch.bfloat16))
    kernel.process_weights_after_loading(layer)
    x = torch.randn(3, 200).bfloat16()
    assert rel_error(kernel.apply(layer, x), x.double() @ weight.t(), round_ref=True) < 1e-3
