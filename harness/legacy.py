"""Legacy environment variables that chose kernels, and the public flags that replace them.

Test-only variables such as `VLLM_TEST_FORCE_FP8_MARLIN` selected kernels behind the
server's back, so a config could claim "marlin" while something else ran. Configs must say
it with `--linear-backend` / `--moe-backend` instead. `translate(env)` turns a config's `env:`
into those flags (`quantgate migrate` applies it); `lint` reports each variable with the
exact replacement.

Sources (vllm-project/vllm): `vllm/envs.py` (each variable's definition; the FlashInfer MoE
ones carry the deprecation warning "Use --moe-backend (e.g. flashinfer_trtllm,
flashinfer_cutlass, flashinfer_cutedsl)"), `vllm/config/kernel.py` (the flag values), and
`tests/evals/gsm8k/configs/moe-refactor/*.yaml`, whose `env:` blocks
(`VLLM_TEST_FORCE_FP8_MARLIN: "1"`, `VLLM_USE_DEEP_GEMM: "1"` ...) later became
`--linear-backend marlin --moe-backend marlin` style server_args.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# vLLM reads these switches as "1"/"true"; anything else is off.
_TRUE = {"1", "true", "yes", "on"}


def is_on(value: object) -> bool:
    return str(value).strip().lower() in _TRUE


# VLLM_FLASHINFER_MOE_BACKEND values -> --moe-backend value.
FLASHINFER_MOE_MODES = {
    "throughput": "flashinfer_cutlass",
    "latency": "flashinfer_trtllm",
    "masked_gemm": "flashinfer_cutedsl",
}
_FLASHINFER_SWITCHES = ("VLLM_USE_FLASHINFER_MOE_FP8", "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_USE_FLASHINFER_MOE_FP16")


@dataclass(frozen=True)
class Forbids:
    """The value only rules a backend out (`VLLM_USE_DEEP_GEMM=0`): it is replaced only once
    the config names the backend of each of these flags explicitly."""

    flags: tuple[str, ...]


# What one variable stands for: flags to add ([] = drop it, it switches nothing on),
# Forbids, or None = no public equivalent (the author must decide; see `advice`).
Rewrite = list[str] | Forbids | None


@dataclass(frozen=True)
class LegacyVar:
    name: str
    meaning: str
    rewrite: Callable[[str, Mapping[str, str]], Rewrite]
    advice: str  # what to do when `rewrite` gives Forbids or None


def _switch(*flags: str) -> Callable[[str, Mapping[str, str]], Rewrite]:
    return lambda value, env: list(flags) if is_on(value) else []


def _flashinfer_moe(value: str, env: Mapping[str, str]) -> Rewrite:
    if not is_on(value):
        return Forbids(("--moe-backend",))
    mode = env.get("VLLM_FLASHINFER_MOE_BACKEND", "throughput").strip().lower()
    return ["--moe-backend", FLASHINFER_MOE_MODES.get(mode, "flashinfer_cutlass")]


def _flashinfer_mode(value: str, env: Mapping[str, str]) -> Rewrite:
    # A mode chooses nothing by itself; the VLLM_USE_FLASHINFER_MOE_* switch emits the flag.
    return []


def _deep_gemm(value: str, env: Mapping[str, str]) -> Rewrite:
    if not is_on(value):  # DeepGEMM off for vLLM's MoE too, whatever VLLM_USE_DEEP_GEMM_MOE says
        return Forbids(("--linear-backend", "--moe-backend"))
    moe_on = is_on(env.get("VLLM_USE_DEEP_GEMM_MOE", env.get("VLLM_MOE_USE_DEEP_GEMM", "1")))
    return ["--linear-backend", "deep_gemm"] + (["--moe-backend", "deep_gemm"] if moe_on else [])


def _deep_gemm_moe(value: str, env: Mapping[str, str]) -> Rewrite:
    if not is_on(value):
        return Forbids(("--moe-backend",))
    return ["--moe-backend", "deep_gemm"]


def _nvfp4_gemm(value: str, env: Mapping[str, str]) -> Rewrite:
    name = value.strip().lower().replace("-", "_")
    return ["--linear-backend", name] if name else []


def _no_flag(value: str, env: Mapping[str, str]) -> Rewrite:
    return None


LEGACY_VARS: dict[str, LegacyVar] = {v.name: v for v in [
    LegacyVar("VLLM_TEST_FORCE_FP8_MARLIN", "forced the FP8 Marlin (W8A16) kernels for linear and MoE layers",
              _switch("--linear-backend", "marlin", "--moe-backend", "marlin"), ""),
    LegacyVar("VLLM_USE_DEEP_GEMM", "enabled DeepGEMM for block-FP8 linear layers, and for MoE unless "
              "VLLM_USE_DEEP_GEMM_MOE=0", _deep_gemm,
              "VLLM_USE_DEEP_GEMM=0 only rules DeepGEMM out, for linear and MoE layers alike: name the backends "
              "that must run with --linear-backend (e.g. cutlass, triton) and --moe-backend (e.g. triton, cutlass)"),
    LegacyVar("VLLM_USE_DEEP_GEMM_MOE", "enabled DeepGEMM for FP8 MoE layers", _deep_gemm_moe,
              "VLLM_USE_DEEP_GEMM_MOE=0 only rules DeepGEMM out: name the MoE backend that must run "
              "with --moe-backend (e.g. triton, cutlass)"),
    LegacyVar("VLLM_MOE_USE_DEEP_GEMM", "older name of VLLM_USE_DEEP_GEMM_MOE", _deep_gemm_moe,
              "VLLM_MOE_USE_DEEP_GEMM=0 only rules DeepGEMM out: name the MoE backend that must run "
              "with --moe-backend (e.g. triton, cutlass)"),
    *[LegacyVar(name, f"chose FlashInfer for {kind} MoE (flavour from VLLM_FLASHINFER_MOE_BACKEND)",
                _flashinfer_moe, f"{name}=0 only rules FlashInfer out: name the MoE backend that must run "
                "with --moe-backend (e.g. triton, deep_gemm)")
      for name, kind in zip(_FLASHINFER_SWITCHES, ("FP8", "FP4", "unquantized"))],
    LegacyVar("VLLM_FLASHINFER_MOE_BACKEND", "chose the FlashInfer MoE flavour: throughput -> flashinfer_cutlass, "
              "latency -> flashinfer_trtllm, masked_gemm -> flashinfer_cutedsl", _flashinfer_mode, ""),
    LegacyVar("VLLM_NVFP4_GEMM_BACKEND", "chose the NVFP4 linear kernel", _nvfp4_gemm, ""),
    LegacyVar("VLLM_MXFP4_USE_MARLIN", "forced Marlin for MXFP4 MoE layers", _switch("--moe-backend", "marlin"), ""),
    LegacyVar("VLLM_USE_DEEP_GEMM_E8M0", "chose DeepGEMM's UE8M0 scale format: a numeric format, not a backend",
              _no_flag, "remove it: it selects no kernel and has no public flag; pin DeepGEMM with "
              "--linear-backend deep_gemm / --moe-backend deep_gemm if it must run"),
    LegacyVar("QUANTGATE_DISABLED_KERNELS", "disabled built-in kernels by class name (debugging only)", _no_flag,
              "remove it from the config: choose the kernel with --linear-backend / --moe-backend"),
]}


@dataclass
class Translation:
    """The public flags that `env`'s legacy variables stand for."""

    flags: list[str] = field(default_factory=list)  # flag, value, flag, value ...
    replaced: list[str] = field(default_factory=list)  # legacy names the flags fully replace
    unresolved: dict[str, str] = field(default_factory=dict)  # name -> what the author must do


