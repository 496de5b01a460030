"""Eval configs: loading, validation and list files (SPEC section 2).

Three shapes load into one `EvalConfig`:
- vLLM gen-2 (`tests/evals/gsm8k/configs`): `accuracy_threshold`, `server_args`, `env` ...
- vLLM gen-1 (`.buildkite/lm-eval-harness/configs`): `tasks: [{name, metrics: [{name, value}]}]`,
  `limit`, `rtol`, `env_vars`, `max_model_len`, `moe_backend` ...
- this project's extensions: `name`, `engine`, `dataset`, `gate`, `expect`, `requires`, ...

Every problem is a `ConfigError` whose text is `file:line: field: message`, found at load
time so that a typo never costs an hour-long run. Keys this schema does not know are kept in
`extra` and reported as warnings by `inspect_config` (lint), never rejected.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from quantgate.engine.serve_args import usage_problem

from . import backends
from .backends import Engine, Layer
from .evaluate import sha256_file
from .legacy import LEGACY_VARS, is_on, legacy_names, translate
from .options import flag_of, option_uses
from .yaml_lines import KeyPath, YamlDocument, YamlSyntaxError, load_yaml

GateMode = Literal["absolute", "relative", "hypothesis", "wilson", "paired", "recovery"]
# Tags `quantgate pipeline` acts on (the nightly tier runs every config, whatever its tags).
KNOWN_TAGS = ("pr", "release", "negative-check")
STATISTICAL_GATES: tuple[str, ...] = ("hypothesis", "wilson", "paired")
# The modes that gate against reference values: they alone gate a gen-1 file's listed metrics.
REFERENCE_MODES: tuple[str, ...] = ("relative", "hypothesis", "wilson")
DEFAULT_METRIC = "exact_match,strict-match"
CONFIG_SUFFIXES = (".yaml", ".yml")
LIST_SUFFIX = ".txt"


class ConfigError(ValueError):
    """A config problem located in a file. `line` is 1-based; 0 when there is no line."""

    def __init__(self, path: Path | str, line: int, field: str, message: str) -> None:
        self.path = Path(path)
        self.line = line
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else f"{self.path}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


# ---------------------------------------------------------------------------------------------
# The schema


def _number(value: Any) -> Any:
    # pydantic reads true as 1: `num_questions: true` would evaluate one question.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()} (YAML reads true/false as booleans)")
    return value


Int = Annotated[int, BeforeValidator(_number)]
Float = Annotated[float, BeforeValidator(_number)]
_INT64_MAX = 2**63 - 1  # the engines' seed range (OpenAI's `seed` is an int64)
# Finite numbers only: an infinite timeout or temperature passes every bound and fails mid-run.
_SCHEMA = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Block(BaseModel):
    """Our own nested blocks reject unknown keys: a typo there would silently disable a check."""

    model_config = _SCHEMA


class DatasetSpec(_Block):
    """Offline GSM8K-format data (`question`, `answer` ending in `#### N`), paths made absolute."""

    train: Path | None = None
    test: Path
    sha256: dict[Literal["train", "test"], str] = Field(default_factory=dict)


class GateSpec(_Block):
    mode: GateMode = "absolute"
    alpha: Float = Field(0.05, gt=0)
    beta: Float = Field(0.2, gt=0)
    rtol: Float | None = Field(None, ge=0, lt=1)  # None: the config's top-level `rtol`
    recovery: Float = Field(0.95, gt=0, le=1)  # a fraction of the baseline's accuracy
    max_invalid_rate: Float | None = Field(None, ge=0, le=1)

    @field_validator("alpha", "beta")
    @classmethod
    def _one_sided(cls, value: float, info: Any) -> float:
        # z(0.5) = 0: from there on the one-sided quantile has the other sign.
        if value >= 0.5:
            effect = ("a model exactly as good as its reference or baseline then fails at least half the time; the "
                      "usual value is 0.05" if info.field_name == "alpha" else
                      "the minimum detectable drop is then smaller than the drop the gate lets through (power below "
                      "50%); the usual value is 0.2")
            raise ValueError(f"must be below 0.5, got {value}: {effect}")
        return value


class Reference(BaseModel):
    """A measured reference and its provenance; extra provenance keys are kept."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    value: Float = Field(ge=0, le=1)
    stdev: Float | None = Field(None, ge=0)
    runs: Int | None = Field(None, ge=1)
    n: Int | None = Field(None, ge=1)
    measured_on: str | None = None
    date: str | None = None
    commit: str | None = None

    @field_validator("date", "measured_on", "commit", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        return None if value is None else str(value)  # YAML reads 2026-11-29 as a date


# The reference's numbers (the gates read value and n; calibrate writes stdev and runs): a key
# close to one of them is likely a typo that leaves it unset.
_REFERENCE_NUMBERS = ("value", "stdev", "runs", "n")


class Expect(_Block):
    linear_kernel: str | None = None
    moe_kernel: str | None = None


class Requires(_Block):
    """What GPU machine a config needs (any key means at least one GPU); a CPU config has none."""

    gpus: Int = Field(0, ge=0)
    device: str | None = None  # part of the GPU's name as nvidia-smi gives it: h100, a100, h200
    min_compute_capability: str | None = None

    @field_validator("device")
    @classmethod
    def _gpu_name(cls, value: str | None) -> str | None:
        if value is not None and value.strip().lower() in ("cpu", "cuda", "gpu", ""):
            raise ValueError(f"names a GPU model as nvidia-smi lists it (h100, a100, ...), got {value!r}; a config "
                             "for any machine has no requires:")
        return value

    @field_validator("min_compute_capability", mode="before")
    @classmethod
    def _capability(cls, value: Any) -> Any:
        if value is None:
            return None
        text = str(value).strip()
        major, dot, minor = text.partition(".")
        # ASCII digits: str.isdigit() also holds for digits int() refuses ('9²').
        if not (text.isascii() and major.isdigit() and (not dot or minor.isdigit())):
            raise ValueError(f"expected a compute capability like 8.0 or 9.0, got {value!r}")
        return f"{int(major)}.{int(minor or 0)}"


def parse_capability(text: str) -> tuple[int, ...]:
    """'9.0' -> (9, 0): a compute capability as requires: and nvidia-smi write it, comparable."""
    return tuple(int(part) for part in text.split("."))


class EvalConfig(BaseModel):
    """One eval config, every default applied and every path absolute."""

    model_config = _SCHEMA

    name: str = Field(min_length=1)
    source: Path
    sha256: str
    engine: Engine = "builtin"
    model_name: str = Field(min_length=1)
    server_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    task: str = "gsm8k"
    dataset: DatasetSpec | None = None
    metric: str = DEFAULT_METRIC
    num_questions: Int | None = Field(None, ge=1)
    num_fewshot: Int = Field(5, ge=0)
    max_tokens: Int = Field(256, ge=1)
    max_concurrency: Int | None = Field(None, ge=1)
    seed: Int | None = Field(None, ge=-_INT64_MAX - 1, le=_INT64_MAX)
    temperature: Float | None = Field(None, ge=0)
    use_chat_completions: bool = False
    gen_prefix: str | None = None
    request_timeout_seconds: Float | None = Field(None, gt=0)
    startup_max_wait_seconds: Float = Field(1200, gt=0)
    gate: GateSpec = Field(default_factory=GateSpec)
    accuracy_threshold: Float | None = Field(None, ge=0, le=1)
    tolerance: Float = Field(0.08, ge=0, le=1)
    rtol: Float = Field(0.08, ge=0, lt=1)
    reference: Reference | None = None
    # Metrics gated besides `metric`, each against its own value (lm-eval name -> reference
    # value): a gen-1 file's other tasks[0].metrics, which vLLM's test gates too. Not a YAML key.
    other_references: dict[str, Float] = Field(default_factory=dict)
    baseline: str | None = None
    baseline_path: Path | None = None  # the baseline's config or results file, when one was found
    expect: Expect = Field(default_factory=Expect)
    requires: Requires = Field(default_factory=Requires)
    tags: list[str] = Field(default_factory=list)
    vllm_command: list[str] | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("server_args", "vllm_command", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:  # unbalanced quotes
                raise ValueError(f"cannot split into arguments: {exc}") from None
        if isinstance(value, list):
            return [_scalar_text(v) for v in value]
        if value is None:
            return value
        raise ValueError(f"expected a string of arguments (split like a shell) or a list, got {type(value).__name__}")

    @field_validator("name")
    @classmethod
    def _file_name(cls, value: str) -> str:
        # The name is a directory under --output-dir and a junit test id.
        if (value in (".", "..") or any(c in value for c in "/\\") or any(ord(c) < 32 or ord(c) == 127 for c in value)
                or value != value.strip()):
            raise ValueError(f"names the config's folder under --output-dir, so it cannot be '.', '..', hold '/', "
                             f"'\\' or control characters, or begin or end with a space, got {value!r}; use letters, "
                             "digits, '-', '_' and '.'")
        if len(value.encode()) > 255:  # NAME_MAX of Linux file systems
            raise ValueError(f"names the config's folder under --output-dir, and {len(value.encode())} bytes is "
                             "more than a folder name may have (255); give the config a shorter name")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env_text(cls, value: Any) -> Any:
        if value is None:  # `env:` with every variable commented out, as gen-1's `env_vars:` is read
            return {}
        if isinstance(value, dict):
            return {str(k): _scalar_text(v) for k, v in value.items()}
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not name or "=" in name or "\0" in name or "\0" in text:
                raise ValueError(f"{name!r}: environment variable names cannot be empty or hold '=' and neither names "
                                 "nor values can hold NUL characters; the server could not be started with it")
        return value

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, value: Any) -> Any:
        # As the tiers read them: `Release` is `release`, not a tag no tier selects.
        tags = [value] if isinstance(value, str) else value
        return [t.strip().lower() if isinstance(t, str) else t for t in tags] if isinstance(tags, list) else tags

    @field_validator("gate", mode="before")
    @classmethod
    def _gate_shorthand(cls, value: Any) -> Any:
        return {"mode": value} if isinstance(value, str) else value

    @property
    def effective_rtol(self) -> float:
        return self.gate.rtol if self.gate.rtol is not None else self.rtol

    def backend_flags(self) -> dict[str, str]:
        """`--linear-backend` / `--moe-backend` values named in server_args."""
        return backend_flags_of(self.server_args)


def _scalar_text(value: Any) -> Any:
    if isinstance(value, bool):
        return "1" if value else "0"  # env switches; `true` in YAML means "1" to the engines
    if isinstance(value, (int, float)):
        return str(value)
    return value


# ---------------------------------------------------------------------------------------------
# Loading


@dataclass
class Inspection:
    """Everything lint reports about one file."""

    path: Path
    config: EvalConfig | None
    errors: list[ConfigError] = field(default_factory=list)
    warnings: list[ConfigError] = field(default_factory=list)


# Keys of vLLM's two formats that quantgate understands but spells differently, or turns
# into server flags; see _normalize.
_GEN1_KEYS = {"tasks", "limit", "env_vars"}
# What a run reports besides the gated metric (result.json "metrics": its "value"), by lm-eval
# name -> key there (harness/evaluate.py `_metrics`): the other metrics a gen-1 file can gate.
REPORTED_METRICS = {"exact_match,strict-match": "strict_match", "exact_match,flexible-extract": "flexible_extract"}
# Keys of both vLLM formats that are engine options: key -> (flag, takes a value, engines that accept the flag)
_ENGINE_OPTION_KEYS: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    "max_model_len": ("--max-model-len", True, ("builtin", "vllm")),
    "moe_backend": ("--moe-backend", True, ("builtin", "vllm")),
    "enforce_eager": ("--enforce-eager", False, ("builtin", "vllm")),
    "trust_remote_code": ("--trust-remote-code", False, ("vllm",)),
    "kv_cache_dtype": ("--kv-cache-dtype", True, ("vllm",)),
    "tokenizer_mode": ("--tokenizer-mode", True, ("vllm",)),
    "max_num_seqs": ("--max-num-seqs", True, ("builtin", "vllm")),
    "max_num_batched_tokens": ("--max-num-batched-tokens", True, ("vllm",)),
    "tensor_parallel_size": ("--tensor-parallel-size", True, ("builtin", "vllm")),
    "gpu_memory_utilization": ("--gpu-memory-utilization", True, ("vllm",)),
    "dtype": ("--dtype", True, ("builtin", "vllm")),
}
# Keys real vLLM configs carry that mean nothing to quantgate (ROCm and spec-decode knobs,
# lm-eval options of vLLM's in-process runner).
_VLLM_ONLY_KEYS = {
    "rocm_request_timeout_seconds", "rocm_safetensors_load_strategy", "required_gpu_arch",
    "min_acceptance_length", "batch_size", "backend", "gen_kwargs", "apply_chat_template",
    "fewshot_as_multiturn", "system_instruction",
}
_OWN_KEYS = set(EvalConfig.model_fields) - {"source", "sha256", "baseline_path", "extra", "other_references"}
_GATE_ONLY_KEYS = set(GateSpec.model_fields) - _OWN_KEYS  # alpha, beta, recovery ...: read under gate: only
# What a mode that reads no reference value compares the gated metric with.
_COMPARED_WITH = {"absolute": "accuracy_threshold - tolerance", "paired": "the baseline{baseline}'s answers, question "
                  "by question", "recovery": "the baseline{baseline}'s measured value"}
