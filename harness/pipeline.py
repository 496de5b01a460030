"""Buildkite pipelines from eval configs (SPEC section 4, `quantgate pipeline`).

One command step per config, grouped per list file. Tiers:
- `nightly`: every config.
- `release`: configs tagged `release` (config loading makes sure they carry a statistical gate).
- `pr`: configs tagged `pr` always, and every other config only when a file it depends on
  changed, through Buildkite's agent-applied `if_changed` globs. A config depends on its YAML,
  its model folder and data, the engine, the kernel layer's shared files and the source files
  of the kernel backends it names (in `server_args` or `expect:`) or that `auto` can pick on the
  agents it runs on, with all they import, and what its `baseline:` config depends on. So a
  change to a kernel runs the configs that exercise that kernel before merge: an optional
  nightly job is never the only place a crash can show. `select_for_changes` applies the same
  globs locally.

Each step's agent: the `cpu` queue for a config with no `requires:` on the builtin engine whose
server_args can run on a CPU; the `gpu` queue for any other, tagged with its GPU count (at least
the vLLM server's tensor x pipeline x data parallel size, and 1 for an `engine: vllm` config that
says nothing), device and minimum compute capability (`requires:`, raised to what a builtin
server's `--device cuda` or named GPU-only backends need: `agents_for`).

A config tagged `negative-check` is built to FAIL (e.g. `expect:` names a kernel that does not
run): its step passes only when the run's verdict is FAIL, so the check it exercises runs in CI
without turning the build red.

Paths in the pipeline are relative to the repository root (the working directory of a
Buildkite job), so `pipeline` runs from there. They are globs to Buildkite (`if_changed`,
`artifact_paths`), so a config name or path holding glob syntax is refused.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import math
import os
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from .config import (
    CONFIG_SUFFIXES,
    LIST_SUFFIX,
    ConfigError,
    EvalConfig,
    check_unique_names,
    list_file_entries,
    load_config,
    parallel_gpus,
    parse_capability,
    resolve_model,
)
from .results import SAMPLES_FILE
from .server import split_option

Tier = Literal["pr", "nightly", "release"]
TIERS: tuple[Tier, ...] = ("pr", "nightly", "release")
RUN_EVAL = ".buildkite/scripts/run-eval.sh"
NEGATIVE_TAG = "negative-check"
RESULTS_DIR = "results"
RETRYABLE_EXIT = 2  # SPEC: an error without a verdict (server died, eval incomplete)
RETRY_LIMIT = 2
# Buildkite reports a job that handled its cancel or timeout SIGTERM with the exit status the
# job chose (run-eval.sh: 2) and signal_reason `cancel`: only `none` leaves those unretried.
RETRY_RULES: tuple[dict[str, Any], ...] = (
    {"exit_status": RETRYABLE_EXIT, "signal_reason": "none", "limit": RETRY_LIMIT},
    {"exit_status": -1, "signal_reason": "none", "limit": RETRY_LIMIT},  # the agent was lost
    {"signal_reason": "agent_stop", "limit": RETRY_LIMIT},  # its host stopped it (a spot instance)
)
EVAL_ALLOWANCE_S = 3600  # on top of the config's start-up wait, for the evaluation itself
# Buildkite's glob syntax (and escape); such a character in a literal path would match other files.
GLOB_SPECIAL = "*?[]{}\\"
KEY_MAX = 100  # the schema's maxLength of a step key
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

# What every step runs through: the CI scripts and the install (pins included).
CI_GLOBS = (".buildkite/**", "Makefile", "constraints.txt", "pyproject.toml")
# Every builtin config runs through these (engine, harness, and the kernel layer's selection,
# contract and quantization reference); a change here re-runs them all.
BUILTIN_SHARED_GLOBS = ("engine/**", "harness/**", "kernels/*.py", *CI_GLOBS)
# A vLLM config runs vLLM's kernels, not ours: only the harness that drives it matters.
VLLM_SHARED_GLOBS = ("harness/**", *CI_GLOBS)
# Engines whose server needs a GPU on CI (SPEC: `engine: vllm` is for real models on GPU CI), so
# that a config of theirs with no `requires:` still goes to a GPU agent: on the CPU queue its
# server would fail to start. Only `builtin` runs on a CPU agent.
GPU_ENGINES = ("vllm",)


@dataclass
class Group:
    label: str
    configs: list[EvalConfig] = field(default_factory=list)


def collect(paths: Sequence[Path | str], engine: str | None = None,
            tier: str | None = None) -> tuple[list[Group], list[EvalConfig]]:
    """Groups per list file, then configs named directly. A directory contributes its list
    files as groups and any YAML no list file names as a group of its own. A config listed in
    several list files is in the first one's group: that of a list file named after `tier`
    (release.txt for the release tier), else the first by path."""
    groups: list[Group] = []
    loose: list[EvalConfig] = []
    placed: set[Path] = set()

    def load(path: Path) -> EvalConfig | None:
        resolved = path.resolve()
        if resolved in placed:
            return None
        placed.add(resolved)
        return load_config(path, engine)  # type: ignore[arg-type]

    def add_list(list_file: Path) -> None:
        entries, errors = list_file_entries(list_file)
        if errors:
            raise errors[0]
        group = Group(_relative(list_file))
        group.configs = [c for c in (load(p) for p in entries) if c is not None]
        if group.configs:
            groups.append(group)

    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for list_file in sorted(path.rglob(f"*{LIST_SUFFIX}"), key=lambda p: (p.stem != tier, p)):
                add_list(list_file)
            rest = Group(_relative(path))
            for file in sorted(p for p in path.rglob("*") if p.suffix in CONFIG_SUFFIXES and p.is_file()):
                config = load(file)
                if config is not None:
                    rest.configs.append(config)
            if rest.configs:
                groups.append(rest)
        elif path.suffix == LIST_SUFFIX:
            add_list(path)
        elif path.is_file():
            config = load(path)
            if config is not None:
                loose.append(config)
        else:
            raise ConfigError(path, 0, "", "no such file or directory")
    every = [c for g in groups for c in g.configs] + loose
    errors = check_unique_names(every)
    if errors:
        raise errors[0]
    return groups, loose


def in_tier(config: EvalConfig, tier: Tier) -> bool:
    if tier == "release":
        return "release" in config.tags
    return True  # pr: the rest are filtered by if_changed


def dependency_globs(config: EvalConfig, engine: str | None = None) -> list[str]:
    """Repository-relative globs of the files whose change can change this config's verdict,
    its baseline config's included; `engine` as in `step_for`."""
    return _unique(_dependency_globs(config, engine, frozenset(), step_runs(config, engine)))


