"""The `quantgate` command. Each subcommand lives in its own module under quantgate.harness
(or quantgate.engine for the engine's own commands) and is imported only when used, so
`quantgate lint` never pays for lm-eval's import, and for torch's only when a config names a
backend (the built-in engine's names come from the kernel registry: harness/backends.py).

A command module provides `register(parser: argparse.ArgumentParser) -> None` and
`main(args: argparse.Namespace) -> int`, and may provide `normalize_argv(argv) -> argv`, applied
before parsing.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, one-line help). `serve` parses its own vLLM-style flags.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("quantgate.harness.commands.run", "run eval configs and gate on accuracy"),
    "lint": ("quantgate.harness.commands.lint", "validate configs and list files"),
    "migrate": ("quantgate.harness.commands.migrate", "rewrite legacy env hacks into server_args"),
    "repro": ("quantgate.harness.commands.repro", "print the server and eval commands to reproduce a config"),
    "serve": ("quantgate.engine.cli", "the built-in OpenAI-compatible engine"),
    "quantize": ("quantgate.engine.quantize", "write an FP8 checkpoint"),
    "kernels": ("quantgate.harness.commands.kernels", "show the kernel registry's decisions"),
    "calibrate": ("quantgate.harness.commands.calibrate", "run a config K times and propose a reference"),
    "compare": ("quantgate.harness.commands.compare", "paired per-question comparison of two results"),
    "pipeline": ("quantgate.harness.commands.pipeline", "emit a Buildkite pipeline"),
    "report": ("quantgate.harness.commands.report", "summarize results across runs"),
}

EXIT_USAGE = 3
EXIT_BROKEN_PIPE = 128 + 13  # killed by SIGPIPE, as the shell reports it for `cat` or `grep`


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quantgate", description="CI evaluation harness for quantized models")
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("quantgate")
    except PackageNotFoundError:
        ver = "unknown"
    parser.add_argument("--version", action="version", version=f"quantgate {ver}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(sys.argv[1:] if argv is None else argv)
        # stdout into a pipe is block-buffered: unflushed, the output (all of a short report) is
        # written at exit, where a reader that left raises past this handler ("Exception ignored").
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # `quantgate kernels --json | head`: the reader left; end as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return EXIT_BROKEN_PIPE


def _main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        parser = _parser()
        if not argv:
            parser.print_help()
            return EXIT_USAGE
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            return EXIT_USAGE if exc.code else 0
        return EXIT_USAGE
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"quantgate {name}", description=COMMANDS[name][1])
    module.register(parser)
    try:
        args = parser.parse_args(getattr(module, "normalize_argv", list)(rest))
    except SystemExit as exc:  # argparse exits 2 on bad usage; SPEC reserves 2 for retryable errors
        return EXIT_USAGE if exc.code else 0
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
