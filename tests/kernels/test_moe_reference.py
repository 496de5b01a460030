"""The layers and routings every MoE backend test runs on, the tolerances, and checks of the
float64 reference itself (kernels/moe/reference.py: a per-token loop, FP8 rounding ties, and the
same result whatever device it runs on).

The reference sees the same quantized experts (FP8 values and float32 scales) and the same
routing as the kernel under test, dequantizes in float64, quantizes activations where the
W8A8 schemes do (kernels/quant.py's definition, as the kernels compute it) and multiplies
in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quantgate.kernels import quant
from quantgate.kernels.moe import experts
from quantgate.kernels.moe.reference import (dequantize64, intermediate64, mean_relative_error, near_fp8_tie,
                                             reference_moe)
from quantgate.kernels.moe.routing import select_experts
from quantgate.kernels.schemes import MoELayerConfig, Scheme

FP8_SCHEMES = (Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR)
QWEN3_30B_A3B = dict(experts_=128, top_k=8, hidden=2048, inter=768)  # moe_config keywords
# Issue 4's bar: mean |out - ref| / mean |ref| (reference.mean_relative_error). Rounding each
# top-k slot to float16 and then their sum costs ~2.7e-4 of it; a float32 kernel adds ~1e-7,
# as long as it rounds every FP8 value of the intermediate as the reference does (tie_free_inputs).
TOLERANCE = 1e-3
# bf16 keeps 8 significant bits: the same two roundings cost ~2.2e-3, and backends that keep the
# intermediate in the activation dtype (unquantized, marlin) round once more: ~2.8e-3 in all.
BF16_TOLERANCE = 4e-3
# Relative distance from an FP8 rounding tie that a float32 kernel's intermediate cannot cross:
# its gate/up results are ~1e-7 (relative) from float64, more only where a sum cancels.
TIE_MARGIN = 1e-5


def moe_config(scheme: Scheme, *, experts_: int = 8, top_k: int = 2, hidden: int = 192, inter: int = 128,
               act_dtype: torch.dtype = torch.float32, scale_name: str = "weight_scale",
               static_input_scale: bool = False) -> MoELayerConfig:
    return MoELayerConfig(num_experts=experts_, top_k=top_k, hidden_size=hidden, intermediate_size=inter,
                          scheme=scheme, act_dtype=act_dtype, scale_name=scale_name,
                          static_input_scale=static_input_scale)


def moe_layer(config: MoELayerConfig, device: str = "cpu") -> torch.nn.Module:
    """A module holding random stacked experts in the checkpoint layout the loader produces."""
    e, h, i = config.num_experts, config.hidden_size, config.intermediate_size
    w13 = torch.randn(e, 2 * i, h, device=device) / h ** 0.5
    w2 = torch.randn(e, h, i, device=device) / i ** 0.5
    layer = torch.nn.Module()
    for name, tensor in experts.quantize_experts(w13, w2, config).items():
        layer.register_buffer(name, tensor, persistent=False)
    if config.static_input_scale:
        # Calibrated scales differ per expert; the kernels use the largest one.
        layer.register_buffer("w13_input_scale", 0.02 + 0.01 * torch.rand(e, device=device), persistent=False)
        layer.register_buffer("w2_input_scale", 0.01 + 0.01 * torch.rand(e, device=device), persistent=False)
    return layer


def raw_tensors(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the checkpoint tensors, taken before a kernel processes the layer."""
    return {name: t.clone() for name, t in layer.named_buffers()}


def routing(num_tokens: int, config: MoELayerConfig, device: str = "cpu",
            skip_experts: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(num_tokens, config.num_experts, device=device)
    logits[:, list(skip_experts)] = -torch.inf  # experts that receive no tokens
    return select_experts(logits, config.top_k, renormalize=True)


def gaussian_activations(num_tokens: int, hidden: int, device: str) -> torch.Tensor:
    return torch.randn(num_tokens, hidden, device=device)


def tied_activations(num_tokens: int, hidden: int, device: str) -> torch.Tensor:
    """Activations whose FP8 quantization lands exactly on rounding ties: values 7 m 2^s / 1024
    (|m| <= 28, s <= 4: exact in bf16 and fp16) and 3.0625 = 7 * 448 / 1024 at the start of every
    128-wide group. Every group, row and tensor amax is then 3.0625, its scale 3.0625 / 448 =
    7 / 1024 is exact, and x / scale = m 2^s, which lies halfway between two e4m3 neighbours when
    m is odd and above 16 (a fifth of the values). 3.0625 times the float32 1/448 is one ulp above
    that scale and rounds half of those ties the other way."""
    m = torch.randint(-28, 29, (num_tokens, hidden), device=device)
    x = 7 * m * 2.0 ** torch.randint(0, 5, (num_tokens, hidden), device=device) / 1024
    x[:, ::128] = 3.0625
    return x


def plain_inputs(config: MoELayerConfig, num_tokens: int, device: str = "cpu", skip_experts: tuple[int, ...] = (),
                 draw=gaussian_activations) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x [T, H] from `draw`, in config.act_dtype; topk_weights; topk_ids). For many tokens: an
    FP8 rounding of the intermediate that differs from the reference moves the metric by only
    ~1e-3 / T (see tie_free_inputs)."""
    weights, ids = routing(num_tokens, config, device, skip_experts)
    return draw(num_tokens, config.hidden_size, device).to(config.act_dtype), weights, ids


def tie_free_inputs(raw: dict[str, torch.Tensor], config: MoELayerConfig, num_tokens: int, device: str = "cpu",
                    skip_experts: tuple[int, ...] = (), draw=gaussian_activations
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x [T, H] from `draw`, in config.act_dtype; topk_weights; topk_ids) such that no value of
    the W8A8 intermediate lies within TIE_MARGIN of an FP8 rounding tie, so a float32 kernel and
    the float64 reference round every one alike. Otherwise a value rounding the other way (~1e-5
    chance each) moves a one-token output by ~5e-3 and fails about 1% of small runs for no bug.
    Tokens near a tie are drawn again; per-tensor scales depend on every token, so then every
    token is checked again."""
    x, weights, ids = plain_inputs(config, num_tokens, device, skip_experts, draw)
    if not config.scheme.is_fp8:
        return x, weights, ids
    static = raw["w2_input_scale"].float().max() if config.static_input_scale else None
    redraw = torch.ones(num_tokens, dtype=torch.bool, device=device)
    for _ in range(50):
        rows = torch.arange(num_tokens, device=device) if config.scheme is Scheme.FP8_TENSOR else redraw.nonzero()[:, 0]
        inter = intermediate64(raw, config, x[rows], ids[rows])
        redraw = torch.zeros_like(redraw)
        redraw[rows] = near_fp8_tie(inter, config, static, TIE_MARGIN).view(-1, config.top_k).any(dim=1)
        if not redraw.any():
            return x, weights, ids
        x[redraw] = draw(int(redraw.sum()), config.hidden_size, device).to(config.act_dtype)
    raise AssertionError(f"no input without FP8 rounding ties in 50 draws for {config}: too many values per token")