def step_runs(config: EvalConfig, engine: str | None = None) -> list[EvalConfig]:
    """The configs a config's step runs, on one agent: the config, and its paired or recovery
    gate's baseline config (which the runner runs first)."""
    base = baseline_config(config, engine)
    return [config] if base is None else [config, base]


def _dependency_globs(config: EvalConfig, engine: str | None, seen: frozenset[Path],
                      runs: Sequence[EvalConfig]) -> list[str]:
    globs = [_literal(config, "the config file's path", _relative(config.source))]
    if config.dataset is not None:
        globs += [_literal(config, "dataset", _relative(p)) for p in (config.dataset.train, config.dataset.test)
                  if p is not None]
    if config.baseline_path is not None:
        globs.append(_literal(config, "baseline", _relative(config.baseline_path)))
        if config.baseline_path.suffix == ".json":  # a results file: the gates read its answers beside it
            globs.append(_literal(config, "baseline", _relative(config.baseline_path.with_name(SAMPLES_FILE))))
    base = baseline_config(config, engine)
    if base is not None and base.source not in seen:  # a baseline cycle is the runner's error to report
        globs += _dependency_globs(base, engine, seen | {config.source}, runs)
    if config.engine == "vllm":
        return globs + list(VLLM_SHARED_GLOBS)
    globs += _model_globs(config)
    globs += list(BUILTIN_SHARED_GLOBS)
    globs += kernel_files(config, runs)
    return globs


def baseline_config(config: EvalConfig, engine: str | None = None) -> EvalConfig | None:
    """The `baseline:` config the runner runs in this config's step (before it, into its own
    results folder): that of a paired or recovery gate, unless the baseline is a results file."""
    path = config.baseline_path
    if path is None or path.suffix == ".json" or config.gate.mode not in ("paired", "recovery"):
        return None
    return load_config(path, engine)  # type: ignore[arg-type]


