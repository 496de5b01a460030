"""`load_model`: HF folder -> model on the kernel layer, with its kernel report and reload.

Kernels are selected while the model is built, before any weight is read, so a strict
`--linear-backend` / `--moe-backend` that cannot serve a layer fails at once with every
candidate's reason. `--linear-backend` applies to the linears stored in the checkpoint's
scheme; linears an FP8 checkpoint leaves unquantized (lm_head, the MoE router, ignored
modules) select with `auto`, since every FP8 checkpoint has some (lm_head) and a weight-only
backend could otherwise never serve one. `--moe-backend` applies to every MoE layer, whatever
its scheme: no MoE layer is unquantized by convention, so experts an FP8 checkpoint leaves
unquantized run on the requested backend or fail to load with its reasons, as a bf16
checkpoint's do (SPEC section 7: an explicit backend is strict, never a silent fallback).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn

from quantgate.kernels import (
    LINEAR_BACKENDS,
    MOE_BACKENDS,
    LinearLayerConfig,
    MoELayerConfig,
    Platform,
    Scheme,
    Selection,
    normalize_backend,
    select_linear_kernel,
    select_moe_kernel,
)

from .checkpoint import FUSED_EXPERT_SUFFIXES, Checkpoint, CheckpointError, fused_experts_advice
from .config import ModelConfig, ModelConfigError, QuantConfig, unreadable
from .layers import FusedMoE, KernelLayer, QuantLinear, RMSNorm
from .model import Qwen3ForCausalLM

logger = logging.getLogger("quantgate.engine")

DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
_ALWAYS_UNQUANTIZED = ("lm_head", ".mlp.gate")  # suffixes: vLLM keeps these unquantized too
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_MODEL_PREFIXES = ("model.layers.", "model.embed_tokens.", "model.norm.", "lm_head.")  # this architecture's modules
# Scales of an FP8 KV cache (llm-compressor's kv_cache_scheme): this engine keeps the cache in the
# model dtype, where they mean nothing, as vLLM's does with --kv-cache-dtype auto.
_KV_CACHE_SCALES = (".k_scale", ".v_scale", ".q_scale", ".prob_scale", ".kv_scale", "k_proj.output_scale",
                    "v_proj.output_scale")
# Projections of one input that run as one GEMM (engine module name -> checkpoint modules).
MERGED_PROJECTIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def resolve_dtype(requested: str | torch.dtype, checkpoint_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(requested, torch.dtype):
        return requested
    name = requested.strip().lower()
    if name == "auto":
        if device.type == "cpu" and checkpoint_dtype == torch.float16:
            logger.info("--dtype auto: float16 checkpoint runs in bfloat16 on CPU (float16 matmuls are slow there)")
            return torch.bfloat16
        return checkpoint_dtype
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown --dtype {requested!r}; use auto, {', '.join(DTYPE_NAMES)}")
    return DTYPE_NAMES[name]


@dataclass
class LoadedModel:
    model: Qwen3ForCausalLM
    tokenizer: Tokenizer | None  # None when the folder ships no tokenizer.json
    model_config: ModelConfig
    path: Path
    platform: Platform
    device: torch.device
    dtype: torch.dtype

    def kernel_layers(self) -> dict[str, KernelLayer]:
        return {m.module_name: m for m in self.model.modules() if isinstance(m, KernelLayer)}

    def kernel_report(self) -> dict:
        """The body of `GET /v1/kernels` (SPEC section 5)."""
        return {
            "platform": self.platform.to_dict(),
            "modules": {name: layer.report() for name, layer in self.kernel_layers().items()},
        }

    @torch.inference_mode()
    def reload_weights(self) -> None:
        """Re-read the weights from disk into the storage every buffer already has. Every tensor
        is checked before any is overwritten (the files are read twice): a bad file leaves the
        served weights as they were, not half replaced."""
        self._check_config_unchanged()
        with Checkpoint(self.path) as ckpt:
            _load_weights(self.model, ckpt, self.model_config, check_only=True)
            _load_weights(self.model, ckpt, self.model_config)
        try:
            for layer in self.kernel_layers().values():
                layer.process_weights()
        except ValueError as exc:  # e.g. scales marlin cannot hold in fp16: after the new weights were written
            raise WeightsPartlyReloaded(f"{exc}; some layers already hold the new weights") from exc
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        logger.info("Reloaded weights from %s", self.path)

    def _check_config_unchanged(self) -> None:
        """The model, its kernels and their scheme were built from the config.json read at start; a
        reload swaps weights only. A folder re-exported in another format would otherwise fail on its
        scale names or shapes, with advice (re-export, fix the config) for a checkpoint that is fine."""
        changes = _config_changes(self.model_config, ModelConfig.from_pretrained(self.path))
        if changes:
            raise ConfigChanged(
                f"{self.path / 'config.json'}: the checkpoint's config changed since the server started "
                f"({'; '.join(changes)}); restart the server to serve the new format (reload only swaps weights of "
                "the same format and shapes)")


# ModelConfig fields under their config.json names, for messages.
_CONFIG_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                "num_kv_heads": "num_key_value_heads", "eos_token_ids": "eos_token_id", "architecture": "architectures",
                "quant": "quantization_config"}


def _config_changes(served: ModelConfig, now: ModelConfig) -> list[str]:
    """What differs between the config the model was built from and config.json now, as "field: old ->
    new". The dtype is left out: the served one was chosen at start (--dtype) and new weights are cast
    to it, as the first ones were."""
    changes = []
    for field in dataclasses.fields(ModelConfig):
        old, new = getattr(served, field.name), getattr(now, field.name)
        if field.name == "quant":  # the same modules ignored and targeted, listed in another order
            old, new = _unordered(old), _unordered(new)
        if not field.compare or field.name == "dtype" or old == new:
            continue
        if field.name == "quant":
            old, new = _describe_quant(old), _describe_quant(new)
            if old == new:
                old, new = "its ignore list or targets", "others"
        changes.append(f"{_CONFIG_KEYS.get(field.name, field.name)}: {old} -> {new}")
    return changes


def _unordered(quant: QuantConfig | None) -> QuantConfig | None:
    return quant and dataclasses.replace(quant, ignore=tuple(sorted(set(quant.ignore))),
                                         targets=tuple(sorted(set(quant.targets))))


def _describe_quant(quant: QuantConfig | None) -> str:
    if quant is None:
        return "unquantized"
    described = f"{'native' if quant.fmt == 'fp8' else quant.fmt} {quant.scheme.value} with `{quant.scale_name}` scales"
    if quant.block_size:
        described += f" in {quant.block_size[0]}x{quant.block_size[1]} blocks"
    return described + (", static activations" if quant.static_input_scale else "")


class ConfigChanged(CheckpointError):
    """config.json no longer describes the served model: only a restart can serve it."""


class WeightsPartlyReloaded(RuntimeError):
    """A reload failed after it overwrote weights: the model serves a mix until restarted."""


def plan_kernels(
    path: str | Path,
    platform: Platform,
    *,
    dtype: str | torch.dtype = "auto",
    linear_backend: str = "auto",
    moe_backend: str = "auto",
) -> list[tuple[str, Selection]]:
    """Every kernel layer of the checkpoint at `path` with its selection on `platform` (detected or
    described), as `load_model` would make them: the checkpoint's own shapes, schemes and dtype. Reads
    config.json only; the layers are built on the meta device. Selections without a kernel are
    returned with their error, not raised."""
    path = Path(path)
    linear_backend = normalize_backend(linear_backend, LINEAR_BACKENDS, "--linear-backend")
    moe_backend = normalize_backend(moe_backend, MOE_BACKENDS, "--moe-backend")
    cfg = ModelConfig.from_pretrained(path)
    cfg = dataclasses.replace(cfg, dtype=resolve_dtype(dtype, cfg.dtype, torch.device(platform.device)))
    factory = _LayerFactory(cfg, platform, torch.device("meta"), linear_backend, moe_backend, plan=True)
    Qwen3ForCausalLM(cfg, torch.device("meta"), factory)
    return factory.selections


def load_model(
    path: str | Path,
    *,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    linear_backend: str = "auto",
    moe_backend: str = "auto",
) -> LoadedModel:
    path = Path(path)
    platform = Platform.detect(device)
    torch_device = torch.device(platform.device)
    linear_backend = normalize_backend(linear_backend, LINEAR_BACKENDS, "--linear-backend")
    moe_backend = normalize_backend(moe_backend, MOE_BACKENDS, "--moe-backend")
    cfg = ModelConfig.from_pretrained(path)
    act_dtype = resolve_dtype(dtype, cfg.dtype, torch_device)
    cfg = dataclasses.replace(cfg, dtype=act_dtype)
    factory = _LayerFactory(cfg, platform, torch_device, linear_backend, moe_backend)
    with torch.inference_mode():
        model = Qwen3ForCausalLM(cfg, torch_device, factory)
        with Checkpoint(path) as ckpt:
            _load_weights(model, ckpt, cfg)
        for module in model.modules():
            if isinstance(module, KernelLayer):
                module.process_weights()
    model.eval()
    quant = cfg.quant
    logger.info(
        "Loaded %s (%s, %s, %s) on %s", path, cfg.architecture,
        "unquantized" if quant is None else f"{quant.fmt} {quant.scheme.value}", act_dtype, platform.device,
    )
    return LoadedModel(model, _load_tokenizer(path), cfg, path, platform, torch_device, act_dtype)


class _LayerFactory:
    """Builds the kernel layers, selecting each one's kernel. `plan`: record every selection in
    `selections` and bind the ones that found a kernel, instead of failing at the first that did
    not (`plan_kernels`)."""

    def __init__(self, cfg: ModelConfig, platform: Platform, device: torch.device, linear_backend: str,
                 moe_backend: str, plan: bool = False) -> None:
        self.cfg, self.platform, self.device = cfg, platform, device
        self.linear_backend, self.moe_backend = linear_backend, moe_backend
        self.checkpoint_scheme = cfg.quant.scheme if cfg.quant else Scheme.UNQUANTIZED
        self.plan = plan
        self.selections: list[tuple[str, Selection]] = []

    def _bind(self, layer: KernelLayer, selection: Selection) -> None:
        self.selections.append((layer.module_name, selection))
        if not self.plan or selection.kernel is not None:
            layer.bind_kernel(selection)

    def _scheme(self, name: str) -> Scheme:
        if self.cfg.quant is None or name.endswith(_ALWAYS_UNQUANTIZED):
            return Scheme.UNQUANTIZED
        return self.cfg.quant.scheme_for(name)

    def _requested_linear(self, scheme: Scheme) -> str:
        return self.linear_backend if scheme is self.checkpoint_scheme else "auto"  # see the module docstring

    def _expert_scheme(self, name: str) -> Scheme:
        """The one scheme of every projection of every expert of the MoE layer `name`: its experts
        run stacked in one kernel, so a config (targets, ignore list) that splits them is refused."""
        first: dict[Scheme, str] = {}
        for e in range(self.cfg.num_experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                first.setdefault(self._scheme(f"{name}.{e}.{proj}"), f"{name}.{e}.{proj}")
        if len(first) > 1:
            found = ", ".join(f"{module} is {scheme.value}" for scheme, module in first.items())
            raise ModelConfigError(
                f"config.json's quantization_config quantizes some expert projections of {name} and not others "
                f"({found}); its experts run stacked in one kernel and one scheme: make the config's targets and "
                "ignore list cover all of them or none")
        return next(iter(first))

    def _quant_fields(self, scheme: Scheme) -> dict:
        q = self.cfg.quant
        if not scheme.is_fp8:
            return {}
        return dict(block_size=q.block_size, scale_name=q.scale_name, static_input_scale=q.static_input_scale)

    def linear(self, name: str, in_features: int, out_features: int, bias: bool,
               shards: tuple[tuple[str, int], ...] = ()) -> QuantLinear:
        scheme = self._scheme(shards[0][0] if shards else name)
        config = LinearLayerConfig(in_features, out_features, scheme, self.cfg.dtype, has_bias=bias,
                                   **self._quant_fields(scheme))
        layer = QuantLinear(name, config, self.device, shards)
        self._bind(layer, select_linear_kernel(self.platform, config, self._requested_linear(scheme)))
        return layer

    def merged_linear(self, prefix: str, name: str, in_features: int, sizes: tuple[int, ...],
                      bias: bool) -> QuantLinear | None:
        """One GEMM for the projections MERGED_PROJECTIONS[name] of one input (vLLM's qkv_proj and
        gate_up_proj): at batch 1 each GEMM is a weight stream with a fixed cost, and q/k/v alone
        are three. Only where the checkpoint's tensors concatenate exactly: one scheme for all
        parts, no per-tensor or static input scales (one per part), block scales whole per part."""
        names = tuple(f"{prefix}.{part}" for part in MERGED_PROJECTIONS[name])
        schemes = {self._scheme(n) for n in names}
        if len(schemes) != 1:
            return None
        scheme = schemes.pop()
        if scheme is Scheme.FP8_TENSOR or (scheme.is_fp8 and self.cfg.quant.static_input_scale):
            return None
        if scheme is Scheme.FP8_BLOCK and any(rows % self.cfg.quant.block_size[0] for rows in sizes):
            return None
        return self.linear(f"{prefix}.{name}", in_features, sum(sizes), bias, tuple(zip(names, sizes)))

    def moe(self, name: str) -> FusedMoE:
        cfg = self.cfg
        scheme = self._expert_scheme(name)
        config = MoELayerConfig(cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size, cfg.moe_intermediate_size,
                                scheme, cfg.dtype, renormalize=cfg.norm_topk_prob, **self._quant_fields(scheme))
        layer = FusedMoE(name, config, self.device)
        self._bind(layer, select_moe_kernel(self.platform, config, self.moe_backend))  # whatever the scheme
        return layer


def _load_weights(model: Qwen3ForCausalLM, ckpt: Checkpoint, cfg: ModelConfig, check_only: bool = False) -> None:
    """Every tensor the model needs from `ckpt` into its module; `check_only`: check them all and
    store nothing."""
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        if name not in ckpt:
            raise CheckpointError(ckpt.missing(name, _missing_cause(name, ckpt, cfg)))
        return ckpt.get(name)

    def put(module: KernelLayer, attr: str, tensor: torch.Tensor, source: str) -> None:
        (module.check_raw if check_only else module.set_raw)(attr, tensor, source)

    for name, module in model.named_modules():
        if isinstance(module, QuantLinear) and module.shards:
            for attr in module.raw_specs():
                keys = [f"{shard}.{attr}" for shard, _ in module.shards]
                parts = [take(key) for key in keys]
                if attr not in ("weight", "bias"):  # scales: block rows, or channel rows saved as [N] or [N, 1]
                    parts = [_as_rows(part) for part in parts]
                put(module, attr, _joined(torch.cat, parts, " + ".join(keys)), " + ".join(keys))
        elif isinstance(module, QuantLinear):
            for attr in module.raw_specs():
                key = f"{name}.{attr}"
                if name == "lm_head" and attr == "weight" and key not in ckpt and cfg.tie_word_embeddings:
                    put(module, attr, model.model.embed_tokens.weight, "model.embed_tokens.weight (tied)")
                else:
                    put(module, attr, take(key), key)
        elif isinstance(module, FusedMoE):
            fused = [f"{name}.{suffix.split('.')[-1]}" for suffix in FUSED_EXPERT_SUFFIXES]
            if any(key in ckpt for key in fused):
                raise CheckpointError(f"{ckpt.path} {fused_experts_advice(next(k for k in fused if k in ckpt))}")
            for attr, tensor in _stacked_experts(module, take).items():
                put(module, attr, tensor, f"{name}.*")
        elif isinstance(module, (RMSNorm, nn.Embedding)):
            key = f"{name}.weight"
            _copy_checked(module.weight, take(key), key, check_only)
    foreign = _check_unused(sorted(set(ckpt.names()) - used), ckpt, cfg)
    if foreign and not check_only:
        logger.warning("%d checkpoint tensors are not used (other heads, rotary buffers, FP8 KV-cache scales: the "
                       "cache stays in the model dtype), e.g. %s", len(foreign), ", ".join(foreign[:5]))


def _missing_cause(name: str, ckpt: Checkpoint, cfg: ModelConfig) -> str:
    """What config.json asks for that makes the model read a tensor the checkpoint lacks, and the fix,
    where the config explains it: static activations' input scales, an untied lm_head."""
    if name.endswith(".input_scale"):  # read only when the config says activations are static
        native = cfg.quant.fmt == "fp8"
        field = "activation_scheme: static" if native else "input_activations with dynamic: false"
        fix = "activation_scheme: dynamic" if native else "dynamic: true"
        if any(n.endswith(".input_scale") for n in ckpt.names()):
            return (f"config.json's quantization_config has static activations ({field}), which need an input_scale "
                    "for every quantized linear, and other linears have one: re-export the checkpoint with all of "
                    f"them (or set {fix} to compute activation scales at run time)")
        return (f"config.json's quantization_config has static activations ({field}), which need an input_scale for "
                "every quantized linear, and the checkpoint has none (it was quantized for dynamic activations): "
                f"set {fix}")
    if name == "lm_head.weight" and not cfg.tie_word_embeddings:
        said = "tie_word_embeddings: false" if "tie_word_embeddings" in cfg.raw else "no tie_word_embeddings (false)"
        return (f"config.json has {said}, so lm_head needs a weight of its own; if the model ties lm_head to the "
                "embeddings (transformers then saves no lm_head.weight), set tie_word_embeddings: true")
    return ""


