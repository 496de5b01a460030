"""FP8 checkpoints in both formats load through the kernel layer and compute what their
dequantized weights compute (with the scheme's activation quantization, the emulation
backend), and the kernel report says which layers are quantized."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quantgate.engine import load_model
from quantgate.engine.kv_cache import KVCache
from quantgate.engine.layers import FusedMoE, QuantLinear
from quantgate.kernels import Scheme, quant
from quantgate.kernels.moe.routing import select_experts

from .conftest import needs_moe_kernel
from .test_parity import _hf, _prefill_batch, _rel_err
from .tiny_models import is_quantizable, quantize_folder

B, C, T = Scheme.FP8_BLOCK, Scheme.FP8_CHANNEL, Scheme.FP8_TENSOR
CASES = [("fp8", B, False), ("fp8", T, False), ("fp8", T, True),
         ("compressed-tensors", B, False), ("compressed-tensors", C, False), ("compressed-tensors", T, False),
         ("compressed-tensors", T, True)]


def _qdq(x: torch.Tensor, scheme: Scheme, input_scale: torch.Tensor | None) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    if scheme is B:
        out = quant.dequantize_act(*quant.quantize_act_per_token_group(x2, 128), group=128)
    elif scheme is C:
        out = quant.dequantize_act(*quant.quantize_act_per_token(x2))
    else:
        out = quant.dequantize_act(*quant.quantize_act_per_tensor(x2, input_scale))
    return out.reshape(x.shape)


def _dequantized(q_dir, name: str, scheme: Scheme, scale_name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(q_dir / "model.safetensors"), "pt") as f:
        w, s = f.get_tensor(name), f.get_tensor(name.replace(".weight", f".{scale_name}")).float()
    return quant.dequantize_weight(w, s, (128, 128) if scheme is B else None)


def _dequantized_layer(q_dir, layer: QuantLinear, scheme: Scheme, scale_name: str) -> torch.Tensor:
    """The layer's dequantized weight; a merged projection's is its checkpoint modules' stacked."""
    names = [shard for shard, _ in layer.shards] or [layer.module_name]
    return torch.cat([_dequantized(q_dir, f"{name}.weight", scheme, scale_name) for name in names])


def _quantized(q_dir, name: str) -> bool:
    """Whether the checkpoint stores module `name` in FP8 (a config's targets or ignore list can
    leave any module unquantized)."""
    from safetensors import safe_open

    with safe_open(str(q_dir / "model.safetensors"), "pt") as f:
        return f"{name}.weight" in f.keys() and f.get_slice(f"{name}.weight").get_dtype() == "F8_E4M3"


def _reference(src, q_dir, scheme: Scheme, scale_name: str, static: bool):
    """transformers' model with dequantized weights; each quantized linear quantize-dequantizes its input."""
    hf = _hf(src)
    input_scale = torch.tensor(0.02) if static else None
    for name, module in hf.named_modules():
        if isinstance(module, torch.nn.Linear) and is_quantizable(f"{name}.weight") and _quantized(q_dir, name):
            module.weight.data = _dequantized(q_dir, f"{name}.weight", scheme, scale_name)
            module.forward = (lambda m: lambda x: F.linear(_qdq(x, scheme, input_scale), m.weight))(module)
        elif type(module).__name__ == "Qwen3MoeExperts" and _quantized(q_dir, f"{name}.0.gate_proj"):
            module.forward = _reference_experts(name, q_dir, scheme, scale_name, module.num_experts)
    return hf


def _reference_experts(name: str, q_dir, scheme: Scheme, scale_name: str, num_experts: int):
    """Per token and chosen expert, in float32: the MoE math with per-row activation quantization."""
    w13 = [torch.cat([_dequantized(q_dir, f"{name}.{e}.{p}.weight", scheme, scale_name)
                      for p in ("gate_proj", "up_proj")]) for e in range(num_experts)]
    w2 = [_dequantized(q_dir, f"{name}.{e}.down_proj.weight", scheme, scale_name) for e in range(num_experts)]

    def forward(hidden, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden)
        for t in range(hidden.shape[0]):
            for e, w in zip(top_k_index[t].tolist(), top_k_weights[t]):
                gate, up = (_qdq(hidden[t : t + 1], scheme, None) @ w13[e].t()).chunk(2, dim=-1)
                out[t] += (_qdq(F.silu(gate) * up, scheme, None) @ w2[e].t())[0] * w
        return out

    return forward


