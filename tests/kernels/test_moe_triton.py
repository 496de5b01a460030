"""The triton MoE backend: token alignment, W8A8 (block, channel, tensor) and bf16/fp16 fused MoE.

On CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py) in float16: the
interpreter computes bfloat16 dots on the raw bits, so bfloat16 runs in the GPU tests only.
`apply` is called directly: `is_supported` refuses CPU, the launches themselves do not.
"""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import IncompatibleBufferError
from quantgate.kernels.moe.marlin import MarlinMoEKernel
from quantgate.kernels.moe.routing import select_experts
from quantgate.kernels.moe.triton import TritonFusedMoEKernel, TritonUnquantizedMoEKernel
from quantgate.kernels.schemes import Scheme
from quantgate.kernels.triton import fused_moe
from quantgate.kernels.triton.moe_align import max_padded_rows, moe_align_block_size

from quantgate.kernels.moe.reference import mean_relative_error, reference_moe

from .test_moe_reference import (BF16_TOLERANCE, QWEN3_30B_A3B, TOLERANCE, gaussian_activations, moe_config, moe_layer,
                                 plain_inputs, raw_tensors, routing, tie_free_inputs, tied_activations)

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (kernel, scheme, scale name, hidden, intermediate, static input scales); block needs I % 128 == 0.
CASES = [
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_BLOCK, "weight_scale_inv", 192, 128, False, id="block-native"),
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_BLOCK, "weight_scale", 200, 256, False, id="block-ct"),
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_CHANNEL, "weight_scale", 200, 72, False, id="channel"),
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_TENSOR, "weight_scale", 200, 72, False, id="tensor-dynamic"),
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_TENSOR, "weight_scale", 136, 72, True, id="tensor-static"),
    pytest.param(TritonUnquantizedMoEKernel, Scheme.UNQUANTIZED, "weight_scale", 200, 72, False, id="unquantized"),
]


def _processed(kernel_class, cfg):
    """The kernel, a fresh layer of `cfg` it has processed, and the layer's checkpoint tensors."""
    layer = moe_layer(cfg, DEVICE)
    raw = raw_tensors(layer)
    kernel = kernel_class(cfg)
    kernel.process_weights_after_loading(layer)
    return kernel, layer, raw


def _run(kernel_class, cfg, num_tokens, skip_experts=(), draw=gaussian_activations, tie_free=True):
    """Mean relative error of the kernel against the float64 reference on inputs from `draw`,
    kept clear of FP8 rounding ties of the intermediate unless `tie_free` is False
    (tests/kernels/test_moe_reference.py says when that matters)."""
    kernel, layer, raw = _processed(kernel_class, cfg)
    if tie_free:
        x, weights, ids = tie_free_inputs(raw, cfg, num_tokens, DEVICE, skip_experts, draw)
    else:
        x, weights, ids = plain_inputs(cfg, num_tokens, DEVICE, skip_experts, draw)
    out = kernel.apply(layer, x, weights, ids)
    assert out.shape == x.shape and out.dtype == x.dtype
    return mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids))


@pytest.mark.parametrize("kernel_class,scheme,scale_name,hidden,inter,static", CASES)
@pytest.mark.parametrize("num_tokens", [1, 29])
def test_matches_float64_reference(kernel_class, scheme, scale_name, hidden, inter, static, num_tokens, seed):
    cfg = moe_config(scheme, hidden=hidden, inter=inter, scale_name=scale_name, act_dtype=torch.float16,
                     static_input_scale=static)
    # Experts 0 and 5 receive no tokens.
    assert _run(kernel_class, cfg, num_tokens, skip_experts=(0, 5)) < TOLERANCE


@pytest.mark.parametrize("scheme", [Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR])
def test_activations_on_rounding_ties_round_as_the_reference(scheme, seed):
    # A fifth of the input values sit exactly halfway between FP8 neighbours: the kernel's
    # activation scales must equal the reference's bit for bit, or half of those round the
    # other way (6e-2 of the metric).
    cfg = moe_config(scheme, hidden=200, inter=128, act_dtype=torch.float16)
    assert _run(TritonFusedMoEKernel, cfg, 8, draw=tied_activations) < TOLERANCE