def exercised_backends(config: EvalConfig) -> set[str]:
    """Builtin kernel backends the config names: explicit server_args and `expect:` values."""
    from .backends import canonical, known_backends

    names = {canonical(v) for v in config.backend_flags().values()}
    for expected in (config.expect.linear_kernel, config.expect.moe_kernel):
        if expected:
            names.add(_backend_of_class().get(expected, canonical(expected)))
    known = {canonical(b) for layer in ("linear", "moe") for b in known_backends("builtin", layer)}  # type: ignore[arg-type]
    return {n for n in names if n in known and n != "auto"}


def kernel_files(config: EvalConfig, runs: Sequence[EvalConfig]) -> list[str]:
    """Kernel source files the config exercises: the modules of the kernels of its named
    backends and of those `auto` can pick on the agents it runs on, their packages, and
    everything of quantgate.kernels they import (lazy imports inside functions too). Kernels it
    cannot reach stay out, so a change to one backend re-runs only the configs that use it.
    `runs`: the configs of the step it runs in (`step_runs`), whose agent serves them all: a CPU
    config whose baseline needs a GPU runs on the GPU agent, where `auto` picks GPU kernels."""
    from quantgate.kernels.registry import ALL_LINEAR_KERNELS, ALL_MOE_KERNELS

    from .backends import canonical

    backends = exercised_backends(config)
    kernels = [k for k in (*ALL_LINEAR_KERNELS, *ALL_MOE_KERNELS) if k.backend in backends]
    named = frozenset(flag for flag, value in config.backend_flags().items() if canonical(value) != "auto")
    on_cpu = agents_for(*runs)["queue"] == "cpu"
    kernels += _auto_kernels(None if on_cpu else _step_floor(runs) or (0, 0), named)
    files: set[str] = set()
    for kernel in kernels:
        files |= _module_closure(kernel.__module__)
    return sorted(files)


@cache
def _auto_kernels(min_capability: tuple[int, int] | None, named: frozenset[str]) -> tuple[type, ...]:
    """The kernels `auto` can pick on a CPU agent (`min_capability` None) or on any GPU agent of
    at least `min_capability`: those of the priority rows such agents reach that can run there.
    Every capability counts, not only the minimum: an 8.0 config also lands on 9.0 agents, whose
    row differs. A layer whose backend is `named` still selects with auto when the checkpoint
    leaves it unquantized (lm_head, the MoE router), whatever the model."""
    from quantgate.kernels import Platform, Scheme
    from quantgate.kernels.platform import CAPABILITY_MAJORS, CAPABILITY_MINORS
    from quantgate.kernels.registry import LINEAR_PRIORITY, MOE_PRIORITY

    if min_capability is None:
        platforms = [Platform.hypothetical("cpu")]
    else:
        # Every capability `quantgate kernels --capability` accepts.
        platforms = [Platform.hypothetical("cuda", (major, minor)) for major in CAPABILITY_MAJORS
                     for minor in CAPABILITY_MINORS if (major, minor) >= min_capability]
    picks: list[type] = []
    for flag, table in (("--linear-backend", LINEAR_PRIORITY), ("--moe-backend", MOE_PRIORITY)):
        for platform in platforms:
            # The first row of the platform's device that its capability reaches, as selection takes it.
            by_scheme = next(row for device, minimum, row in table
                             if device == platform.device and (platform.capability or (0, 0)) >= minimum)
            schemes = [Scheme.UNQUANTIZED] if flag in named else list(by_scheme)
            picks += [k for scheme in schemes for k in by_scheme.get(scheme, []) if k.is_supported(platform)[0]]
    return tuple(dict.fromkeys(picks))


def _backend_of_class() -> dict[str, str]:
    from quantgate.kernels.registry import ALL_LINEAR_KERNELS, ALL_MOE_KERNELS

    return {k.kernel_name(): k.backend for k in (*ALL_LINEAR_KERNELS, *ALL_MOE_KERNELS)}


@cache
def _module_closure(module: str) -> frozenset[str]:
    """Repository paths of `module` and of the quantgate.kernels modules it imports, transitively,
    with the packages that hold them (an import runs each package's __init__.py first). The
    top package is kernels/*.py, which every builtin config depends on already."""
    seen: dict[str, str] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        if name in seen or not name.startswith(_KERNELS + "."):
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        seen[name] = spec.origin
        pending += _kernel_imports(name, Path(spec.origin))
        pending.append(name.rpartition(".")[0])
    root = Path(importlib.util.find_spec(_KERNELS).origin or "").parent  # type: ignore[union-attr]
    return frozenset(f"kernels/{Path(origin).relative_to(root).as_posix()}" for origin in seen.values())


