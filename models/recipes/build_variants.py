"""Build the FP8 variants of every shipped bf16 model with `quantgate quantize` (`make models`).

For each model in models/MANIFEST.json and each valid (scheme, format) pair, writes
models/<base>-fp8-<block|channel|tensor>-<native|ct>/, then the deliberately broken variants
of faults.py (models/<variant>-<fault>/, for negative checks). A variant already on disk whose files
match the manifest is kept; a rebuilt variant must match the manifest byte for byte, and any
difference fails loudly (the quantizer or a library changed its output). Variants the manifest
does not pin yet are built and reported, to be recorded with `manifest.py`.
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


def build(manifest_path: Path = manifest_lib.MANIFEST_PATH, models_dir: Path = manifest_lib.MODELS_DIR) -> int:
    manifest = manifest_lib.load(manifest_path)
    if not manifest.get("models"):
        print(f"no model is shipped yet ({manifest_path} lists none); nothing to build")
        return 0
    failures: list[str] = []
    unpinned: list[str] = []
    for base, entry in sorted(manifest["models"].items()):
        base_dir = models_dir / base
        bad = manifest_lib.mismatches(base_dir, entry.get("files", {}))
        if bad:
            failures += bad
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
                failures.append(f"{name}: {exc}")
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
    if failures:
        print(f"error: the FP8 variants do not reproduce {manifest_path}:", file=sys.stderr)
        for line in failures:
            print(f"  {line}", file=sys.stderr)
        return EXIT_MISMATCH
    return 0


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    return build()


if __name__ == "__main__":
    sys.exit(main())
