"""`quantgate migrate PATH... [--write]`: rewrite legacy kernel env switches into server_args.

`env: {VLLM_TEST_FORCE_FP8_MARLIN: "1"}` becomes `--linear-backend marlin --moe-backend marlin`
appended to `server_args` (string or list form, whichever the file uses); the variable is
removed, and `env` too once empty. The file is edited as a ruamel.yaml round-trip tree, so
comments, key order, quoting and indentation stay. Without --write a unified diff is printed;
running it again changes nothing. Variables with no public equivalent are reported, and
left for the author (exit 3).
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from .. import backends
from ..config import ConfigError, expand_paths
from ..legacy import legacy_names, translate
from ..yaml_lines import YamlSyntaxError, dump_like, parse_yaml

EXIT_OK, EXIT_INVALID = 0, 3
_ENV_KEYS = ("env", "env_vars")  # gen-2 and gen-1 spellings
_BACKEND_FLAGS = ("--linear-backend", "--moe-backend")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="config files, list files (*.txt) or directories")
    parser.add_argument("--write", action="store_true", help="rewrite the files in place instead of printing a diff")


def main(args: argparse.Namespace) -> int:
    try:
        paths = expand_paths(args.paths)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    if not paths:
        print(f"no config files (*.yaml, *.yml) in {' '.join(args.paths)}", file=sys.stderr)
        return EXIT_INVALID
    status = EXIT_OK
    changed = manual = unreadable = 0
    for path in paths:
        try:
            original = path.read_bytes().decode("utf-8")
            # Migrated as LF text without a BOM; written back in the file's own style.
            bom, body = original.startswith("\ufeff"), original.removeprefix("\ufeff")
            crlf = "\r\n" in body
            text = body.replace("\r\n", "\n")
            result = migrate_text(text, path)
        except UnicodeDecodeError as exc:
            print(ConfigError(path, 0, "", f"not UTF-8 text ({exc.reason} at byte {exc.start})"), file=sys.stderr)
            status = EXIT_INVALID
            unreadable += 1
            continue
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            status = EXIT_INVALID
            unreadable += 1
            continue
        for problem in result.unresolved:
            print(problem, file=sys.stderr)
            status = EXIT_INVALID
        manual += len(result.unresolved)
        for note in result.notes:
            print(note, file=sys.stderr)
        if result.text == text:
            continue
        changed += 1
        if args.write:
            migrated = result.text.replace("\n", "\r\n") if crlf else result.text
            path.write_bytes((("\ufeff" if bom else "") + migrated).encode("utf-8"))
            print(f"migrated {path}", file=sys.stderr)
        else:
            sys.stdout.writelines(difflib.unified_diff(
                text.splitlines(keepends=True), result.text.splitlines(keepends=True),
                fromfile=_diff_name("a", path), tofile=_diff_name("b", path)))
    done = [f"{'migrated' if args.write else 'would change'} {changed}"] if changed else []
    left = [f"{manual} legacy switch(es) need manual migration (see above)"] if manual else []
    broken = [f"{unreadable} could not be read (see above)"] if unreadable else []
    print(f"{len(paths)} config(s): " + ("; ".join(done + left + broken) or "nothing to migrate (no legacy kernel "
                                         "switches in env)"), file=sys.stderr)
    return status


def _engine_notes(path: Path, engine: str, flags: list[str]) -> list[str]:
    """The backends the migration names that the config's engine does not have (legacy switches
    are vLLM's: a builtin config may need `engine: vllm`)."""
    notes = []
    for flag, value in zip(flags[::2], flags[1::2]):
        layer = "linear" if flag == "--linear-backend" else "moe"
        problem = backends.check_backend(engine if engine in backends.ENGINES else "builtin", layer, value)
        if problem:
            notes.append(f"{path}: note: the migrated {flag} {value}: {problem.message}")
    return notes


def _diff_name(side: str, path: Path) -> str:
    return str(path) if path.is_absolute() else f"{side}/{path}"  # `git apply` takes a/ b/ names


@dataclass
class Migration:
    text: str
    unresolved: list[ConfigError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the migrated file still needs


def migrate_text(text: str, path: Path) -> Migration:
    """The migrated text of one config and what could not be migrated."""
    try:
        doc = parse_yaml(text)
    except YamlSyntaxError as exc:
        raise ConfigError(path, exc.line, "", exc.message) from None
    root = doc.root
    if not isinstance(root, CommentedMap):
        kind = "an empty file" if root is None else "a list" if isinstance(root, list) else f"the value {root!r}"
        raise ConfigError(path, 1, "", f"a config must be a mapping of keys to values, got {kind}")
    out = Migration(text)
    changed = False
    for env_key in _ENV_KEYS:
        env = root.get(env_key)
        if not isinstance(env, CommentedMap) or not legacy_names(env):
            continue
        translation = translate({str(k): v for k, v in env.items()}, _chosen_backends(root))
        for name, advice in translation.unresolved.items():
            out.unresolved.append(ConfigError(path, doc.line([env_key, name]), f"{env_key}.{name}",
                                              f"cannot migrate automatically: {advice}"))
        if not translation.replaced and not translation.flags:
            continue
        position = list(root).index(env_key)
        for name in translation.replaced:
            del env[name]
        if not env:
            del root[env_key]
        if translation.flags:
            _append_server_args(root, translation.flags, position)
            out.notes += _engine_notes(path, str(root.get("engine") or "builtin"), translation.flags)
        changed = True
    if changed:
        out.text = dump_like(root, text)
    return out


def _chosen_backends(root: CommentedMap) -> dict[str, str]:
    """Backend flags the file already sets: in server_args, or gen-1's `moe_backend:` key."""
    args = _args_of(root.get("server_args"))
    chosen: dict[str, str] = {}
    for i, arg in enumerate(args):
        head, eq, tail = arg.partition("=")
        flag = head.replace("_", "-")
        if flag in _BACKEND_FLAGS:
            value = tail if eq else (args[i + 1] if i + 1 < len(args) else "")
            if value:
                chosen.setdefault(flag, value)
    if root.get("moe_backend"):
        chosen.setdefault("--moe-backend", str(root["moe_backend"]))
    return chosen


def _args_of(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError:
            return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return []


def _append_server_args(root: CommentedMap, flags: list[str], position: int) -> None:
    current = root.get("server_args")
    if isinstance(current, CommentedSeq):
        current.extend(flags)
    elif isinstance(current, str):
        joined = f"{current} {shlex.join(flags)}" if current.strip() else shlex.join(flags)
        root["server_args"] = type(current)(joined)  # keeps the quoting style of the original
    elif current is None and "server_args" not in root:
        root.insert(min(position, len(root)), "server_args", shlex.join(flags))
    else:
        root["server_args"] = shlex.join(flags)
