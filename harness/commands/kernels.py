"""`quantgate kernels`: the kernel registry's decisions, for this machine or a described one.

For each layer type and scheme: the ordered candidates, whether each can serve and why not,
and the one selected. `--device cuda --capability 8.0` answers "what would an A100 pick?" on
any machine, because selection is a pure function of (platform, layer, requested backend).
Without `--model` the layers are representative: a 4096x4096 linear and a Qwen3-30B-A3B-shaped
MoE (128 experts, top-8, hidden 2048, expert intermediate 768), in bf16 unless `--dtype` says
otherwise. A kernel may serve some shapes and dtypes and not others (Triton's tiles, cuBLAS's
block scaling), so `--model FOLDER` selects for that checkpoint's own layers, as `serve` would
(its config.json only: no weight is read); modules that select alike are shown together.

Exit 0 when every shown layer has a kernel, 1 when one does not (an explicit backend that
cannot serve: every candidate's reason is printed), 3 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys

_LINEAR = {"in_features": 4096, "out_features": 4096}
_MOE = {"num_experts": 128, "top_k": 8, "hidden_size": 2048, "intermediate_size": 768}
_EXIT_OK, _EXIT_NO_KERNEL, _EXIT_USAGE = 0, 1, 3


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the machine-readable report (SPEC section 5)")
    parser.add_argument("--device", default=None, help="auto (default), cpu or cuda[:N]")
    parser.add_argument("--capability", default=None, metavar="X.Y",
                        help="describe a CUDA GPU of this compute capability instead of detecting one (e.g. 8.0)")
    parser.add_argument("--scheme", default=None,
                        help="fp8-block, fp8-channel, fp8-tensor or unquantized (default: all FP8 schemes, plus the "
                             "unquantized layers of an FP8 checkpoint)")
    parser.add_argument("--linear-backend", default="auto", help="as `quantgate serve --linear-backend` (default auto)")
    parser.add_argument("--moe-backend", default="auto", help="as `quantgate serve --moe-backend` (default auto)")
    parser.add_argument("--model", default=None, metavar="FOLDER",
                        help="select for this checkpoint's layers (its config.json), as `quantgate serve FOLDER` would")
    parser.add_argument("--dtype", default="auto",
                        help="as `quantgate serve --dtype` (default auto: the checkpoint's, bfloat16 without --model)")


def _platform(args: argparse.Namespace):
    from quantgate.kernels import Platform

    if args.capability is not None:
        if args.device not in (None, "auto") and not args.device.startswith("cuda"):
            raise ValueError(f"--capability describes a CUDA GPU; it cannot be combined with --device {args.device}")
        return _checked_capability(Platform.hypothetical("cuda", args.capability), args.capability)
    device = args.device or "auto"
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    try:
        return Platform.detect(device)
    except RuntimeError as exc:
        raise ValueError(f"{exc}; or describe a GPU with --capability X.Y (e.g. --capability 9.0)") from None


def _checked_capability(platform, text: str):
    """`platform` if its capability is one a GPU can report; Platform.hypothetical only parses X.Y."""
    from quantgate.kernels.platform import CAPABILITY_MAJORS, CAPABILITY_MINORS

    major, minor = platform.capability
    if major not in CAPABILITY_MAJORS or minor not in CAPABILITY_MINORS:
        raise ValueError(f"capability {text!r} is not a CUDA compute capability: expected X.Y with X from "
                         f"{CAPABILITY_MAJORS[0]} to {CAPABILITY_MAJORS[-1]} and Y from {CAPABILITY_MINORS[0]} to "
                         f"{CAPABILITY_MINORS[-1]} (e.g. 8.0 for an A100, 9.0 for an H100 or H200)")
    return platform


def _selections(args: argparse.Namespace, platform) -> list[tuple[list[str], object]]:
    """(module names, selection) pairs: one per representative layer, or per group of a
    checkpoint's modules that selected alike."""
    if args.model is not None:
        return _model_selections(args, platform)
    import torch

    from quantgate.engine.loader import resolve_dtype
    from quantgate.kernels import (
        LINEAR_BACKENDS,
        MOE_BACKENDS,
        LinearLayerConfig,
        MoELayerConfig,
        Scheme,
        normalize_backend,
        select_linear_kernel,
        select_moe_kernel,
    )

    linear = normalize_backend(args.linear_backend, LINEAR_BACKENDS, "--linear-backend")
    moe = normalize_backend(args.moe_backend, MOE_BACKENDS, "--moe-backend")
    dtype = resolve_dtype(args.dtype, torch.bfloat16, torch.device(platform.device))
    schemes = [Scheme.parse(args.scheme)] if args.scheme is not None else [s for s in Scheme if s.is_fp8]
    out = []
    for scheme in schemes:
        out.append(select_linear_kernel(platform, LinearLayerConfig(**_LINEAR, scheme=scheme, act_dtype=dtype), linear))
        out.append(select_moe_kernel(platform, MoELayerConfig(**_MOE, scheme=scheme, act_dtype=dtype), moe))
    if args.scheme is None:  # the layers an FP8 checkpoint leaves unquantized (lm_head) always select with auto
        out.append(select_linear_kernel(platform, LinearLayerConfig(**_LINEAR, scheme=Scheme.UNQUANTIZED,
                                                                    act_dtype=dtype), "auto"))
    return [([], sel) for sel in out]


