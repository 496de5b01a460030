"""config.json -> ModelConfig / QuantConfig, for both FP8 formats and the errors users can cause."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from quantgate.engine.config import SUPPORTED_ARCHITECTURES, ModelConfig, ModelConfigError, parse_quant_config
from quantgate.kernels import Scheme

BASE = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "dtype": "bfloat16"}


# The activations each weight strategy is served with (what `quantgate quantize` writes).
SERVED_ACTS = {"block": {"strategy": "group", "group_size": 128}, "channel": {"strategy": "token"},
               "tensor": {"strategy": "tensor"}}


def _ct(strategy: str, acts: dict | None = None, **weights) -> dict:
    acts = SERVED_ACTS.get(strategy, {"strategy": "token"}) if acts is None else acts
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"g": {"targets": ["Linear"],
                                    "weights": {"num_bits": 8, "type": "float", "strategy": strategy, **weights},
                                    "input_activations": {"num_bits": 8, "type": "float", "dynamic": True, **acts}}},
            "ignore": ["lm_head", "re:.*mlp\\.gate$"]}


def test_dense_fields_and_defaults():
    cfg = ModelConfig.from_dict(dict(BASE, rope_parameters={"rope_type": "default", "rope_theta": 5e5}))
    assert (cfg.head_dim, cfg.rope_theta, cfg.quant, cfg.is_moe) == (128, 5e5, None, False)


@pytest.mark.parametrize("arch", SUPPORTED_ARCHITECTURES)
@pytest.mark.parametrize("left_out", [(), ("num_key_value_heads",), ("head_dim",), ("num_key_value_heads", "head_dim")])
def test_attention_fields_left_out_or_null_mean_what_they_mean_to_transformers(arch, left_out):
    """Left out, Qwen3Config gives 32 KV heads of 128 and Qwen3MoeConfig 4 KV heads of
    hidden_size // heads; an explicit null means one KV head per query head. Reading either
    otherwise builds projections of other shapes than transformers (and vLLM) build."""
    import transformers

    moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32) if "Moe" in arch else {}
    raw = dict(BASE, architectures=[arch], num_attention_heads=8, head_dim=16, **moe)
    for key in left_out:
        raw.pop(key)
    hf = getattr(transformers, arch.replace("ForCausalLM", "Config")).from_dict(raw)
    hf_head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    cfg = ModelConfig.from_dict(raw)
    assert (cfg.num_kv_heads, cfg.head_dim) == (hf.num_key_value_heads, hf_head_dim)
    null = ModelConfig.from_dict(dict(raw, num_key_value_heads=None, head_dim=None))
    assert (null.num_kv_heads, null.head_dim) == (8, 64 // 8)


def test_moe_layers_follow_sparse_step_and_mlp_only_layers():
    cfg = ModelConfig.from_dict(dict(BASE, architectures=["Qwen3MoeForCausalLM"], num_hidden_layers=4,
                                     num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                     decoder_sparse_step=2, mlp_only_layers=[3]))
    assert cfg.num_experts == 8 and [cfg.is_moe_layer(i) for i in range(4)] == [False, True, False, False]


def test_norm_topk_prob_defaults_as_transformers_and_shipped_moe_models_state_it():
    from transformers import Qwen3MoeConfig

    moe = dict(BASE, architectures=["Qwen3MoeForCausalLM"], num_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=32)
    assert ModelConfig.from_dict(moe).norm_topk_prob is Qwen3MoeConfig().norm_topk_prob is False
    # The default changed from True: every shipped MoE folder must say which it was trained with.
    shipped = Path(__file__).resolve().parents[2] / "models"
    for config in shipped.glob("*moe*/config.json"):
        assert "norm_topk_prob" in json.loads(config.read_text()), config


def test_native_fp8_block_and_tensor():
    block = parse_quant_config({"quant_method": "fp8", "weight_block_size": [128, 128],
                                "activation_scheme": "dynamic", "modules_to_not_convert": ["lm_head", "mlp.gate"]})
    assert (block.scheme, block.scale_name, block.block_size) == (Scheme.FP8_BLOCK, "weight_scale_inv", (128, 128))
    assert block.scheme_for("model.layers.0.mlp.gate") is Scheme.UNQUANTIZED
    assert block.scheme_for("model.layers.0.mlp.gate_proj") is Scheme.FP8_BLOCK
    tensor = parse_quant_config({"quant_method": "fp8", "activation_scheme": "static",
                                 "ignored_layers": ["model.layers.1.self_attn.o_proj"]})
    assert (tensor.scheme, tensor.scale_name, tensor.static_input_scale) == (Scheme.FP8_TENSOR, "weight_scale", True)
    assert tensor.is_ignored("model.layers.1.self_attn.o_proj")
    assert not tensor.is_ignored("model.layers.11.self_attn.o_proj")


def test_native_fp8_block_size_keeps_rows_then_columns():
    """weight_block_size is [rows (N), cols (K)]: a non-square [64, 128] must stay (64, 128), or
    the scales would be read on the wrong grid and the activations grouped by 64."""
    qc = parse_quant_config({"quant_method": "fp8", "weight_block_size": [64, 128], "activation_scheme": "dynamic"})
    assert (qc.scheme, qc.block_size) == (Scheme.FP8_BLOCK, (64, 128))
    cfg = ModelConfig.from_dict(dict(BASE, quantization_config={"quant_method": "fp8", "weight_block_size": [128, 64]}))
    assert cfg.quant.block_size == (128, 64)


def test_regex_ignore_entries_match_from_the_start_as_compressed_tensors_does():
    """A "re:" entry is matched with re.match against the whole module name, as compressed-tensors'
    match_name does: "re:gate" ignores nothing named model.layers..., and a prefix pattern need
    not reach the end of the name. Guards against re.search (ignoring gate_proj everywhere) or
    re.fullmatch semantics."""
    from compressed_tensors.utils.match import match_name

    names = ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.gate", "gate", "lm_head",
             "model.layers.10.self_attn.o_proj"]
    entries = ["re:gate", r"re:model\.layers\.0\.mlp\.gate", r"re:.*mlp\.gate$", r"re:.*\.1\.", "re:lm_"]
    for entry in entries:
        qc = parse_quant_config({"quant_method": "fp8", "activation_scheme": "dynamic",
                                 "modules_to_not_convert": [entry]})
        for name in names:
            assert qc.is_ignored(name) is match_name(name, entry), (entry, name)
    qc = parse_quant_config({**_ct("channel"), "ignore": ["re:gate", r"re:model\.layers\.0\.mlp\.gate"]})
    assert not qc.is_ignored("model.layers.1.mlp.gate_proj")  # "gate" is not at the start
    assert qc.is_ignored("model.layers.0.mlp.gate_proj")  # a prefix matches: the pattern need not end the name
    assert qc.is_ignored("gate_up")


@pytest.mark.parametrize("strategy,scheme", [("block", Scheme.FP8_BLOCK), ("channel", Scheme.FP8_CHANNEL),
                                             ("tensor", Scheme.FP8_TENSOR)])
def test_compressed_tensors_strategies_and_regex_ignore(strategy, scheme):
    extra = {"block_structure": [128, 128]} if strategy == "block" else {}
    qc = parse_quant_config(_ct(strategy, **extra))
    assert (qc.scheme, qc.scale_name, qc.fmt) == (scheme, "weight_scale", "compressed-tensors")
    assert qc.is_ignored("model.layers.3.mlp.gate") and not qc.is_ignored("model.layers.3.mlp.gate_proj")


def _targeted(targets: list[str]) -> dict:
    qc = _ct("channel")
    qc["config_groups"]["g"]["targets"] = targets
    return qc


def test_compressed_tensors_targets_match_as_compressed_tensors_does():
    linear = "model.layers.0.self_attn.q_proj"
    expert = "model.layers.0.mlp.experts.3.down_proj"
    for every in (["Linear"], ["re:.*Linear"]):  # the class name of every linear module
        qc = parse_quant_config(_targeted(every))
        assert qc.scheme_for(linear) is qc.scheme_for(expert) is Scheme.FP8_CHANNEL
    qc = parse_quant_config(_targeted(["re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"]))
    assert (qc.scheme_for(linear), qc.scheme_for(expert)) == (Scheme.UNQUANTIZED, Scheme.FP8_CHANNEL)
    assert qc.scheme_for("model.layers.0.mlp.gate") is Scheme.UNQUANTIZED  # ignored, and not targeted
    qc = parse_quant_config(_targeted([linear, "Embedding"]))  # plain names: exact module or class names
    assert qc.scheme_for(linear) is Scheme.FP8_CHANNEL
    assert qc.scheme_for("model.layers.0.self_attn.k_proj") is qc.scheme_for(expert) is Scheme.UNQUANTIZED
    with pytest.raises(ModelConfigError, match=re.escape("config_groups target 're:(gate' is not a valid regex")):
        parse_quant_config(_targeted(["re:(gate"]))


def _act(**changes) -> dict:
    qc = _ct("channel")
    qc["config_groups"]["g"]["input_activations"] = (None if changes.get("none") else
                                                     {**qc["config_groups"]["g"]["input_activations"], **changes})
    return qc


@pytest.mark.parametrize("qc, message", [
    # what a producer wrote that the engine would otherwise serve with other numbers, silently
    (_act(none=True), "no input_activations (FP8 weight-only, W8A16)"),
    (_act(type="int"), "input_activations must be 8-bit symmetric float (FP8), got int 8-bit"),
    (_act(num_bits=4), "got float 4-bit"),
    (_act(symmetric=False), "asymmetric"),
    (_act(strategy="group", group_size=128), "input_activations declare strategy 'group', group_size: 128, "
                                             "dynamic: true with fp8-channel weights"),
    ({**_ct("channel"), "transform_config": {"config_groups": {"u": {"type": "hadamard", "apply": []}}}},
     "transform_config (online rotations"),
    ({**_ct("channel"), "sparsity_config": {"format": "sparse-24-bitmask"}},
     "sparsity_config format 'sparse-24-bitmask' is not supported"),
    ({**_ct("channel"), "ignore": ["lm_head", "re:(["]}, "quantization_config.ignore 're:([' is not a valid regex"),
    ({"quant_method": "fp8", "modules_to_not_convert": ["re:(["]}, "modules_to_not_convert / ignored_layers 're:(['"),
])
def test_compressed_tensors_parts_the_engine_would_ignore_are_refused(qc, message):
    with pytest.raises(ModelConfigError, match=re.escape(message)):
        parse_quant_config(qc)


BLOCK = {"block_structure": [128, 128]}


@pytest.mark.parametrize("weights, acts, declared, served, fix", [
    # Each was accepted and then served with the scheme's own rounding, not the declared one.
    ({"strategy": "tensor"}, {"strategy": "token"}, "strategy 'token', dynamic: true", "per tensor",
     "strategy 'tensor', dynamic: true (or false, with input_scale tensors)"),
    ({"strategy": "channel"}, {"strategy": "tensor"}, "strategy 'tensor', dynamic: true", "per token, dynamically",
     "strategy 'token', dynamic: true"),
    ({"strategy": "channel"}, {"strategy": "tensor", "dynamic": False}, "strategy 'tensor', dynamic: false",
     "per token, dynamically", "strategy 'token', dynamic: true"),
    ({"strategy": "block", **BLOCK}, {"strategy": "token"}, "strategy 'token', dynamic: true",
     "per token in 1x128 groups (the weight block's K), dynamically",
     "strategy 'group', group_size: 128, dynamic: true"),
    ({"strategy": "block", **BLOCK}, {"strategy": "tensor", "dynamic": False}, "strategy 'tensor', dynamic: false",
     "in 1x128 groups", "group_size: 128"),
    ({"strategy": "block", **BLOCK}, {"strategy": "group", "group_size": 64},
     "strategy 'group', group_size: 64, dynamic: true",
     "in 1x128 groups", "group_size: 128"),
    ({"strategy": "block", "block_structure": [128, 64]}, {"strategy": "group", "group_size": 128},
     "strategy 'group', group_size: 128, dynamic: true", "in 1x64 groups (the weight block's K)", "group_size: 64"),
])
def test_activations_other_than_the_served_ones_are_refused(weights, acts, declared, served, fix):
    qc = _ct(acts=acts, **weights)
    with pytest.raises(ModelConfigError) as info:
        parse_quant_config(qc)
    message = str(info.value)
    assert f"config_groups input_activations declare {declared}" in message
    assert served in message and fix in message and "or serve it with engine: vllm" in message


@pytest.mark.parametrize("weights, acts, static", [
    ({"strategy": "tensor"}, {"strategy": "tensor"}, False),
    ({"strategy": "tensor"}, {"strategy": "tensor", "dynamic": False}, True),
    ({"strategy": "channel"}, {"strategy": "token"}, False),
    ({"strategy": "block", **BLOCK}, {"strategy": "group", "group_size": 128}, False),
    ({"strategy": "block", "block_structure": [64, 64]}, {"strategy": "group", "group_size": 64}, False),
])
def test_the_served_activations_are_accepted(weights, acts, static):
    assert parse_quant_config(_ct(acts=acts, **weights)).static_input_scale is static


def test_every_shipped_checkpoint_config_parses():
    shipped = sorted((Path(__file__).resolve().parents[2] / "models").glob("*/config.json"))
    assert sum(1 for c in shipped if c.parent.name.endswith("-ct")) == 6
    for config in shipped:
        ModelConfig.from_pretrained(config.parent)


def test_what_quantize_writes_still_parses():
    for fields in ({"transform_config": {}, "sparsity_config": {}}, {"sparsity_config": {"format": "dense"}}):
        assert parse_quant_config({**_ct("channel"), **fields}).scheme is Scheme.FP8_CHANNEL


@pytest.mark.parametrize("change,message", [
    ({"architectures": ["MistralForCausalLM"]}, "not supported by the built-in engine"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"dtype": "int8"}, "dtype 'int8'"),
    ({"quantization_config": {"quant_method": "awq"}}, "quant_method 'awq'"),
    ({"quantization_config": _ct("group", group_size=128)}, "weight strategy 'group'"),
    ({"vocab_size": None}, None),
])
def test_unsupported_configs_name_the_field(change, message):
    raw = {k: v for k, v in dict(BASE, **change).items() if v is not None}
    with pytest.raises(ModelConfigError, match=message or "missing required field 'vocab_size'"):
        ModelConfig.from_dict(raw)


def deny_reading(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Reading files called `name` fails as it does without read permission (the tests run as root,
    which chmod 000 does not stop)."""
    read_text = Path.read_text

    def read(self: Path, *args, **kwargs) -> str:
        if self.name == name:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read)


