"""Build the FP8 variants of every shipped bf16 model with `quantgate quantize` (`make models`).

For each model in models/MANIFEST.json and each valid (scheme, format) pair, writes
models/<base>-fp8-<block|channel|tensor>-<native|ct>/, then the deliberately broken variants
of faults.py (models/<variant>-<fault>/, for negative checks). A variant already on disk whose files
match the manifest is kept; a rebuilt variant must match the manifest byte for byte, and any
difference fails loudly (the quantizer or a library changed its output). Variants the manifest
does not pin yet are built and reported, to be recorded with `manifest.py`. A missing or unreadable
manifest, or a shipped bf16 model that differs from it, fails too (exit 3), naming the fix.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import faults as faults_lib  # noqa: E402
import manifest as manifest_lib  # noqa: E402

from quantgate.engine.quantize import QuantizeError, quantize_checkpoint  # noqa: E402


EXIT_MISMATCH = 3  # deterministic: the same checkout fails the same way (CI never retries 3)


def _error(lines: list[str]) -> int:
    for line in lines:
        print(line, file=sys.stderr)
    return EXIT_MISMATCH


def build(manifest_path: Path = manifest_lib.MANIFEST_PATH, models_dir: Path = manifest_lib.MODELS_DIR) -> int:
    # The manifest is tracked: without it (or unreadable) there is nothing to check the models
    # against, which is an error, not "no model shipped yet" (that is a manifest listing none).
    if not manifest_path.is_file():
        return _error([f"error: {manifest_path} is missing; it pins every shipped model and FP8 variant. "
                       f"Restore it with `git checkout -- {_shown(manifest_path)}` and run `make models` again"])
    try:
        manifest = manifest_lib.load(manifest_path)
    except (ValueError, OSError) as exc:  # json.JSONDecodeError is a ValueError
        return _error([f"error: {manifest_path} cannot be read ({exc}); resolve its merge conflict or restore "
                       f"it with `git checkout -- {_shown(manifest_path)}`, then run `make models` again"])
    if not manifest.get("models"):
        print(f"no model is shipped yet ({manifest_path} lists none); nothing to build")
        return 0
    failures: list[str] = []
    base_failures: dict[str, list[str]] = {}
    build_errors: list[str] = []
    unpinned: list[str] = []
    for base, entry in sorted(manifest["models"].items()):
        base_dir = models_dir / base
        bad = manifest_lib.mismatches(base_dir, entry.get("files", {}))
        if bad:
            base_failures[base] = bad
            continue
        builds = [(manifest_lib.variant_name(base, scheme, fmt),
                   lambda folder, scheme=scheme, fmt=fmt: quantize_checkpoint(base_dir, folder, scheme, fmt, force=True))
                  for scheme, fmt in manifest_lib.VARIANTS]
        for fault in faults_lib.FAULTS_OF.get(base, ()):
            spec = faults_lib.FAULTS[fault]
            source = models_dir / manifest_lib.variant_name(base, spec.scheme, spec.fmt)  # built just before
            builds.append((manifest_lib.fault_name(base, fault),
                           lambda folder, source=source, spec=spec: faults_lib.apply_fault(source, folder, spec)))
        for name, make in builds:
            folder = models_dir / name
            expected = entry.get("variants", {}).get(name, {}).get("files")
            if expected and folder.is_dir() and not manifest_lib.mismatches(folder, expected):
                print(f"{name}: up to date")
                continue
            try:
                make(folder)
            except (QuantizeError, ValueError, OSError) as exc:
                build_errors.append(f"{name}: {exc}")
                continue
            if not expected:
                unpinned.append(name)
                print(f"{name}: built (not pinned in the manifest yet)")
                continue
            bad = manifest_lib.mismatches(folder, expected)
            failures += bad
            print(f"{name}: built, {'MISMATCH' if bad else 'matches the manifest'}")
    if unpinned:
        print(f"record the new variants with `python models/recipes/manifest.py`: {', '.join(unpinned)}")
    lines: list[str] = []
    if base_failures:
        # The bf16 models are tracked files the variants are made from: nothing was built from them.
        lines += [f"error: the shipped bf16 models differ from {manifest_path}, so their FP8 variants were not built:",
                  *(f"  {line}" for bad in base_failures.values() for line in bad),
                  f"  restore them with `git checkout -- {' '.join(_shown(models_dir / b) for b in base_failures)}` "
                  "(`git status` there also shows files git does not track); "
                  "a retrained model is registered with `python models/recipes/manifest.py --train-log ...` "
                  "(models/README.md, 'Shipping a trained model')"]
    if build_errors:
        lines += ["error: these FP8 variants could not be built:", *(f"  {line}" for line in build_errors)]
    if failures:
        lines += [f"error: the FP8 variants do not reproduce {manifest_path}:", *(f"  {line}" for line in failures),
                  "  the quantizer (`quantgate quantize`) or a library it uses (torch, safetensors) now writes other "
                  "bytes: rebuild in a venv made from constraints.txt (`make clean models`); if the change is "
                  "intended, re-pin the variants with `python models/recipes/manifest.py` and commit "
                  "models/MANIFEST.json"]
    if lines:
        return _error(lines)
    return 0


def _shown(path: Path) -> str:
    """`path` as a user types it from the repository root (absolute when outside it)."""
    try:
        return str(path.resolve().relative_to(manifest_lib.REPO))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    return build()


if __name__ == "__main__":
    sys.exit(main())