_GATE_KEYS_READ: dict[str, set[str]] = {  # per mode, besides max_invalid_rate, which every mode reads
    "absolute": set(), "relative": {"rtol"}, "hypothesis": {"alpha", "beta"}, "wilson": {"alpha", "rtol"},
    "paired": {"alpha"}, "recovery": {"recovery"},
}


def load_config(path: Path | str, engine: Engine | None = None) -> EvalConfig:
    """Load and validate one config file; raise the first ConfigError.

    `engine` overrides the file's `engine:` (`quantgate run --engine`), before backend names
    are checked against that engine's known set.
    """
    result = inspect_config(path, engine)
    if result.errors:
        raise result.errors[0]
    assert result.config is not None
    return result.config


def inspect_config(path: Path | str, engine: Engine | None = None, models: bool = False) -> Inspection:
    """Validate one config file and collect every error and warning (for lint); with `models`,
    also warn when a builtin config's model folder is not found here (lint's check of the files a
    config names: `quantgate run` refuses such a config itself)."""
    path = Path(path)
    report = Inspection(path=path, config=None)
    try:
        raw = path.read_bytes()
        doc = load_yaml(path)
    except FileNotFoundError:
        report.errors.append(ConfigError(path, 0, "", "no such file"))
        return report
    except IsADirectoryError:
        report.errors.append(ConfigError(path, 0, "", "is a directory, not a config file"))
        return report
    except OSError as exc:  # unreadable, a name too long, a loop of links
        report.errors.append(ConfigError(path, 0, "", f"cannot be read: {exc.strerror or exc}"))
        return report
    except YamlSyntaxError as exc:
        report.errors.append(ConfigError(path, exc.line, "", exc.message))
        return report
    if doc.data is None or doc.data == {}:
        report.errors.append(ConfigError(path, 1, "", "empty config: the file has no keys (all commented out?)"))
        return report
    if not isinstance(doc.data, dict):
        kind = type(doc.data).__name__
        report.errors.append(ConfigError(path, 1, "", f"a config must be a mapping of keys to values, got a {kind}"))
        return report
    _Loader(path, raw, doc, engine, report, models).run()
    return report