def _check(src, q_dir, scheme: Scheme, scale_name: str, static: bool, seed: int):
    """Every quantized layer on the same random input as its reference (tight), then the whole model.

    End to end the tolerance is FP8's: a 1e-7 difference upstream (another summation order)
    can move an activation across an FP8 rounding boundary, one e4m3 step (6%) for that value,
    which shows as ~1e-2 in the logits. A wrong scale, layout or gate/up order is O(1).
    """
    loaded = load_model(q_dir, device="cpu", linear_backend="emulation", moe_backend="emulation")
    gen = torch.Generator().manual_seed(seed)
    input_scale = torch.tensor(0.02) if static else None
    with torch.inference_mode():
        for name, layer in loaded.kernel_layers().items():
            if isinstance(layer, QuantLinear) and layer.layer_config.scheme.is_fp8:
                x = torch.randn(7, layer.layer_config.in_features, generator=gen)
                expected = _qdq(x, scheme, input_scale) @ _dequantized_layer(q_dir, layer, scheme, scale_name).t()
                assert _rel_err(layer(x), expected) < 1e-5, name
            elif isinstance(layer, FusedMoE) and layer.layer_config.scheme.is_fp8:
                cfg = layer.layer_config
                x = torch.randn(9, cfg.hidden_size, generator=gen)
                weights, ids = select_experts(torch.randn(9, cfg.num_experts, generator=gen), cfg.top_k, True)
                expected = _reference_experts(name, q_dir, scheme, scale_name, cfg.num_experts)(x, ids, weights)
                # The experts quantize their intermediate activation (silu(gate) * up) to FP8 inside the
                # layer: a 1e-7 difference of summation order can move one value across an FP8 rounding
                # boundary (seeds 4160615089 and 1528795584: 4e-4 and 8e-4, at the tree of session 10
                # too). A wrong scale, layout or gate/up order is O(1).
                assert _rel_err(layer(x, weights, ids), expected) < 1e-2, name
    ref = _reference(src, q_dir, scheme, scale_name, static)
    cfg = loaded.model_config
    kv = KVCache(cfg, num_slots=1, max_len=256, dtype=torch.float32, device=torch.device("cpu"))
    # An MoE model can also route a token to another expert when two router logits nearly tie,
    # which moves its logits more than one FP8 step does (seed 2403291852: 0.052); still far below
    # the O(1) of a wrong scale or layout.
    bound = 1.5e-1 if cfg.num_experts else 5e-2
    for length in (5, 131):  # one prompt per forward: per-tensor activation scales span the batch
        prompt = torch.randint(0, cfg.vocab_size, (length,), generator=gen).tolist()
        with torch.inference_mode():
            ours = loaded.model(_prefill_batch([prompt], [0]), kv)
            expected = ref(torch.tensor([prompt])).logits[0]
        assert _rel_err(ours, expected) < bound, length
    return loaded


@pytest.mark.parametrize("fmt,scheme,static", CASES, ids=lambda v: getattr(v, "value", str(v)))
def test_dense_fp8_checkpoint_matches_dequantized_reference(dense_dir, tmp_path, fmt, scheme, static, seed):
    q_dir = quantize_folder(dense_dir, tmp_path / "q", scheme, fmt, static_input=static)
    scale_name = "weight_scale_inv" if fmt == "fp8" and scheme is B else "weight_scale"
    loaded = _check(dense_dir, q_dir, scheme, scale_name, static, seed)
    modules = loaded.kernel_report()["modules"]
    # q/k/v and gate/up run as one GEMM each, except where per-tensor or static input scales
    # differ between the projections, or 128-row scale blocks would straddle two of them
    cfg = loaded.model_config
    whole_blocks = {"qkv": cfg.num_kv_heads * cfg.head_dim % 128 == 0 and cfg.num_heads * cfg.head_dim % 128 == 0,
                    "gate_up": cfg.intermediate_size % 128 == 0}
    for merged_name, part, mlp in (("qkv_proj", "k_proj", False), ("gate_up_proj", "up_proj", True)):
        merged = scheme is not T and not static and (scheme is not B or whole_blocks["gate_up" if mlp else "qkv"])
        prefix = "model.layers.1." + ("mlp." if mlp else "self_attn.")
        assert (prefix + merged_name in modules) is merged and (prefix + part in modules) is not merged
    assert modules["model.layers.1.mlp.down_proj"]["scheme"] == scheme.value
    assert modules["model.layers.1.mlp.down_proj"]["kernel"] == "EmulationLinearKernel"
    # lm_head is unquantized and selected with auto, whatever --linear-backend says
    assert modules["lm_head"] == {**modules["lm_head"], "scheme": "unquantized", "kernel": "UnquantizedLinearKernel"}


