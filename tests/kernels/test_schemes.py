"""Schemes as users name them, and the layer configs' checks and defaults."""

from __future__ import annotations

import re

import pytest

from quantgate.kernels import LinearLayerConfig, MoELayerConfig, Scheme


@pytest.mark.parametrize("written", ["fp8-block", "FP8_BLOCK", "Fp8_Block"])
def test_a_scheme_parses_in_any_case_with_underscores_or_dashes(written):
    """`quantgate quantize --scheme` and `quantgate kernels --scheme` take what the user typed."""
    assert Scheme.parse(written) is Scheme.FP8_BLOCK


def test_an_unknown_scheme_lists_the_known_ones():
    with pytest.raises(ValueError, match=re.escape(
            "unknown scheme 'fp8'; known schemes: unquantized, fp8-block, fp8-channel, fp8-tensor")):
        Scheme.parse("fp8")


@pytest.mark.parametrize("config_class, sizes", [(LinearLayerConfig, (256, 128)), (MoELayerConfig, (4, 2, 128, 128))],
                         ids=["linear", "moe"])
def test_a_scale_name_no_format_writes_is_refused(config_class, sizes):
    """A kernel would read a scale no checkpoint has: the historic `weight_scale` /
    `weight_scale_inv` mix-up must fail where the config is made."""
    with pytest.raises(ValueError, match=r"^scale_name must be one of \(.*'weight_scale_inv'.*\), got 'weight_scale_in'$"):
        config_class(*sizes, Scheme.FP8_BLOCK, scale_name="weight_scale_in")


@pytest.mark.parametrize("config_class, sizes", [(LinearLayerConfig, (256, 128)), (MoELayerConfig, (4, 2, 128, 128))],
                         ids=["linear", "moe"])
def test_a_config_without_a_scale_name_reads_weight_scale_in_128_blocks(config_class, sizes):
    """The defaults the benchmarks and `quantgate kernels` build layers with: compressed-tensors'
    scale name, and DeepSeek-style 128x128 blocks for block FP8 only."""
    block = config_class(*sizes, Scheme.FP8_BLOCK)
    assert (block.scale_name, block.block_size) == ("weight_scale", (128, 128))
    assert config_class(*sizes, Scheme.FP8_CHANNEL).block_size is None


def test_a_config_without_a_dtype_computes_in_bfloat16():
    """The benchmarks build layers without a dtype: what they select for is a bf16 checkpoint's
    choice (row-wise _scaled_mm serves bf16 and not fp16, so the default decides the kernel)."""
    import torch

    assert LinearLayerConfig(256, 128, Scheme.FP8_CHANNEL).act_dtype is torch.bfloat16
    moe = MoELayerConfig(4, 2, 128, 128, Scheme.FP8_CHANNEL)
    assert (moe.act_dtype, moe.renormalize, moe.activation) == (torch.bfloat16, True, "silu")  # Qwen3-MoE's
