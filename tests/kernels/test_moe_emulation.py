"""The emulation MoE backend: numerics against the float64 reference (on CPU, and on CUDA where
torch's own arithmetic must give the same FP8 roundings), reloads, bad layers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantgate.kernels import IncompatibleBufferError
from quantgate.kernels.moe import experts
from quantgate.kernels.moe.emulation import EmulationMoEKernel
from quantgate.kernels.schemes import Scheme

from quantgate.kernels.moe.reference import mean_relative_error, reference_moe

from .test_moe_reference import (BF16_TOLERANCE, QWEN3_30B_A3B, TOLERANCE, moe_config, moe_layer, plain_inputs,
                                 raw_tensors, tie_free_inputs, tied_activations)

# fp8-block needs I to be a multiple of 128 (experts.layout_verdict); the others take any size.
CASES = [
    pytest.param(Scheme.FP8_BLOCK, "weight_scale_inv", 192, 128, id="block-native"),
    pytest.param(Scheme.FP8_BLOCK, "weight_scale", 200, 256, id="block-ct"),
    pytest.param(Scheme.FP8_CHANNEL, "weight_scale", 200, 72, id="channel"),
    pytest.param(Scheme.FP8_TENSOR, "weight_scale", 200, 72, id="tensor"),
    pytest.param(Scheme.UNQUANTIZED, "weight_scale", 200, 72, id="unquantized"),
]


@pytest.mark.parametrize("scheme,scale_name,hidden,inter", CASES)
@pytest.mark.parametrize("num_tokens", [1, 37])
def test_matches_float64_reference(scheme, scale_name, hidden, inter, num_tokens, seed) -> None:
    cfg = moe_config(scheme, hidden=hidden, inter=inter, scale_name=scale_name)
    layer = moe_layer(cfg)
    raw = raw_tensors(layer)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    x, weights, ids = tie_free_inputs(raw, cfg, num_tokens, skip_experts=(0, 5))
    out = kernel.apply(layer, x, weights, ids)
    assert out.shape == (num_tokens, hidden) and out.dtype == x.dtype
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids)) < TOLERANCE


@pytest.mark.parametrize("scheme,scale_name,hidden,inter", CASES)
def test_an_empty_batch_gives_an_empty_output(scheme, scale_name, hidden, inter) -> None:
    cfg = moe_config(scheme, hidden=hidden, inter=inter, scale_name=scale_name)
    layer = moe_layer(cfg)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    x = torch.empty(0, hidden, dtype=cfg.act_dtype)
    ids = torch.empty(0, cfg.top_k, dtype=torch.int64)
    assert kernel.apply(layer, x, torch.empty(0, cfg.top_k), ids).shape == (0, hidden)


def test_static_input_scales_use_the_largest_expert_scale(seed) -> None:
    cfg = moe_config(Scheme.FP8_TENSOR, hidden=200, inter=72, static_input_scale=True)
    layer = moe_layer(cfg)
    raw = raw_tensors(layer)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    assert layer.w13_input_scale.shape == () and float(layer.w13_input_scale) == float(raw["w13_input_scale"].max())
    x, weights, ids = tie_free_inputs(raw, cfg, 9)
    out = kernel.apply(layer, x, weights, ids)
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids)) < TOLERANCE


def test_non_square_blocks_match_the_reference(seed) -> None:
    # 64x128 blocks: the stacking rule takes the block height (64), and the scale blocks run
    # 64 rows by 128 columns, with a partial last column block (hidden 200).
    cfg = dataclasses.replace(moe_config(Scheme.FP8_BLOCK, hidden=200, inter=64), block_size=(64, 128))
    assert EmulationMoEKernel.can_implement(cfg) == (True, None)
    layer = moe_layer(cfg)
    raw = raw_tensors(layer)
    assert tuple(raw["w13_weight_scale"].shape) == (8, 2, 2)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    x, weights, ids = tie_free_inputs(raw, cfg, 7)
    out = kernel.apply(layer, x, weights, ids)
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids)) < TOLERANCE


def test_missing_static_input_scales_are_refused() -> None:
    cfg = moe_config(Scheme.FP8_TENSOR, hidden=64, inter=32, static_input_scale=True)
    layer = moe_layer(dataclasses.replace(cfg, static_input_scale=False))
    with pytest.raises(ValueError, match="static input scales but the layer has no w13_input_scale"):
        EmulationMoEKernel(cfg).process_weights_after_loading(layer)


def test_bf16_activations(seed) -> None:
    cfg = moe_config(Scheme.FP8_BLOCK, act_dtype=torch.bfloat16)
    layer = moe_layer(cfg)
    raw = raw_tensors(layer)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    x, weights, ids = tie_free_inputs(raw, cfg, 16)
    out = kernel.apply(layer, x, weights, ids)
    assert out.dtype == torch.bfloat16
    # Only the final rounding to bf16 differs from the reference (about 2^-9 relative).
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids)) < 3e-3


def test_every_token_on_one_expert_and_tied_weights(seed) -> None:
    cfg = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=32)
    layer = moe_layer(cfg)
    raw = raw_tensors(layer)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    x = torch.randn(6, 64)
    ids = torch.tensor([[3, 1]] * 6, dtype=torch.int32)
    weights = torch.full((6, 2), 0.5)
    out = kernel.apply(layer, x, weights, ids)
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids)) < TOLERANCE


def test_reload_keeps_storage_and_uses_new_weights(seed) -> None:
    cfg = moe_config(Scheme.FP8_BLOCK, scale_name="weight_scale_inv")
    layer = moe_layer(cfg)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    names = ["w13_weight", "w2_weight", "w13_weight_scale_inv", "w2_weight_scale_inv"]
    pointers = {n: getattr(layer, n).data_ptr() for n in names}

    fresh = moe_layer(cfg)
    raw = raw_tensors(fresh)
    for name, tensor in raw.items():  # what the engine loader does on /v1/reload_weights
        layer.register_buffer(name, tensor.clone(), persistent=False)
    kernel.process_weights_after_loading(layer)
    assert {n: getattr(layer, n).data_ptr() for n in names} == pointers
    x, weights, ids = tie_free_inputs(raw, cfg, 5)
    assert mean_relative_error(kernel.apply(layer, x, weights, ids), reference_moe(raw, cfg, x, weights, ids)) < TOLERANCE


def test_reload_with_other_shapes_raises(seed) -> None:
    cfg = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=32)
    layer = moe_layer(cfg)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    other = moe_layer(moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=48))
    for name, tensor in raw_tensors(other).items():
        layer.register_buffer(name, tensor, persistent=False)
    with pytest.raises(ValueError, match="w13_weight is \\(8, 96, 64\\).*expected \\(8, 64, 64\\)"):
        kernel.process_weights_after_loading(layer)
    # A layer rebuilt for another shape cannot be copied into the storage bound before.
    with pytest.raises(IncompatibleBufferError, match="w13_weight"):
        EmulationMoEKernel(moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=48)).process_weights_after_loading(layer)


def test_out_of_range_expert_ids_are_refused() -> None:
    cfg = moe_config(Scheme.UNQUANTIZED, hidden=16, inter=8)
    layer = moe_layer(cfg)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    with pytest.raises(ValueError, match="topk_ids must lie in \\[0, 8\\)"):
        kernel.apply(layer, torch.randn(2, 16), torch.ones(2, 2), torch.tensor([[0, 8], [1, 2]], dtype=torch.int32))


@pytest.mark.parametrize("ids", [[[0, -1], [1, 2]], [[-3, 0], [1, 2]]], ids=["negative-second", "negative-first"])
def test_negative_expert_ids_are_refused_with_the_range(ids) -> None:
    """Negative ids get the same message as too large ones (torch.bincount would refuse them first
    with its own 'non-negative integral inputs' error)."""
    cfg = moe_config(Scheme.UNQUANTIZED, hidden=16, inter=8)
    layer = moe_layer(cfg)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    with pytest.raises(ValueError, match="topk_ids must lie in \\[0, 8\\); got ids from -"):
        kernel.apply(layer, torch.randn(2, 16), torch.ones(2, 2), torch.tensor(ids, dtype=torch.int32))


@pytest.mark.parametrize("scheme", [Scheme.FP8_BLOCK, Scheme.UNQUANTIZED], ids=lambda s: s.value)
def test_processing_twice_without_a_reload_names_the_reload(scheme) -> None:
    """A second processing of an already processed (dequantized) layer is refused with the fix that
    applies (load the checkpoint tensors again), not with the loader's stacking rule."""
    cfg = moe_config(scheme, hidden=136, inter=128, act_dtype=torch.bfloat16)
    layer = moe_layer(cfg)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    with pytest.raises(ValueError, match="processed already: load the checkpoint tensors again"):
        kernel.process_weights_after_loading(layer)
    # A layer never processed keeps the stacking hint.
    fresh = moe_layer(cfg)
    fresh.w13_weight = fresh.w13_weight[:, :-1]
    with pytest.raises(ValueError, match="^(?!.*processed already).*The loader must stack"):
        EmulationMoEKernel(cfg).process_weights_after_loading(fresh)


