"""The marlin MoE backend: weight-only FP8 (W8A16) experts, packed four to an int32.

The reference is W8A16: activations unquantized, weight scales rounded to the activation dtype
as marlin stores them. On CPU the kernels run under TRITON_INTERPRET=1 in float16 (see
test_moe_triton.py for why not bfloat16); bfloat16 runs in the GPU tests.
"""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels import IncompatibleBufferError, Platform
from quantgate.kernels.moe.marlin import MarlinMoEKernel, kernel_scales
from quantgate.kernels.schemes import Scheme
from quantgate.kernels.triton.fused_moe_w8a16 import CONFIGS, config_for, fused_moe_w8a16
from quantgate.kernels.triton.w8a16_gemm import unpack_weight

from quantgate.kernels.moe.reference import mean_relative_error, reference_moe

from .test_moe_reference import BF16_TOLERANCE, QWEN3_30B_A3B, TOLERANCE, moe_config, moe_layer, raw_tensors, routing
from .test_moe_triton import DEVICE

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

CASES = [
    pytest.param(Scheme.FP8_BLOCK, "weight_scale_inv", 192, 128, id="block-native"),
    pytest.param(Scheme.FP8_BLOCK, "weight_scale", 200, 256, id="block-ct"),
    pytest.param(Scheme.FP8_CHANNEL, "weight_scale", 200, 72, id="channel"),
    pytest.param(Scheme.FP8_TENSOR, "weight_scale", 136, 72, id="tensor"),
]


def _run(cfg, num_tokens, skip_experts=()):
    layer = moe_layer(cfg, DEVICE)
    raw = raw_tensors(layer)
    kernel = MarlinMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    x = torch.randn(num_tokens, cfg.hidden_size, device=DEVICE).to(cfg.act_dtype)
    weights, ids = routing(num_tokens, cfg, DEVICE, skip_experts)
    out = kernel.apply(layer, x, weights, ids)
    assert out.shape == x.shape and out.dtype == x.dtype
    return mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids, weight_only=True))


@pytest.mark.parametrize("scheme,scale_name,hidden,inter", CASES)
@pytest.mark.parametrize("num_tokens", [1, 29])
def test_matches_float64_w8a16_reference(scheme, scale_name, hidden, inter, num_tokens, seed):
    cfg = moe_config(scheme, hidden=hidden, inter=inter, scale_name=scale_name, act_dtype=torch.float16)
    assert _run(cfg, num_tokens, skip_experts=(0, 5)) < TOLERANCE


def test_activation_rows_strided_past_hidden_read_only_hidden_columns(seed):
    """x a view of wider rows (hidden 200 of 256) whose other columns hold NaN: the K loop masks
    columns past hidden instead of relying on the packed weights' zero padding."""
    cfg = moe_config(Scheme.FP8_BLOCK, hidden=200, inter=128, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    raw = raw_tensors(layer)
    kernel = MarlinMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    x = torch.full((5, 256), torch.nan, device=DEVICE).half()[:, :cfg.hidden_size]
    x.copy_(torch.randn(5, cfg.hidden_size, device=DEVICE))
    weights, ids = routing(5, cfg, DEVICE)
    out = kernel.apply(layer, x, weights, ids)
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids, weight_only=True)) < TOLERANCE


def test_static_input_scales_are_ignored(seed):
    # Weight-only: a checkpoint's activation scales do not change the result.
    cfg = moe_config(Scheme.FP8_TENSOR, hidden=136, inter=72, act_dtype=torch.float16, static_input_scale=True)
    assert _run(cfg, 5) < TOLERANCE


