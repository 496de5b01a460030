"""`quantgate migrate PATH... [--write]`: rewrite legacy kernel env switches into server_args.

`env: {VLLM_TEST_FORCE_FP8_MARLIN: "1"}` becomes `--linear-backend marlin --moe-backend marlin`
appended to `server_args` (string or list form, whichever the file uses); the variable is
removed, and `env` too once empty. The file is edited as a ruamel.yaml round-trip tree, so
comments, key order, quoting and indentation stay. Without --write a unified diff is printed;
running it again changes nothing. Variables with no public equivalent, or whose value names
no backend (a `VLLM_FLASHINFER_MOE_BACKEND` flavour vLLM does not know), are reported, and
left for the author (exit 3): a backend is never guessed.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark
from ruamel.yaml.scalarstring import FoldedScalarString, LiteralScalarString
from ruamel.yaml.tokens import CommentToken

from .. import backends
from ..config import ConfigError, backend_flags_of, expand_paths
from ..legacy import legacy_names, translate
from ..results import write_atomic
from ..yaml_lines import YamlSyntaxError, dump_like, parse_yaml

EXIT_OK, EXIT_INVALID = 0, 3
_ENV_KEYS = ("env", "env_vars")  # gen-2 and gen-1 spellings


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
    changed = manual = unreadable = unwritable = 0
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
        except OSError as exc:  # no permission, a name too long
            print(ConfigError(path, 0, "", f"cannot be read: {exc.strerror or exc}"), file=sys.stderr)
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
        if args.write:
            migrated = result.text.replace("\n", "\r\n") if crlf else result.text
            try:
                _replace_file(path, (("\ufeff" if bom else "") + migrated).encode("utf-8"))
            except OSError as exc:  # no space, no permission: the file stays as it was
                print(ConfigError(path, 0, "", f"cannot be written, left unchanged: {exc.strerror or exc}"),
                      file=sys.stderr)
                status = EXIT_INVALID
                unwritable += 1
                continue
            print(f"migrated {path}", file=sys.stderr)
        changed += 1
        if not args.write:
            sys.stdout.writelines(difflib.unified_diff(
                text.splitlines(keepends=True), result.text.splitlines(keepends=True),
                fromfile=_diff_name("a", path), tofile=_diff_name("b", path)))
    done = [f"{'migrated' if args.write else 'would change'} {changed}"] if changed else []
    left = [f"{manual} legacy switch(es) need manual migration (see above)"] if manual else []
    broken = [f"{unreadable} could not be read (see above)"] if unreadable else []
    broken += [f"{unwritable} could not be written (see above)"] if unwritable else []
    print(f"{len(paths)} config(s): " + ("; ".join(done + left + broken) or "nothing to migrate (no legacy kernel "
                                         "switches in env)"), file=sys.stderr)
    return status


def _replace_file(path: Path, data: bytes) -> None:
    """`data` written over `path` by a rename (write_atomic): a write that fails (no space left)
    leaves the original whole instead of truncated. Where no file can be made or renamed next to
    it (a folder this user cannot write, a file bind-mounted into a container), the file itself
    is rewritten, as an editor would."""
    try:
        write_atomic(path, data)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EBUSY, errno.EXDEV):
            raise
        path.resolve().write_bytes(data)


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
        problem = _not_editable(root, env_key, env)
        if problem:
            where, field_name, message = problem
            out.unresolved.append(ConfigError(path, doc.line(where), field_name,
                                              f"cannot migrate automatically: {message}"))
            continue
        translation = translate({str(k): v for k, v in env.items()}, _chosen_backends(root))
        for name, advice in translation.unresolved.items():
            out.unresolved.append(ConfigError(path, doc.line([env_key, name]), f"{env_key}.{name}",
                                              f"cannot migrate automatically: {advice}"))
        if not translation.replaced and not translation.flags:
            continue
        position = list(root).index(env_key)
        after, indent = _key_after(root, env_key), env.lc.col
        orphans = _remove_keeping_comments(env, [name for name in env if name in translation.replaced])
        if not env:  # it goes; its comments, and those its keys held, stay where they stood, a level up
            orphans = [_dedent(line, indent) for line in _pop_key(root, env_key) + orphans]
        if translation.flags:
            _append_server_args(root, translation.flags, position)
            out.notes += _engine_notes(path, str(root.get("engine") or "builtin"), translation.flags)
        _place_comments(root, after, orphans)  # after server_args, which may now stand where env did
        changed = True
    if changed:
        out.text = dump_like(root, text)
    return out


def _not_editable(root: CommentedMap, env_key: str, env: CommentedMap) -> tuple[list[Any], str, str] | None:
    """Why `env_key` cannot be rewritten safely: (key path, field, message), else None.

    A migration edits `env` and `server_args` in place. Nodes written elsewhere and reused
    through YAML anchors, aliases or merge keys (`<<: *defaults`) would change every user of them
    (or, for merged keys, not change at all), and server_args that cannot be read as arguments
    would swallow the new flags (an open quote) or be replaced."""
    shared = "edit the file so that the key is written out in place (no anchor, alias or `<<:` merge), then migrate again"
    if env_key not in root.lc.data:
        return [env_key], env_key, f"{env_key} comes from a YAML merge key (`<<:`); {shared}"
    if env.anchor.value is not None:
        return [env_key], env_key, (f"{env_key} is a YAML anchor (&{env.anchor.value}) that aliases may share, and "
                                    f"rewriting it would change them too; {shared}")
    for name in legacy_names(env):
        if name not in env.lc.data:
            return [env_key], f"{env_key}.{name}", f"{name} comes into {env_key} from a YAML merge key (`<<:`); {shared}"
    if "server_args" not in root:
        return None
    args = root["server_args"]
    if "server_args" not in root.lc.data:
        return ["server_args"], "server_args", f"server_args comes from a YAML merge key (`<<:`); {shared}"
    if isinstance(args, CommentedSeq) and args.anchor.value is not None:
        return ["server_args"], "server_args", (f"server_args is a YAML anchor (&{args.anchor.value}) that aliases "
                                                f"may share, and adding flags to it would change them too; {shared}")
    if isinstance(args, str):
        try:
            shlex.split(args)
        except ValueError as exc:
            return ["server_args"], "server_args", (f"cannot split it into arguments ({exc}), so flags appended to it "
                                                    "would be read as part of the unbalanced quote; fix its quoting "
                                                    "(`quantgate lint`), then migrate again")
    elif args is not None and not isinstance(args, list):
        kind = "a mapping" if isinstance(args, dict) else f"the {type(args).__name__} {args!r}"
        return ["server_args"], "server_args", (f"is {kind}, neither a string of arguments nor a list, and migrating "
                                                "would replace it; fix it (`quantgate lint`), then migrate again")
    return None


def _chosen_backends(root: CommentedMap) -> dict[str, str]:
    """Backend flags the file already sets: in server_args, or gen-1's `moe_backend:` key."""
    chosen = backend_flags_of(_args_of(root.get("server_args")))
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
        # The own-line comments below the last item introduce the next key: they stay below the
        # new last item, the old one's end-of-line comment with it.
        token = current.ca.items.get(len(current) - 1, [None])[0] if current else None
        own_lines = token.value.partition("\n")[2] if token is not None else ""
        if own_lines:
            token.value = token.value[:len(token.value) - len(own_lines)]
        current.extend(flags)
        if own_lines:
            current.ca.items[len(current) - 1] = [CommentToken("\n" + own_lines, CommentMark(0), None), None]
    elif isinstance(current, (FoldedScalarString, LiteralScalarString)) and current.strip():
        root["server_args"] = _block_scalar_with(current, shlex.join(flags))
    elif isinstance(current, str):
        joined = f"{current} {shlex.join(flags)}" if current.strip() else shlex.join(flags)
        root["server_args"] = type(current)(joined)  # keeps the quoting style of the original
    elif current is None and "server_args" not in root:
        root.insert(min(position, len(root)), "server_args", shlex.join(flags))
    else:
        root["server_args"] = shlex.join(flags)