# Every row of the tile tables, forced on a small layer (hidden not a multiple of 128, several row
# blocks per expert at BLOCK_M 16). The interpreter computes FP8 dots exactly whatever the tile;
# on a GPU the rows compile to different instructions (H200: BLOCK_M 64 ran FP8 warpgroup MMAs,
# whose ~13-bit accumulation cost 10x this tolerance), so the GPU job runs this test too, with
# channel scales (GPU only: the interpreter quantizes the padded intermediate a row per program).
TILE_ROWS = [pytest.param(scheme, cfg, id=f"{scheme.value}-upto{largest}-bm{cfg.block_m}",
                          marks=[pytest.mark.gpu] if scheme is Scheme.FP8_CHANNEL else [])
             for scheme, table in ((Scheme.FP8_BLOCK, fused_moe.FP8_CONFIGS), (Scheme.FP8_CHANNEL, fused_moe.FP8_CONFIGS),
                                   (Scheme.UNQUANTIZED, fused_moe.BF16_CONFIGS))
             for largest, cfg in table]


@pytest.mark.parametrize("scheme,tile_config", TILE_ROWS)
def test_every_tile_row_matches_float64_reference(scheme, tile_config, seed):
    cfg = moe_config(scheme, experts_=4, top_k=2, hidden=200, inter=128, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    raw = raw_tensors(layer)
    kernel_class = TritonUnquantizedMoEKernel if scheme is Scheme.UNQUANTIZED else TritonFusedMoEKernel
    kernel_class(cfg).process_weights_after_loading(layer)
    x, weights, ids = tie_free_inputs(raw, cfg, 40, DEVICE)
    if scheme is Scheme.UNQUANTIZED:
        out = fused_moe.fused_moe_unquantized(x, weights, ids, layer.w13_weight, layer.w2_weight, config=tile_config)
    else:
        per_rows, activation = ((fused_moe.block_scales, "group") if scheme is Scheme.FP8_BLOCK
                                else (fused_moe.channel_scales, "token"))
        out = fused_moe.fused_moe_fp8(x, weights, ids, layer.w13_weight, per_rows(layer.w13_weight_scale, 128),
                                      layer.w2_weight, per_rows(layer.w2_weight_scale), activation=activation,
                                      config=tile_config)
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids)) < TOLERANCE


def test_grouped_tile_order_covers_a_partial_last_group(seed):
    """GROUP_M (8) row blocks sweep the column tiles together; 600 slots over 4 experts at BLOCK_M
    64 bound 14 row blocks, so the last group holds 6, about 4 of them used, and the down GEMM
    has 3 column tiles (hidden 300): each of its (row block, column tile) pairs must still run."""
    cfg = moe_config(Scheme.UNQUANTIZED, experts_=4, top_k=2, hidden=300, inter=72, act_dtype=torch.float16)
    tile_config = fused_moe.BF16_CONFIGS[-1][1]
    assert tile_config.block_m == 64 and tile_config.down.group_m == 8
    layer = moe_layer(cfg, DEVICE)
    raw = raw_tensors(layer)
    x, weights, ids = plain_inputs(cfg, 300, DEVICE)
    assert int(moe_align_block_size(ids, 4, 64)[2]) > 9 * 64  # used row blocks reach into the last group
    out = fused_moe.fused_moe_unquantized(x, weights, ids, layer.w13_weight, layer.w2_weight, config=tile_config)
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids)) < TOLERANCE


def test_all_tokens_on_one_expert_with_tied_logits(seed):
    cfg = moe_config(Scheme.FP8_BLOCK, act_dtype=torch.float16, top_k=2)
    layer = moe_layer(cfg, DEVICE)
    raw = raw_tensors(layer)
    kernel = TritonFusedMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    x = torch.randn(20, cfg.hidden_size, device=DEVICE).half()
    logits = torch.zeros(20, cfg.num_experts, device=DEVICE)
    logits[:, 3] = 1.0  # every token picks expert 3, then the tie among the rest goes to expert 0
    weights, ids = select_experts(logits, 2, renormalize=True)
    assert ids[:, 1].eq(0).all()
    out = kernel.apply(layer, x, weights, ids)
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids)) < TOLERANCE


