"""YAML loading that remembers where every key and item came from.

Config errors must name `file:line`, so configs are read with ruamel.yaml's round-trip
loader, whose mappings and sequences carry `.lc` positions. `YamlDocument.line(path)`
answers the 1-based line of any key path such as ("tasks", 0, "metrics", 1, "value").
The same round-trip tree is what `quantgate migrate` edits, so comments and key order
survive a rewrite.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.error import MarkedYAMLError, YAMLError

KeyPath = Sequence[str | int]


class YamlSyntaxError(ValueError):
    """The text is not YAML. `line` is 1-based (0 when the parser gave no position)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def round_trip_yaml() -> YAML:
    """The one YAML instance configuration both loading and `migrate` use."""
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.allow_duplicate_keys = False
    yaml.width = 4096  # never re-wrap a long server_args string
    return yaml


@dataclass
class YamlDocument:
    """A parsed file: the round-trip tree (`root`) and plain Python data (`data`)."""

    root: Any
    data: Any

    def line(self, path: KeyPath) -> int:
        """1-based line of the deepest node of `path` that exists (1 for the document)."""
        node, line = self.root, 1
        for key in path:
            if isinstance(node, CommentedMap) and key in node:
                owner = _owner(node, key)
                line = owner.lc.key(key)[0] + 1 if owner is not None else line
                node = node[key]
            elif isinstance(node, CommentedSeq) and isinstance(key, int) and 0 <= key < len(node):
                line = node.lc.item(key)[0] + 1
                node = node[key]
            else:
                break
        return line

    def value_line(self, path: KeyPath) -> int:
        """1-based line of the value at `path` (differs from `line` for multi-line values)."""
        if not path:
            return 1
        parent = self.root
        for key in path[:-1]:
            try:
                parent = parent[key]
            except (KeyError, IndexError, TypeError):
                return self.line(path)
        last = path[-1]
        if isinstance(parent, CommentedMap) and last in parent:
            owner = _owner(parent, last)
            if owner is not None:
                return owner.lc.value(last)[0] + 1
        return self.line(path)


def _owner(mapping: CommentedMap, key: Any) -> CommentedMap | None:
    """The mapping whose text holds `key`: `mapping` itself, or for a key it takes from a merge
    key (`<<: *defaults`), the anchored mapping the key is written in (positions are recorded
    there only)."""
    if key in mapping.lc.data:
        return mapping
    for source in getattr(mapping, "merge", None) or []:
        if isinstance(source, tuple):  # older ruamel.yaml: (position, mapping)
            source = source[-1]
        if isinstance(source, CommentedMap) and key in source:
            return _owner(source, key)
    return None


def parse_yaml(text: str) -> YamlDocument:
    """Parse `text` into a YamlDocument, or raise YamlSyntaxError with the line."""
    try:
        root = round_trip_yaml().load(io.StringIO(text))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        raise YamlSyntaxError(line, f"invalid YAML: {_syntax_message(exc, line)}") from None
    except YAMLError as exc:  # duplicate keys and other errors without a mark
        raise YamlSyntaxError(0, f"invalid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    except (ValueError, IndexError) as exc:
        # ruamel.yaml 0.19 resolves plain scalars such as `-_` or `._` as numbers, then fails to
        # convert them: valid YAML that it cannot read.
        raise YamlSyntaxError(0, f"the YAML reader failed on a plain scalar ({type(exc).__name__}: {exc}); quote "
                                 "any unquoted key or value made only of signs, dots and underscores") from None
    return YamlDocument(root=root, data=to_plain(root))


def _syntax_message(exc: MarkedYAMLError, line: int) -> str:
    """The parser's context and problem as one sentence, with the fix for the common causes."""
    problem, context = exc.problem or "", exc.context or ""
    if context and problem:
        start = exc.context_mark.line + 1 if exc.context_mark is not None else line
        where = f" (from line {start})" if start != line else ""
        text = f"{context}{where}{', ' if problem.startswith('but ') else ': '}{problem}"
    else:
        text = problem or context or "not YAML"
    if "another document" in problem:
        text += "; a config file holds one YAML document: remove the second `---` or give each config its own file"
    elif "'\\t'" in problem:  # the parser names the character as '\t'
        text += "; use spaces: YAML does not allow a tab there (indentation is spaces only)"
    return text


def load_yaml(path: Path) -> YamlDocument:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise YamlSyntaxError(0, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_yaml(text)


def to_plain(node: Any) -> Any:
    """Round-trip nodes to dict/list/str/int/float/bool/None (scalars lose their styles)."""
    if isinstance(node, dict):
        return {_plain_key(k): to_plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [to_plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, TaggedScalar) and node.tag.value == "tag:yaml.org,2002:str":  # the round-trip keeps `!!str`
        return str(node.value)
    return node  # dates and other tagged scalars stay as ruamel/python objects


def _plain_key(key: Any) -> Any:
    """YAML allows sequences and mappings as keys (`? [a, b]`); Python dicts do not."""
    plain = to_plain(key)
    return str(plain) if isinstance(plain, (list, dict)) else plain


def dump_like(root: Any, original: str) -> str:
    """Serialize a round-trip tree edited from `original`, keeping its indentation style so a
    rewrite changes only the lines it must."""
    yaml = round_trip_yaml()
    mapping, sequence, offset = guess_indent(original)
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    stream = io.StringIO()
    yaml.dump(root, stream)
    return stream.getvalue()


def guess_indent(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) as ruamel's `YAML.indent` takes them."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    mapping, sequence, offset = 2, 2, 0
    found_map = found_seq = False
    for above, below in zip(lines, lines[1:]):
        if not above.rstrip().endswith(":"):
            continue
        if above.lstrip().startswith("- "):
            continue  # a key inside a sequence item: its column is shifted by the dash
        step = (len(below) - len(below.lstrip())) - (len(above) - len(above.lstrip()))
        if step < 0:
            continue
        if below.lstrip().startswith("- ") and not found_seq:
            offset, sequence, found_seq = step, step + 2, True
        elif not below.lstrip().startswith("- ") and step > 0 and not found_map:
            mapping, found_map = step, True
    return mapping, max(sequence, offset + 2), offset