_KERNELS = "quantgate.kernels"


def _kernel_imports(module: str, source: Path) -> list[str]:
    package = module if source.name == "__init__.py" else module.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module or ""
            found.append(base)
            found += [f"{base}.{alias.name}" for alias in node.names]  # `from .. import quant`
    return [name for name in found if name.startswith(_KERNELS + ".") and _is_module(name)]


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _model_globs(config: EvalConfig) -> list[str]:
    """The local model folder under models/, and for an FP8 variant (built by `make models`,
    not tracked) its bf16 source and the recipe that builds it. Hub ids give nothing."""
    parts = Path(config.model_name).parts
    if "models" not in parts[:-1]:
        path = Path(config.model_name)
        return [f"{_literal(config, 'model_name', _relative(path))}/**"] if path.is_dir() else []
    name = parts[parts.index("models") + 1]
    base = _literal(config, "model_name", re.sub(r"-fp8-.*$", "", name))
    globs = [f"models/{base}/**"]
    if base != name:
        globs += ["models/MANIFEST.json", "models/recipes/**"]
    return globs


def step_for(config: EvalConfig, tier: Tier, engine: str | None = None) -> dict[str, Any]:
    """`engine`: the `--engine` override the configs were loaded with; the step passes it on."""
    path = _relative(config.source)
    options = (["--expect-fail"] if NEGATIVE_TAG in config.tags else []) + (["--engine", engine] if engine else [])
    # Computed in every tier, so a path Buildkite would misread fails the nightly generation too,
    # not only a pull request's.
    dependencies = dependency_globs(config, engine)
    runs = step_runs(config, engine)
    step: dict[str, Any] = {
        "label": config.name,
        "key": _key(config.name),
        "command": shlex.join([RUN_EVAL, *options, path]),
        # The baseline config runs first, on the same agent: the agent must serve both, in time for both.
        "agents": agents_for(*runs),
        "timeout_in_minutes": sum(timeout_minutes(c) for c in runs),
        "retry": {"automatic": [dict(rule) for rule in RETRY_RULES]},
        "artifact_paths": [*(f"{RESULTS_DIR}/{_artifact_name(c)}/**/*" for c in runs),
                           f"{RESULTS_DIR}/junit.xml", f"{RESULTS_DIR}/summary.md"],
        "env": {"QUANTGATE_TIER": tier},
    }
    if tier == "pr" and "pr" not in config.tags:
        step["if_changed"] = dependencies
    return step


def agents_for(config: EvalConfig, *others: EvalConfig) -> dict[str, str]:
    """Agent tags from `requires:` (Buildkite tag values are strings). Tags match by value, not
    by order, so a minimum compute capability X.Y is the tag `smXY: "true"`, which a GPU agent
    sets for every capability it reaches (an H100 agent: sm80, sm89 and sm90). Without it a
    triton config (8.9+) could land on an A100 agent and fail there with exit 3, never retried.
    The GPU count is at least the server's tensor x pipeline x data parallel size: a vLLM server
    of --tensor-parallel-size 8 on fewer GPUs (or on a CPU agent) cannot start. A config of an
    engine in GPU_ENGINES gets a GPU agent without any `requires:`: its server needs one.
    `others`: configs the same step runs as well (a paired or recovery gate's baseline config),
    whose needs the agent must meet too: the runner refuses a `requires:` it does not (exit 3)."""
    runs = (config, *others)
    gpus = max(max(c.requires.gpus, parallel_gpus(c.server_args)) for c in runs)
    floor = _step_floor(runs)
    devices = list(dict.fromkeys(c.requires.device for c in runs if c.requires.device))
    if (gpus <= 1 and not devices and floor is None
            and all(c.requires.gpus == 0 and c.engine not in GPU_ENGINES for c in runs)):
        return {"queue": "cpu"}
    if len(devices) > 1:
        raise ConfigError(config.source, 0, "requires.device", f"{devices[0]!r}, but its baseline config "
                          f"{others[0].source} requires device {devices[1]!r}; the baseline runs in this config's "
                          "step, on one agent: give both the same requires.device")
    agents = {"queue": "gpu", "gpus": str(max(gpus, 1))}  # any requires: needs a GPU, as the runner
    if devices:
        agents["device"] = devices[0]
    if floor is not None and floor > (0, 0):
        agents[f"sm{floor[0]}{floor[1]}"] = "true"
    return agents