@pytest.mark.parametrize("num_tokens,top_k,experts_,block_m", [(1, 8, 128, 16), (37, 2, 6, 16), (1200, 4, 16, 64)])
def test_alignment_groups_slots_by_expert(num_tokens, top_k, experts_, block_m, seed):
    ids = torch.stack([torch.randperm(experts_)[:top_k] for _ in range(num_tokens)]).to(torch.int32).to(DEVICE)
    sorted_slots, block_expert, num_padded = moe_align_block_size(ids, experts_, block_m)
    slots, padded = ids.numel(), int(num_padded)
    counts = torch.bincount(ids.flatten().long().cpu(), minlength=experts_)
    assert padded == int(((counts + block_m - 1) // block_m * block_m).sum()) <= sorted_slots.numel()
    assert sorted_slots.numel() == max_padded_rows(slots, experts_, block_m)
    rows = sorted_slots.cpu()
    used = rows[:padded]
    assert sorted(used[used < slots].tolist()) == list(range(slots))  # every slot exactly once
    assert rows[padded:].eq(slots).all()
    flat = ids.flatten().cpu()
    for b in range(padded // block_m):
        block = rows[b * block_m:(b + 1) * block_m]
        real = block[block < slots].long()
        assert real.numel() and flat[real].eq(int(block_expert[b])).all()


def test_the_row_bound_counts_only_experts_the_slots_can_reach(seed):
    """The GEMM grids cover max_padded_rows: slots plus fewer than block_m padding rows for each
    expert that can be non-empty (no more than there are slots), rounded up to a block. One decode
    token's 8 slots among 128 experts need 8 blocks, not 121; the worst routing fits."""
    assert [max_padded_rows(*case) for case in [(1, 128, 16), (8, 128, 16), (70, 6, 16), (4816, 16, 64)]] == [
        16, 128, 160, 5824]
    ids = torch.arange(8, dtype=torch.int32, device=DEVICE)[torch.randperm(8)].view(1, 8) * 16  # 8 experts of 128
    sorted_slots, block_expert, num_padded = moe_align_block_size(ids, 128, 16)
    assert int(num_padded) == sorted_slots.numel() == 128 and block_expert.numel() == 8
    assert sorted(block_expert.tolist()) == list(range(0, 128, 16))


def test_alignment_refuses_ids_and_workspaces_it_cannot_use():
    ids = torch.randint(0, 6, (5, 2), dtype=torch.int32, device=DEVICE)
    for bad in (ids.long(), ids.t()):
        with pytest.raises(ValueError, match="topk_ids must be contiguous int32"):
            moe_align_block_size(bad, 6, 16)
    for cursor in (torch.zeros(5, dtype=torch.int32, device=DEVICE), torch.zeros(6, dtype=torch.int64, device=DEVICE)):
        with pytest.raises(ValueError, match="cursor workspace must be int32 with >= 6 elements"):
            moe_align_block_size(ids, 6, 16, cursor)
    exact = moe_align_block_size(ids, 6, 16, torch.full((6,), 99, dtype=torch.int32, device=DEVICE))
    fresh = moe_align_block_size(ids, 6, 16)
    assert torch.equal(exact[1], fresh[1]) and torch.equal(exact[2], fresh[2])
    assert sorted(exact[0].tolist()) == sorted(fresh[0].tolist())


def _unaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of contiguous `t` one element past a 16-byte boundary."""
    buffer = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buffer[1:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("kernel_class,scheme", [
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_BLOCK, id="triton-block"),
    pytest.param(TritonUnquantizedMoEKernel, Scheme.UNQUANTIZED, id="triton-unquantized"),
    pytest.param(MarlinMoEKernel, Scheme.FP8_BLOCK, id="marlin-block"),
])
def test_unaligned_operands_between_aligned_calls(kernel_class, scheme, seed):
    """On a GPU every launch after a key's first goes by the compiled kernel's handle
    (kernels/triton/launch.py), so a key that missed the alignment of the activations or of the
    routing weights would run a kernel compiled for 16-byte aligned pointers on unaligned ones.
    Calls alternate aligned and unaligned operands, each against the float64 reference. Rows of
    256 elements: with a row stride divisible by 16 the aligned compilation loads the activations
    in 16-byte vectors, which an unaligned pointer cannot take."""
    cfg = moe_config(scheme, hidden=256, inter=128, act_dtype=torch.float16)
    kernel, layer, raw = _processed(kernel_class, cfg)
    x, weights, ids = tie_free_inputs(raw, cfg, 5, DEVICE)
    expected = reference_moe(raw, cfg, x, weights, ids, weight_only=kernel_class is MarlinMoEKernel)
    unaligned_x, unaligned_weights = _unaligned(x), _unaligned(weights)
    assert unaligned_x.data_ptr() % 16 and unaligned_weights.data_ptr() % 16
    for x_in, weights_in in [(x, weights), (unaligned_x, weights), (x, unaligned_weights), (x, weights)]:
        assert mean_relative_error(kernel.apply(layer, x_in, weights_in, ids), expected) < TOLERANCE


def test_reload_keeps_storage_and_uses_new_weights(seed):
    cfg = moe_config(Scheme.FP8_BLOCK, scale_name="weight_scale_inv", act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    kernel = TritonFusedMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    names = ["w13_weight", "w2_weight", "w13_weight_scale_inv", "w2_weight_scale_inv", "moe_workspace"]
    pointers = {n: getattr(layer, n).data_ptr() for n in names}
    raw = raw_tensors(moe_layer(cfg, DEVICE))
    for name, tensor in raw.items():  # the engine loader re-sets the checkpoint tensors
        layer.register_buffer(name, tensor.clone(), persistent=False)
    kernel.process_weights_after_loading(layer)
    assert {n: getattr(layer, n).data_ptr() for n in names} == pointers
    x, weights, ids = tie_free_inputs(raw, cfg, 4, DEVICE)
    out = kernel.apply(layer, x, weights, ids)
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids)) < TOLERANCE


def test_reload_with_other_shapes_raises():
    cfg = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=32, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    TritonFusedMoEKernel(cfg).process_weights_after_loading(layer)
    bigger = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=48, act_dtype=torch.float16)
    for name, tensor in raw_tensors(moe_layer(bigger, DEVICE)).items():
        layer.register_buffer(name, tensor, persistent=False)
    with pytest.raises(IncompatibleBufferError, match="w13_weight"):
        TritonFusedMoEKernel(bigger).process_weights_after_loading(layer)


EACH_GPU_KERNEL = [
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_CHANNEL, id="triton-channel"),
    pytest.param(TritonUnquantizedMoEKernel, Scheme.UNQUANTIZED, id="triton-unquantized"),
    pytest.param(MarlinMoEKernel, Scheme.FP8_CHANNEL, id="marlin-channel"),
]


@pytest.mark.parametrize("kernel_class,scheme", [
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_BLOCK, id="triton-block"),
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_TENSOR, id="triton-tensor"),
    pytest.param(TritonUnquantizedMoEKernel, Scheme.UNQUANTIZED, id="triton-unquantized"),
    pytest.param(MarlinMoEKernel, Scheme.FP8_BLOCK, id="marlin-block"),
])
def test_no_tokens_give_an_empty_output(kernel_class, scheme):
    cfg = moe_config(scheme, hidden=200, inter=128, act_dtype=torch.float16)
    kernel, layer, _ = _processed(kernel_class, cfg)
    out = kernel.apply(layer, torch.empty(0, cfg.hidden_size, device=DEVICE).half(),
                       torch.empty(0, cfg.top_k, device=DEVICE), torch.empty(0, cfg.top_k, dtype=torch.int64,
                                                                              device=DEVICE))
    assert out.shape == (0, cfg.hidden_size) and out.dtype == torch.float16


def test_calls_past_int32_offsets_are_refused():
    """The kernels' int32 offsets reach 2^31 - 1: activations, aligned intermediate rows and one
    expert's gate/up weight each up to that many elements run, one more is refused (meta tensors)."""
    def check(tokens, hidden, rows, two_i):
        x = torch.empty(tokens, hidden, dtype=torch.float16, device="meta")
        fused_moe._check_offsets(x, rows, torch.empty(4, two_i, hidden, dtype=torch.float16, device="meta"))

    limit = 2 ** 31
    check(limit // 256 - 1, 256, 16, 144)  # the largest of each still fits: 2^31 - 256 elements
    check(16, 256, (limit - 1) // 144, 144)
    check(16, 255, 16, limit // 256 - 1)
    for args in [(limit // 256, 256, 16, 144), (16, 256, limit // 128, 128), (16, 256, 16, limit // 256)]:
        with pytest.raises(ValueError, match="MoE call too large for int32 offsets"):
            check(*args)


def test_processed_weight_scales_are_float32(seed):
    # Checkpoints may store scales in bf16; the kernels read float32 (fused_moe.ExpertScales).
    cfg = moe_config(Scheme.FP8_CHANNEL, hidden=200, inter=72, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    for name in ("w13_weight_scale", "w2_weight_scale"):
        layer.register_buffer(name, getattr(layer, name).bfloat16(), persistent=False)
    raw = raw_tensors(layer)
    kernel = TritonFusedMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    for name in ("w13_weight_scale", "w2_weight_scale"):
        assert getattr(layer, name).dtype == torch.float32 and torch.equal(getattr(layer, name), raw[name].float())
    x, weights, ids = tie_free_inputs(raw, cfg, 5, DEVICE)
    assert mean_relative_error(kernel.apply(layer, x, weights, ids), reference_moe(raw, cfg, x, weights, ids)) < TOLERANCE


def test_tile_table_rows_apply_up_to_their_token_count():
    # The first row with num_tokens <= largest applies (the edges are tuned batch sizes).
    for table, fp8 in ((fused_moe.FP8_CONFIGS, True), (fused_moe.BF16_CONFIGS, False)):
        (first, first_cfg), (second, second_cfg), (_, last_cfg) = table
        assert [fused_moe.config_for(t, fp8) for t in (1, first, first + 1, second, second + 1, 1 << 20)] == [
            first_cfg, first_cfg, second_cfg, second_cfg, last_cfg, last_cfg]


@pytest.mark.parametrize("kernel_class,scheme", EACH_GPU_KERNEL)
def test_int64_expert_ids_and_float16_routing_weights_are_taken(kernel_class, scheme, seed):
    # A router's torch.topk gives int64 ids, and its weights may be in the activation dtype.
    cfg = moe_config(scheme, hidden=200, inter=72, act_dtype=torch.float16)
    kernel, layer, raw = _processed(kernel_class, cfg)
    x, weights, ids = tie_free_inputs(raw, cfg, 5, DEVICE)
    weights = weights.half()
    expected = reference_moe(raw, cfg, x, weights, ids, weight_only=kernel_class is MarlinMoEKernel)
    assert mean_relative_error(kernel.apply(layer, x, weights, ids.long()), expected) < TOLERANCE


@pytest.mark.parametrize("kernel_class,scheme", EACH_GPU_KERNEL)
def test_processing_refuses_weights_of_another_dtype(kernel_class, scheme):
    # bf16 experts under an FP8 config (or fp32 experts under an fp16 one) are refused by name, not bound.
    cfg = moe_config(scheme, hidden=64, inter=32, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    layer.register_buffer("w2_weight", layer.w2_weight.float(), persistent=False)
    with pytest.raises(ValueError, match=r"MoE layer tensors do not match its config .*w2_weight is \(8, 64, 32\) "
                                         r"torch.float32, expected \(8, 64, 32\) torch.float"):
        kernel_class(cfg).process_weights_after_loading(layer)
    assert not hasattr(layer, "moe_workspace")


def test_block_scheme_needs_a_128_wide_gate_up_tile():
    cfg = moe_config(Scheme.FP8_BLOCK, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    kernel = TritonFusedMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    narrow = fused_moe.FusedMoEConfig(16, fused_moe.GemmTile(64, 128, 4, 2), fused_moe.GemmTile(64, 128, 4, 2))
    weights, ids = routing(2, cfg, DEVICE)
    with pytest.raises(ValueError, match="block_n must be 128"):
        fused_moe.fused_moe_fp8(
            torch.randn(2, cfg.hidden_size, device=DEVICE).half(), weights, ids,
            layer.w13_weight, fused_moe.block_scales(layer.w13_weight_scale, cfg.intermediate_size),
            layer.w2_weight, fused_moe.block_scales(layer.w2_weight_scale), activation="group", config=narrow)


def test_layer_refusals_name_the_cause():
    ok, reason = TritonFusedMoEKernel.can_implement(moe_config(Scheme.FP8_BLOCK, act_dtype=torch.float32))
    assert not ok and "bfloat16 or float16" in reason
    ok, reason = TritonFusedMoEKernel.can_implement(moe_config(Scheme.UNQUANTIZED, act_dtype=torch.bfloat16))
    assert not ok and "scheme unquantized not handled" in reason
    ok, reason = TritonUnquantizedMoEKernel.can_implement(moe_config(Scheme.FP8_BLOCK, act_dtype=torch.bfloat16))
    assert not ok and "scheme fp8-block not handled" in reason
    ok, reason = TritonUnquantizedMoEKernel.can_implement(moe_config(Scheme.UNQUANTIZED, act_dtype=torch.float32))
    assert not ok and "bfloat16 or float16, not torch.float32" in reason


# --- CUDA: the Qwen3-30B-A3B layer in both activation dtypes ------------------------------------
# Lean on purpose: every (kernel, scheme, dtype, tile bucket, shape class) is a Triton compilation.
# float16 at 16 tokens (the decode tiles, issue 4's 1e-3 bar) and bfloat16 at 2048 (the prefill
# tiles); benchmarks/bench_moe.py reuses these compilations and reports both dtypes at both
# sizes. Channel and tensor scales share kernels. With 16 tokens of 6144 intermediate values, an
# FP8 rounding that differs from the reference moves the metric by only ~7e-5, so plain inputs do
# (keeping a per-tensor scale clear of ties would redraw every token forever).

GPU_CASES = [
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_BLOCK, False, id="block"),
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_CHANNEL, False, id="channel"),
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_TENSOR, False, id="tensor-dynamic"),
    pytest.param(TritonFusedMoEKernel, Scheme.FP8_TENSOR, True, id="tensor-static"),
    pytest.param(TritonUnquantizedMoEKernel, Scheme.UNQUANTIZED, False, id="unquantized"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_class,scheme,static", GPU_CASES)
@pytest.mark.parametrize("dtype,num_tokens", [(torch.float16, 16), (torch.bfloat16, 2048)],
                         ids=["fp16-16", "bf16-2048"])
def test_gpu_qwen3_layer_matches_float64_reference(kernel_class, scheme, static, dtype, num_tokens, seed):
    cfg = moe_config(scheme, **QWEN3_30B_A3B, act_dtype=dtype, static_input_scale=static)
    error = _run(kernel_class, cfg, num_tokens, tie_free=False)
    assert error < (BF16_TOLERANCE if dtype == torch.bfloat16 else TOLERANCE)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", [Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR])
def test_gpu_activations_on_rounding_ties_round_as_the_reference(scheme, seed):
    # CUDA torch divides by a Python scalar as a product with its rounded reciprocal: a scale
    # computed that way (instead of act_quant's div_rn) fails here deterministically.
    cfg = moe_config(scheme, **QWEN3_30B_A3B, act_dtype=torch.bfloat16)
    assert _run(TritonFusedMoEKernel, cfg, 16, draw=tied_activations, tie_free=False) < BF16_TOLERANCE


@pytest.mark.gpu
def test_gpu_partial_tiles(seed):
    # Sizes that are not multiples of 128 or 16: the masked loads and the partial 1x128 groups.
    cfg = moe_config(Scheme.FP8_BLOCK, hidden=200, inter=256, act_dtype=torch.float16)
    assert _run(TritonFusedMoEKernel, cfg, 29, skip_experts=(0, 5)) < TOLERANCE
