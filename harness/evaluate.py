"""lm-eval against a running OpenAI-compatible server, offline, with per-question results.

The task is the INSTALLED lm-eval task YAML (e.g. `tasks/gsm8k/gsm8k.yaml`) with only its
dataset replaced by the config's local files (absolute paths: lm-eval resolves relative
`data_files` against the CWD), written into the run directory and loaded with
`TaskManager(include_path=..., include_defaults=False)`, so prompts, filters and metrics are
lm-eval's own.

A request that fails is never scored: lm-eval retries it, then aborts the whole evaluation.
So is a 200 that is not an OpenAI completion response (no JSON, no answer, more choices than
prompts). A request that times out (on either of lm-eval's paths, a body that stalls after the
headers, or trickles it, too) or is answered as another model than the one asked for aborts at once: a retry
would wait, or answer, the same. Every answer received before that is recorded as it arrives,
with its finish_reason, so an aborted run still keeps (and scores, with the task's own filters)
the questions answered so far. lm-eval is imported lazily: it costs seconds and `quantgate lint`
never needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import difflib
import errno
import functools
import gc
import hashlib
import json
import logging
import math
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .results import ArtifactsUnwritable

INVALID = "[invalid]"  # lm-eval's RegexFilter fallback when no answer can be extracted
STRICT, FLEXIBLE = "exact_match,strict-match", "exact_match,flexible-extract"

ProgressCallback = Callable[[int, int], None]  # (answered, requested)


class EvalSetupError(ValueError):
    """The evaluation cannot be built (task, dataset or metric); a config problem, not retryable."""


class DatasetUnreachable(EvalSetupError):
    """The task's hub dataset could not be fetched: the config's fix (local data) or a retry."""


class RequestTimedOut(BaseException):
    """A request got no answer within request_timeout_seconds.

    A BaseException on purpose: lm-eval wraps each request in tenacity's retry, which retries
    every `Exception`. A server that hangs once will hang again, and retrying would multiply
    the configured bound; this one goes straight through and aborts the evaluation.
    """


class WrongModelAnswered(BaseException):
    """A response named another model than the one the requests asked for: whatever answers at
    the server's address (a proxy, a router) serves another model, so its answers are not the
    model under test's. A BaseException, like RequestTimedOut: every retry would get the same."""


@dataclass(frozen=True)
class EvalSettings:
    base_url: str  # server root, e.g. http://127.0.0.1:8000
    model: str  # the served model name sent in each request
    task: str
    test_file: Path | None  # None: the task's own dataset (needs the hub)
    train_file: Path | None
    num_fewshot: int
    limit: int | None
    max_tokens: int
    max_concurrency: int
    request_timeout_s: float
    seed: int | None
    temperature: float | None
    metric: str
    work_dir: Path
    use_chat_completions: bool = False
    gen_prefix: str | None = None
    api_key: str | None = None  # sent as a bearer token; never in model_args (repro prints those)
    # Other names a response's `model` may carry for `model`: the server's aliases of the same model
    # (vLLM and quantgate serve answer with the first --served-model-name whichever one was asked for).
    model_aliases: tuple[str, ...] = ()


@dataclass
class EvalOutcome:
    metrics: dict[str, Any]
    samples: list[dict[str, Any]]
    error: str | None  # why the evaluation did not complete; None when it did
    requested: int
    answered: int
    eval_s: float
    server_busy_s: float  # time with at least one request in flight
    task_file: Path
    task_sha256: str
    dataset_sha256: dict[str, str] = field(default_factory=dict)
    # How many answers stopped because they reached max_tokens (finish_reason "length"), of those
    # whose finish_reason the server gave (`finish_reasons`, by reason); None when it gave none.
    truncated: int | None = None
    finish_reasons: dict[str, int] = field(default_factory=dict)
    config_error: bool = False  # the error is the server setup's or the config's: a retry cannot help


def dataset_hashes(test: Path | None, train: Path | None) -> dict[str, str]:
    """sha256 of the data files by role (two files may share a name in different folders)."""
    return {role: sha256_file(path) for role, path in (("test", test), ("train", train)) if path is not None}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------- task


@dataclass(frozen=True)
class InstalledName:
    """One name in the installed lm-eval's task index: what `--tasks NAME` would load."""

    name: str
    kind: str  # "task", "python task" (`class:`), "group" or "tag"
    path: Path | None  # the YAML that defines it; None for a tag (its tasks' files name it)
    members: tuple[str, ...] = ()  # a group's subtasks (those named by a string), a tag's tasks


@dataclass(frozen=True)
class _TaskIndex:
    tasks_dir: Path
    entries: dict[str, tuple[str, str | None, list[str]]]  # name -> (kind, path, members): no Path per name
    by_stem: dict[str, list[str]]  # file stem -> the names its YAML defines (for did-you-mean)

    def get(self, name: str) -> InstalledName | None:
        if name not in self.entries:
            return None
        kind, path, members = self.entries[name]
        return InstalledName(name, kind, Path(path) if path else None, tuple(members))


# The top-level keys lm-eval's TaskIndex reads to name a YAML, plain or quoted (generated task
# files write `"task": "..."`): column 0, so a key of a nested mapping or a line of a block
# scalar never matches.
_INDEX_KEY = re.compile(r"^([\"']?)(task|group|tag|class|include)\1[ \t]*:(?=[ \t\r]|$)(.*)$", re.M)
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_QUOTED_NAME = re.compile(r"\"([^\"\\]*)\"|'([^']*)'")  # no escapes: the text between the quotes
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}  # plain words YAML reads as non-strings
_IGNORE_DIRS = {"__pycache__", ".ipynb_checkpoints"}  # as lm-eval's TaskIndex