def _block_scalar_with(current: FoldedScalarString | LiteralScalarString, flags: str) -> str:
    """A `>-` / `|` server_args with `flags` on a line of their own: a folded scalar keeps its
    line breaks only as `fold_pos` (the spaces it folds at), which a new string would lose,
    writing the whole value on one line."""
    body = current.rstrip("\n")
    ending = current[len(body):]  # the chomping indicator's trailing newlines
    if isinstance(current, LiteralScalarString):
        return LiteralScalarString(f"{body}\n{flags}{ending}")
    folded = FoldedScalarString(f"{body} {flags}{ending}")
    folded.fold_pos = [*getattr(current, "fold_pos", []), len(body)]
    return folded


# -- comments -------------------------------------------------------------------------------
# ruamel hangs the comment lines below a value on the key above them, as one token whose first
# line is that key's end-of-line comment; so deleting a key would delete the comments of the
# key that follows it (and of its parent's next key, after the last key of a block). Those lines
# are moved onto the key that now follows them; a key's own end-of-line comment goes with it.

_SLOT_BEFORE, _SLOT_AFTER, _SLOT_FIRST_CHILD = 1, 2, 3  # in CommentedMap.ca.items[key]


def _remove_keeping_comments(mapping: CommentedMap, keys: list[Any]) -> list[str]:
    """Delete `keys` from `mapping`, moving the own-line comments they held in front of the key
    that follows each; returns those with no key left after them in `mapping`."""
    leftover: list[str] = []
    for key in keys:
        after = _key_after(mapping, key)
        lines = _pop_key(mapping, key)
        if after is not None:
            _place_comments(mapping, after, lines)
        else:
            leftover += lines
    if leftover and mapping:
        _place_comments(mapping, None, leftover)
        return []
    return leftover