class _Loader:
    """One file's journey from YAML to EvalConfig, with every problem located."""

    def __init__(self, path: Path, raw: bytes, doc: YamlDocument, engine: Engine | None, report: Inspection,
                 models: bool = False):
        self.path, self.raw, self.doc, self.report = path, raw, doc, report
        self.engine_override = engine
        self.check_models = models
        self.data: dict[str, Any] = doc.data
        self.origin: dict[str, KeyPath] = {}  # EvalConfig field -> YAML key path it came from
        self.arg_origin: dict[int, KeyPath] = {}  # server_args index -> the option key that added it
        self.listed: dict[str, Any] = {}  # a gen-1 file's tasks[0].metrics: name -> value, in file order

    def error(self, key_path: KeyPath, message: str, *, value: bool = False) -> None:
        line = self.doc.value_line(key_path) if value else self.doc.line(key_path)
        self.report.errors.append(ConfigError(self.path, line, _dotted(key_path), message))

    def warn(self, key_path: KeyPath, message: str) -> None:
        self.report.warnings.append(ConfigError(self.path, self.doc.line(key_path), _dotted(key_path), message))

    def run(self) -> None:
        fields = self._normalize()
        if self.report.errors:
            return
        try:
            config = EvalConfig.model_validate(fields)
        except ValidationError as exc:
            for err in exc.errors():
                self._pydantic_error(err)
            self._check_switches_despite(exc, fields)
            return
        config = self._check(config)
        if not self.report.errors:
            self.report.config = config

    # -- shape: three formats to one set of fields ----------------------------------------------

    def _normalize(self) -> dict[str, Any]:
        data = self.data
        out: dict[str, Any] = {"source": self.path.resolve(), "sha256": hashlib.sha256(self.raw).hexdigest()}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                self.error([key], f"keys must be text, got {key!r}")
            elif key in _OWN_KEYS:
                out[key] = value
                self.origin[key] = [key]
            elif key not in _GEN1_KEYS and key not in _ENGINE_OPTION_KEYS:
                extra[key] = value
        out["name"] = out.get("name", self.path.stem)
        if self.engine_override is not None:
            out["engine"] = self.engine_override
        self._gen1(out)
        self._engine_option_flags(out, extra)
        engine = out.get("engine", "builtin")
        for key in extra:
            if key in _ENGINE_OPTION_KEYS:
                flag = _ENGINE_OPTION_KEYS[key][0]
                self.warn([key], f"kept, but engine {engine} has no {flag}: it applies with engine: vllm")
            elif key in _GATE_ONLY_KEYS:
                self.error([key], f"belongs under gate: (gate: {{{key}: ...}}); at the top level nothing reads it")
            elif key in _VLLM_ONLY_KEYS:
                self.warn([key], "a vLLM harness key quantgate does not use; kept as-is")
            else:
                hint = _did_you_mean(key, sorted(_OWN_KEYS | _GEN1_KEYS | set(_ENGINE_OPTION_KEYS)))
                self.warn([key], f"unknown key, not used by quantgate; kept as-is{hint}")
        out["extra"] = extra
        return out

    def _gen1(self, out: dict[str, Any]) -> None:
        data = self.data
        if "env_vars" in data:
            env_vars = data["env_vars"] or {}
            if not isinstance(env_vars, dict):
                self.error(["env_vars"], "must be a mapping of variable names to values")
            elif isinstance(out.get("env"), dict):
                clash = sorted(set(env_vars) & set(out["env"]))
                if clash:
                    self.error(["env_vars"], f"{', '.join(clash)} set in both env and env_vars; keep one")
                out["env"] = {**out["env"], **env_vars}
            else:
                out["env"] = env_vars
                self.origin["env"] = ["env_vars"]
        if "limit" in data:
            if "num_questions" in data:
                self.error(["limit"], "set either num_questions or limit (the gen-1 spelling), not both")
            out["num_questions"] = data["limit"]
            self.origin["num_questions"] = ["limit"]
        if "tasks" in data:
            self._gen1_tasks(out, data["tasks"])

    def _gen1_tasks(self, out: dict[str, Any], tasks: Any) -> None:
        if not isinstance(tasks, list) or not tasks:
            self.error(["tasks"], "must be a list like [{name: gsm8k, metrics: [{name: ..., value: ...}]}]")
            return
        if len(tasks) > 1:
            self.error(["tasks", 1], "one task per config: split the other tasks into their own config files")
            return
        task = tasks[0]
        if not isinstance(task, dict) or not isinstance(task.get("name"), str):
            self.error(["tasks", 0], "a task needs a `name` (the lm-eval task, e.g. gsm8k)")
            return
        if "task" in self.data and self.data["task"] != task["name"]:
            self.error(["task"], f"task {self.data['task']!r} contradicts tasks[0].name {task['name']!r}")
        out.setdefault("task", task["name"])
        self.origin.setdefault("task", ["tasks", 0, "name"])
        metrics = task.get("metrics") or []
        values: dict[str, tuple[int, Any]] = {}
        for i, metric in enumerate(metrics if isinstance(metrics, list) else [None]):
            if not isinstance(metric, dict) or not isinstance(metric.get("name"), str) or "value" not in metric:
                self.error(["tasks", 0, "metrics", i], "each metric needs `name` and `value`")
                return
            if metric["name"] in values:
                self.error(["tasks", 0, "metrics", i, "name"], f"{metric['name']!r} is listed twice (also "
                           f"tasks[0].metrics[{values[metric['name']][0]}]); keep the one value to gate against")
                return
            values[metric["name"]] = (i, metric["value"])
        if not values:
            return
        self.listed = {name: value for name, (_, value) in values.items()}
        gated = out.get("metric", DEFAULT_METRIC)
        if "reference" not in self.data:  # an explicit reference: wins over the gated metric's listed value
            if gated not in values:
                if "metric" in self.data:
                    self.error(["metric"], f"{gated!r} is not among tasks[0].metrics ({', '.join(values)})")
                    return
                gated = next(iter(values))  # e.g. mbpp's pass_at_1: gate what the file lists
                out["metric"] = gated
                self.origin["metric"] = ["tasks", 0, "metrics", 0, "name"]
            index, value = values[gated]
            out["reference"] = {"value": value}
            self.origin["reference"] = ["tasks", 0, "metrics", index]
        # vLLM's test gates every listed metric (measured >= value * (1 - rtol), all must pass):
        # keeping only the gated one would pass a run whose flexible-extract score vLLM fails.
        others: dict[str, float] = {}
        for name, (index, value) in values.items():
            if name == gated:
                continue
            where: list[str | int] = ["tasks", 0, "metrics", index]
            if name not in REPORTED_METRICS:
                measured = ", ".join(dict.fromkeys([gated, *REPORTED_METRICS]))
                self.error(where + ["name"], f"{name!r} is gated by vLLM's test too, but a run measures only "
                           f"{measured}: gate {name!r} in a config of its own (metric: {name!r}), or remove it here")
                continue
            try:
                others[name] = Reference.model_validate({"value": value}).value
            except ValidationError as exc:
                problem = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
                self.error(where + ["value"], f"{problem} (got {_short(value)})", value=True)
        if others:
            out["other_references"] = others

    def _gen1_metric_path(self, name: str) -> list[str | int]:
        """Where tasks[0].metrics lists metric `name`."""
        metrics = self.data["tasks"][0]["metrics"]
        index = next(i for i, metric in enumerate(metrics) if metric["name"] == name)
        return ["tasks", 0, "metrics", index, "name"]

    def _engine_option_flags(self, out: dict[str, Any], extra: dict[str, Any]) -> None:
        """Engine options written as keys (`max_model_len: 4096`, in both vLLM formats) become
        server flags for engines that take them; server_args naming the flag win."""
        engine = out.get("engine", "builtin")
        args = out.get("server_args", [])
        if isinstance(args, str):
            try:
                args = shlex.split(args)
            except ValueError:
                return  # reported by validation
        if not isinstance(args, list):
            return
        args = [str(a) for a in args]
        added: list[str] = []
        for key, (flag, takes_value, engines) in _ENGINE_OPTION_KEYS.items():
            if key not in self.data:
                continue
            value = self.data[key]
            if engine not in engines:
                extra[key] = value
                continue
            if _has_flag(args, flag):
                self.warn([key], f"not used: server_args already give {flag}, which wins; keep one")
                continue
            self.arg_origin[len(args) + len(added)] = [key]
            if takes_value:
                if value is not None:
                    added += [flag, str(value)]
                    self.arg_origin[len(args) + len(added) - 1] = [key]
            elif _switch(value) is None:
                self.error([key], f"expected true or false (or yes/no, on/off, 1/0), got {_short(value)}", value=True)
            elif _switch(value):
                added.append(flag)
            self.origin.setdefault("server_args", [key])
        if added:
            out["server_args"] = args + added

    # -- validation errors ---------------------------------------------------------------------

    def _pydantic_error(self, err: Mapping[str, Any]) -> None:
        loc = list(err["loc"])
        top = str(loc[0]) if loc else ""
        key_path: list[str | int] = list(self.origin.get(top, [top])) + loc[1:]
        if err["type"] == "extra_forbidden" and len(loc) >= 2:
            model = {"gate": GateSpec, "dataset": DatasetSpec, "expect": Expect, "requires": Requires}.get(top)
            known = sorted(model.model_fields) if model else []
            message = f"unknown key{_did_you_mean(str(loc[-1]), known)} (known: {', '.join(known)})"
        elif err["type"] == "missing":
            message = "required"
            if top == "model_name":
                message = "required: the model to serve (a Hugging Face id or a local folder)"
        elif err["type"] == "value_error":  # the validators' own messages say what they got
            message = str(err["msg"]).removeprefix("Value error, ")
            if "got" not in message:
                message += f" (got {_short(err.get('input'))})"
        else:
            message = f"{err['msg']} (got {_short(err.get('input'))})"
        self.error(key_path, message, value=err["type"] != "missing")

    # -- checks across fields ------------------------------------------------------------------

    def _check_switches_despite(self, exc: ValidationError, fields: dict[str, Any]) -> None:
        """Report legacy env, backend names, server flags and `expect:` names even when other
        fields failed validation, so one lint pass shows every problem."""
        broken = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
        if broken & {"engine", "server_args", "env"}:
            return
        expect = Expect() if "expect" in broken else Expect.model_validate(fields.get("expect") or {})
        partial = EvalConfig.model_construct(
            engine=fields.get("engine", "builtin"),
            server_args=EvalConfig._split(fields.get("server_args", [])),
            env=EvalConfig._env_text(fields.get("env") or {}),
            expect=expect,
        )
        self._check_env(partial)
        self._check_backends(partial)
        self._check_server_flags(partial)
        self._check_expect(partial)

    def _check(self, config: EvalConfig) -> EvalConfig:
        self._check_env(config)
        self._check_backends(config)
        self._check_server_flags(config)
        self._check_expect(config)
        self._check_parallel_gpus(config)
        if self.check_models:
            self._check_model_folder(config)
        gate = self._check_gate(config)
        dataset = self._check_dataset(config)
        self._check_question_count(config, gate, dataset)
        metric = self._check_task(config)
        baseline_path = self._resolve_baseline(config)
        return config.model_copy(update={"gate": gate, "dataset": dataset, "baseline_path": baseline_path,
                                          "metric": metric})

    def _at(self, field_name: str, *rest: str | int) -> list[str | int]:
        return list(self.origin.get(field_name, [field_name])) + list(rest)

    def _check_env(self, config: EvalConfig) -> None:
        chosen = config.backend_flags()
        translation = translate(config.env, chosen)
        for name in legacy_names(config.env):
            if name in translation.unresolved:
                fix = translation.unresolved[name]
            elif LEGACY_VARS[name].rewrite(config.env[name], config.env) == []:  # off: it chooses nothing
                fix = (f"remove it: as set here ({name}={config.env[name]}) it turns no kernel on "
                       "(`quantgate migrate --write` does it)")
            elif translation.flags:
                fix = f"use `{' '.join(translation.flags)}` in server_args instead (`quantgate migrate --write` does it)"
            else:
                fix = "remove it: server_args already choose the backend (`quantgate migrate --write` does it)"
            self.error(self._at("env", name), f"legacy kernel switch ({LEGACY_VARS[name].meaning}): {fix}")

    def _check_backends(self, config: EvalConfig) -> None:
        for flag, value, arg_index in _backend_flags(config.server_args, strict=True):
            layer: Layer = "linear" if flag == "--linear-backend" else "moe"
            where = self._server_arg_path(arg_index)
            if value is None:
                self.error(where, f"{flag} needs a value", value=True)
                continue
            problem = backends.check_backend(config.engine, layer, value)
            if problem:
                self.error(where, problem.message, value=True)
        seen: dict[str, str] = {}
        for flag, value, arg_index in _backend_flags(config.server_args):
            if flag in seen and backends.canonical(seen[flag]) != backends.canonical(value):
                self.error(self._server_arg_path(arg_index), f"{flag} given twice ({seen[flag]}, {value})", value=True)
            seen[flag] = value

    def _check_server_flags(self, config: EvalConfig) -> None:
        """server_args as arguments: one per list item, flags given once, and the built-in
        engine's own parser on them. Flags it refuses are an error in a file that chose the
        builtin engine and a warning in one that names no engine (vLLM's own files must load
        unchanged); `quantgate run` refuses both before any server starts, with exit 3."""
        for index, arg in enumerate(config.server_args):
            if arg.startswith("-") and any(c.isspace() for c in arg.partition("=")[0]):
                self.error(self._server_arg_path(index), f"{arg!r} is one list item holding several arguments: give "
                           f"each its own item ({', '.join(map(repr, arg.split()))}), or write server_args as one "
                           "string", value=True)
        flags: dict[str, str] = {}
        for arg in config.server_args:
            flag = flag_of(arg)
            if flag.startswith("--") and flag not in _BACKEND_FLAGS:
                if flag in flags:
                    self.warn(self._at("server_args"), f"{flag} given twice: for most flags the server keeps only "
                              "the last value; remove one")
                flags[flag] = arg
        problem = builtin_flags_problem(config)
        if problem:
            # vLLM's own files name no engine and must load; a file that chose builtin is wrong.
            explicit = self.engine_override or self.data.get("engine")
            report = self.error if explicit == "builtin" else self.warn
            report(self._refused_flags_path(config), f"{problem}; so `quantgate run` refuses this config")
        if config.vllm_command is not None and config.engine == "builtin":
            self.warn(self._at("vllm_command"), "not used: engine builtin runs `quantgate serve`; set `engine: vllm` "
                      "to run this command, or remove it")

    def _refused_flags_path(self, config: EvalConfig) -> list[str | int]:
        """Where the flags `quantgate serve` refuses come from: server_args when they alone are
        refused, else the first engine option key (`tensor_parallel_size: 2`) whose flags are;
        the problem is then named at that key, not at whichever option key came first."""
        count = len(config.server_args)
        added: dict[tuple[str | int, ...], list[int]] = {}
        for index in sorted(i for i in self.arg_origin if i < count):
            added.setdefault(tuple(self.arg_origin[index]), []).append(index)
        if not added:
            return self._at("server_args")
        from_keys = {i for indices in added.values() for i in indices}
        own = [arg for i, arg in enumerate(config.server_args) if i not in from_keys]
        if "server_args" in self.data and builtin_flags_problem(config.model_copy(update={"server_args": own})):
            return ["server_args"]
        for key, indices in added.items():
            args = own + [config.server_args[i] for i in indices]
            if builtin_flags_problem(config.model_copy(update={"server_args": args})):
                return list(key)
        return self._at("server_args")

    def _check_model_folder(self, config: EvalConfig) -> None:
        """A name that points into a local folder (an absolute path, or one whose first part is a
        folder next to the config, above it or in the CWD: `models/tiny-qwen3-fp8-block`) but
        holds no model. Not a hub id (`Qwen/Qwen3-8B`, no `Qwen/` folder) nor a bare name. A
        warning, not an error: a shipped FP8 variant exists only once `make models` built it."""
        name = Path(config.model_name)
        bases = (config.source.parent, *config.source.parent.parents, Path.cwd())
        local = name.is_absolute() or (len(name.parts) > 1 and any((b / name.parts[0]).is_dir() for b in bases))
        if config.engine == "builtin" and local and not (Path(resolve_model(config)) / "config.json").is_file():
            self.warn(self._at("model_name"), f"{config.model_name} is not a model folder here (no config.json next to "
                      "the config, in a folder above it, or in the current directory), so `quantgate run` refuses "
                      "it: fix the path (a shipped FP8 variant is built by `make models`), or set `engine: vllm` for "
                      "a hub id")
        elif config.engine == "builtin" and local and not (Path(resolve_model(config)) / "tokenizer.json").is_file():
            self.warn(self._at("model_name"), f"{config.model_name} has no tokenizer.json, so `quantgate run` refuses "
                      "it (the builtin engine cannot read text prompts without one): copy tokenizer.json from the "
                      "model's source into the folder")

    def _check_parallel_gpus(self, config: EvalConfig) -> None:
        """A vLLM server of tensor x pipeline x data parallelism N needs N GPUs: `quantgate
        pipeline` asks for them, but `quantgate run` checks the machine against requires: alone."""
        needed = parallel_gpus(config.server_args)
        if config.engine != "vllm" or needed <= max(config.requires.gpus, 1):
            return
        sizes = _local_sizes(config.server_args)
        product = " x ".join(f"{name} {sizes.get(kind, (1, 0))[0]}" for kind, name in _PARALLEL_NAMES.items())
        runs = f"server_args run vLLM on {needed} GPUs ({product})"
        fix = f"`quantgate run` would start it on a machine with fewer; set requires: {{gpus: {needed}}}"
        requires = self.data.get("requires")
        if isinstance(requires, dict) and "gpus" in requires:
            self.warn(["requires", "gpus"], f"is {config.requires.gpus}, but {runs}: {fix}")
        else:
            where = ["requires"] if "requires" in self.data else \
                self._server_arg_path(min(index for _, index in sizes.values()))
            self.warn(where, f"{runs}, but requires: gives no gpus: {fix}")

    def _server_arg_path(self, arg_index: int) -> list[str | int]:
        if arg_index in self.arg_origin:
            return list(self.arg_origin[arg_index])
        origin = self.origin.get("server_args", ["server_args"])
        if origin == ["server_args"] and isinstance(self.data.get("server_args"), list):
            return ["server_args", arg_index]
        return list(origin)

    def _check_expect(self, config: EvalConfig) -> None:
        for layer, value in (("linear", config.expect.linear_kernel), ("moe", config.expect.moe_kernel)):
            if value is None:
                continue
            problem = backends.check_expected_kernel(config.engine, layer, value)  # type: ignore[arg-type]
            if problem:
                self.error(["expect", f"{layer}_kernel"], problem.message, value=True)
        variable, level = backends.VLLM_DEBUG_ENV
        moe = config.expect.moe_kernel or config.backend_flags().get(backends.FLAGS["moe"])
        if (config.engine == "vllm" and moe is not None and backends.canonical(moe) in backends.VLLM_MOE_DEBUG_PROOF
                and config.env.get(variable, level).strip().upper() != level):
            self.error(["env", variable], f"a deep_gemm MoE expectation ({moe}) needs {variable}={level}: vLLM's "
                       "deep_gemm MoE runs Triton for every shape DeepGEMM refuses and says so only in DEBUG lines, "
                       f"so at {config.env[variable]} nothing can prove DeepGEMM ran; drop {variable} (the runner "
                       f"then sets {level}) or set it to {level}", value=True)

    def _check_gate(self, config: EvalConfig) -> GateSpec:
        """The gate with its mode settled; a missing input is an error now, not after the run."""
        mode = config.gate.mode
        given = self.data.get("gate")
        if not (isinstance(given, str) or (isinstance(given, dict) and "mode" in given)):
            mode = _default_mode(config) or mode
            if _default_mode(config) is None:
                self.error([], "no accuracy gate: set accuracy_threshold (absolute), reference (relative), "
                           "or gate: {mode: ...} with its inputs")
                return config.gate
        where = ["gate", "mode"] if "gate" in self.data else []
        if isinstance(given, dict) and "rtol" in given and "rtol" in self.data:
            self.warn(["gate", "rtol"], f"set twice: gate.rtol ({given['rtol']}) is used, the top-level rtol "
                      f"({self.data['rtol']}) is not; keep one")
        if mode == "absolute" and config.accuracy_threshold is None:
            self.error(where, "mode absolute needs accuracy_threshold (passes iff measured >= threshold - tolerance)")
        if mode in ("relative", "hypothesis", "wilson") and config.reference is None:
            self.error(where, f"mode {mode} needs reference: {{value: ...}} (or a gen-1 tasks[0].metrics value)")
        if mode in ("paired", "recovery") and config.baseline is None:
            self.error(where, f"mode {mode} needs baseline: the config name or results file to compare against")
        self._warn_gate_cannot_decide(config, mode)
        self._warn_listed_values_unread(config, mode)
        if isinstance(given, dict):
            for key in sorted(set(given) - {"mode", "max_invalid_rate"} - _GATE_KEYS_READ[mode]):
                self.warn(["gate", key], f"not read by mode {mode} (it reads "
                          f"{', '.join(sorted(_GATE_KEYS_READ[mode])) or 'none of alpha, beta, rtol, recovery'}); "
                          "remove it, or set the mode that uses it")
        for key in (config.reference.model_extra or {}) if config.reference is not None else ():
            # Only the numbers: a key close to a text one (measured_by, commit_sha) is provenance as
            # much as measured_on or commit are, and renaming it would change nothing.
            hint = _did_you_mean(key, _REFERENCE_NUMBERS)  # other keys are provenance, kept on purpose
            if hint:
                self.warn(["reference", key], f"kept as provenance, read by no gate{hint}")
        for index, tag in enumerate(config.tags):
            if "," in tag:  # `tags: pr, release` is YAML for the one string "pr, release"
                parts = [part.strip() for part in tag.split(",") if part.strip()]
                where = self._at("tags") if isinstance(self.data.get("tags"), str) else self._at("tags", index)
                self.warn(where, f"tag {tag!r} is one tag holding a comma, which no tier of `quantgate "
                          f"pipeline` acts on (YAML reads `tags: a, b` as one string); write a list: "
                          f"tags: [{', '.join(parts)}]")
                continue
            # `nightly-h100` is a label; `negative` or `neg-check` a config pipeline would not expect to FAIL.
            close = difflib.get_close_matches(tag, KNOWN_TAGS, n=1, cutoff=0.8) or (
                ["negative-check"] if isinstance(tag, str) and tag.startswith("neg") else [])
            if tag not in KNOWN_TAGS and close:
                self.warn(self._at("tags", index), f"tag {tag!r} is not one `quantgate pipeline` acts on; did you "
                          f"mean {close[0]!r}? (it acts on {', '.join(KNOWN_TAGS)}; other tags are labels only)")
        if "release" in config.tags and mode not in STATISTICAL_GATES:
            self.error(self._at("tags"), f"a config tagged release needs a statistical gate "
                       f"({', '.join(STATISTICAL_GATES)}), not {mode}: a release verdict must account for noise")
        return config.gate.model_copy(update={"mode": mode})

    def _warn_listed_values_unread(self, config: EvalConfig, mode: str) -> None:
        """A gen-1 file's tasks[0].metrics values are what vLLM's test gates every listed metric
        against; only the reference modes read them, so under any other mode the file looks
        gated against values nothing reads, and its other listed metrics are not gated at all."""
        if not self.listed or mode in REFERENCE_MODES:
            return
        values = ", ".join(f"{name} {value}" for name, value in self.listed.items())
        others = [name for name in self.listed if name != config.metric]
        lost = f", so {' and '.join(others)} {'is' if len(others) == 1 else 'are'} not gated at all" if others else ""
        own = "".join(f" and gate {name} in a config of its own (metric: {name!r})" for name in others)
        modes = f"{', '.join(REFERENCE_MODES[:-1])} and {REFERENCE_MODES[-1]}"
        compared = _COMPARED_WITH[mode].format(baseline=f" {config.baseline}" if config.baseline else "")
        self.warn(["tasks", 0, "metrics"], f"gate {mode} reads none of the values listed here ({values}): it "
                  f"compares {config.metric} with {compared}{lost}; vLLM's gen-1 test gates every listed metric "
                  f"against its value, as quantgate does only in modes {modes}: set gate: {{mode: relative}} (vLLM's "
                  f"own) to gate them, or keep gate {mode}, remove tasks[0].metrics{own}")

    def _warn_gate_cannot_decide(self, config: EvalConfig, mode: str) -> None:
        """Gates whose inputs leave nothing to measure: valid, so a warning, but never intended."""
        threshold = config.accuracy_threshold
        if mode == "absolute" and threshold is not None and config.tolerance >= threshold:
            where = self._at("tolerance") if "tolerance" in self.data else self._at("accuracy_threshold")
            self.warn(where, f"tolerance {config.tolerance:g} >= accuracy_threshold {threshold:g}: the threshold "
                      f"accuracy_threshold - tolerance is {threshold - config.tolerance:g}, so the gate can never "
                      "fail; tolerance is an accuracy subtracted from accuracy_threshold (default 0.08): lower it")
        value = config.reference.value if config.reference else None
        if mode == "relative" and value == 0:
            self.warn(self._at("reference", "value"), "reference 0 with gate relative: the threshold reference * "
                      "(1 - rtol) is 0, so the gate can never fail; set the reference to the accuracy measured "
                      "(`quantgate calibrate`)")
        if mode in REFERENCE_MODES:  # a gen-1 file's other listed metrics are gated by the same mode
            for name, other in config.other_references.items():
                if other == 0:
                    self.warn(self._gen1_metric_path(name)[:-1] + ["value"], f"{name} is listed with value 0: gate "
                              f"{mode} gates it against a threshold of 0, so it can never fail; list the accuracy "
                              "measured, or remove it")
        if mode in ("hypothesis", "wilson") and value in (0, 1):
            rtol_threshold = value * (1 - config.effective_rtol)
            if value == 0:
                consequence = "the threshold is 0, so the gate can never fail"
            elif mode == "hypothesis":
                consequence = "the threshold is the reference itself, so any single miss fails"
            elif rtol_threshold >= 1:
                consequence = "the threshold is 1, which no Wilson lower bound reaches, so the gate can never pass"
            else:
                consequence = f"the threshold {rtol_threshold:g} comes from rtol alone, not from measured noise"
            self.warn(self._at("reference", "value"), f"reference {value:g} with gate {mode} has no spread (sigma = "
                      f"sqrt(p (1 - p)) = 0): {consequence}; measure the reference on more questions "
                      "(`quantgate calibrate`) or gate absolute")

    def _check_question_count(self, config: EvalConfig, gate: GateSpec, dataset: DatasetSpec | None) -> None:
        """What the question count the config evaluates leaves a gate: a test file with fewer
        questions than num_questions is evaluated whole, on fewer questions than configured (the
        thresholds were set for num_questions); and on so few questions a hypothesis threshold
        falls to 0 or below, or no outcome of a paired test reaches alpha, so the gate can never fail
        (a warning, an error for a config tagged release)."""
        n = config.num_questions
        where = self._at("num_questions") if n is not None else ["dataset", "test"]
        available = count_test_questions(config.model_copy(update={"dataset": dataset})) \
            if dataset is not None and dataset.test.is_file() else None
        if n is not None and available is not None and available < n:
            self.warn(where, f"num_questions is {n}, but the test file {dataset.test} holds {available} questions: "
                      f"a run evaluates those {available} only; lower num_questions to {available}, or use a "
                      "test file that holds enough")
        if available is not None:
            n = available if n is None else min(n, available)
        if n is None:
            return
        # A release verdict that cannot fail is refused, as a release gate that ignores noise is.
        never_fails = self.error if "release" in config.tags else self.warn
        release = "; a config tagged release must be able to fail" if "release" in config.tags else ""
        if gate.mode == "paired" and 0.5 ** n >= gate.alpha:
            never_fails(where, f"gate paired on {n} question(s) can never fail: even {n} of {n} answers turning "
                        f"wrong has a one-sided p-value of 0.5^{n} = {0.5 ** n:.4g}, not below alpha {gate.alpha:g}; "
                        f"evaluate more questions{release}")
        value = config.reference.value if config.reference else None
        if gate.mode == "hypothesis" and value is not None and 0 < value < 1:
            from .gates import hypothesis  # gates imports this module

            threshold = hypothesis(0.0, value, n, gate.alpha, n_reference=config.reference.n)[1]["threshold"]
            if threshold <= 0:
                never_fails(where, f"gate hypothesis on {n} question(s) against reference {value:g} has a threshold "
                            f"of {threshold:.4f} (at or below 0), so it can never fail; evaluate more "
                            f"questions{release}")

    def _check_task(self, config: EvalConfig) -> str:
        """The metric as the installed lm-eval task reports it; few-shot data."""
        if config.gen_prefix is not None and config.use_chat_completions:
            # lm-eval sends API chat models the messages only: its "continue the last turn" flag is
            # lost, and the server (quantgate's, as vLLM's) closes the prefix turn and opens an empty
            # assistant turn, so the answer does not start with the prefix.
            self.warn(self._at("gen_prefix"), "with use_chat_completions: true the server closes the prefix's "
                      "turn and starts a new assistant turn, so the answer does not continue the prefix; use "
                      "completions (use_chat_completions: false) or drop gen_prefix")
        from .evaluate import EvalSetupError, check_metric, fewshot_from_train, task_config

        try:
            _, task_cfg = task_config(config.task)  # what the run rebuilds: a task it cannot is refused now
        except EvalSetupError as exc:
            self.error(self._at("task"), str(exc), value=True)
            return config.metric
        if (config.dataset is not None and config.num_fewshot > 0 and config.dataset.train is None
                and fewshot_from_train(task_cfg)):
            self.error(["dataset"], f"num_fewshot is {config.num_fewshot}: task {config.task}'s few-shot examples come "
                       "from the train file; add dataset.train or set num_fewshot: 0")
        for name in config.other_references:  # gen-1's other listed metrics are gated too
            try:
                check_metric(task_cfg, name)
            except EvalSetupError as exc:
                self.error(self._gen1_metric_path(name), str(exc), value=True)
        try:
            return check_metric(task_cfg, config.metric)
        except EvalSetupError as exc:
            self.error(self._at("metric"), str(exc), value=True)
            return config.metric

    def _check_dataset(self, config: EvalConfig) -> DatasetSpec | None:
        if config.dataset is None:
            return None
        base = self.path.resolve().parent
        resolved: dict[str, Path | None] = {}
        for split in ("train", "test"):
            rel = getattr(config.dataset, split)
            if rel is None:
                resolved[split] = None
                continue
            absolute = (base / rel).resolve()
            resolved[split] = absolute
            if not absolute.is_file():
                self.error(["dataset", split], f"no such file: {absolute} (paths are relative to the config file)",
                           value=True)
                continue
            expected = config.dataset.sha256.get(split)  # type: ignore[call-overload]
            if expected is not None:
                actual = sha256_file(absolute)
                if actual != expected.lower():
                    self.error(["dataset", "sha256", split], f"{absolute} has sha256 {actual}, expected {expected}; "
                               "the data changed: regenerate it or update the hash and the reference", value=True)
        return config.dataset.model_copy(update=resolved)

    def _resolve_baseline(self, config: EvalConfig) -> Path | None:
        if config.baseline is None:
            return None
        base = self.path.resolve().parent
        text = config.baseline
        looks_like_path = "/" in text or text.endswith((*CONFIG_SUFFIXES, ".json"))
        if looks_like_path:
            candidate = (base / text).resolve()
            if candidate.is_dir():
                candidate = candidate / "result.json"
            if not candidate.is_file():
                self.error(["baseline"], f"no such file: {candidate} (paths are relative to the config file)",
                           value=True)
                return None
            if candidate == self.path.resolve():
                self.error(["baseline"], "is this config itself: name the config or results file to compare against",
                           value=True)
                return None
            return candidate
        for sibling in sorted(base.glob("*")):
            if sibling.suffix in CONFIG_SUFFIXES and sibling.resolve() != self.path.resolve():
                if sibling.stem == text or _declared_name(sibling) == text:
                    return sibling.resolve()
        self.error(["baseline"], f"no config named {text!r} next to this file; give the baseline's config "
                   "name (a sibling file's stem or name:) or a path to its config or result.json", value=True)
        return None


