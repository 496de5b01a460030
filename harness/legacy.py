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

from .backends import canonical

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
_FLASHINFER_MODE_VAR = "VLLM_FLASHINFER_MOE_BACKEND"
_FLASHINFER_DEFAULT_MODE = "latency"  # vLLM's default; see _flashinfer_moe
# What to do about a flavour vLLM does not know (it accepts only these): no backend is guessed.
_FLAVOUR_FIX = (f"set {_FLASHINFER_MODE_VAR} to one of {', '.join(FLASHINFER_MOE_MODES)} (the flavour the config "
                "meant) and migrate again, or name the MoE backend with --moe-backend ("
                + ", ".join(f"{mode}: {backend}" for mode, backend in FLASHINFER_MOE_MODES.items())
                + ") and remove the variables")
_FLASHINFER_SWITCHES = ("VLLM_USE_FLASHINFER_MOE_FP8", "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_USE_FLASHINFER_MOE_FP16")
# What can serve a layer type once FlashInfer is ruled out, by switch. vLLM's NVFP4 MoE
# (NvFp4MoeBackend) has no triton or deep_gemm backend, and DeepGEMM is block-FP8 only.
_NOT_FLASHINFER = {
    "VLLM_USE_FLASHINFER_MOE_FP8": ("FP8", "triton, deep_gemm, cutlass"),
    "VLLM_USE_FLASHINFER_MOE_FP4": ("FP4", "cutlass, marlin"),
    "VLLM_USE_FLASHINFER_MOE_FP16": ("unquantized", "triton"),
}


@dataclass(frozen=True)
class Forbids:
    """The value only rules a backend out (`VLLM_USE_DEEP_GEMM=0`): it is replaced only once
    the config names the backend of each of these flags explicitly."""

    flags: tuple[str, ...]


@dataclass(frozen=True)
class Follows:
    """The value only qualifies what one of `switches` turns on (`VLLM_FLASHINFER_MOE_BACKEND`):
    it is replaced together with such a switch that emitted flags, and otherwise left in place,
    so that the next migrate still reads it once that switch can be migrated."""

    switches: tuple[str, ...]


@dataclass(frozen=True)
class Unknown:
    """The value names nothing this table can translate (`VLLM_FLASHINFER_MOE_BACKEND=fast`):
    left in place and reported with `problem`, never read as some default."""

    problem: str


# What one variable stands for: flags to add ([] = drop it, it switches nothing on),
# Forbids, Follows, Unknown, or None = no public equivalent (the author must decide; see `advice`).
Rewrite = list[str] | Forbids | Follows | Unknown | None


@dataclass(frozen=True)
class LegacyVar:
    name: str
    meaning: str
    rewrite: Callable[[str, Mapping[str, str]], Rewrite]
    advice: str  # what to do when `rewrite` gives Forbids or None, or a Follows left unresolved


def _switch(*flags: str) -> Callable[[str, Mapping[str, str]], Rewrite]:
    return lambda value, env: list(flags) if is_on(value) else []


def _flashinfer_moe(value: str, env: Mapping[str, str]) -> Rewrite:
    if not is_on(value):
        return Forbids(("--moe-backend",))
    # vLLM's default flavour is "latency" (TensorRT-LLM): vllm/envs.py declares
    # env_with_choices("VLLM_FLASHINFER_MOE_BACKEND", "latency", ["throughput", "latency",
    # "masked_gemm"]) (its comment calling "throughput" the default is stale), and the newer
    # FlashInferSettings keeps "latency". A switch without the variable ran flashinfer_trtllm.
    mode = env.get(_FLASHINFER_MODE_VAR, _FLASHINFER_DEFAULT_MODE)
    if _flavour(mode) not in FLASHINFER_MOE_MODES:  # vLLM errors on it: there is no flavour to translate
        return Unknown(f"its flavour {_FLASHINFER_MODE_VAR}={mode!r} is not one vLLM knows, so which FlashInfer MoE "
                       f"backend it meant cannot be told: {_FLAVOUR_FIX}")
    return ["--moe-backend", FLASHINFER_MOE_MODES[_flavour(mode)]]


def _flashinfer_mode(value: str, env: Mapping[str, str]) -> Rewrite:
    # A flavour chooses nothing by itself: the VLLM_USE_FLASHINFER_MOE_* switch that reads it
    # emits the flag, and the flavour goes with that switch (see `translate`).
    if _flavour(value) not in FLASHINFER_MOE_MODES:
        return Unknown(f"{value!r} is not a flavour vLLM knows, so it names no FlashInfer MoE backend: "
                       f"{_FLAVOUR_FIX}")
    return Follows(_FLASHINFER_SWITCHES)


def _flavour(value: str) -> str:
    # vLLM compares the value exactly; a case or spacing difference still names one flavour.
    return value.strip().lower()


