"""`quantgate quantize SRC DST --scheme S --format F`: write an FP8 checkpoint from a bf16 HF folder.

Every linear weight of the decoder layers (attention projections, MLP and per-expert MoE
projections) becomes float8_e4m3fn with float32 scales computed by `quantgate.kernels.quant`;
`lm_head`, the MoE router (`mlp.gate`), norms and embeddings stay as they are, and the
ignored modules are listed in the config. Two on-disk formats:

- native (`quant_method: fp8`, vLLM/DeepSeek style): block -> `weight_scale_inv`
  [ceil(N/128), ceil(K/128)] and `weight_block_size: [128, 128]`; tensor -> 0-d `weight_scale`
  (as AutoFP8 writes it). Activations are dynamic. There is no native channel scheme.
- compressed-tensors (`format: float-quantized`, config objects from the compressed-tensors
  library): block [128,128] weights with dynamic 1x128 group activations; channel [N, 1]
  weights with dynamic per-token activations; tensor [1] weights with dynamic per-tensor
  activations (no calibration data, so no static `input_scale`). Scale name `weight_scale`.

fp8-block refuses MoE experts whose intermediate size is not a multiple of 128 (no server loads
them) and warns about other linears that are not whole blocks (only this engine serves those).

The output is deterministic: tensors in sorted order, fixed safetensors metadata, JSON with
sorted keys, tokenizer and generation files copied byte for byte.
"""

from __future__ import annotations

import argparse
import errno
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from quantgate.kernels import quant
from quantgate.kernels.schemes import Scheme

from .checkpoint import FUSED_EXPERT_SUFFIXES, SCALE_SUFFIXES, Checkpoint, CheckpointError, fused_experts_advice
from .config import unreadable

EXIT_USAGE = 3
# Native per-tensor FP8 is vLLM's (AutoFP8) form. transformers (5.x) reads native FP8 only as
# 128x128 blocks with `weight_scale_inv`: it drops these scales and computes wrong logits.
NATIVE_TENSOR_NOTE = ("note: native per-tensor FP8 (`weight_scale`) is the form vLLM reads; transformers reads native "
                      "FP8 only as 128x128 blocks (`weight_scale_inv`) and would drop these scales. For transformers "
                      "use --format compressed-tensors")
FORMATS = ("native", "compressed-tensors")
SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
BLOCK = (128, 128)
# Files copied unchanged when present.
SIDE_FILES = (
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.json", "merges.txt", "chat_template.jinja",
)
# Linear weights that are quantized: attention and (per-expert) MLP projections of a decoder layer.
_QUANTIZED = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(experts\.\d+\.)?(gate|up|down)_proj)\.weight$"
)
_ROUTER = re.compile(r"^(model\.layers\.\d+\.mlp\.gate)\.weight$")
_EXPERT_GATE = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.gate_proj\.weight$")
# Projections vLLM runs as one merged GEMM (qkv_proj, gate_up_proj): its validate_fp8_block_shape
# refuses a block checkpoint where one part's output rows are not whole blocks.
_MERGED_PART = re.compile(r"\.(self_attn\.(q|k|v)_proj|mlp\.(gate|up)_proj)$")
_LAYER_INDEX = re.compile(r"^model\.layers\.\d+\.")
BLOCK_ALTERNATIVES = "--scheme fp8-channel --format compressed-tensors, or --scheme fp8-tensor"


_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


class QuantizeError(Exception):
    """A problem the user can fix (bad paths, options or checkpoint); exit code 3."""


@dataclass(frozen=True)
class Target:
    scheme: Scheme
    fmt: str

    @property
    def scale_name(self) -> str:
        return "weight_scale_inv" if self.fmt == "native" and self.scheme is Scheme.FP8_BLOCK else "weight_scale"


def parse_target(scheme: str, fmt: str) -> Target:
    try:
        parsed = Scheme.parse(scheme)
    except ValueError:
        parsed = None
    if parsed is None or not parsed.is_fp8:
        raise QuantizeError(f"unknown scheme {scheme!r}; use one of fp8-block, fp8-channel, fp8-tensor")
    fmt = fmt.lower().replace("_", "-")
    if fmt in ("ct", "compressed"):
        fmt = "compressed-tensors"
    if fmt not in FORMATS:
        raise QuantizeError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt == "native" and parsed is Scheme.FP8_CHANNEL:
        raise QuantizeError(
            "the native fp8 format has no per-channel scheme; use --format compressed-tensors for fp8-channel "
            "(or --scheme fp8-block / fp8-tensor with --format native)"
        )
    return Target(parsed, fmt)