def count_test_questions(config: EvalConfig) -> int | None:
    """How many questions the config's local test file holds; None for a task's own data."""
    if config.dataset is None:
        return None
    try:
        return sum(1 for line in config.dataset.test.read_text().splitlines() if line.strip())
    except OSError:
        return None


def _default_mode(config: EvalConfig) -> GateMode | None:
    """gen-2 files gate absolutely, gen-1 files relatively: as vLLM's own harnesses do."""
    if config.accuracy_threshold is not None:
        return "absolute"
    if config.reference is not None:
        return "relative"
    return None


def _declared_name(path: Path) -> str | None:
    try:
        data = load_yaml(path).data
    except (OSError, YamlSyntaxError):
        return None
    return data.get("name") if isinstance(data, dict) else None


def resolve_model(config: EvalConfig) -> str:
    """A relative local model folder is found next to the config, above it, or in the CWD;
    anything else (a hub id) is passed through."""
    name = config.model_name
    if Path(name).is_absolute():
        return name
    for base in (config.source.parent, *config.source.parent.parents, Path.cwd()):
        candidate = base / name
        if (candidate / "config.json").is_file():
            return str(candidate.resolve())
    return name


_BACKEND_FLAGS = frozenset(backends.FLAGS.values())


def builtin_flags_problem(config: EvalConfig) -> str | None:
    """Why `quantgate serve` would refuse the config's server_args (engine builtin), else None.
    Backend values are left to the backend check, whose messages name the engines."""
    if config.engine != "builtin":
        return None
    skip = {i for use in option_uses(config.server_args, _BACKEND_FLAGS) for i in use.items}
    problem = usage_problem([a for i, a in enumerate(config.server_args) if i not in skip])
    return f"quantgate serve (engine builtin) refuses these flags: {problem}" if problem else None


