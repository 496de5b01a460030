"""HF `config.json` -> the model facts the engine builds from, and the checkpoint's quantization.

Two FP8 formats are recognised: native (`quant_method: fp8`, as written by transformers'
FineGrainedFP8 and vLLM) and compressed-tensors (`quant_method: compressed-tensors`,
`format: float-quantized`, parsed with the compressed-tensors package). Both reduce to one
`QuantConfig` that answers, per module name, which `Scheme` its weights are stored in.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from quantgate.kernels import Scheme

if TYPE_CHECKING:
    from compressed_tensors.quantization import QuantizationArgs

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
# What transformers' config class of each architecture gives an attention field config.json leaves
# out; an explicit null (or a field missing here) means one KV head per query head and
# hidden_size // num_attention_heads, as its modeling code falls back to.
_ATTENTION_DEFAULTS = {
    "Qwen3ForCausalLM": {"num_key_value_heads": 32, "head_dim": 128},
    "Qwen3MoeForCausalLM": {"num_key_value_heads": 4},
}

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
LINEAR = "Linear"  # the class name of every module a quantization config can quantize here


class ModelConfigError(ValueError):
    """The checkpoint's config.json describes something this engine cannot load."""


def unreadable(path: Path, exc: OSError) -> str:
    """Why the file `path` of a model folder could not be read, and the fix."""
    if isinstance(exc, PermissionError):
        cause = "permission denied: fix its permissions so the user running quantgate can read it"
    elif path.is_symlink() and not path.exists():
        cause = f"it is a symbolic link to {os.readlink(path)}, which does not exist: fix or remove the link"
    elif path.is_dir():
        cause = "it is a directory, not a file: put the file there"
    else:
        cause = f"{exc.strerror or exc}: copy or download it again"
    return f"{path} cannot be read ({cause})"


@dataclass(frozen=True)
class QuantConfig:
    """Which modules are FP8, in which scheme, and under which scale name."""

    scheme: Scheme
    fmt: str  # "fp8" (native) | "compressed-tensors"
    scale_name: str  # weight_scale_inv (native block) | weight_scale
    block_size: tuple[int, int] | None = None
    static_input_scale: bool = False
    ignore: tuple[str, ...] = ()  # module names; entries starting with "re:" are regexes
    # compressed-tensors config_groups targets; native FP8 quantizes every linear
    targets: tuple[str, ...] = (LINEAR,)

    def scheme_for(self, module_name: str) -> Scheme:
        """The scheme of the linear module `module_name` (an expert's projection is one too)."""
        if self.is_ignored(module_name) or not self.is_targeted(module_name):
            return Scheme.UNQUANTIZED
        return self.scheme

    def is_ignored(self, module_name: str) -> bool:
        return any(_matches(module_name, entry) for entry in self.ignore)

    def is_targeted(self, module_name: str) -> bool:
        return any(_is_target(module_name, target) for target in self.targets)


