"""config.json -> ModelConfig / QuantConfig, for both FP8 formats and the errors users can cause."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from quantgate.engine.config import ModelConfig, ModelConfigError, parse_quant_config
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
    assert (cfg.head_dim, cfg.rope_theta, cfg.quant, cfg.is_moe) == (16, 5e5, None, False)


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