# vLLM's spellings (vllm/engine/arg_utils.py) of the sizes whose product is the GPUs one server
# uses: each data parallel replica is a whole tensor x pipeline parallel group of its own. With
# --data-parallel-size-local, the replicas on this machine are that many (multi-node DP).
_PARALLEL_FLAGS = {"--tensor-parallel-size": "tp", "-tp": "tp", "--pipeline-parallel-size": "pp", "-pp": "pp",
                   "--data-parallel-size": "dp", "-dp": "dp", "--data-parallel-size-local": "dpl", "-dpl": "dpl"}
# How lint names each size (`_check_parallel_gpus`), in the order of the product.
_PARALLEL_NAMES = {"tp": "tensor parallel", "pp": "pipeline parallel", "dp": "data parallel"}


def parallel_gpus(args: Sequence[str]) -> int:
    """The GPUs a vLLM server started with `args` uses on this machine: --tensor-parallel-size
    (-tp) times --pipeline-parallel-size (-pp) times --data-parallel-size (-dp), or its local part
    --data-parallel-size-local (-dpl) when given; 1 without them."""
    sizes = _local_sizes(args)
    return math.prod(sizes.get(kind, (1, 0))[0] for kind in _PARALLEL_NAMES)


def _local_sizes(args: Sequence[str]) -> dict[str, tuple[int, int]]:
    """`_parallel_sizes` with dp the replicas on this machine (-dpl over -dp)."""
    sizes = _parallel_sizes(args)
    if "dpl" in sizes:
        sizes["dp"] = sizes.pop("dpl")
    return sizes