def _check_unused(unused: list[str], ckpt: Checkpoint, cfg: ModelConfig) -> list[str]:
    """Refuses the tensors the model would silently drop that config.json should have described (a
    layer beyond num_hidden_layers, a bias or scale it does not read); returns the foreign rest
    (another head such as mtp or vision, precomputed rotary buffers, KV-cache scales), which vLLM
    skips too."""
    beyond = [n for n in unused if (m := _LAYER.match(n)) and int(m[1]) >= cfg.num_layers]
    if beyond:
        layers = sorted({int(_LAYER.match(n)[1]) for n in beyond})
        raise CheckpointError(
            f"{ckpt.path}: the checkpoint has tensors of layers {', '.join(map(str, layers))} (e.g. {beyond[0]}), "
            f"beyond the {cfg.num_layers} layers config.json's num_hidden_layers gives; a model without layers it was "
            "trained with computes wrong outputs: fix num_hidden_layers or remove those layers' tensors")
    ours = [n for n in unused if n.startswith(_MODEL_PREFIXES) and ".rotary_emb." not in n
            and not n.endswith(_KV_CACHE_SCALES)]
    if ours:
        raise CheckpointError(
            f"{ckpt.path}: {len(ours)} tensors of this model's modules are not read by it: {', '.join(ours[:5])}"
            f"{', ...' if len(ours) > 5 else ''}; config.json does not describe them (attention_bias, "
            "quantization_config's scheme or activation_scheme, the MoE layers): fix config.json or remove them")
    return [n for n in unused if n not in ours]