@needs_moe_kernel
@pytest.mark.parametrize("fmt,scheme", [("compressed-tensors", C), ("fp8", B)], ids=["ct-channel", "native-block"])
def test_moe_fp8_checkpoint_matches_dequantized_reference(moe_dir, tmp_path, fmt, scheme, seed):
    if scheme is B:  # stacked gate/up blocks need moe_intermediate_size % 128 == 0
        from .tiny_models import write_model

        moe_dir = write_model(tmp_path / "moe128", moe=True, seed=4, moe_intermediate_size=128, hidden_size=128,
                              head_dim=32)
    q_dir = quantize_folder(moe_dir, tmp_path / "q", scheme, fmt)
    scale_name = "weight_scale_inv" if fmt == "fp8" and scheme is B else "weight_scale"
    loaded = _check(moe_dir, q_dir, scheme, scale_name, False, seed)
    modules = loaded.kernel_report()["modules"]
    assert modules["model.layers.0.mlp.experts"]["layer"] == "moe"
    assert modules["model.layers.0.mlp.experts"]["scheme"] == scheme.value
    assert modules["model.layers.0.mlp.gate"]["scheme"] == "unquantized"


@needs_moe_kernel
def test_compressed_tensors_targets_choose_the_quantized_modules(moe_dir, tmp_path, seed):
    # Experts-only FP8, as llm-compressor writes it: attention and the dense MLP stay unquantized.
    experts = r".*mlp\.experts\.\d+\.(gate|up|down)_proj$"
    q_dir = quantize_folder(moe_dir, tmp_path / "experts", C, "compressed-tensors", targets=experts)
    modules = _check(moe_dir, q_dir, C, "weight_scale", False, seed).kernel_report()["modules"]
    assert modules["model.layers.0.mlp.experts"]["scheme"] == "fp8-channel"
    assert {m["scheme"] for name, m in modules.items() if name != "model.layers.0.mlp.experts"} == {"unquantized"}
    # A target that matches part of q/k/v: those projections run apart, each in its own scheme.
    q_dir = quantize_folder(moe_dir, tmp_path / "q", C, "compressed-tensors", targets=r".*self_attn\.q_proj$")
    modules = _check(moe_dir, q_dir, C, "weight_scale", False, seed).kernel_report()["modules"]
    assert "model.layers.0.self_attn.qkv_proj" not in modules
    assert [modules[f"model.layers.1.self_attn.{p}_proj"]["scheme"] for p in "qkv"] == [
        "fp8-channel", "unquantized", "unquantized"]