def _parallel_sizes(args: Sequence[str]) -> dict[str, tuple[int, int]]:
    """tp, pp and dp -> (size, index of its flag in `args`), the last of each as argparse keeps it.
    A value that is no positive integer counts as 1: the server refuses it."""
    sizes: dict[str, tuple[int, int]] = {}
    for use in option_uses(args, _PARALLEL_FLAGS):
        sizes[_PARALLEL_FLAGS[use.flag]] = (_positive_int(use.value or ""), use.index)
    return sizes


def _positive_int(text: str) -> int:
    """`text` as the server's `type=int` reads it, or 1 when that is no positive integer. int()
    itself decides: str.isdigit() also holds for digits int() refuses (`²`)."""
    try:
        value = int(text)
    except ValueError:
        return 1
    return value if value > 0 else 1


def backend_flags_of(args: Sequence[str]) -> dict[str, str]:
    """`--linear-backend` / `--moe-backend` values named in server arguments `args`."""
    return {flag: value for flag, value, _ in _backend_flags(args)}


def _backend_flags(args: Sequence[str], strict: bool = False) -> list[tuple[str, Any, int]]:
    """(flag, value, index) for each --linear-backend / --moe-backend in `args` (`--flag=` has no
    value). Without `strict`, flags with no value are skipped."""
    found = [(use.flag, use.value or None, use.index) for use in option_uses(args, _BACKEND_FLAGS)]
    return [use for use in found if use[1] is not None or strict]