def _step_floor(runs: Sequence[EvalConfig]) -> tuple[int, int] | None:
    """The compute capability an agent needs to run all of `runs` (None: any)."""
    return max((f for f in map(min_capability, runs) if f is not None), default=None)


def min_capability(config: EvalConfig) -> tuple[int, int] | None:
    """The compute capability the config's agent must reach: its `requires:`, raised to what a
    builtin server's own flags need, `--device cuda` (any GPU: (0, 0)) or a named backend whose
    kernels for the model's scheme run on no CPU (marlin: 8.0; triton: 8.9 for FP8). Such a
    config without `requires:` went to a CPU agent, where its server exits 3; None when a CPU
    agent can run it."""
    given = config.requires.min_compute_capability
    floors = [parse_capability(given)] if given else []
    if config.engine == "builtin":
        if split_option(config.server_args, "--device")[0] == "cuda":
            floors.append((0, 0))
        model = _model_layers(config)
        for flag, value in config.backend_flags().items():
            if flag == "--moe-backend" and model is not None and not model[1]:
                continue  # a dense model has no layer the MoE backend serves
            floor = _backend_floor(flag, value, None if model is None else model[0])
            if floor is not None:
                floors.append(floor)
    return max(floors, default=None)  # type: ignore[arg-type]


def _model_layers(config: EvalConfig) -> tuple[str, bool] | None:
    """(the checkpoint's scheme, whether it has MoE layers) from the model folder's config.json;
    None where the folder is not here (a hub id, or an FP8 variant `make models` has not built)."""
    from quantgate.engine.config import ModelConfig
    from quantgate.kernels import Scheme

    folder = Path(resolve_model(config))
    if not (folder / "config.json").is_file():
        return None
    try:
        model = ModelConfig.from_pretrained(folder)
    except (OSError, ValueError):  # the server will say what is wrong with it
        return None
    return (model.quant.scheme if model.quant else Scheme.UNQUANTIZED).value, model.is_moe


@cache
def _backend_floor(flag: str, backend: str, scheme: str | None) -> tuple[int, int] | None:
    """The lowest compute capability on which builtin `backend` can serve the layers of `flag`
    (--linear-backend, --moe-backend) quantized in `scheme`; for an unknown scheme, the highest
    such floor over the schemes the backend serves (triton MoE: 8.0 unquantized, 8.9 FP8), so the
    agent can run it whichever. None when a kernel for it runs on a CPU (or the name is auto or
    unknown, or the backend cannot serve the scheme: the config check and the server say so)."""
    from quantgate.kernels import Platform
    from quantgate.kernels.registry import ALL_LINEAR_KERNELS, ALL_MOE_KERNELS

    from .backends import canonical

    every = ALL_LINEAR_KERNELS if flag == "--linear-backend" else ALL_MOE_KERNELS
    kernels = [k for k in every if k.backend == canonical(backend)]
    schemes = {s.value for k in kernels for s in k.schemes} if scheme is None else {scheme}
    floors = []
    for name in sorted(schemes):
        serving = [k for k in kernels if any(s.value == name for s in k.schemes)]
        if not serving or any(k.is_supported(Platform.hypothetical("cpu"))[0] for k in serving):
            continue
        floors.append(next(((major, minor) for major in range(1, 21) for minor in range(10)
                            if any(k.is_supported(Platform.hypothetical("cuda", (major, minor)))[0] for k in serving)),
                           (0, 0)))
    return max(floors, default=None)


def timeout_minutes(config: EvalConfig) -> int:
    return math.ceil((config.startup_max_wait_seconds + EVAL_ALLOWANCE_S) / 60)