def _folder(path: Path, generation: str) -> Path:
    (path / "config.json").write_text(json.dumps(dict(BASE, eos_token_id=2)))
    (path / "generation_config.json").write_text(generation)
    return path


@pytest.mark.parametrize("generation,message", [
    ('{"eos_token_id": "x"}', "generation_config.json: eos_token_id must be a token id or a list of token ids, got 'x'"),
    ('{"eos_token_id": [1, "2"]}', "generation_config.json: eos_token_id must be a token id"),
    ("[1]", "generation_config.json holds a JSON list, not an object of fields"),
    ('{"eos_token_id": [5, 7],}', "generation_config.json is not valid JSON"),  # else config.json's EOS, silently
])
def test_a_bad_generation_config_is_named_not_config_json(tmp_path, generation, message):
    with pytest.raises(ModelConfigError, match=re.escape(message)):
        ModelConfig.from_pretrained(_folder(tmp_path, generation))


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_an_unreadable_file_is_named_with_its_cause(tmp_path, monkeypatch, name):
    folder = _folder(tmp_path, '{"eos_token_id": 1}')
    assert ModelConfig.from_pretrained(folder).eos_token_ids == (1,)
    deny_reading(monkeypatch, name)
    with pytest.raises(ModelConfigError, match=re.escape(f"{folder / name} cannot be read (permission denied: fix its "
                                                         "permissions")):
        ModelConfig.from_pretrained(folder)