def _index_keys(path: str, cache: dict[str, dict[str, Any] | None]) -> dict[str, Any] | None:
    """The index keys of one YAML file (`class` only as present), found by reading its text:
    parsing the 14,000 installed YAML files takes seconds, this a fraction of one. None when the
    file cannot be read."""
    if path in cache:
        return cache[path]
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        cache[path] = None
        return None
    keys: dict[str, Any] = {}
    for match in _INDEX_KEY.finditer(text):
        key, rest = match.group(2), match.group(3).strip()
        if key == "class":  # `class: !function ...`: lm-eval's Python task, whatever the value
            keys[key] = True
            continue
        if rest and not rest.startswith("#"):
            if _PLAIN_NAME.fullmatch(rest) and rest.lower() not in _YAML_WORDS:
                keys[key] = rest
                continue
            quoted = _QUOTED_NAME.fullmatch(rest)
            if quoted:
                keys[key] = quoted.group(1) if quoted.group(1) is not None else quoted.group(2)
                continue
            snippet = f"{key}: {rest}"
        else:  # a block value: the indented (or `- ` item) lines that follow
            lines = [f"{key}:"]
            for line in text[match.end() + 1:].splitlines():
                if line.strip() and not line[0].isspace() and not line.startswith(("- ", "#")) and line != "-":
                    break
                lines.append(line)
            snippet = "\n".join(lines)
        parsed = _parse_snippet(snippet)
        if isinstance(parsed, dict) and key in parsed:
            keys[key] = parsed[key]
    cache[path] = keys
    return keys


class _IndexLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """A safe loader (libyaml's when there) that reads lm-eval's `!function` tag as the text it
    holds, never importing anything."""


_IndexLoader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