def _copy_checked(param: torch.Tensor, tensor: torch.Tensor, key: str, check_only: bool = False) -> None:
    if tuple(tensor.shape) != tuple(param.shape):
        raise CheckpointError(f"{key}: shape {tuple(tensor.shape)} does not match {tuple(param.shape)} (config.json)")
    if not tensor.dtype.is_floating_point or tensor.dtype.itemsize == 1:  # itemsize 1: the float8 dtypes
        raise CheckpointError(f"{key}: stored as {tensor.dtype}; embeddings and norms are never quantized and must be "
                              "float32, bfloat16 or float16: re-export the checkpoint with it in the model dtype")
    if not check_only:
        param.copy_(tensor)


def _joined(op, tensors: list[torch.Tensor], what: str) -> torch.Tensor:
    """`op` (torch.cat or torch.stack) over checkpoint tensors that must agree in shape and dtype
    (merged projections, experts); a CheckpointError naming them when they do not."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1 and not all(d.is_floating_point for d in dtypes):  # torch would cast the integers silently
        raise CheckpointError(f"{what}: these tensors cannot be joined ({_shapes(tensors)}): an integer or bool tensor "
                              "among floats would be cast to floats, its codes served as values; store them all in "
                              "the model dtype (weights) or float32 (scales)")
    try:
        return op(tensors)
    except RuntimeError as exc:
        raise CheckpointError(f"{what}: these tensors cannot be joined ({_shapes(tensors)}): {exc}; their shapes and "
                              "dtypes must agree with config.json and with each other") from None


def _shapes(tensors: list[torch.Tensor]) -> str:
    return ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in tensors[:4]) + (", ..." if len(tensors) > 4 else "")


def _stacked_experts(layer: FusedMoE, take) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint tensors (`experts.{e}.gate_proj.weight`, ...) -> the MoE kernel layout."""
    cfg = layer.layer_config
    prefix, experts = layer.module_name, range(cfg.num_experts)

    def joined(op, tensors: list[torch.Tensor], what: str) -> torch.Tensor:
        return _joined(op, tensors, f"{prefix}.*.{what}")

    def one(scale: torch.Tensor, what: str) -> torch.Tensor:
        if scale.numel() != 1:
            raise CheckpointError(f"{prefix}.*.{what}: a per-tensor scale has one value, found shape "
                                  f"{tuple(scale.shape)}; every expert stores one per projection: re-export the "
                                  "checkpoint")
        return scale.reshape(())

    def per_expert(proj: str, attr: str,
                   form: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Every expert's `proj.attr`, through `form` (a reshape every saved form allows), all alike."""
        names = [f"{prefix}.{e}.{proj}.{attr}" for e in experts]
        return _alike([form(take(n)) if form else take(n) for n in names], names)

    gate, up, down = (per_expert(p, "weight") for p in ("gate_proj", "up_proj", "down_proj"))
    out = {
        "w13_weight": joined(torch.stack, [joined(partial(torch.cat, dim=0), [g, u], "gate_proj/up_proj.weight")
                                           for g, u in zip(gate, up)], "gate_proj/up_proj.weight"),
        "w2_weight": joined(torch.stack, down, "down_proj.weight"),
    }
    if not cfg.scheme.is_fp8:
        return out
    s = cfg.scale_name
    if cfg.scheme is Scheme.FP8_TENSOR:
        g_s, u_s, d_s = (per_expert(p, s, partial(one, what=f"{p}.{s}")) for p in ("gate_proj", "up_proj", "down_proj"))
        out[f"w13_{s}"] = torch.stack([torch.stack([g, u]) for g, u in zip(g_s, u_s)])
        out[f"w2_{s}"] = torch.stack(d_s)
    else:  # block rows stack only when I is a multiple of the block: the MoE kernels' can_implement checks it
        g_s, u_s, d_s = (per_expert(p, s, _as_rows) for p in ("gate_proj", "up_proj", "down_proj"))
        out[f"w13_{s}"] = joined(torch.stack, [joined(torch.cat, [g, u], f"gate_proj/up_proj.{s}")
                                               for g, u in zip(g_s, u_s)], f"gate_proj/up_proj.{s}")
        out[f"w2_{s}"] = joined(torch.stack, d_s, f"down_proj.{s}")
    if cfg.static_input_scale:
        g_i, u_i, d_i = (per_expert(p, "input_scale", partial(one, what=f"{p}.input_scale"))
                         for p in ("gate_proj", "up_proj", "down_proj"))
        # gate and up read the same input: one static scale, the larger, covers both
        out["w13_input_scale"] = torch.stack([torch.maximum(g.float(), u.float()) for g, u in zip(g_i, u_i)])
        out["w2_input_scale"] = torch.stack([d.float() for d in d_i])
    return out


def _alike(tensors: list[torch.Tensor], names: list[str]) -> list[torch.Tensor]:
    """`tensors` (one per expert), or a CheckpointError naming the first whose shape or dtype differs
    from most experts' (stacking would only say "at entry N", or promote a dtype silently)."""
    expected, _ = Counter((tuple(t.shape), t.dtype) for t in tensors).most_common(1)[0]
    for tensor, name in zip(tensors, names):
        found = (tuple(tensor.shape), tensor.dtype)
        if found != expected:
            raise CheckpointError(
                f"{name}: shape {found[0]} {found[1]} differs from the other experts' {expected[0]} {expected[1]}; "
                "every expert of a layer is stored alike, in the shapes config.json gives: re-export the checkpoint")
    return tensors


def _as_rows(scale: torch.Tensor) -> torch.Tensor:
    """Channel scales may be saved as [N] or [N, 1]; block scales are [N/bn, K/bk]."""
    return scale.reshape(scale.shape[0], -1) if scale.dim() > 1 else scale.reshape(-1, 1)


def _load_tokenizer(path: Path) -> Tokenizer | None:
    file = path / "tokenizer.json"
    if not file.exists() and not file.is_symlink():  # a dangling link is a broken file, not a missing one
        logger.warning("%s has no tokenizer.json: requests must be token ids and outputs have no text", path)
        return None
    try:  # read here, not by `tokenizers`, whose errors do not tell an unreadable file from a bad one
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise CheckpointError(unreadable(file, exc)) from None
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{file} is not UTF-8 text ({exc.reason} at byte {exc.start}): copy it again from the "
                              "model's source") from None
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # the tokenizers library raises a bare Exception for a malformed file
        raise CheckpointError(f"{file}: not a valid tokenizer.json ({exc}); copy it again from the model's source") from None