def test_fields_a_config_json_leaves_out_default_as_transformers_does():
    """A field missing from config.json must mean what it means to transformers (the reference
    the engine must match), or the engine serves another model than the checkpoint's."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    hf = Qwen3Config()
    cfg = ModelConfig.from_dict(BASE)
    hf_theta = getattr(hf, "rope_parameters", None) or {"rope_theta": hf.rope_theta}
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings, cfg.tie_word_embeddings,
            cfg.attention_bias) == (hf_theta["rope_theta"], hf.rms_norm_eps, hf.max_position_embeddings,
                                    hf.tie_word_embeddings, hf.attention_bias)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings) == (10000.0, 1e-6, 32768)
    assert (cfg.tie_word_embeddings, cfg.attention_bias) == (False, False)
    moe = ModelConfig.from_dict(dict(BASE, architectures=["Qwen3MoeForCausalLM"], num_experts=8,
                                     num_experts_per_tok=2, moe_intermediate_size=32))
    hf_moe = Qwen3MoeConfig()
    assert (moe.decoder_sparse_step, list(moe.mlp_only_layers)) == (hf_moe.decoder_sparse_step,
                                                                     hf_moe.mlp_only_layers) == (1, [])
    assert ModelConfig.from_dict(dict({k: v for k, v in BASE.items() if k != "dtype"}, torch_dtype="float32")).dtype \
        is torch.float32  # the older name of `dtype`
    assert ModelConfig.from_dict(dict(BASE, quantization_config={})).quant is None
    assert ModelConfig.from_dict(dict(BASE, architectures=["Qwen3Model", "Qwen3ForCausalLM"])).architecture == \
        "Qwen3ForCausalLM"


@pytest.mark.parametrize("entry, ignored, kept", [
    ("lm_head", ["lm_head", "lm_head.sub"], ["lm_head_x", "xlm_head", "model.xlm_head", "lm_head_x.sub"]),
    ("mlp.gate", ["model.layers.0.mlp.gate"], ["model.layers.0.mlp.gate_proj", "model.layers.0.xmlp.gate",
                                               "model.layers.0.mlp.gate_up_proj"]),
    ("self_attn", ["model.layers.0.self_attn.o_proj"], ["model.layers.0.self_attn_x.o_proj",
                                                        "model.layers.0.xself_attn.o_proj"]),
])
def test_native_ignore_entries_match_whole_dotted_name_parts(entry, ignored, kept):
    """A bare or partial name in modules_to_not_convert matches whole dotted parts of the module
    name: "lm_head" must not leave "lm_head_x" or "xlm_head" unquantized (their FP8 tensors would be
    refused, or worse, read as plain weights)."""
    for key in ("modules_to_not_convert", "ignored_layers"):
        qc = parse_quant_config({"quant_method": "fp8", "activation_scheme": "dynamic", key: ["other", entry]})
        assert [qc.is_ignored(n) for n in ignored] == [True] * len(ignored), (key, entry)
        assert [qc.is_ignored(n) for n in kept] == [False] * len(kept), (key, entry)
        assert qc.scheme_for(kept[0]) is Scheme.FP8_TENSOR and qc.scheme_for(ignored[0]) is Scheme.UNQUANTIZED


@pytest.mark.parametrize("change, message", [
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "config.json: rope_type 'yarn' is not supported (only 'default'"),
    ({"hidden_act": "gelu"}, "config.json: hidden_act 'gelu' is not supported (only silu)"),
    ({"eos_token_id": [1, True]}, "config.json: eos_token_id must be a token id or a list of token ids, got [1, True]"),
    ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}},
     "config.json: block FP8 needs activation_scheme 'dynamic', got 'static'"),
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}}, "FP8 format 'e5m2' is not supported (only e4m3)"),
    ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "per-token"}},
     "activation_scheme 'per-token' must be 'dynamic' or 'static'"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 128]}},
     "weight_block_size must be two positive integers [rows, cols], e.g. [128, 128]; got [0, 128]"),
    ({"quantization_config": {**_ct("channel"), "config_groups": {}}},
     "config.json: 0 config_groups; only one quantization group is supported"),
    ({"quantization_config": {**_ct("channel"), "format": "pack-quantized"}},
     "compressed-tensors format 'pack-quantized' is not supported (only float-quantized FP8)"),
    ({"quantization_config": _ct("channel", num_bits=4)}, "only 8-bit float weights are supported"),
    ({"quantization_config": {**_ct("channel"), "sparsity_config": {"format": "sparse-bitmask"}}},
     "sparsity_config format 'sparse-bitmask' is not supported"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 2, "num_experts_per_tok": 3,
      "moe_intermediate_size": 32}, "num_experts 2, num_experts_per_tok 3 and moe_intermediate_size 32 must be"),
])
def test_configs_the_engine_would_serve_wrongly_are_refused_with_the_field(change, message):
    with pytest.raises(ModelConfigError, match=re.escape(message)):
        ModelConfig.from_dict(dict(BASE, **change))


def test_compressed_tensors_block_structure_keeps_rows_then_columns():
    qc = parse_quant_config(_ct("block", acts={"strategy": "group", "group_size": 128}, block_structure=[64, 128]))
    assert (qc.scheme, qc.block_size) == (Scheme.FP8_BLOCK, (64, 128))


def test_a_folder_without_config_json_is_named(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelConfigError, match=re.escape(f"{tmp_path} has no config.json: pass a Hugging Face model "
                                                         "folder")):
        ModelConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match=re.escape(f"{tmp_path / 'config.json'} holds a JSON list, not an "
                                                         "object of fields")):
        ModelConfig.from_pretrained(tmp_path)


def test_a_field_of_the_wrong_type_in_config_json_is_named_not_a_traceback(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(BASE, rope_scaling="yarn")))
    with pytest.raises(ModelConfigError, match=re.escape(f"{tmp_path / 'config.json'}: a field has the wrong type or "
                                                         "shape (AttributeError: ")):
        ModelConfig.from_pretrained(tmp_path)