def test_layout_refusals_name_the_cause() -> None:
    ok, reason = EmulationMoEKernel.can_implement(moe_config(Scheme.FP8_BLOCK, inter=96))
    assert not ok and "multiple of the block height 128" in reason
    ok, reason = EmulationMoEKernel.can_implement(moe_config(Scheme.FP8_BLOCK, top_k=9))
    assert not ok and "top_k 9 exceeds" in reason
    gelu = dataclasses.replace(moe_config(Scheme.FP8_CHANNEL), activation="gelu")
    ok, reason = EmulationMoEKernel.can_implement(gelu)
    assert not ok and "activation 'gelu' not handled (handles: silu)" in reason
    ok, reason = EmulationMoEKernel.can_implement(moe_config(Scheme.FP8_CHANNEL, inter=0))
    assert not ok and "sizes must be positive" in reason
    # Every expert on every token is a valid layer.
    assert EmulationMoEKernel.can_implement(moe_config(Scheme.FP8_BLOCK, top_k=8)) == (True, None)
    assert experts.scale_shape(moe_config(Scheme.FP8_TENSOR), "w13") == (8, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", [Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR])
def test_gpu_activations_on_rounding_ties_round_as_the_reference(scheme, seed) -> None:
    # Emulation quantizes with kernels/quant.py on the layer's device. Its scales must be correctly
    # rounded divisions there too: CUDA torch turns a division by a Python scalar into a product
    # with the rounded reciprocal, one ulp off for some amax values, which decides the exact
    # ties of these activations the other way (~6e-2 of the metric).
    cfg = moe_config(scheme, **QWEN3_30B_A3B, act_dtype=torch.bfloat16)
    layer = moe_layer(cfg, "cuda")
    raw = raw_tensors(layer)
    kernel = EmulationMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    x, weights, ids = plain_inputs(cfg, 16, "cuda", draw=tied_activations)
    out = kernel.apply(layer, x, weights, ids)
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids)) < BF16_TOLERANCE