def quantize_weight(weight: torch.Tensor, target: Target) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (fp8 weight, float32 scale in the format's on-disk shape)."""
    if target.scheme is Scheme.FP8_BLOCK:
        return quant.quantize_weight_block(weight, BLOCK)
    if target.scheme is Scheme.FP8_CHANNEL:
        return quant.quantize_weight_channel(weight)
    q, scale = quant.quantize_weight_tensor(weight)
    return q, scale.reshape(()) if target.fmt == "native" else scale.reshape(1)


def quantize_state_dict(state: dict[str, torch.Tensor], target: Target) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Quantized tensors in sorted order, and the names of the modules left unquantized."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if _QUANTIZED.match(name):
            q, scale = quantize_weight(tensor, target)
            out[name] = q
            out[name[: -len("weight")] + target.scale_name] = scale.float().contiguous()
        else:
            out[name] = tensor
    ignored = ["lm_head", *sorted({m.group(1) for n in state if (m := _ROUTER.match(n))}, key=_natural)]
    return dict(sorted(out.items())), ignored


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def quantization_config(target: Target, ignored: list[str]) -> dict:
    if target.fmt == "native":
        config: dict = {"quant_method": "fp8", "activation_scheme": "dynamic", "modules_to_not_convert": ignored}
        if target.scheme is Scheme.FP8_BLOCK:
            config["weight_block_size"] = list(BLOCK)
        return config
    return _compressed_tensors_config(target, ignored)


def _compressed_tensors_config(target: Target, ignored: list[str]) -> dict:
    import compressed_tensors
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme

    fp8 = dict(num_bits=8, type="float", symmetric=True)
    if target.scheme is Scheme.FP8_BLOCK:
        weights = QuantizationArgs(**fp8, strategy="block", block_structure=list(BLOCK), dynamic=False)
        acts = QuantizationArgs(**fp8, strategy="group", group_size=BLOCK[1], dynamic=True)
    elif target.scheme is Scheme.FP8_CHANNEL:
        weights = QuantizationArgs(**fp8, strategy="channel", dynamic=False)
        acts = QuantizationArgs(**fp8, strategy="token", dynamic=True)
    else:
        weights = QuantizationArgs(**fp8, strategy="tensor", dynamic=False)
        acts = QuantizationArgs(**fp8, strategy="tensor", dynamic=True)
    scheme = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=acts, format="float-quantized")
    config = QuantizationConfig(
        config_groups={"group_0": scheme}, format="float-quantized", quantization_status="compressed", ignore=ignored
    )
    # The same keys compressed-tensors' ModelCompressor writes next to the config groups.
    return {
        "version": compressed_tensors.__version__,
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        **config.model_dump(exclude={"quant_method"}),
    }