def _switch(value: Any) -> bool | None:
    """A switch key's value: YAML 1.2 reads yes/on as text, vLLM's PyYAML as true. None: neither."""
    text = str(value).strip().lower()
    if value is None or text in ("false", "no", "off", "0"):
        return False
    return True if is_on(value) else None


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(flag_of(a) == flag for a in args)


def _dotted(key_path: KeyPath) -> str:
    text = ""
    for key in key_path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Paths: files, list files, directories


def expand_paths(paths: Iterable[Path | str]) -> list[Path]:
    """Config files named by `paths`: YAML files as given, `*.txt` list files expanded
    (entries relative to the list file), directories searched recursively for YAML.
    Order is kept and duplicates dropped. A missing path or listed file is a ConfigError."""
    found: dict[Path, Path] = {}  # resolved -> as first named: one file named two ways runs once
    for raw in paths:
        path = Path(raw)
        try:
            if path.is_dir():
                children = sorted(p for p in path.rglob("*") if p.suffix in CONFIG_SUFFIXES and p.is_file())
            elif path.suffix == LIST_SUFFIX:
                children = read_list_file(path)
            elif path.is_file():
                children = [path]
            else:
                raise ConfigError(path, 0, "", "no such file or directory")
            for child in children:
                found.setdefault(child.resolve(), child)
        except OSError as exc:
            raise ConfigError(path, 0, "", f"cannot be read: {exc.strerror or exc}") from None
    return list(found.values())