def test_reference_matches_a_per_token_loop(seed: int) -> None:
    cfg = moe_config(Scheme.UNQUANTIZED, hidden=40, inter=24)
    layer = moe_layer(cfg)
    x = torch.randn(5, cfg.hidden_size)
    weights, ids = routing(5, cfg)
    expected = torch.zeros(5, cfg.hidden_size, dtype=torch.float64)
    for t in range(5):
        for j in range(cfg.top_k):
            e = int(ids[t, j])
            gate, up = (layer.w13_weight[e].double() @ x[t].double()).split(cfg.intermediate_size)
            expected[t] += float(weights[t, j]) * (layer.w2_weight[e].double() @ (F.silu(gate) * up))
    got = reference_moe(raw_tensors(layer), cfg, x, weights, ids)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_near_fp8_tie_flags_rows_with_a_value_at_a_tie() -> None:
    cfg = moe_config(Scheme.FP8_CHANNEL)
    a = torch.full((3, 4), 7 * 8 / 1024)  # amax 3.0625: scale 7 / 1024, so a / scale = 8 (on the grid)
    a[:, 0] = 3.0625
    a[1, 2] = 7 * 17 / 1024  # a / scale = 17: halfway between 16 and 18
    a[2, 2] = 7 * 17.01 / 1024  # 6e-4 (relative) from that tie
    assert near_fp8_tie(a, cfg, None, margin=1e-5).tolist() == [False, True, False]
    assert near_fp8_tie(a, cfg, None, margin=1e-3).tolist() == [False, True, True]


def test_mean_relative_error_is_mean_absolute_error_over_mean_magnitude() -> None:
    # Errors of opposite signs do not cancel, and the scale is the mean |ref|, not its largest value.
    ref = torch.tensor([[1.0, -3.0]], dtype=torch.float64)
    assert mean_relative_error(torch.tensor([[2.0, -4.0]]), ref) == pytest.approx(0.5)


@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_quantize_experts_round_trips(scheme: Scheme, seed: int) -> None:
    cfg = moe_config(scheme, hidden=200, inter=128)
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    w13, w2 = torch.randn(e, 2 * i, h), torch.randn(e, h, i)
    tensors = experts.quantize_experts(w13, w2, cfg)
    for proj, w in (("w13", w13), ("w2", w2)):
        assert tensors[f"{proj}_weight"].dtype == quant.FP8_DTYPE
        assert tuple(tensors[experts.scale_attr(cfg, proj)].shape) == experts.scale_shape(cfg, proj)
        real = dequantize64(tensors[f"{proj}_weight"], tensors[experts.scale_attr(cfg, proj)], cfg, proj)
        # e4m3 keeps 3 mantissa bits: at most half an ulp (1/16) of relative error per element.
        assert float((real - w.double()).abs().max() / w.abs().max()) < 1 / 16


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_gpu_reference_does_not_depend_on_the_device(scheme: Scheme, seed: int) -> None:
    # On CUDA, torch's own scale arithmetic would decide these rounding ties differently.
    cfg = moe_config(scheme, hidden=256, inter=128, act_dtype=torch.bfloat16,
                     static_input_scale=scheme is Scheme.FP8_TENSOR)
    raw = raw_tensors(moe_layer(cfg))
    x, weights, ids = plain_inputs(cfg, 8, draw=tied_activations)
    on_cpu = reference_moe(raw, cfg, x, weights, ids)
    on_gpu = reference_moe({n: t.cuda() for n, t in raw.items()}, cfg, x.cuda(), weights.cuda(), ids.cuda())
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-12, atol=1e-12)
