"""`quantgate pipeline [--tier pr|nightly|release] [PATHS]`: a Buildkite pipeline on stdout.

`.buildkite/scripts/upload-pipeline.sh` pipes it into `buildkite-agent pipeline upload`.
With `--changed-files FILE` (one path per line, e.g. from `git diff --name-only`), the pr
tier's `if_changed` filter is applied here and only the selected steps are emitted, for
agents that do not apply `if_changed` themselves and for checking a selection locally.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from ..backends import ENGINES
from ..config import ConfigError
from ..pipeline import TIERS, build_pipeline, collect, outside_root, select_for_changes

EXIT_OK, EXIT_INVALID = 0, 3
DEFAULT_PATHS = ["eval_configs"]


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help=f"configs, list files or directories (default: {' '.join(DEFAULT_PATHS)})")
    parser.add_argument("--tier", choices=TIERS, default="nightly", help="which configs run (default: nightly)")
    parser.add_argument("--engine", choices=ENGINES, default=None, help="override every config's engine")
    parser.add_argument("--changed-files", type=Path, metavar="FILE",
                        help="pr tier: apply the if_changed filter here, for the paths listed in FILE")


def main(args: argparse.Namespace) -> int:
    if args.changed_files is not None and args.tier != "pr":
        print("--changed-files only applies to --tier pr", file=sys.stderr)
        return EXIT_INVALID
    try:
        groups, loose = collect(args.paths or DEFAULT_PATHS, args.engine, args.tier)
        pipeline = build_pipeline(groups, loose, args.tier, args.engine)
        if args.changed_files is not None:
            changed = [line.strip() for line in args.changed_files.read_text(encoding="utf-8").splitlines()
                       if line.strip()]
            pipeline = keep_steps(pipeline, set(select_for_changes(pipeline, changed)))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        print(f"{exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_INVALID
    if args.tier == "release" and not pipeline["steps"]:
        # A release pipeline of no steps is a green release that tested nothing.
        print(f"no config under {', '.join(map(str, args.paths or DEFAULT_PATHS))} is tagged release: tag the configs "
              "that gate a release `tags: [release]`, or pass the paths that hold them", file=sys.stderr)
        return EXIT_INVALID
    outside = outside_root(pipeline)
    if outside:
        print(f"warning: {len(outside)} step(s) name configs outside the current directory ({', '.join(outside[:3])}"
              f"{', ...' if len(outside) > 3 else ''}); Buildkite runs steps from the repository root: run "
              "`quantgate pipeline` there", file=sys.stderr)
    sys.stdout.write(yaml.safe_dump(pipeline, sort_keys=False, width=4096))
    return EXIT_OK


def keep_steps(pipeline: dict, labels: set[str]) -> dict:
    """The pipeline with only the command steps named in `labels` (empty groups dropped);
    the kept steps lose `if_changed`, since the selection is already made."""
    steps = []
    for step in pipeline["steps"]:
        if "group" in step:
            members = [_selected(s) for s in step["steps"] if s["label"] in labels]
            if members:
                steps.append({**step, "steps": members})
        elif step["label"] in labels:
            steps.append(_selected(step))
    return {**pipeline, "steps": steps}


def _selected(step: dict) -> dict:
    return {k: v for k, v in step.items() if k != "if_changed"}