def _read_checkpoint(src: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    if not src.exists():
        raise QuantizeError(f"SRC {src} does not exist; pass a Hugging Face model folder (config.json + *.safetensors)")
    config_path = src / "config.json"
    files = sorted(src.glob("*.safetensors")) if src.is_dir() else []
    if not src.is_dir() or not config_path.is_file() or not files:
        raise QuantizeError(
            f"SRC {src} is not a Hugging Face model folder: it needs config.json and *.safetensors weights"
        )
    try:
        config = json.loads(config_path.read_text())
    except OSError as exc:
        raise QuantizeError(f"SRC {unreadable(config_path, exc)}") from None
    except json.JSONDecodeError as exc:
        raise QuantizeError(f"SRC {config_path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise QuantizeError(f"SRC {config_path} holds a JSON {type(config).__name__}, not an object of fields")
    archs = config.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise QuantizeError(
            f"SRC {src} has architecture {archs or 'unknown'}; quantize supports {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    qc = config.get("quantization_config")
    if qc and not isinstance(qc, dict):
        raise QuantizeError(f"SRC {config_path}: quantization_config must be an object (or null), got {qc!r}")
    if qc:  # null or {} is how some exports say "not quantized"
        raise QuantizeError(f"SRC {src} is already quantized ({qc.get('quant_method', '?')}); start from the bf16 "
                            "checkpoint")
    # As the engine reads it: the index decides between files, and a tensor in two files without one is an error.
    try:
        with Checkpoint(src) as checkpoint:
            # config.json can lose its quantization_config: the tensors tell too, before a scale is read as a weight
            scales = [n for n in checkpoint.names() if n.endswith(SCALE_SUFFIXES)]
            if scales:
                raise QuantizeError(f"SRC {src} holds FP8 scales ({scales[0]}): already quantized, though config.json "
                                    "has no quantization_config; start from the bf16 checkpoint")
            state = {name: checkpoint.get(name) for name in checkpoint.names()}
    except CheckpointError as exc:
        raise QuantizeError(f"SRC {exc}") from None
    for name, tensor in state.items():
        if tensor.dtype.itemsize == 1 and tensor.dtype != torch.bool:  # float8 and int8 codes
            raise QuantizeError(f"SRC {src} holds {name} as {tensor.dtype}: already quantized; start from the bf16 "
                                "checkpoint")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise QuantizeError(f"SRC {src}: {name} holds {bad} NaN or infinite values, which the FP8 checkpoint "
                                "would inherit (as NaN or infinite scales): fix or re-export the source checkpoint")
    fused = [n for n in state if n.endswith(FUSED_EXPERT_SUFFIXES)]
    if fused:
        raise QuantizeError(f"SRC {src} {fused_experts_advice(fused[0])}")
    return config, state


def _check_block_experts(src: Path, state: dict[str, torch.Tensor]) -> None:
    """fp8-block experts must have whole blocks of intermediate rows: each expert's gate and up rows
    stack into one [2I, H] weight, where up's scale blocks would otherwise straddle the seam. Neither
    quantgate serve's MoE kernels nor vLLM's Fp8MoEMethod load such a checkpoint, so it is not written."""
    for name, tensor in state.items():
        rows = tensor.shape[0] if _EXPERT_GATE.match(name) else 0
        if rows % BLOCK[0]:
            raise QuantizeError(
                f"SRC {src}: moe_intermediate_size {rows} ({name} has {rows} rows) is not a multiple of the fp8-block "
                f"height {BLOCK[0]}; each expert's gate and up rows stack into one weight whose scale blocks would "
                "straddle them, so neither quantgate serve's MoE kernels nor vLLM's Fp8MoEMethod can serve the "
                f"checkpoint. Use {BLOCK_ALTERNATIVES}")


def _partial_block_warnings(state: dict[str, torch.Tensor]) -> list[str]:
    """The linears (experts aside) that are not whole 128x128 blocks: quantgate serve runs them (it
    does not merge their projections), but other servers do not, and the command still succeeds."""
    partial: dict[str, tuple[int, ...]] = {}  # module of every layer -> its shape
    for name, tensor in state.items():
        if _QUANTIZED.match(name) and ".experts." not in name and any(d % b for d, b in zip(tensor.shape, BLOCK)):
            partial.setdefault(_LAYER_INDEX.sub("model.layers.*.", name[: -len(".weight")]), tuple(tensor.shape))
    if not partial:
        return []
    shown = ", ".join(f"{module} {list(shape)}" for module, shape in partial.items())
    merged = [module for module, shape in partial.items() if _MERGED_PART.search(module) and shape[0] % BLOCK[0]]
    vllm = (f"vLLM refuses {', '.join(merged)} (the parts of its merged q/k/v and gate/up GEMMs need output rows "
            f"that are a multiple of {BLOCK[0]}: validate_fp8_block_shape)" if merged else
            "vLLM needs whole blocks where tensor parallelism splits a layer (validate_fp8_block_shape)")
    return [f"these linears are not whole {BLOCK[0]}x{BLOCK[1]} blocks: {shown}. quantgate serve runs them; {vllm}, "
            "and transformers cannot load or run partial blocks. To serve it with those, quantize with "
            f"{BLOCK_ALTERNATIVES}"]


def _check_replaceable(src: Path, dst: Path) -> None:
    """--force deletes DST: only ever a model folder (or an empty one) that neither is SRC nor
    holds it nor lies inside it, so a mistyped DST can never take anything else with it."""
    source, target = src.resolve(), dst.resolve()
    if target == source or target in source.parents or source in target.parents:
        raise QuantizeError(f"DST {dst} is SRC {src}, holds it or lies inside it; choose a folder outside SRC")
    if dst.is_symlink():
        raise QuantizeError(f"DST {dst} is a symbolic link; --force replaces only a real folder. Choose another path")
    if not dst.exists():
        return
    if not dst.is_dir():
        raise QuantizeError(f"DST {dst} is a file; --force replaces only a model folder. Choose a folder path")
    if any(dst.iterdir()) and not (dst / "config.json").is_file():
        raise QuantizeError(f"DST {dst} is a folder but not a model folder (no config.json); --force will not delete "
                            "it. Choose a new or empty folder")


def quantize_checkpoint(src: Path, dst: Path, scheme: str, fmt: str, force: bool = False) -> dict:
    """Write the FP8 checkpoint of `src` to `dst`; returns a summary for the command's output, with
    warnings about servers that cannot load it."""
    target = parse_target(scheme, fmt)
    src, dst = Path(src), Path(dst)
    if dst.exists() and not force:
        raise QuantizeError(f"DST {dst} already exists; choose another path or pass --force to replace it")
    _check_replaceable(src, dst)
    config, state = _read_checkpoint(src)
    warnings = []
    if target.scheme is Scheme.FP8_BLOCK:
        _check_block_experts(src, state)
        warnings = _partial_block_warnings(state)
    tensors, ignored = quantize_state_dict(state, target)
    config["quantization_config"] = quantization_config(target, ignored)
    _write(src, dst, tensors, config)
    quantized = sum(1 for n in state if _QUANTIZED.match(n))
    return {"dst": str(dst), "scheme": target.scheme.value, "format": target.fmt, "quantized": quantized,
            "kept": len(state) - quantized, "ignored": ignored, "warnings": warnings}


def _write(src: Path, dst: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """DST appears whole or not at all: the files are written to a temporary folder beside it, which
    is renamed into place; on failure nothing is left, not even the parent folders made for it."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    made = _missing_parents(dst)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.") as tmp:
            staging = Path(tmp) / "out"
            staging.mkdir()
            save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
            (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            for name in SIDE_FILES:
                if (src / name).is_file():
                    shutil.copyfile(src / name, staging / name)
            _replace(staging, dst, Path(tmp) / "old")
    except (OSError, SafetensorError) as exc:  # safetensors reports a full disk as its own error
        for folder in made:
            _remove_if_empty(folder)
        # A side file SRC could not give; copyfile names the source on a failed write too (sendfile
        # sets both names), so the errors only a write meets (a full disk) go to DST.
        if (isinstance(exc, OSError) and exc.filename and Path(exc.filename).parent == src
                and exc.errno not in _WRITE_ERRNOS):
            raise QuantizeError(f"SRC {unreadable(Path(exc.filename), exc)}") from None
        raise QuantizeError(_unwritable(dst, exc)) from None


def _replace(staging: Path, dst: Path, old: Path) -> None:
    """Rename `staging` to `dst`; an existing DST (--force) is moved to `old`, which the temporary
    folder deletes, and moved back if the rename fails, so a failure never loses the earlier output."""
    if dst.exists():
        dst.rename(old)
    try:
        staging.rename(dst)
    except OSError:
        if old.exists():
            old.rename(dst)
        raise


def _missing_parents(dst: Path) -> list[Path]:
    """The folders above DST that do not exist yet, deepest first."""
    missing = []
    for parent in dst.parents:
        if parent.exists() or parent.is_symlink():
            break
        missing.append(parent)
    return missing


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not empty, or never made: leave it
        pass


def _unwritable(dst: Path, exc: Exception) -> str:
    """One line: DST, where and why it cannot be written, and the fix."""
    existing = next((p for p in dst.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        cause = f"{existing} is a file, not a folder"
    elif isinstance(exc, OSError):
        where = Path(exc.filename) if exc.filename else dst.parent
        if where != dst and where not in dst.parents:  # a file of the temporary folder beside DST
            where = dst.parent
        cause = f"{where}: {exc.strerror or exc}"
    else:  # SafetensorError: "Error while serializing: I/O error: No space left on device (os error 28)"
        cause = f"{dst.parent}: {str(exc).rpartition('I/O error: ')[2] or exc}"
    return (f"DST {dst} cannot be written ({cause}); no partial output was left. Choose a folder on a writable file "
            "system with room for the checkpoint, or free space")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", type=Path, metavar="SRC", help="bf16 Hugging Face model folder")
    parser.add_argument("dst", type=Path, metavar="DST", help="output folder (must not exist unless --force)")
    parser.add_argument("--scheme", required=True, help="fp8-block | fp8-channel | fp8-tensor")
    parser.add_argument("--format", required=True, dest="fmt", help="native | compressed-tensors")
    parser.add_argument("--force", action="store_true", help="replace DST if it exists")


def main(args: argparse.Namespace) -> int:
    try:
        summary = quantize_checkpoint(args.src, args.dst, args.scheme, args.fmt, force=args.force)
    except QuantizeError as exc:
        print(f"quantgate quantize: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {summary['dst']}: {summary['quantized']} linear weights in {summary['scheme']} "
          f"({summary['format']}), {summary['kept']} tensors kept; unquantized modules: {', '.join(summary['ignored'])}")
    for warning in summary["warnings"]:
        print(f"quantgate quantize: warning: {warning}", file=sys.stderr)
    if summary["scheme"] == Scheme.FP8_TENSOR.value and summary["format"] == "native":
        print(NATIVE_TENSOR_NOTE, file=sys.stderr)
    return 0