def _is_target(name: str, target: str) -> bool:
    """compressed-tensors' matching of a target to a linear module: a "re:" regex matched (from the
    start) against the module's name or its class name, or a plain module or class name."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None or re.match(target[3:], LINEAR) is not None
    return target in (name, LINEAR)


def _matches(name: str, entry: str) -> bool:
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    # Native configs list bare or partial names ("lm_head", "mlp.gate"); match on dotted boundaries.
    return name == entry or name.startswith(entry + ".") or name.endswith("." + entry) or f".{entry}." in name


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    dtype: torch.dtype  # the checkpoint's dtype for unquantized tensors
    eos_token_ids: tuple[int, ...] = ()
    # Qwen3-MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # transformers' Qwen3MoeConfig default: a config.json without it keeps raw weights
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    quant: QuantConfig | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_moe(self) -> bool:
        return self.architecture == "Qwen3MoeForCausalLM"

    def is_moe_layer(self, index: int) -> bool:
        return (
            self.is_moe
            and self.num_experts > 0
            and index not in self.mlp_only_layers
            and (index + 1) % self.decoder_sparse_step == 0
        )

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype.itemsize

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ModelConfigError(f"{path} has no config.json: pass a Hugging Face model folder")
        try:
            raw = json.loads(config_file.read_text())
        except OSError as exc:
            raise ModelConfigError(unreadable(config_file, exc)) from None
        except json.JSONDecodeError as exc:
            raise ModelConfigError(f"{config_file} is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ModelConfigError(f"{config_file} holds a JSON {type(raw).__name__}, not an object of fields")
        try:
            return cls.from_dict(raw, source=str(config_file), eos_token_ids=_generation_eos(path))
        except ModelConfigError:
            raise
        except (TypeError, ValueError, AttributeError, IndexError) as exc:  # a field of the wrong type
            raise ModelConfigError(f"{config_file}: a field has the wrong type or shape ({type(exc).__name__}: {exc}); "
                                   "compare it with the model's original config.json") from None

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json", eos_token_ids: tuple[int, ...] = ()) -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ModelConfigError(
                f"{source}: architectures {archs} are not supported by the built-in engine "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)}); use `engine: vllm` for other models"
            )

        def need(key: str):
            if key not in raw:
                raise ModelConfigError(f"{source}: missing required field {key!r} for {arch}")
            return raw[key]

        if raw.get("use_sliding_window"):
            raise ModelConfigError(f"{source}: use_sliding_window=true is not supported; set it to false")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ModelConfigError(f"{source}: rope_type {rope_type!r} is not supported (only 'default' RoPE)")
        rope_theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        if raw.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported (only silu)")

        def attention(key: str):
            return raw.get(key, _ATTENTION_DEFAULTS[arch].get(key))

        num_heads = need("num_attention_heads")
        hidden = need("hidden_size")
        dtype_name = raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"
        if dtype_name not in _DTYPES:
            raise ModelConfigError(f"{source}: dtype {dtype_name!r} is not one of {', '.join(_DTYPES)}")
        eos = eos_token_ids or _as_ids(raw.get("eos_token_id"), source)
        moe = {}
        if arch == "Qwen3MoeForCausalLM":
            experts = raw.get("num_experts", raw.get("num_local_experts"))
            if experts is None:
                raise ModelConfigError(f"{source}: missing num_experts (or num_local_experts) for {arch}")
            moe = dict(
                num_experts=int(experts),
                num_experts_per_tok=int(need("num_experts_per_tok")),
                moe_intermediate_size=int(need("moe_intermediate_size")),
                norm_topk_prob=bool(raw.get("norm_topk_prob", False)),  # Qwen3MoeConfig's default
                decoder_sparse_step=int(raw.get("decoder_sparse_step", 1)),
                mlp_only_layers=tuple(raw.get("mlp_only_layers") or ()),
            )
        if moe and not (moe["num_experts"] >= 1 and 1 <= moe["num_experts_per_tok"] <= moe["num_experts"]
                        and moe["moe_intermediate_size"] >= 1):
            raise ModelConfigError(
                f"{source}: num_experts {moe['num_experts']}, num_experts_per_tok {moe['num_experts_per_tok']} and "
                f"moe_intermediate_size {moe['moe_intermediate_size']} must be positive, with num_experts_per_tok "
                "at most num_experts")
        return cls(
            architecture=arch,
            vocab_size=int(need("vocab_size")),
            hidden_size=int(hidden),
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=int(num_heads),
            num_kv_heads=int(attention("num_key_value_heads") or num_heads),
            head_dim=int(attention("head_dim") or hidden // num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            dtype=_DTYPES[dtype_name],
            eos_token_ids=eos,
            quant=parse_quant_config(raw.get("quantization_config"), source),
            raw=raw,
            **moe,
        )


def _as_ids(value, source: str) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ModelConfigError(f"{source}: eos_token_id must be a token id or a list of token ids, got {value!r}")
    return tuple(ids)


def _generation_eos(path: Path) -> tuple[int, ...]:
    """generation_config.json's eos_token_id, which takes precedence over config.json's."""
    gen = path / "generation_config.json"
    if not gen.is_file():
        return ()
    try:
        raw = json.loads(gen.read_text())
    except OSError as exc:
        raise ModelConfigError(unreadable(gen, exc)) from None
    except json.JSONDecodeError as exc:  # its EOS ids would silently be config.json's
        raise ModelConfigError(f"{gen} is not valid JSON: {exc}; fix it or remove the file") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{gen} holds a JSON {type(raw).__name__}, not an object of fields")
    return _as_ids(raw.get("eos_token_id"), str(gen))


def parse_quant_config(qc: dict | None, source: str = "config.json") -> QuantConfig | None:
    if not qc:
        return None
    if not isinstance(qc, dict):
        raise ModelConfigError(f"{source}: quantization_config must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method == "fp8":
        return _parse_native_fp8(qc, source)
    if method == "compressed-tensors":
        return _parse_compressed_tensors(qc, source)
    raise ModelConfigError(
        f"{source}: quantization_config.quant_method {method!r} is not supported "
        "(supported: 'fp8' and 'compressed-tensors' float-quantized FP8)"
    )


def _parse_native_fp8(qc: dict, source: str) -> QuantConfig:
    if qc.get("fmt", "e4m3") != "e4m3":
        raise ModelConfigError(f"{source}: FP8 format {qc['fmt']!r} is not supported (only e4m3)")
    activation = qc.get("activation_scheme", "dynamic")
    if activation not in ("dynamic", "static"):
        raise ModelConfigError(f"{source}: activation_scheme {activation!r} must be 'dynamic' or 'static'")
    ignore = tuple(qc.get("modules_to_not_convert") or ()) + tuple(qc.get("ignored_layers") or ())
    _check_patterns(ignore, f"{source}: quantization_config.modules_to_not_convert / ignored_layers")
    block = qc.get("weight_block_size")
    if block is not None:
        if activation != "dynamic":
            raise ModelConfigError(f"{source}: block FP8 needs activation_scheme 'dynamic', got {activation!r}")
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
            raise ModelConfigError(f"{source}: quantization_config.weight_block_size must be two positive integers "
                                   f"[rows, cols], e.g. [128, 128]; got {block!r}")
        return QuantConfig(Scheme.FP8_BLOCK, "fp8", "weight_scale_inv", (block[0], block[1]), False, ignore)
    return QuantConfig(Scheme.FP8_TENSOR, "fp8", "weight_scale", None, activation == "static", ignore)


def _check_patterns(entries: tuple[str, ...], where: str) -> None:
    """A "re:" entry that is not a regex, refused where it is read (not as re.error while the
    model is built)."""
    for entry in (e for e in entries if isinstance(e, str) and e.startswith("re:")):
        try:
            re.compile(entry[3:])
        except re.error as exc:
            raise ModelConfigError(f"{where} {entry!r} is not a valid regex ({exc}); fix the pattern after "
                                   "'re:'") from None


def _parse_compressed_tensors(qc: dict, source: str) -> QuantConfig:
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStrategy, QuantizationType

    # Parts of a compressed-tensors checkpoint that change what its tensors mean, which the
    # engine does not apply (QuantizationConfig drops them unread): online rotations must be
    # applied to the activations, and a sparse format stores other tensors.
    if qc.get("transform_config"):
        raise ModelConfigError(f"{source}: quantization_config.transform_config (online rotations such as QuIP or "
                               "SpinQuant's Hadamard transforms) is not supported: the built-in engine would serve "
                               "the rotated weights without the rotations; export without transforms")
    sparsity = qc.get("sparsity_config") or {}
    if isinstance(sparsity, dict) and sparsity.get("format", "dense") != "dense":
        raise ModelConfigError(f"{source}: quantization_config.sparsity_config format {sparsity.get('format')!r} is "
                               "not supported (only dense weights); export a dense checkpoint")

    try:
        parsed = QuantizationConfig.model_validate(qc)
    except Exception as exc:  # pydantic's message names the field
        raise ModelConfigError(f"{source}: invalid compressed-tensors quantization_config: {exc}") from None
    if parsed.format not in ("float-quantized", "naive-quantized"):
        raise ModelConfigError(
            f"{source}: compressed-tensors format {parsed.format!r} is not supported (only float-quantized FP8)"
        )
    groups = list(parsed.config_groups.values())
    if len(groups) != 1:
        raise ModelConfigError(f"{source}: {len(groups)} config_groups; only one quantization group is supported")
    group = groups[0]
    targets = tuple(group.targets)
    _check_patterns(targets, f"{source}: quantization_config.config_groups target")
    _check_patterns(tuple(parsed.ignore or ()), f"{source}: quantization_config.ignore")
    w = group.weights
    if w is None or w.type != QuantizationType.FLOAT or w.num_bits != 8:
        raise ModelConfigError(f"{source}: only 8-bit float weights are supported by the built-in engine")
    if not w.symmetric:  # a zero point would be ignored: wrong numbers, so refused
        raise ModelConfigError(f"{source}: asymmetric weights (symmetric: false, with zero points) are not supported; "
                               "FP8 checkpoints are symmetric: re-export with symmetric: true")
    strategies = {
        QuantizationStrategy.BLOCK: Scheme.FP8_BLOCK,
        QuantizationStrategy.CHANNEL: Scheme.FP8_CHANNEL,
        QuantizationStrategy.TENSOR: Scheme.FP8_TENSOR,
    }
    if w.strategy not in strategies:
        raise ModelConfigError(
            f"{source}: weight strategy {getattr(w.strategy, 'value', w.strategy)!r} is not supported "
            "(block, channel or tensor)"
        )
    scheme = strategies[w.strategy]
    block = tuple(w.block_structure) if scheme is Scheme.FP8_BLOCK else None
    act = group.input_activations
    if act is None:  # W8A16: activations stay 16-bit; this scheme's kernels would quantize them
        raise ModelConfigError(f"{source}: config_groups has no input_activations (FP8 weight-only, W8A16): the "
                               "built-in engine serves FP8 checkpoints with FP8 activations (W8A8) and would add "
                               "activation rounding the checkpoint never had; export with FP8 input_activations, "
                               "or serve it with engine: vllm")
    if act.type != QuantizationType.FLOAT or act.num_bits != 8 or not act.symmetric:
        raise ModelConfigError(f"{source}: input_activations must be 8-bit symmetric float (FP8), got "
                               f"{getattr(act.type, 'value', act.type)} {act.num_bits}-bit"
                               f"{'' if act.symmetric else ' asymmetric'}: the built-in engine quantizes activations "
                               "to FP8 only")
    _check_activations_as_served(act, scheme, block, source)
    static = act.dynamic is False  # tensor weights only: the check above refuses static activations elsewhere
    return QuantConfig(scheme, "compressed-tensors", "weight_scale", block, static, tuple(parsed.ignore or ()),
                       targets)


def _check_activations_as_served(act: QuantizationArgs, scheme: Scheme, block: tuple[int, ...] | None, source: str) -> None:
    """The declared input_activations must be the rounding the scheme's kernels apply (what
    engine/quantize.py writes): tensor weights per tensor (dynamic, or static with input_scale),
    channel weights per token, block weights in 1 x block-K groups, both dynamic. Any other
    declaration would be served with activation rounding the checkpoint never had."""
    from compressed_tensors.quantization import QuantizationStrategy

    strategy = getattr(act.strategy, "value", act.strategy)
    if scheme is Scheme.FP8_TENSOR:
        ok = act.strategy == QuantizationStrategy.TENSOR and act.dynamic in (True, False)
        served, fix = "per tensor", "strategy 'tensor', dynamic: true (or false, with input_scale tensors)"
    elif scheme is Scheme.FP8_CHANNEL:
        ok = act.strategy == QuantizationStrategy.TOKEN and act.dynamic is True
        served, fix = "per token, dynamically", "strategy 'token', dynamic: true"
    else:
        group = block[1]
        ok = act.strategy == QuantizationStrategy.GROUP and act.group_size == group and act.dynamic is True
        served = f"per token in 1x{group} groups (the weight block's K), dynamically"
        fix = f"strategy 'group', group_size: {group}, dynamic: true"
    if ok:
        return
    declared = f"strategy {strategy!r}"
    if act.strategy == QuantizationStrategy.GROUP:
        declared += f", group_size: {act.group_size}"
    declared += f", dynamic: {str(act.dynamic).lower() if isinstance(act.dynamic, bool) else repr(act.dynamic)}"
    raise ModelConfigError(
        f"{source}: config_groups input_activations declare {declared} with {scheme.value} weights, but the "
        f"built-in engine quantizes the activations of {scheme.value} weights {served}, so it would serve other "
        f"activation rounding than the checkpoint declares; re-export with input_activations {fix}, as "
        "`quantgate quantize` writes them, or serve it with engine: vllm")