def _pop_key(mapping: CommentedMap, key: Any) -> list[str]:
    """Delete `key`; return the own-line comment lines it held, in file order."""
    slots = mapping.ca.items.pop(key, None) or [None] * 4
    lines = _token_lines(slots[_SLOT_BEFORE])
    token = slots[_SLOT_AFTER]
    if token is not None:
        # A block scalar ends with its line break: all its token's lines stand on their own.
        block = isinstance(mapping[key], (FoldedScalarString, LiteralScalarString))
        lines += token.value.splitlines() if block else token.value.partition("\n")[2].splitlines()
    lines += _token_lines(slots[_SLOT_FIRST_CHILD])  # a block mapping's comments above its first key
    del mapping[key]
    return lines


def _place_comments(mapping: CommentedMap, before: Any, lines: list[str]) -> None:
    """Put comment `lines` in front of key `before` of `mapping`, or after its last key (None)."""
    if not lines:
        return
    if before is not None and before in mapping:
        slots = mapping.ca.items.setdefault(before, [None] * 4)
        slots[_SLOT_BEFORE] = [CommentToken(f"{line}\n", CommentMark(0), None) for line in lines] + list(
            slots[_SLOT_BEFORE] or [])
        return
    if not mapping:
        return  # an empty document keeps no comments; not reached: migrate never empties the root
    key = list(mapping)[-1]
    value = mapping[key]
    if isinstance(value, CommentedMap) and value and not value.fa.flow_style():
        _place_comments(value, None, lines)
        return
    holder, index, slot = mapping, key, _SLOT_AFTER
    while isinstance(value, CommentedSeq) and value and not value.fa.flow_style():
        holder, index, slot, value = value, len(value) - 1, 0, value[-1]  # a sequence item's comment slot is 0
        if isinstance(value, CommentedMap) and value and not value.fa.flow_style():
            _place_comments(value, None, lines)
            return
    slots = holder.ca.items.setdefault(index, [None] * 4)
    text = "".join(f"{line}\n" for line in lines)
    if slots[slot] is not None:
        slots[slot].value += text  # the token keeps its column: that of the key's end-of-line comment
        return
    # Without a comment of its own the token starts with the end of the key's line; a block
    # scalar has ended its line already.
    start = "" if isinstance(value, (FoldedScalarString, LiteralScalarString)) else "\n"
    slots[slot] = CommentToken(start + text, CommentMark(0), None)


def _token_lines(tokens: list[CommentToken] | None) -> list[str]:
    """The lines of comment tokens that each stand before a key (their column is not in their text)."""
    return [" " * token.column + line if i == 0 else line
            for token in tokens or [] for i, line in enumerate(token.value.splitlines())]


def _key_after(mapping: CommentedMap, key: Any) -> Any:
    keys = list(mapping)
    index = keys.index(key) + 1
    return keys[index] if index < len(keys) else None


def _dedent(line: str, columns: int) -> str:
    """A comment of a removed block, moved up a level: indented as the keys it now stands among."""
    return line[min(columns, len(line) - len(line.lstrip(" "))):]
