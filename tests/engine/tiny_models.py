"""Small randomly initialised Qwen3 / Qwen3-MoE folders for engine tests, and FP8 versions of them.

Models are built and saved by transformers (the reference the engine must match); FP8
checkpoints are written here from `quantgate.kernels.quant` in both formats, with the tensor
names and configs that transformers / vLLM / llm-compressor write.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from quantgate.kernels import Scheme, quant

EOS = "<|endoftext|>"
CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? The answer is 72.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "Betty is saving money for a new wallet which costs $100. #### 5",
] * 4

DENSE = dict(vocab_size=384, hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=512)
MOE = dict(DENSE, intermediate_size=160, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
           norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1])


def write_tokenizer(path: Path, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path / "tokenizer.json"))
    return tok


def write_model(path: Path, moe: bool = False, seed: int = 0, std: float = 0.1, **overrides) -> Path:
    """A float32 transformers checkpoint with its tokenizer; `std` > HF's 0.02 so logits spread."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    fields = dict(MOE if moe else DENSE, **overrides)
    config = (Qwen3MoeConfig if moe else Qwen3Config)(initializer_range=std, eos_token_id=0, **fields)
    torch.manual_seed(seed)
    model = (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(config).float().eval()
    with torch.no_grad():  # norms start at 1; random ones test that each is applied where it belongs
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    write_tokenizer(path, fields["vocab_size"])
    return path


def is_quantizable(name: str) -> bool:
    """Linear weights of the layers; the embeddings, norms, lm_head and the router stay unquantized."""
    return name.endswith("_proj.weight") and ".layers." in name


def quantize_folder(src: Path, dst: Path, scheme: Scheme, fmt: str, static_input: bool = False,
                    ignore: str | None = None, targets: str | None = None, block: tuple[int, int] = (128, 128)) -> Path:
    """Write an FP8 copy of `src` in the native (`fmt="fp8"`) or compressed-tensors format.

    Regexes over module names, compressed-tensors only (its `ignore` and `targets` take "re:"
    entries): `ignore` names modules whose weights stay in the model dtype, listed in the
    config's ignore list; `targets` replaces the config's ["Linear"], and only the modules it
    matches are quantized."""
    if (ignore is not None or targets is not None) and fmt != "compressed-tensors":
        raise ValueError("ignore= and targets= write compressed-tensors 're:' entries; use fmt='compressed-tensors'")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    tensors = load_file(str(src / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    scale_name = "weight_scale_inv" if fmt == "fp8" and scheme is Scheme.FP8_BLOCK else "weight_scale"
    for name, w in tensors.items():
        prefix = name[: -len(".weight")]
        if (not is_quantizable(name) or (ignore is not None and re.match(ignore, prefix))
                or (targets is not None and not re.match(targets, prefix))):
            out[name] = w
            continue
        if scheme is Scheme.FP8_BLOCK:
            q, s = quant.quantize_weight_block(w, block)
        elif scheme is Scheme.FP8_CHANNEL:
            q, s = quant.quantize_weight_channel(w)
        else:
            q, s = quant.quantize_weight_tensor(w)
            s = s.reshape(1) if fmt == "compressed-tensors" else s
        out[name] = q
        out[f"{prefix}.{scale_name}"] = s.to(torch.bfloat16) if fmt == "compressed-tensors" else s
        if static_input:
            out[f"{prefix}.input_scale"] = torch.tensor([0.02], dtype=torch.float32)
    save_file(out, str(dst / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = _native_config(scheme, static_input, block) if fmt == "fp8" else _ct_config(
        scheme, static_input, block)
    if ignore is not None:
        config["quantization_config"]["ignore"].append(f"re:{ignore}")
    if targets is not None:
        config["quantization_config"]["config_groups"]["group_0"]["targets"] = [f"re:{targets}"]
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def _native_config(scheme: Scheme, static_input: bool, block: tuple[int, int]) -> dict:
    qc = {"quant_method": "fp8", "activation_scheme": "static" if static_input else "dynamic",
          "modules_to_not_convert": ["lm_head", "mlp.gate"]}
    if scheme is Scheme.FP8_BLOCK:
        qc["weight_block_size"] = list(block)
    elif scheme is Scheme.FP8_CHANNEL:
        raise ValueError("native FP8 has no per-channel format; use compressed-tensors")
    return qc


def _ct_config(scheme: Scheme, static_input: bool, block: tuple[int, int]) -> dict:
    strategy = {Scheme.FP8_BLOCK: "block", Scheme.FP8_CHANNEL: "channel", Scheme.FP8_TENSOR: "tensor"}[scheme]
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": strategy}
    if scheme is Scheme.FP8_BLOCK:
        weights["block_structure"] = list(block)
        acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "group",
                "group_size": block[1]}
    elif scheme is Scheme.FP8_CHANNEL:
        acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"}
    else:
        acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": not static_input, "strategy": "tensor"}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}},
        "ignore": ["lm_head", "re:.*mlp.gate$"],
    }