def _rewrite_checkpoint(q_dir, edit) -> None:
    """Apply `edit(tensors)` to the folder's model.safetensors (in place)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(q_dir / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(q_dir / "model.safetensors"))


@needs_moe_kernel
@pytest.mark.parametrize("larger", ["up_proj", "gate_proj"])
def test_static_moe_gate_up_input_scale_is_the_larger_of_the_two(moe_dir, tmp_path, seed, larger):
    """gate and up read the same input, so one static scale must cover both: the larger of their
    input_scales, then the largest across experts (vLLM's rule). Guards against taking gate's
    (or up's) alone, which clips the other projection's activations."""
    q_dir = quantize_folder(moe_dir, tmp_path / "q", T, "fp8", static_input=True)
    gen = torch.Generator().manual_seed(seed)
    experts = "model.layers.0.mlp.experts"
    num_experts = 4
    scales = {(e, p): (0.035 + 0.025 * torch.rand((), generator=gen)) if p == larger
              else (0.01 + 0.02 * torch.rand((), generator=gen))
              for e in range(num_experts) for p in ("gate_proj", "up_proj", "down_proj")}
    scales = {k: float(v) for k, v in scales.items()}

    def set_scales(tensors: dict) -> None:
        for (e, proj), value in scales.items():
            tensors[f"{experts}.{e}.{proj}.input_scale"] = torch.tensor([value], dtype=torch.float32)

    _rewrite_checkpoint(q_dir, set_scales)
    loaded = load_model(q_dir, device="cpu", linear_backend="emulation", moe_backend="emulation")
    layer = loaded.kernel_layers()[experts]
    assert layer.layer_config.static_input_scale and layer.layer_config.scheme is T
    w13_scale = max(max(scales[e, "gate_proj"], scales[e, "up_proj"]) for e in range(num_experts))
    w2_scale = max(scales[e, "down_proj"] for e in range(num_experts))
    assert float(layer.w13_input_scale) == pytest.approx(w13_scale, rel=1e-6)
    assert float(layer.w13_input_scale) == pytest.approx(max(scales[e, larger] for e in range(num_experts)), rel=1e-6)
    assert float(layer.w2_input_scale) == pytest.approx(w2_scale, rel=1e-6)
    # The output computes with that scale: a float64 reference that quantizes with it.
    cfg = layer.layer_config
    x = 4 * torch.randn(9, cfg.hidden_size, generator=gen)  # some values beyond what the smaller scale covers
    weights, ids = select_experts(torch.randn(9, cfg.num_experts, generator=gen), cfg.top_k, True)

    def qdq(v: torch.Tensor, scale: float) -> torch.Tensor:
        return quant.dequantize_act(*quant.quantize_act_per_tensor(v.float(), torch.tensor(scale))).double()

    w13 = [torch.cat([_dequantized(q_dir, f"{experts}.{e}.{p}.weight", T, "weight_scale").double()
                      for p in ("gate_proj", "up_proj")]) for e in range(num_experts)]
    w2 = [_dequantized(q_dir, f"{experts}.{e}.down_proj.weight", T, "weight_scale").double()
          for e in range(num_experts)]
    expected = torch.zeros(9, cfg.hidden_size, dtype=torch.float64)
    for t in range(9):
        for e, w in zip(ids[t].tolist(), weights[t].tolist()):
            gate, up = (qdq(x[t : t + 1], w13_scale) @ w13[e].t()).chunk(2, dim=-1)
            expected[t] += (qdq(F.silu(gate) * up, w2_scale) @ w2[e].t())[0] * w
    with torch.inference_mode():
        assert _rel_err(layer(x, weights, ids), expected) < 1e-2


@needs_moe_kernel
def test_the_moe_router_stays_unquantized_when_the_config_lists_only_lm_head(moe_dir, tmp_path, seed):
    """vLLM never quantizes the router (`mlp.gate`), whatever modules_to_not_convert lists; a native
    config naming only lm_head must still load with the router in the model dtype. Guards against
    the router being taken for an FP8 linear, whose scale the checkpoint does not have."""
    import json

    q_dir = quantize_folder(moe_dir, tmp_path / "q", T, "fp8")
    config = json.loads((q_dir / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"] = ["lm_head"]
    (q_dir / "config.json").write_text(json.dumps(config))
    loaded = load_model(q_dir, device="cpu", linear_backend="emulation", moe_backend="emulation")
    modules = loaded.kernel_report()["modules"]
    assert modules["model.layers.0.mlp.gate"]["scheme"] == "unquantized"
    assert modules["model.layers.0.mlp.experts"]["scheme"] == "fp8-tensor"
    assert modules["lm_head"]["scheme"] == "unquantized"
    from safetensors import safe_open

    with safe_open(str(q_dir / "model.safetensors"), "pt") as f:
        router = f.get_tensor("model.layers.0.mlp.gate.weight").double()
    x = torch.randn(5, router.shape[1], generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        assert _rel_err(loaded.kernel_layers()["model.layers.0.mlp.gate"](x), x.double() @ router.t()) < 1e-6