def legacy_names(env: Mapping[str, object]) -> list[str]:
    return [name for name in env if name in LEGACY_VARS]


def translate(env: Mapping[str, object], chosen: Mapping[str, str] | None = None) -> Translation:
    """Translate `env`. `chosen` holds backend flags the config already sets (flag -> value):
    they satisfy a Forbids and are never repeated; a different value is a conflict."""
    plain = {k: str(v) for k, v in env.items()}
    already = dict(chosen or {})
    picked: dict[str, str] = {}
    out = Translation()
    forbids: list[tuple[str, Forbids]] = []
    for name in legacy_names(plain):
        var = LEGACY_VARS[name]
        rewrite = var.rewrite(plain[name], plain)
        if rewrite is None:
            out.unresolved[name] = var.advice
        elif isinstance(rewrite, Forbids):
            forbids.append((name, rewrite))
        else:
            conflict = _conflict(rewrite, {**already, **picked})
            if conflict:
                out.unresolved[name] = conflict
                continue
            for flag, value in zip(rewrite[::2], rewrite[1::2]):
                if flag not in already and flag not in picked:
                    picked[flag] = value
                    out.flags += [flag, value]
            out.replaced.append(name)
    for name, rule in forbids:
        if all(flag in already or flag in picked for flag in rule.flags):
            out.replaced.append(name)
        else:
            out.unresolved[name] = LEGACY_VARS[name].advice
    return out


def _conflict(flags: list[str], chosen: Mapping[str, str]) -> str | None:
    for flag, value in zip(flags[::2], flags[1::2]):
        if flag in chosen and chosen[flag].replace("-", "_").lower() != value:
            return (f"it means `{flag} {value}` but the config already chooses `{flag} {chosen[flag]}`; "
                    f"keep one {flag} and remove the variable")
    return None