def _deep_gemm(value: str, env: Mapping[str, str]) -> Rewrite:
    if not is_on(value):  # DeepGEMM off for vLLM's MoE too, whatever VLLM_USE_DEEP_GEMM_MOE says
        return Forbids(("--linear-backend", "--moe-backend"))
    moe_on = is_on(env.get("VLLM_USE_DEEP_GEMM_MOE", env.get("VLLM_MOE_USE_DEEP_GEMM", "1")))
    return ["--linear-backend", "deep_gemm"] + (["--moe-backend", "deep_gemm"] if moe_on else [])


def _deep_gemm_moe(value: str, env: Mapping[str, str]) -> Rewrite:
    if not is_on(value):
        return Forbids(("--moe-backend",))
    if not is_on(env.get("VLLM_USE_DEEP_GEMM", "1")):
        # vLLM runs DeepGEMM MoE only while VLLM_USE_DEEP_GEMM is on too (`VLLM_USE_DEEP_GEMM and
        # VLLM_MOE_USE_DEEP_GEMM`): under VLLM_USE_DEEP_GEMM=0 this switch turns nothing on, and
        # --moe-backend deep_gemm would run a kernel the config never ran.
        return []
    return ["--moe-backend", "deep_gemm"]


def _nvfp4_gemm(value: str, env: Mapping[str, str]) -> Rewrite:
    name = canonical(value)
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
                _flashinfer_moe, f"{name}=0 only rules FlashInfer out: name the {kind} MoE backend that must run "
                f"with --moe-backend (e.g. {examples})")
      for name, (kind, examples) in _NOT_FLASHINFER.items()],
    LegacyVar(_FLASHINFER_MODE_VAR, "chose the FlashInfer MoE flavour: throughput -> flashinfer_cutlass, "
              "latency (vLLM's default) -> flashinfer_trtllm, masked_gemm -> flashinfer_cutedsl", _flashinfer_mode,
              "it only picks the flavour of the FlashInfer MoE that a VLLM_USE_FLASHINFER_MOE_* switch set to 1 "
              "turns on, and no such switch here was migrated (none is on, or it needs manual migration): keep it "
              "while that switch stays, or name the flavour with --moe-backend (throughput: flashinfer_cutlass, "
              "latency: flashinfer_trtllm, masked_gemm: flashinfer_cutedsl) and remove the variables"),
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
    picked_by: dict[str, str] = {}  # flag -> the variable whose rewrite picked it
    out = Translation()
    forbids: list[tuple[str, Forbids]] = []
    follows: list[tuple[str, Follows]] = []
    emitted: set[str] = set()  # replaced by flags it stands for (not merely dropped or satisfied)
    for name in legacy_names(plain):
        var = LEGACY_VARS[name]
        rewrite = var.rewrite(plain[name], plain)
        if rewrite is None:
            out.unresolved[name] = var.advice
        elif isinstance(rewrite, Unknown):
            out.unresolved[name] = rewrite.problem
        elif isinstance(rewrite, Forbids):
            forbids.append((name, rewrite))
        elif isinstance(rewrite, Follows):
            follows.append((name, rewrite))
        else:
            conflict = _conflict(rewrite, {**already, **picked}, picked_by)
            if conflict:
                out.unresolved[name] = conflict
                continue
            for flag, value in zip(rewrite[::2], rewrite[1::2]):
                if flag not in already and flag not in picked:
                    picked[flag] = value
                    picked_by[flag] = name
                    out.flags += [flag, value]
            out.replaced.append(name)
            if rewrite:
                emitted.add(name)
    for name, rule in forbids:
        if all(flag in already or flag in picked for flag in rule.flags):
            out.replaced.append(name)
        else:
            out.unresolved[name] = LEGACY_VARS[name].advice
    for name, rule in follows:
        if emitted.intersection(rule.switches):
            out.replaced.append(name)
        else:  # removing it would lose the flavour an unresolved (or absent) switch still needs
            out.unresolved[name] = LEGACY_VARS[name].advice
    return out


def _conflict(flags: list[str], chosen: Mapping[str, str], picked_by: Mapping[str, str]) -> str | None:
    """Why `flags` contradict `chosen`: server_args' backend flags, or those another legacy
    variable (`picked_by`) stands for."""
    for flag, value in zip(flags[::2], flags[1::2]):
        if flag in chosen and chosen[flag].replace("-", "_").lower() != value:
            if flag in picked_by:  # not in server_args: the config chooses nothing there
                return (f"it means `{flag} {value}` but {picked_by[flag]} here means `{flag} {chosen[flag]}`; the "
                        f"two contradict: keep the variable whose {flag} the config meant, or name {flag} in "
                        "server_args, and remove the other")
            return (f"it means `{flag} {value}` but the config already chooses `{flag} {chosen[flag]}`; "
                    f"keep one {flag} and remove the variable")
    return None
