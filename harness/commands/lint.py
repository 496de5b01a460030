"""`quantgate lint PATH...`: validate configs and list files without running anything.

Prints one `file:line: field: message` line per problem (warnings marked `warning:`), then a
summary on stderr. Exit 0 when there is no error (warnings, such as unknown keys that are kept,
do not fail), 3 when there is at least one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..backends import ENGINES
from ..config import (
    CONFIG_SUFFIXES,
    LIST_SUFFIX,
    ConfigError,
    EvalConfig,
    check_unique_names,
    inspect_config,
    list_file_entries,
)

EXIT_OK, EXIT_INVALID = 0, 3


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="config files, list files (*.txt) or directories")
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="check backend names against this engine instead of each config's `engine:`")


def main(args: argparse.Namespace) -> int:
    errors, warnings, count = lint(args.paths, args.engine)
    if count == 0 and not errors:  # as `quantgate run` says of the same paths
        print(f"no config files in {', '.join(args.paths)} (*{', *'.join(CONFIG_SUFFIXES)} or *{LIST_SUFFIX})",
              file=sys.stderr)
        return EXIT_INVALID
    for problem in _in_file_order(errors):
        print(problem)
    for problem in _in_file_order(warnings):
        print(_as_warning(problem))
    print(f"{count} config(s): {len(errors)} error(s), {len(warnings)} warning(s)", file=sys.stderr)
    return EXIT_INVALID if errors else EXIT_OK


def _in_file_order(problems: list[ConfigError]) -> list[ConfigError]:
    """Each file's problems by line (the checks find them in their own order); files as listed."""
    first = {p.path: i for i, p in reversed(list(enumerate(problems)))}
    return sorted(problems, key=lambda p: (first[p.path], p.line))


def lint(paths: list[str], engine: str | None = None) -> tuple[list[ConfigError], list[ConfigError], int]:
    """(errors, warnings, number of configs checked) for `paths`."""
    errors: list[ConfigError] = []
    configs_files: dict[Path, Path] = {}  # resolved -> as first named: one file named two ways is one config
    for raw in paths:
        path = Path(raw)
        try:
            if path.is_dir():
                for child in sorted(path.rglob("*")):
                    if child.is_file() and child.suffix in CONFIG_SUFFIXES:
                        configs_files.setdefault(child.resolve(), child)
                    elif child.is_file() and child.suffix == LIST_SUFFIX:
                        errors += list_file_entries(child)[1]
            elif path.suffix == LIST_SUFFIX:
                entries, problems = list_file_entries(path)
                errors += problems
                for entry in entries:
                    configs_files.setdefault(entry.resolve(), entry)
            elif path.exists():
                configs_files.setdefault(path.resolve(), path)
            else:
                errors.append(ConfigError(path, 0, "", "no such file or directory"))
        except OSError as exc:  # a name too long, a loop of links
            errors.append(ConfigError(path, 0, "", f"cannot be read: {exc.strerror or exc}"))
    warnings: list[ConfigError] = []
    configs: list[EvalConfig] = []
    for path in configs_files.values():
        report = inspect_config(path, engine, models=True)  # type: ignore[arg-type]
        errors += report.errors
        warnings += report.warnings
        if report.config is not None:
            configs.append(report.config)
    errors += check_unique_names(configs)
    return errors, warnings, len(configs_files)


def _as_warning(problem: ConfigError) -> str:
    where = f"{problem.path}:{problem.line}" if problem.line else str(problem.path)
    detail = f"{problem.field}: {problem.message}" if problem.field else problem.message
    return f"{where}: warning: {detail}"
