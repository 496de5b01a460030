"""`quantgate run CONFIG_OR_LIST...`: run eval configs and gate on accuracy.

Exit codes (SPEC section 4): 0 all passed, 1 a gate or `expect:` failed, 2 an error without a
verdict (the retryable class; also an interrupted run), 3 an invalid config or usage.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..backends import ENGINES
from ..runner import DEFAULT_OUTPUT_DIR, RunOptions, run_configs
from .arg_types import positive_int, server_url


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="CONFIG_OR_LIST",
                        help="config files (*.yaml), list files (*.txt) or directories")
    parser.add_argument("--engine", choices=ENGINES, default=None, help="override every config's `engine:`")
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR,
                        help=f"artifacts go to OUTPUT_DIR/<config name>/ (default {DEFAULT_OUTPUT_DIR})")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="evaluate only the first N questions (overrides num_questions)")
    parser.add_argument("--server-url", type=server_url, default=None, metavar="URL",
                        help="evaluate this already running server instead of launching one")
    parser.add_argument("--junit", type=Path, default=None, help="JUnit XML path (default OUTPUT_DIR/junit.xml)")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="markdown summary path (default OUTPUT_DIR/summary.md)")
    parser.add_argument("--skip-unmet-requires", action="store_true",
                        help="skip (and report) configs whose `requires:` this machine does not meet, instead "
                             "of exiting 3; for local runs of mixed lists, not for CI")


def main(args: argparse.Namespace) -> int:
    options = RunOptions(output_dir=args.output_dir, engine=args.engine, limit=args.limit,
                         server_url=args.server_url, junit=args.junit, markdown=args.markdown,
                         skip_unmet=args.skip_unmet_requires)
    return run_configs(args.paths, options)