def read_list_file(path: Path | str) -> list[Path]:
    """The configs a list file names: one path per line relative to the list file, `#` starts a
    comment, blank lines are skipped; an entry may itself be a list file. A missing entry is a
    ConfigError (the first one; `list_file_entries` collects them all)."""
    entries, errors = list_file_entries(path)
    if errors:
        raise errors[0]
    return entries


def list_file_entries(path: Path | str, _seen: frozenset[Path] = frozenset()) -> tuple[list[Path], list[ConfigError]]:
    """Like read_list_file, but returns every problem instead of raising the first."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except FileNotFoundError:
        return [], [ConfigError(path, 0, "", "no such list file")]
    except UnicodeDecodeError:
        return [], [ConfigError(path, 0, "", "a list file must be UTF-8 text with one config path per line")]
    resolved = path.resolve()
    if resolved in _seen:
        return [], [ConfigError(path, 0, "", "list file includes itself (directly or through another list file)")]
    entries: list[Path] = []
    errors: list[ConfigError] = []
    for number, line in enumerate(lines, start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        target = path.parent / entry
        if entry.endswith(LIST_SUFFIX) and target.is_file():
            more, problems = list_file_entries(target, _seen | {resolved})
            entries += more
            errors += problems
        elif target.is_file():
            entries.append(target)
        elif target.is_dir():
            errors.append(ConfigError(path, number, "", f"{entry!r} is a directory; list config files one per line"))
        else:
            errors.append(ConfigError(path, number, "", f"listed file {entry!r} does not exist ({target}); "
                                      "fix the path (relative to this list file) or remove the line"))
    return entries, errors


def check_unique_names(configs: Sequence[EvalConfig]) -> list[ConfigError]:
    """`name` is the test id and its run folder: two configs of one run must not share it, nor
    differ only in case (on macOS's and Windows' file systems, where CI artifacts are often read,
    the two folders are one)."""
    first: dict[str, EvalConfig] = {}
    errors = []
    for config in configs:
        other = first.setdefault(config.name.casefold(), config)
        if other is not config:
            same = "also" if other.name == config.name else f"in another case {other.name!r},"
            errors.append(ConfigError(config.source, 1, "name", f"{config.name!r} is {same} the name of "
                                      f"{other.source}; names are test ids and run folders, and must be unique "
                                      "(ignoring case)"))
    return errors