def build_pipeline(groups: Sequence[Group], loose: Sequence[EvalConfig], tier: Tier,
                   engine: str | None = None) -> dict[str, Any]:
    """The pipeline document for `tier` (a dict ready for YAML); `engine` as in `step_for`."""
    if not any(g.configs for g in groups) and not loose:
        raise ConfigError(Path("."), 0, "", "no configs in the given paths: a pipeline with no steps would pass "
                          "without running anything")
    steps: list[dict[str, Any]] = []
    for group in groups:
        members = [step_for(c, tier, engine) for c in group.configs if in_tier(c, tier)]
        if members:
            steps.append({"group": group.label, "key": _key(f"group-{group.label}"), "steps": members})
    steps += [step_for(c, tier, engine) for c in loose if in_tier(c, tier)]
    _check_unique_keys(steps)
    return {"env": {"QUANTGATE_TIER": tier}, "steps": steps}


def outside_root(pipeline: dict[str, Any]) -> list[str]:
    """Labels of steps whose config lies outside the current directory: Buildkite runs each step
    from the repository root, where such a path does not exist."""
    return [step["label"] for step in _command_steps(pipeline["steps"])
            if any(part.startswith("../") for part in shlex.split(step["command"]))]


def _check_unique_keys(steps: Sequence[dict[str, Any]]) -> None:
    """Buildkite refuses a pipeline whose steps share a key; names that differ only in characters
    a key cannot hold (`qwen3-0.6b` and `qwen3-0-6b`) would."""
    seen: dict[str, str] = {}
    for step in (*steps, *_command_steps(steps)):
        other = seen.setdefault(step["key"], step.get("label") or step.get("group"))
        if other != (step.get("label") or step.get("group")):
            raise ConfigError(Path("."), 0, "", f"{other!r} and {step.get('label') or step.get('group')!r} both "
                              f"become the Buildkite key {step['key']!r}: rename one (keys keep only letters, "
                              "digits, '-', '_' and ':')")


def select_for_changes(pipeline: dict[str, Any], changed: Iterable[str]) -> list[str]:
    """Labels of the command steps Buildkite would keep for these changed files."""
    changed = list(changed)
    kept = []
    for step in _command_steps(pipeline["steps"]):
        globs = step.get("if_changed")
        if globs is None or any(glob_match(g, f) for g in globs for f in changed):
            kept.append(step["label"])
    return kept


def glob_match(pattern: str, path: str) -> bool:
    """Buildkite's `if_changed` glob: `**` spans directories, `*` and `?` stay inside one."""
    return re.fullmatch(_glob_regex(pattern), path) is not None


@cache
def _glob_regex(pattern: str) -> str:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def _command_steps(steps: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    for step in steps:
        if "group" in step:
            yield from step["steps"]
        else:
            yield step


def _relative(path: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path.cwd().resolve())).as_posix()


def _key(name: str) -> str:
    """Buildkite keys: letters, digits, '-', '_', ':' only, at most KEY_MAX characters. A longer
    one keeps its start and ends in a hash of the whole name, so long names stay apart."""
    key = re.sub(r"[^A-Za-z0-9_:-]", "-", name)
    if _UUID.fullmatch(key):  # the schema forbids keys that resemble a UUID (Buildkite's own step ids)
        key = f"config-{key}"
    if len(key) <= KEY_MAX:
        return key
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{key[:KEY_MAX - len(digest) - 1]}-{digest}"


def _literal(config: EvalConfig, what: str, text: str) -> str:
    """`text`, a name or path that goes into a Buildkite glob, when it holds no glob syntax."""
    special = sorted({c for c in text if c in GLOB_SPECIAL})
    if special:
        raise ConfigError(config.source, 0, "", f"{what} {text!r} holds {' '.join(special)}, which Buildkite's "
                          "if_changed and artifact_paths read as glob syntax (the step would match other files): "
                          f"rename it without any of {' '.join(GLOB_SPECIAL)}")
    return text


def _artifact_name(config: EvalConfig) -> str:
    """The config's name as part of an artifact path: the agent joins a step's artifact_paths with
    ';' and splits them there again (buildkite-agent's ArtifactPathDelimiter), so a ';' in a name
    would upload two wrong patterns and none of the run's files."""
    if ";" in config.name:
        raise ConfigError(config.source, 0, "name", f"{config.name!r} holds ';', which the Buildkite agent reads "
                          "as the separator of artifact paths (the run's files would not be uploaded): rename it "
                          "without ';'")
    return _literal(config, "name", config.name)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