@functools.lru_cache(maxsize=4096)
def _parse_snippet(snippet: str) -> Any:
    try:
        return yaml.load(snippet, Loader=_IndexLoader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError:
        return None


def _merged_keys(path: str, cache: dict[str, dict[str, Any] | None], seen: set[str]) -> dict[str, Any]:
    """The keys of `path` with its `include:`s merged in as lm-eval's load_yaml does (included
    files first, the file's own keys win); an error where lm-eval's loader fails, so the file
    is skipped as lm-eval skips it. Paths are strings: pathlib objects and a realpath per file
    cost more than reading the files."""
    path = os.path.normpath(path)
    if path in seen:  # lm-eval shares one `seen` set across the whole include tree
        raise ValueError(f"include cycle at {path}")
    seen.add(path)
    own = _index_keys(path, cache)
    if own is None:
        raise OSError(f"cannot read {path}")
    if "include" not in own:
        return own
    merged: dict[str, Any] = {}
    includes = own["include"]
    for include in includes if isinstance(includes, list) else [includes]:
        merged.update(_merged_keys(os.path.join(os.path.dirname(path), include), cache, seen))  # absolute stays
    merged.update({k: v for k, v in own.items() if k != "include"})
    return merged


def _names_of(merged: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) as lm-eval's TaskIndex reads a YAML; None where it skips the file."""
    if "class" in merged:
        kind, name = "python task", merged.get("task")
    elif "group" in merged:
        kind, name = "group", merged["group"]
    elif "task" in merged:
        kind, name = "task", merged["task"]
    else:
        return None
    return (kind, name) if isinstance(name, str) else None


@functools.lru_cache(maxsize=4)
def _task_index(tasks_dir: Path) -> _TaskIndex:
    """Every task, group and tag name of the lm-eval tasks under `tasks_dir`, by the rules of
    lm-eval's own TaskIndex (`lm_eval/tasks/_index.py`): a task is named by its YAML's `task:`
    key, never by its file name; a YAML with `group:` is a group, one with `class:` a Python
    task; `tag:`s of tasks are tags; files in sorted path order, the first definition of a name
    wins. Not lm-eval's index itself: importing lm-eval and building it takes 6 s, on every
    `quantgate lint`; this takes under one. A test checks both agree on the installed tree."""
    cache: dict[str, dict[str, Any] | None] = {}
    found: dict[str, tuple[str, str | None, list[str]]] = {}
    by_stem: dict[str, list[str]] = {}
    files = []
    for folder, subfolders, names in os.walk(tasks_dir, followlinks=True):  # lm-eval's glob("**/*.yaml")
        subfolders[:] = [d for d in subfolders if d not in _IGNORE_DIRS]
        files += [os.path.join(folder, n) for n in names if n.endswith(".yaml")]
    for path in sorted(files):
        try:
            merged = _merged_keys(path, cache, set())
        except (OSError, ValueError, TypeError):
            continue
        named = _names_of(merged)
        if named is None:
            continue
        kind, name = named
        by_stem.setdefault(os.path.basename(path)[:-len(".yaml")], []).append(name)
        if name in found:
            continue
        if kind == "group":
            subtasks = merged.get("task")
            found[name] = (kind, path, [t for t in (subtasks if isinstance(subtasks, list) else [subtasks])
                                        if isinstance(t, str)])
            continue
        found[name] = (kind, path, [])
        tags = merged.get("tag")
        for tag in tags if isinstance(tags, list) else [tags] if tags else []:
            if isinstance(tag, str):
                entry = found.setdefault(tag, ("tag", None, []))
                if entry[0] == "tag":
                    entry[2].append(name)
    return _TaskIndex(tasks_dir, found, by_stem)


def _tasks_dir() -> Path:
    from importlib.util import find_spec

    spec = find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise EvalSetupError("lm-eval is not installed; install quantgate with its dependencies (`make install`)")
    return Path(next(iter(spec.submodule_search_locations))).resolve() / "tasks"


def _did_you_mean(task: str, index: _TaskIndex) -> str:
    """A hint for a name lm-eval does not know: the task a file of that name defines (a file
    name is not a task name: `gsm8k-cot` is the file of `gsm8k_cot`), the same name up to case
    and `-`/`_`, or a close spelling."""
    def norm(name: str) -> str:
        return name.lower().replace("-", "_")

    stem_names = [n for n in index.by_stem.get(task, ()) if n != task]
    if len(stem_names) == 1:
        [name] = stem_names
        kind, path, _ = index.entries[name]
        return (f"; {task}.yaml ({path}) is the file of the {kind} {name!r}: lm-eval names a "
                f"task by its YAML's `task:` key, not by its file name. Did you mean {name!r}?")
    same = [n for n in index.entries if norm(n) == norm(task)]
    close = same or difflib.get_close_matches(task, list(index.entries), n=3, cutoff=0.8)
    return f"; did you mean {' or '.join(repr(n) for n in close)}?" if close else ""


def installed_task_yaml(task: str) -> Path:
    """The YAML file that defines the lm-eval task named `task` (its `task:` key, not its file
    name) in the installed lm-eval; an EvalSetupError for a name that is a group, a tag, a
    Python task or nothing lm-eval knows, saying which."""
    tasks_dir = _tasks_dir()
    index = _task_index(tasks_dir)
    entry = index.get(task)
    if entry is None:
        raise EvalSetupError(f"task {task!r} is not the name of a task in the installed lm-eval ({tasks_dir})"
                             f"{_did_you_mean(task, index) or '; check `task:` (`lm_eval ls tasks` lists them)'}")
    some = ", ".join(entry.members[:5]) + (", ..." if len(entry.members) > 5 else "")
    if entry.kind == "group":
        raise EvalSetupError(f"task {task!r} ({entry.path}) is a group of tasks ({some or 'its subtasks'}), with no "
                             "metrics of its own: groups are refused; give one self-contained task (such as gsm8k) "
                             "per config")
    if entry.kind == "tag":
        raise EvalSetupError(f"task {task!r} is an lm-eval tag of {len(entry.members)} task(s) ({some}), not a "
                             "task: tags are refused; give one self-contained task (such as gsm8k) per config")
    if entry.kind == "python task":
        raise EvalSetupError(f"task {task!r} ({entry.path}) is defined by a Python class (`class:`), which "
                             "quantgate cannot rebuild with local data; use a self-contained YAML task such as gsm8k")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", task) or task.startswith("."):  # the rebuilt file is named after it
        raise EvalSetupError(f"task {task!r} ({entry.path}) has a name quantgate cannot use as a file name "
                             "(letters, digits, '_', '-', '.'); use a task such as gsm8k")
    return entry.path


def task_config(task: str) -> tuple[Path, dict[str, Any]]:
    """The installed task YAML of `task` and its contents, if quantgate can rebuild it (with
    local data, a gen_prefix) from that one file; else an EvalSetupError."""
    source = installed_task_yaml(task)
    try:
        task_cfg = yaml.safe_load(source.read_text())
    except yaml.YAMLError as exc:
        raise EvalSetupError(f"task {task!r} ({source}) uses lm-eval YAML extensions (such as !function) that "
                             f"cannot be rebuilt offline ({exc.__class__.__name__}); use a self-contained task such "
                             "as gsm8k") from None
    if not isinstance(task_cfg, dict) or "include" in task_cfg:
        raise EvalSetupError(f"task {task!r} ({source}) includes other files; only self-contained task "
                             "YAMLs (such as gsm8k) can be rebuilt with local data")
    if "metric_list" not in task_cfg:
        raise EvalSetupError(f"task {task!r} ({source}) has no metric_list: lm-eval would score it with its output "
                             "type's default metrics, which quantgate cannot check `metric:` against; use a task "
                             "that lists its metrics (such as gsm8k)")
    return source, task_cfg


def fewshot_from_train(task_cfg: Mapping[str, Any]) -> bool:
    """Whether the task draws its few-shot examples from its training split; tasks that list their
    own (`fewshot_config: {samples: [...]}`, as gsm8k_cot does) need no train file."""
    fewshot = task_cfg.get("fewshot_config")
    return not (isinstance(fewshot, Mapping) and fewshot.get("samples"))


def write_task_yaml(settings: EvalSettings) -> Path:
    """Write the installed task YAML into the run directory with the dataset (and the config's
    gen_prefix) replaced."""
    source, task_cfg = task_config(settings.task)
    if settings.test_file is not None:
        data_files = {task_cfg.get("test_split", "test"): str(settings.test_file.resolve())}
        if settings.train_file is not None:
            data_files[task_cfg.get("training_split") or "train"] = str(settings.train_file.resolve())
        elif settings.num_fewshot > 0 and fewshot_from_train(task_cfg):
            raise EvalSetupError(f"num_fewshot is {settings.num_fewshot} but dataset has no train file to draw "
                                 "few-shot examples from; add `dataset: {train: ...}` or set num_fewshot: 0")
        task_cfg["dataset_path"] = "json"
        task_cfg.pop("dataset_name", None)  # a hub config name ("main") means nothing to the json loader
        task_cfg["dataset_kwargs"] = {"data_files": data_files}
    if settings.gen_prefix is not None:  # in the file, so `quantgate repro`'s lm_eval command has it too
        task_cfg["gen_prefix"] = settings.gen_prefix
    task_dir = settings.work_dir / "task"
    task_dir.mkdir(parents=True, exist_ok=True)
    path = task_dir / f"{settings.task}.yaml"
    path.write_text(f"# {source} with its dataset replaced by quantgate\n"
                    + yaml.safe_dump(task_cfg, sort_keys=False, allow_unicode=True))
    return path


def check_metric(task_cfg: Mapping[str, Any], metric: str) -> str:
    """`metric` as the task (`task_config`) reports it (`<metric>,<filter>`); fail before any
    server starts if it does not. A bare metric name (vLLM's gen-1 files: `exact_match`) stands
    for the task's one filter of it."""
    names = [m["metric"] for m in task_cfg.get("metric_list", [])]
    filters = [f["name"] for f in task_cfg.get("filter_list", [])] or ["none"]
    known = [f"{m},{f}" for m in names for f in filters]
    if metric in known:
        return metric
    bare = [k for k in known if k.partition(",")[0] == metric]
    if "," not in metric and len(bare) == 1:
        return bare[0]
    raise EvalSetupError(f"metric {metric!r} is not reported by task {task_cfg.get('task')!r}; "
                         f"choose one of: {', '.join(known)}")


# ---------------------------------------------------------------------------- recording model


class _BusyClock:
    """Wall time during which at least one request is in flight (the server's answering time)."""

    def __init__(self) -> None:
        self.busy_s = 0.0
        self._inflight = 0
        self._since = 0.0

    def start(self) -> None:
        if self._inflight == 0:
            self._since = time.perf_counter()
        self._inflight += 1

    def stop(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self.busy_s += time.perf_counter() - self._since


class _TimedSemaphore:
    """lm-eval holds its semaphore exactly while a request is on the wire; time that span."""

    def __init__(self, inner: Any, clock: _BusyClock) -> None:
        self._inner, self._clock = inner, clock

    async def acquire(self) -> bool:
        acquired = await self._inner.acquire()
        self._clock.start()
        return acquired

    def release(self) -> None:
        self._clock.stop()
        self._inner.release()


def _prompt_key(message: Any) -> str:
    return message.prompt if hasattr(message, "prompt") else str(message)  # JsonChatStr for chat requests


def _recording_model_class(chat: bool) -> type:
    from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI

    base = LocalChatCompletion if chat else LocalCompletionsAPI

    class Recording(base):
        """`base` that keeps every answer as it arrives and never retries a timed-out request."""

        def __init__(self, *, on_progress: ProgressCallback | None, model_aliases: tuple[str, ...] = (),
                     **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.answers: dict[str, str] = {}
            self.finish_reasons: dict[str, str | None] = {}  # by prompt, as `answers`
            self._answering_models = {self.model, *model_aliases}
            self.requested = 0
            self.clock = _BusyClock()
            self._on_progress = on_progress
            self._tasks: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()

        def _task(self, loop: asyncio.AbstractEventLoop, coro: Coroutine, **kwargs: Any) -> asyncio.Task:
            task = asyncio.Task(coro, loop=loop, **kwargs)
            self._tasks.add(task)
            return task

        async def get_batched_requests(self, *args: Any, **kwargs: Any) -> Any:
            # Every task of the requests (aiohttp's own included) is known, for `interrupted`.
            asyncio.get_running_loop().set_task_factory(self._task)
            return await super().get_batched_requests(*args, **kwargs)

        def interrupted(self) -> None:
            """An interrupt (a KeyboardInterrupt) raised inside one of the requests' tasks ends that
            task with it and leaves asyncio.run, which cancels and collects the tasks still pending:
            the ended one's exception is retrieved here, or asyncio prints it as "never retrieved",
            with a traceback, whenever the task is collected (after the run's result)."""
            for task in list(self._tasks):
                if task.done() and not task.cancelled():
                    task.exception()

        def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
            self.requested += len(requests)
            return super().generate_until(requests, disable_tqdm=disable_tqdm)

        def _record(self, messages: Any, answers: list) -> None:
            batch = _batch(messages)
            if len(answers) != len(batch):  # zipped, the extra answers would be dropped or misattributed
                raise MalformedResponse(f"the server answered 200 with {len(answers)} choices for {len(batch)} "
                                        "prompt(s)")
            reasons = _PARSED_FINISH.get()
            for i, (message, answer) in enumerate(zip(batch, answers)):
                self.answers[_prompt_key(message)] = answer
                self.finish_reasons[_prompt_key(message)] = reasons[i] if i < len(reasons) else None
            if self._on_progress is not None:
                self._on_progress(len(self.answers), self.requested)

        def parse_generations(self, outputs: Any, **kwargs: Any) -> list[str]:
            # lm-eval turns a body it cannot read into "" (a wrong answer); here it is an error,
            # retried like an HTTP error and, if it persists, the run's ERROR.
            parsed = []
            for out in outputs if isinstance(outputs, list) else [outputs]:
                choices = _choices(out, chat)
                answered_as = out.get("model")
                if isinstance(answered_as, str) and answered_as not in self._answering_models:
                    raise WrongModelAnswered(answered_as)
                parsed += choices
            # For `_record`, in this request's own context (an asyncio task has one of its own).
            _PARSED_FINISH.set([reason for _, reason in parsed])
            texts = [text for text, _ in parsed]
            if not chat:
                return texts
            from lm_eval.models.utils import postprocess_generated_text

            return [postprocess_generated_text(t, stop=None, think_end_token=self.think_end_token) for t in texts]

        async def amodel_call(self, session: Any, sem: Any, messages: Any, **kwargs: Any) -> Any:
            import aiohttp

            try:
                answers = await super().amodel_call(session, _TimedSemaphore(sem, self.clock), messages,
                                                    **kwargs)
            except TimeoutError:  # aiohttp's total timeout
                raise RequestTimedOut(f"no answer within {self.timeout} s (request_timeout_seconds)") from None
            except aiohttp.ContentTypeError as exc:  # a 200 whose body is not JSON (a proxy's HTML page)
                raise MalformedResponse(f"the server answered {exc.status} with a body that is not JSON "
                                        f"({exc.message})") from None
            except json.JSONDecodeError as exc:
                raise MalformedResponse(f"the server answered 200 with a body that is not valid JSON ({exc}: "
                                        f"{exc.doc[:200]!r})") from None
            except aiohttp.ClientResponseError as exc:
                await asyncio.sleep(_retry_after_s(exc.status, exc.headers))
                raise
            if kwargs.get("generate", True) and answers is not None:
                self._record(messages, answers)
            return answers

        def model_call(self, messages: Any, **kwargs: Any) -> Any:
            import requests

            self.clock.start()
            try:
                outputs = _within(self.timeout, functools.partial(super().model_call, messages, **kwargs))
            except requests.exceptions.JSONDecodeError as exc:  # before the ConnectionError: not a transport one
                raise MalformedResponse(f"the server answered 200 with a body that is not valid JSON ({exc.msg} at "
                                        f"char {exc.pos}: {exc.doc[:200]!r})") from None
            except (requests.exceptions.Timeout, requests.exceptions.ConnectionError) as exc:
                # A body that stalls after the headers: requests wraps urllib3's read timeout in a
                # ConnectionError, which lm-eval would retry. A timeout all the same.
                if not _read_timeout(exc):
                    raise
                raise RequestTimedOut(f"no answer within {self.timeout} s (request_timeout_seconds)") from None
            except requests.exceptions.HTTPError as exc:
                response = exc.response
                time.sleep(_retry_after_s(response.status_code, response.headers) if response is not None else 0.0)
                raise
            finally:
                self.clock.stop()
            if kwargs.get("generate", True) and outputs is not None:
                self._record(messages, self.parse_generations(outputs=outputs))
            return outputs

    Recording.__name__ = f"Recording{base.__name__}"
    return Recording


# The finish_reasons of the response body parsed last in this context (an asyncio task's own).
_PARSED_FINISH: contextvars.ContextVar[list[str | None]] = contextvars.ContextVar("quantgate_finish", default=[])


def _batch(messages: Any) -> list[Any]:
    return list(messages) if isinstance(messages, (list, tuple)) else [messages]


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """call() in a daemon thread, left behind after `seconds` with RequestTimedOut.

    requests' timeout bounds each read of the socket, not the whole answer: a server that
    trickles its body a byte at a time never times out there. A daemon thread, as it cannot be
    stopped: it ends when the server closes the connection, and never holds the process open."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="quantgate-request", daemon=True).start()
    if not done.wait(seconds):
        raise RequestTimedOut(f"no answer within {seconds} s (request_timeout_seconds)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _read_timeout(exc: BaseException) -> bool:
    """requests' Timeout, or its ConnectionError around urllib3's ReadTimeoutError (a body that
    stalls after the headers)."""
    import requests
    import urllib3

    if isinstance(exc, requests.exceptions.Timeout):
        return True
    return any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args)


class MalformedResponse(Exception):
    """A 200 whose body holds no answer: never scored, retried, then the run's ERROR."""


# finish_reasons of a generation that broke off (vLLM's "abort" for a request it dropped, "error"
# in servers that report failures in the body): scored, its partial text would be a wrong answer.
_UNFINISHED = frozenset({"abort", "error"})


def _choices(out: Any, chat: bool) -> list[tuple[str, str | None]]:
    """The answers of one response body and their finish_reasons, in choice order, or
    MalformedResponse saying what is wrong. A null text is an empty answer only when the server
    says generation stopped at max_tokens (a reasoning model can spend them all before any content)."""
    if not isinstance(out, dict):
        raise MalformedResponse(f"the server answered 200 with a {type(out).__name__}, not a JSON object")
    if out.get("error"):
        raise MalformedResponse(f"the server answered 200 with an error: {str(out['error'])[:300]}")
    choices = out.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse(f"the server answered 200 with no choices ({str(out)[:300]})")
    field = "message.content" if chat else "text"
    texts: list[str | None] = [None] * len(choices)
    reasons: list[str | None] = [None] * len(choices)
    for position, choice in enumerate(choices):
        index = choice.get("index", position) if isinstance(choice, dict) else None
        if not isinstance(index, int) or not 0 <= index < len(choices) or texts[index] is not None:
            raise MalformedResponse(f"the server answered 200 with choice indices that are not 0..{len(choices) - 1}")
        message = choice.get("message")
        text = (message.get("content") if isinstance(message, dict) else None) if chat else choice.get("text")
        if text is None and choice.get("finish_reason") == "length":
            text = ""
        if not isinstance(text, str):
            raise MalformedResponse(f"the server answered 200 with no {field} in choice {index} ({str(choice)[:300]})")
        reason = choice.get("finish_reason")
        if reason in _UNFINISHED:  # the text is what came before generation broke off: no answer
            raise MalformedResponse(f"the server answered 200 with finish_reason {reason!r} in choice {index}: "
                                    "generation did not finish")
        texts[index] = text
        reasons[index] = reason if isinstance(reason, str) else None
    return [(str(text), reason) for text, reason in zip(texts, reasons)]  # every text was set above


RETRY_AFTER_MAX_S = 60.0


def _retry_after_s(status: int, headers: Mapping[str, str] | None) -> float:
    """A 429/503's Retry-After in seconds (bounded), honoured before lm-eval's own retry wait."""
    if status not in (429, 503):
        return 0.0
    try:
        seconds = float((headers or {}).get("Retry-After", ""))
    except ValueError:  # absent, or an HTTP date: lm-eval's backoff alone
        return 0.0
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S) if math.isfinite(seconds) else 0.0


@contextlib.contextmanager
def _lm_eval_output_to(path: Path) -> Iterator[None]:
    """lm-eval's log and its progress bars (tqdm writes to sys.stderr) go to the run directory,
    not the console the runner draws on."""
    # asyncio's logger too: when lm-eval aborts, the requests still in flight end with
    # "Task exception was never retrieved", reported when they are garbage collected.
    loggers = [logging.getLogger("lm_eval"), logging.getLogger("asyncio")]
    saved = [(lg.handlers[:], lg.propagate, lg.level) for lg in loggers]
    try:
        stream = open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise ArtifactsUnwritable.of(path, exc) from None
    with _closed_quietly(stream), contextlib.redirect_stderr(stream):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for lg in loggers:
            lg.handlers, lg.propagate = [handler], False
            lg.setLevel(logging.INFO)
        try:
            yield
        finally:
            gc.collect()  # those reports now, into this file
            for lg, (handlers, propagate, level) in zip(loggers, saved):
                lg.handlers, lg.propagate = handlers, propagate
                lg.setLevel(level)


@contextlib.contextmanager
def _closed_quietly(stream: Any) -> Iterator[Any]:
    """A log closed without raising when a full disk refused its last buffered lines (the file
    is closed all the same): that must not cost the evaluation's outcome."""
    try:
        yield stream
    finally:
        with contextlib.suppress(OSError):
            stream.close()


def preload() -> threading.Thread:
    """Import lm-eval in the background (about 3 s) while the server under test loads its model."""
    def load() -> None:
        before = set(os.environ)
        import lm_eval.evaluator  # noqa: F401
        import lm_eval.models.openai_completions  # noqa: F401

        # lm-eval's import sets download switches (HF_XET_HIGH_PERFORMANCE) in os.environ, which
        # every server launched after it would inherit, unrecorded, and the first one not.
        for name in set(os.environ) - before:
            os.environ.pop(name, None)
        compile_templates_once()

    thread = threading.Thread(target=load, name="quantgate-preload-lm-eval", daemon=True)
    thread.start()
    return thread


def compile_templates_once() -> None:
    """lm-eval 0.4 compiles a task's Jinja prompt templates again for every document it formats
    (`utils.apply_template` calls `env.from_string`): 6,000 compilations, 3-4 s of a 500-question
    5-shot run on a CI core, between the server being ready and its first request. A compiled
    template is a pure function of its source, so lm-eval's environment compiles each source once."""
    from lm_eval import utils

    compile_source = utils.env.from_string
    if getattr(compile_source, "quantgate_compiles_once", False):
        return
    compiled: dict[str, Any] = {}

    def from_string(source: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(source, str):
            return compile_source(source, *args, **kwargs)
        if source not in compiled:
            compiled[source] = compile_source(source)
        return compiled[source]

    from_string.quantgate_compiles_once = True  # type: ignore[attr-defined]
    utils.env.from_string = from_string


# ---------------------------------------------------------------------------- run


def model_args(settings: EvalSettings) -> dict[str, Any]:
    """lm-eval's `local-completions` (or `local-chat-completions`) arguments for this run."""
    endpoint = "/v1/chat/completions" if settings.use_chat_completions else "/v1/completions"
    args: dict[str, Any] = {
        "base_url": settings.base_url.rstrip("/") + endpoint,
        "model": settings.model,
        "tokenizer_backend": None,  # the server tokenizes; nothing is downloaded
        "tokenized_requests": False,
        "num_concurrent": settings.max_concurrency,
        "max_gen_toks": settings.max_tokens,
        "timeout": max(1, round(settings.request_timeout_s)),
    }
    if settings.seed is not None:
        args["seed"] = settings.seed
    return args


def lm_eval_command(settings: EvalSettings, task_file: Path, output_path: Path) -> list[str]:
    """The `lm_eval` command line equivalent to `run_eval` (for `quantgate repro`)."""
    model = "local-chat-completions" if settings.use_chat_completions else "local-completions"
    args = ",".join(f"{k}={v}" for k, v in model_args(settings).items())
    script = Path(sys.executable).with_name("lm_eval")  # this installation's, as `quantgate serve` is
    command = [str(script) if script.is_file() else "lm_eval", "run", "--model", model, "--model_args", args, "--tasks", settings.task,
               "--include_path", str(task_file.parent), "--num_fewshot", str(settings.num_fewshot),
               "--log_samples", "--output_path", str(output_path)]
    if settings.limit is not None:
        command += ["--limit", str(settings.limit)]
    if settings.temperature is not None:
        command += ["--gen_kwargs", f"temperature={settings.temperature}"]
    if settings.use_chat_completions:
        command += ["--apply_chat_template"]
    return command


def run_eval(settings: EvalSettings, on_progress: ProgressCallback | None = None) -> EvalOutcome:
    """Evaluate the server at `settings.base_url`; never raises for request or server failures.
    ArtifactsUnwritable when the run's files (the task YAML, lm_eval.log) cannot be written."""
    try:
        task_file = write_task_yaml(settings)
    except OSError as exc:  # a full disk, a folder made read-only: the path, the OS's words, the fix
        written = Path(exc.filename) if exc.filename else settings.work_dir / "task" / f"{settings.task}.yaml"
        if not written.resolve().is_relative_to(settings.work_dir.resolve()):
            raise  # not a file of this run (the installed task YAML)
        raise ArtifactsUnwritable.of(written, exc) from None
    dataset_sha = dataset_hashes(settings.test_file, settings.train_file)
    from lm_eval import evaluate
    from lm_eval.defaults import DEFAULT_OTHER_SEED
    from lm_eval.tasks import TaskManager

    compile_templates_once()

    started = time.perf_counter()
    auth = {"header": {"Authorization": f"Bearer {settings.api_key}"}} if settings.api_key else {}
    lm = _recording_model_class(settings.use_chat_completions)(on_progress=on_progress,
                                                               model_aliases=settings.model_aliases,
                                                               **model_args(settings), **auth)
    with _lm_eval_output_to(settings.work_dir / "lm_eval.log"):
        manager = TaskManager(include_path=str(task_file.parent), include_defaults=False)
        try:
            loaded = manager.load([settings.task])
        except (OSError, ConnectionError) as exc:  # datasets' ConnectionError is an OSError too
            full = disk_error(exc)
            if full is not None:  # datasets' "Cannot find data file" over a write its progress bar or cache lost
                import datasets

                raise ArtifactsUnwritable.of(f"{settings.work_dir / 'lm_eval.log'} (or the datasets cache "
                                             f"{datasets.config.HF_DATASETS_CACHE}) while lm-eval prepared the "
                                             "dataset", full) from None
            if settings.test_file is not None:
                raise
            raise DatasetUnreachable(
                f"task {settings.task}: its dataset could not be loaded from the Hugging Face hub "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}). Offline, or with "
                "the hub unreachable, set `dataset: {train: ..., test: ...}` to local GSM8K-format files "
                "(models/data/ ships some)") from None
        task = loaded["tasks"][settings.task]
        # What `simple_evaluate` would set on the task. It is not called because it also collects
        # environment info (importing torch and running pip: ~5 s per config on a CI core).
        task.set_config(key="num_fewshot", value=settings.num_fewshot)
        task.set_fewshot_seed(seed=DEFAULT_OTHER_SEED)
        if settings.temperature is not None:
            task.set_config(key="generation_kwargs", value={"temperature": settings.temperature}, update=True)
        error: str | None = None
        config_error = False
        results: dict | None = None
        server_said = _LastRefusal()
        logging.getLogger("lm_eval").addHandler(server_said)
        try:
            results = evaluate(lm=lm, task_dict=loaded, limit=settings.limit, log_samples=True,
                               apply_chat_template=settings.use_chat_completions,
                               fewshot_as_multiturn=settings.use_chat_completions)
        except RequestTimedOut as exc:
            error = f"request timed out: {exc}"
        except WrongModelAnswered as exc:
            config_error = True
            error = (f"the server answered as model {str(exc)!r}, but the requests asked for {settings.model!r}, "
                     f"the model under test: what answers at {settings.base_url} serves another model (a proxy or "
                     "router in front of the server?), so its answers are not this model's; fix that setup, or "
                     f"evaluate {settings.model!r}'s own server")
        except KeyboardInterrupt as exc:  # SIGINT, or the runner's SIGTERM: the caller decides, with
            lm.interrupted()               # the answers received so far (`exc.outcome`) to keep
            exc.outcome = _outcome(settings, task, lm, None, "interrupted", started, task_file, dataset_sha)
            raise
        except Exception as exc:  # lm-eval aborts on the first request that fails after its retries
            error = _failure(exc, server_said.text)
            logging.getLogger("lm_eval").exception("quantgate: the evaluation stopped")
    outcome = _outcome(settings, task, lm, results, error, started, task_file, dataset_sha)
    outcome.config_error = config_error
    return outcome


def _outcome(settings: EvalSettings, task: Any, lm: Any, results: dict | None, error: str | None, started: float,
             task_file: Path, dataset_sha: dict[str, str]) -> EvalOutcome:
    """lm-eval's results when it finished; else the answers that arrived, scored as it would."""
    eval_s = time.perf_counter() - started
    if results is not None:
        logged = results["samples"][settings.task]
        n = int(results["n-samples"][settings.task]["effective"])
        scores = results["results"][settings.task]
    else:
        logged = _score_answered(task, lm.answers)
        n, scores = len({s["doc_id"] for s in logged}), {}
    samples = per_question(logged, settings.metric)
    from lm_eval.utils import hash_string

    finish = {hash_string(prompt): reason for prompt, reason in lm.finish_reasons.items()}
    for sample in samples:  # an answer cut at max_tokens scores wrong for a reason that is not accuracy
        sample["finish_reason"] = finish.get(sample["prompt_hash"])
    given = [s["finish_reason"] for s in samples if s["finish_reason"] is not None]
    return EvalOutcome(
        metrics=_metrics(scores, samples, settings.metric, n),
        samples=samples,
        error=error,
        requested=lm.requested,
        answered=len(lm.answers),
        eval_s=eval_s,
        server_busy_s=lm.clock.busy_s,
        task_file=task_file,
        task_sha256=sha256_file(task_file),
        dataset_sha256=dataset_sha,
        truncated=sum(reason == "length" for reason in given) if given else None,
        finish_reasons={reason: given.count(reason) for reason in sorted(set(given))},
    )


class _LastRefusal(logging.Handler):
    """Keeps the last error body a server sent: lm-eval logs it, then raises only the status."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.text: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for marker in ("Response text: ", "error message: "):
            if "API request failed" in message and marker in message:
                self.text = message.split(marker, 1)[1].removesuffix(". Retrying...").strip()


_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def disk_error(exc: BaseException) -> OSError | None:
    """The full disk (or quota, or read-only file system) behind `exc`, if one is: libraries
    re-raise it in words of their own ("Cannot find data file"), keeping it as the cause."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL:
            return current
        current = current.__cause__ or current.__context__
    return None


def _failure(exc: BaseException, server_said: str | None) -> str:
    """Why the evaluation stopped: a request that kept failing, or (rarely) something else."""
    import aiohttp
    import requests

    text = str(exc) or type(exc).__name__
    text = text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"
    # What the server sent is not an answer: before the transport errors, of which requests' and
    # aiohttp's JSON errors are subclasses.
    if isinstance(exc, (MalformedResponse, json.JSONDecodeError, aiohttp.ContentTypeError)):
        return f"request failed after lm-eval's retries: the server's answer was not a valid OpenAI completion " \
               f"response: {exc if isinstance(exc, MalformedResponse) else text}"
    full = disk_error(exc)
    if full is not None and not isinstance(exc, (aiohttp.ClientError, requests.RequestException)):
        return f"lm-eval stopped: a file could not be written ({full}; lm_eval.log, or the datasets cache); free " \
               "space or pass another --output-dir and run again"
    if isinstance(exc, (aiohttp.ClientError, requests.RequestException, ConnectionError)):
        said = f" (the server said: {server_said[:500]})" if server_said else ""
        return f"request failed after lm-eval's retries: {text}{said}"
    return f"lm-eval stopped: {text} (traceback in lm_eval.log)"


def _score_answered(task: Any, answers: dict[str, str]) -> list[dict[str, Any]]:
    """Score the answers received before an abort with the task's own filters and metrics,
    in the shape of lm-eval's logged samples."""
    from lm_eval.utils import hash_string

    answered = [inst for inst in task.instances if _prompt_key(inst.args[0]) in answers]
    if not answered:
        return []
    for inst in answered:
        inst.resps = [answers[_prompt_key(inst.args[0])]]
    for ensemble in task._filters:  # lm-eval's FilterEnsembles: the same extraction as a full run
        ensemble.apply(answered)
    logged = []
    for inst in answered:
        for filter_name, filtered in inst.filtered_resps.items():
            logged.append({
                "doc_id": inst.doc_id,
                "target": task.doc_to_target(inst.doc),
                "resps": [inst.resps],
                "filtered_resps": [filtered],
                "filter": filter_name,
                "prompt_hash": hash_string(_prompt_key(inst.args[0])),
                **task.process_results(inst.doc, [filtered]),
            })
    return logged


def per_question(logged: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """lm-eval logs one entry per (question, filter); merge them into one record per question."""
    metric_name, _, gated_filter = metric.partition(",")
    by_id: dict[int, dict[str, Any]] = {}
    for entry in logged:
        record = by_id.setdefault(entry["doc_id"], {
            "id": entry["doc_id"],
            "prompt_hash": entry["prompt_hash"],
            "target": str(entry["target"]),
            "response": _first(entry["resps"]),
            "filters": {},
        })
        extracted = _first(entry["filtered_resps"])
        record["filters"][entry["filter"]] = {"extracted": extracted, "correct": bool(entry.get(metric_name))}
    samples = []
    for record in sorted(by_id.values(), key=lambda r: r["id"]):
        gated = record["filters"].get(gated_filter, {"extracted": None, "correct": False})
        record["extracted"] = gated["extracted"]
        record["correct"] = gated["correct"]
        record["invalid"] = gated["extracted"] in (None, INVALID)
        samples.append(record)
    return samples


def _first(value: Any) -> Any:
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value


def _metrics(scores: dict[str, Any], samples: list[dict[str, Any]], metric: str, n: int) -> dict[str, Any]:
    """SPEC section 5 metrics. Without lm-eval's aggregate (an aborted run) the values are the
    mean over the questions answered so far, for the record only: such a run has no verdict."""
    metric_name, _, gated_filter = metric.partition(",")

    def value(key: str, filter_name: str) -> float | None:
        if key in scores:
            return float(scores[key])
        hits = [s["filters"][filter_name]["correct"] for s in samples if filter_name in s["filters"]]
        return sum(hits) / len(hits) if hits else None

    stderr = scores.get(f"{metric_name}_stderr,{gated_filter}")
    return {
        "metric": metric,
        "value": value(metric, gated_filter),
        "strict_match": value(STRICT, "strict-match"),
        "flexible_extract": value(FLEXIBLE, "flexible-extract"),
        "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
        "n": n,
        "invalid_rate": (sum(s["invalid"] for s in samples) / len(samples)) if samples else None,
        "complete": bool(scores),
    }