def test_processing_packs_four_fp8_per_int32_and_keeps_storage_on_reload(seed):
    cfg = moe_config(Scheme.FP8_BLOCK, scale_name="weight_scale_inv", hidden=200, inter=128,
                     act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    w13 = layer.w13_weight.clone()
    kernel = MarlinMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    assert layer.w13_weight.dtype == torch.int32 and layer.w13_weight.shape == (e, 2 * 32, 2 * i)  # ceil(200/128)=2
    assert torch.equal(unpack_weight(layer.w13_weight[3], h).view(torch.uint8), w13[3].view(torch.uint8))
    assert layer.w13_weight_scale_inv.dtype == torch.float16 and layer.w13_weight_scale_inv.shape == (e, 2, 2 * i)

    names = ["w13_weight", "w2_weight", "w13_weight_scale_inv", "w2_weight_scale_inv", "moe_workspace"]
    pointers = {n: getattr(layer, n).data_ptr() for n in names}
    raw = raw_tensors(moe_layer(cfg, DEVICE))
    for name, tensor in raw.items():
        layer.register_buffer(name, tensor.clone(), persistent=False)
    kernel.process_weights_after_loading(layer)
    assert {n: getattr(layer, n).data_ptr() for n in names} == pointers
    x = torch.randn(3, h, device=DEVICE).half()
    weights, ids = routing(3, cfg, DEVICE)
    out = kernel.apply(layer, x, weights, ids)
    assert mean_relative_error(out, reference_moe(raw, cfg, x, weights, ids, weight_only=True)) < TOLERANCE


def test_block_scales_expand_to_one_column_per_output_row(seed):
    """Block scales [E, ceil(N/128), ceil(K/128)] become [E, ceil(K/128), N], scale * 2^10 in fp16, with
    N not a multiple of 128 (the down projection of a 200-wide layer): no columns past N."""
    cfg = moe_config(Scheme.FP8_BLOCK, hidden=200, inter=256, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    raw = raw_tensors(layer)
    MarlinMoEKernel(cfg).process_weights_after_loading(layer)
    for proj, (n, k) in (("w13", (2 * cfg.intermediate_size, cfg.hidden_size)),
                         ("w2", (cfg.hidden_size, cfg.intermediate_size))):
        scale = raw[f"{proj}_weight_scale"].double()
        rows, groups = torch.arange(n) // 128, torch.arange(-(-k // 128))
        expected = (scale[:, rows][:, :, groups] * 2.0 ** 10).transpose(1, 2).half()
        got = getattr(layer, f"{proj}_weight_scale")
        assert got.shape == (cfg.num_experts, -(-k // 128), n)
        assert torch.equal(got.cpu(), expected.cpu())


def test_fp16_scales_up_to_the_largest_fp16_value_are_kept():
    # 65504 / 2^10 is the largest scale fp16 marlin scales hold: kept exactly, not refused.
    cfg = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=32, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    layer.w2_weight_scale[3, 5] = 65504 / 2 ** 10
    MarlinMoEKernel(cfg).process_weights_after_loading(layer)
    assert layer.w2_weight_scale.abs().max().item() == 65504.0


def test_overflow_refusals_name_the_layer_type_without_a_module_name():
    cfg = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=32, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    layer.w2_weight_scale[0, 0] = 100.0
    with pytest.raises(ValueError, match=r"^Module\.w2_weight_scale: weight scales up to 100 "):
        MarlinMoEKernel(cfg).process_weights_after_loading(layer)
    with pytest.raises(ValueError, match=r"^MoE layer\.w2_weight_scale: weight scales up to 100 "):
        kernel_scales(layer.w2_weight_scale, cfg, "w2")


def test_w8a16_tile_table_rows_apply_up_to_their_token_count():
    (first, first_cfg), (second, second_cfg), (_, last_cfg) = CONFIGS
    assert [config_for(t) for t in (1, first, first + 1, second, second + 1, 1 << 20)] == [
        first_cfg, first_cfg, second_cfg, second_cfg, last_cfg, last_cfg]


@pytest.mark.parametrize("proj", ["w13", "w2"])
def test_scales_not_in_the_activation_dtype_are_refused(proj, seed):
    cfg = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=32, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    MarlinMoEKernel(cfg).process_weights_after_loading(layer)
    scales = {"w13": layer.w13_weight_scale, "w2": layer.w2_weight_scale}
    scales[proj] = scales[proj].float()
    weights, ids = routing(3, cfg, DEVICE)
    with pytest.raises(ValueError, match="W8A16 scales must be in the activation dtype torch.float16"):
        fused_moe_w8a16(torch.randn(3, cfg.hidden_size, device=DEVICE).half(), weights, ids, layer.w13_weight,
                        scales["w13"], layer.w2_weight, scales["w2"], hidden=cfg.hidden_size,
                        intermediate=cfg.intermediate_size)


def test_processing_twice_without_a_reload_names_the_reload():
    """Repacked experts processed again are refused with the fix that applies (reload the checkpoint
    tensors), not with the loader's stacking rule."""
    cfg = moe_config(Scheme.FP8_BLOCK, hidden=136, inter=128, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    kernel = MarlinMoEKernel(cfg)
    kernel.process_weights_after_loading(layer)
    with pytest.raises(ValueError, match="processed already: load the checkpoint tensors again"):
        kernel.process_weights_after_loading(layer)


def test_reload_with_other_shapes_raises():
    cfg = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=32, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    MarlinMoEKernel(cfg).process_weights_after_loading(layer)
    bigger = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=48, act_dtype=torch.float16)
    for name, tensor in raw_tensors(moe_layer(bigger, DEVICE)).items():
        layer.register_buffer(name, tensor, persistent=False)
    with pytest.raises(IncompatibleBufferError, match="w13_weight"):
        MarlinMoEKernel(bigger).process_weights_after_loading(layer)


@pytest.mark.parametrize("proj", ["w13", "w2"])
def test_fp16_scales_that_overflow_are_refused_before_anything_is_repacked(proj):
    # fp16 marlin scales hold scale * 2^10: past 65504 / 2^10 a cast would make them inf.
    cfg = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=32, act_dtype=torch.float16)
    layer = moe_layer(cfg, DEVICE)
    layer.module_name = "model.layers.0.mlp.experts"
    getattr(layer, f"{proj}_weight_scale")[3, 5] = 100.0
    raw = raw_tensors(layer)
    with pytest.raises(ValueError, match=f"model.layers.0.mlp.experts.{proj}_weight_scale: weight scales up to 100 "
                                         "do not fit torch.float16 marlin scales; serve this checkpoint with "
                                         "--dtype bfloat16"):
        MarlinMoEKernel(cfg).process_weights_after_loading(layer)
    assert all(torch.equal(getattr(layer, n).view(torch.uint8), t.view(torch.uint8)) for n, t in raw.items())
    bf16 = moe_config(Scheme.FP8_CHANNEL, hidden=64, inter=32, act_dtype=torch.bfloat16)
    MarlinMoEKernel(bf16).process_weights_after_loading(layer)  # bf16 holds it
    assert torch.isfinite(getattr(layer, f"{proj}_weight_scale")).all()


def test_support_and_refusals():
    assert MarlinMoEKernel.is_supported(Platform.hypothetical("cuda", "8.0")) == (True, None)
    ok, reason = MarlinMoEKernel.is_supported(Platform.hypothetical("cuda", "7.5"))
    assert not ok and "compute capability >= 8.0" in reason and "7.5" in reason
    ok, reason = MarlinMoEKernel.can_implement(moe_config(Scheme.UNQUANTIZED, act_dtype=torch.bfloat16))
    assert not ok and "scheme unquantized not handled" in reason


# --- CUDA: lean, as in test_moe_triton.py (float16 at 16 tokens, bfloat16 at 2048). W8A16 does not
# quantize activations, so no FP8 rounding ties to steer clear of.

@pytest.mark.gpu
@pytest.mark.parametrize("scheme,dtype,num_tokens", [
    pytest.param(Scheme.FP8_BLOCK, torch.float16, 16, id="block-fp16-16"),
    pytest.param(Scheme.FP8_BLOCK, torch.bfloat16, 2048, id="block-bf16-2048"),
    pytest.param(Scheme.FP8_CHANNEL, torch.float16, 16, id="channel-fp16-16"),  # per-column scales, no K groups
])
def test_gpu_qwen3_layer_matches_float64_w8a16_reference(scheme, dtype, num_tokens, seed):
    cfg = moe_config(scheme, **QWEN3_30B_A3B, act_dtype=dtype)
    assert _run(cfg, num_tokens) < (BF16_TOLERANCE if dtype == torch.bfloat16 else TOLERANCE)


@pytest.mark.gpu
def test_gpu_partial_tiles(seed):
    cfg = moe_config(Scheme.FP8_BLOCK, hidden=200, inter=256, act_dtype=torch.float16)
    assert _run(cfg, 29, skip_experts=(0, 5)) < TOLERANCE
