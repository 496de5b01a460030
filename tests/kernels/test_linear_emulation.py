"""The emulation backend: the reference every fast backend is compared with."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import Scheme
from quantgate.kernels.linear.emulation import EmulationLinearKernel
from quantgate.kernels.schemes import SCALE_NAMES

from .linear_cases import SCHEMES, make_case, reference_w8a8, rel_error


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
@pytest.mark.parametrize("scale_name", SCALE_NAMES)
def test_matches_float64_reference(seed, scheme, scale_name):
    case = make_case(200, 300, scheme, scale_name=scale_name, bias=True, static_input_scale=scheme is Scheme.FP8_TENSOR)
    kernel = EmulationLinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(3, 5, 300).half()
    out = kernel.apply(case.layer, x, case.layer.bias)
    assert out.shape == (3, 5, 200) and out.dtype == torch.float16
    assert rel_error(out, reference_w8a8(case, x)) < 1e-3
    # Results go back under the name the checkpoint used, and only there.
    other = next(n for n in SCALE_NAMES if n != scale_name)
    assert hasattr(case.layer, scale_name) and not hasattr(case.layer, other)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.value)
def test_bf16_single_row(seed, scheme):
    case = make_case(130, 256, scheme, act_dtype=torch.bfloat16)
    kernel = EmulationLinearKernel(case.config)
    kernel.process_weights_after_loading(case.layer)
    x = torch.randn(1, 256).bfloat16()
    assert rel_error(kernel.apply(case.layer, x), reference_w8a8(case, x), round_ref=True) < 1e-3