def _model_selections(args: argparse.Namespace, platform) -> list[tuple[list[str], object]]:
    from quantgate.engine.config import ModelConfigError
    from quantgate.engine.loader import plan_kernels

    if args.scheme is not None:
        raise ValueError("--scheme describes a representative layer; with --model the checkpoint's config.json "
                         "says each module's scheme: drop one of the two")
    try:
        planned = plan_kernels(args.model, platform, dtype=args.dtype, linear_backend=args.linear_backend,
                               moe_backend=args.moe_backend)
    except (ModelConfigError, OSError) as exc:
        raise ValueError(f"--model {args.model}: {exc}") from None
    groups: dict[str, tuple[list[str], object]] = {}
    for module, sel in planned:
        key = json.dumps(sel.to_dict(), sort_keys=True)  # selected alike: same kernel, same reasons
        groups.setdefault(key, ([], sel))[0].append(module)
    return list(groups.values())


def _text(platform, selections: list, model: str | None) -> str:
    where = platform.device + (f" {platform.capability_str}" if platform.capability else "")
    lines = [f"platform: {where} ({platform.name})",
             f"layers: {model}'s modules" if model else
             "layers: representative (a 4096x4096 linear, a Qwen3-30B-A3B-shaped MoE); --model FOLDER for a "
             "checkpoint's own"]
    for modules, sel in selections:
        chosen = sel.kernel.kernel_name() if sel.kernel else None
        verdict = f"{chosen} [{sel.kernel.backend}]" if sel.kernel else "NO KERNEL"
        lines.append(f"\n{sel.layer} {sel.scheme.value} (requested {sel.requested}): {verdict}")
        if modules:
            more = f" and {len(modules) - 3} more" if len(modules) > 3 else ""
            lines.append(f"  {len(modules)} module(s): {', '.join(modules[:3])}{more}")
        width = max((len(c.kernel) for c in sel.candidates), default=0)
        for c in sel.candidates:
            mark = "*" if c.kernel == chosen else " "
            status = "ok" if c.supported else c.reason
            lines.append(f"  {mark} {c.kernel:<{width}}  {c.backend:<9}  {status}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from quantgate.kernels import UnknownBackendError

    try:
        platform = _platform(args)
        selections = _selections(args, platform)
    except (UnknownBackendError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _EXIT_USAGE
    errors = [sel.error for _, sel in selections if sel.kernel is None]
    if args.json:
        layers = [{**sel.to_dict(), **({"modules": modules} if args.model else {})} for modules, sel in selections]
        report = {"platform": platform.to_dict(), "layers": layers, "error": "\n".join(errors) or None}
        if args.model:
            report["model"] = args.model
        print(json.dumps(report, indent=2))
    else:
        print(_text(platform, selections, args.model))
        for error in errors:
            print(f"error: {error}", file=sys.stderr)
    return _EXIT_NO_KERNEL if errors else _EXIT_OK
