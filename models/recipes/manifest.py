"""models/MANIFEST.json: sha256 of every shipped file, with the facts needed to trust and rebuild it.

    python models/recipes/manifest.py                       # refresh the sha256 entries
    python models/recipes/manifest.py --train-log OUT/tiny-qwen3.json --train-log OUT/tiny-qwen3-moe.json
        # register trained models (folders models/<name>/ must exist): parameters, training
        # command, data version, accuracy, from the logs train.py wrote
    python models/recipes/manifest.py --accuracy tiny-qwen3-fp8-block-native=0.842
        # record a measured strict-match accuracy for a model or variant
    python models/recipes/manifest.py --check              # exit 1 if any entry is stale

The FP8 variants are not tracked in git; their entries pin what build_variants.py must
reproduce byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import faults as faults_lib  # noqa: E402
import synth_gsm8k  # noqa: E402
import tokenizer as tokenizer_recipe  # noqa: E402

MODELS_DIR = Path(__file__).resolve().parents[1]
REPO = MODELS_DIR.parent
MANIFEST_PATH = MODELS_DIR / "MANIFEST.json"
SCHEMA_VERSION = 1
# Every valid (scheme, format) pair; the native format has no per-channel scheme.
VARIANTS = [("fp8-block", "native"), ("fp8-block", "compressed-tensors"), ("fp8-channel", "compressed-tensors"),
            ("fp8-tensor", "native"), ("fp8-tensor", "compressed-tensors")]
_FORMAT_SUFFIX = {"native": "native", "compressed-tensors": "ct"}


def variant_name(base: str, scheme: str, fmt: str) -> str:
    return f"{base}-{scheme}-{_FORMAT_SUFFIX[fmt]}"


def fault_name(base: str, fault: str) -> str:
    spec = faults_lib.FAULTS[fault]
    return f"{variant_name(base, spec.scheme, spec.fmt)}-{fault}"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def folder_hashes(folder: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


def mismatches(folder: Path, expected: dict[str, str]) -> list[str]:
    """Human-readable differences between `folder` and its expected file hashes."""
    if not folder.is_dir():
        return [f"{folder} is missing"]
    actual = folder_hashes(folder)
    out = [f"{folder / n}: missing" for n in expected if n not in actual]
    out += [f"{folder / n}: sha256 {actual[n]} != {h}" for n, h in expected.items() if n in actual and actual[n] != h]
    out += [f"{folder / n}: not in the manifest" for n in actual if n not in expected]
    return out


def safetensors_parameters(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())


def _prod(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def data_entry() -> dict:
    files = [synth_gsm8k.DATA_DIR / "train.jsonl", synth_gsm8k.DATA_DIR / "test.jsonl",
             *(tokenizer_recipe.TOKENIZER_DIR / n for n in ("tokenizer.json", "tokenizer_config.json"))]
    return {
        "version": synth_gsm8k.VERSION,
        "generator": "models/recipes/synth_gsm8k.py",
        "tokenizer": "models/recipes/tokenizer.py",
        "files": {str(p.relative_to(REPO)): sha256(p) for p in files},
    }


def load(path: Path = MANIFEST_PATH) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    return {"schema_version": SCHEMA_VERSION, "data": {}, "models": {}}


def dump(manifest: dict) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def register_training_log(manifest: dict, log_path: Path, remove_variants: bool = True) -> str:
    run = json.loads(log_path.read_text())
    name = run["model"]
    folder = MODELS_DIR / name
    if not folder.is_dir():
        raise SystemExit(f"error: {folder} does not exist; unpack {name}.tar into models/ first")
    entry = manifest["models"].setdefault(name, {})
    final = run["chosen"]["final_eval"]
    entry.update({
        "architecture": run["architecture"],
        "dtype": "bfloat16",
        "parameters": run["parameters"],
        "training_command": run["reproduce"],
        "training": {"seed": run["seed"], "steps": run["steps"], "chosen_step": run["chosen"]["step"],
                     "device": run["device_name"], "versions": run["versions"], "wall_s": run["wall_s"]},
        "data_version": run["data"]["version"],
        "data_sha256": run["data"]["sha256"],
        "accuracy": {"strict_match": final["accuracy"], "n": final["n"],
                     "measured_with": "train.py: transformers greedy decoding, lm-eval gsm8k 5-shot prompts"},
    })
    # The variants on disk were quantized from the previous weights and match their pins, so
    # `build_variants.py` would call them up to date and `refresh` would pin them again: they are
    # build outputs (`make models`), so they go, and the next build makes them from the new weights.
    if remove_variants:
        for variant, *_ in derived(name):
            if (MODELS_DIR / variant).is_dir():
                shutil.rmtree(MODELS_DIR / variant)
                print(f"removed {MODELS_DIR / variant}: built from the weights {name} had before")
    entry["variants"] = {}
    return name


def derived(base: str) -> list[tuple[str, str, str, str | None]]:
    """What `build_variants.py` makes from `base`: (folder name, scheme, format, fault or None)."""
    out: list[tuple[str, str, str, str | None]] = [(variant_name(base, s, f), s, f, None) for s, f in VARIANTS]
    for fault in faults_lib.FAULTS_OF.get(base, ()):
        spec = faults_lib.FAULTS[fault]
        out.append((fault_name(base, fault), spec.scheme, spec.fmt, spec.description))
    return out


def refresh(manifest: dict) -> dict:
    """Recompute every sha256 entry from the files on disk (variants only where built)."""
    manifest["schema_version"] = SCHEMA_VERSION
    manifest["data"] = data_entry()
    for base, entry in manifest["models"].items():
        folder = MODELS_DIR / base
        entry["files"] = folder_hashes(folder)
        entry["parameters"] = safetensors_parameters(folder / "model.safetensors")
        variants = entry.setdefault("variants", {})
        for name, scheme, fmt, fault in derived(base):
            vfolder = MODELS_DIR / name
            if vfolder.is_dir():
                v = variants.setdefault(name, {"scheme": scheme, "format": fmt, "accuracy": None})
                if fault is not None:
                    v["fault"] = fault
                v["files"] = folder_hashes(vfolder)
    return manifest


def set_accuracy(manifest: dict, spec: str) -> None:
    name, _, value = spec.partition("=")
    for base, entry in manifest["models"].items():
        if name == base:
            entry.setdefault("accuracy", {})["strict_match"] = float(value)
            return
        if name in entry.get("variants", {}):
            entry["variants"][name]["accuracy"] = float(value)
            return
    raise SystemExit(f"error: {name!r} is neither a model nor a variant in {MANIFEST_PATH}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-log", type=Path, action="append", default=[], help="a <name>.json log from train.py")
    parser.add_argument("--accuracy", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--check", action="store_true", help="only verify; exit 1 when an entry is stale")
    args = parser.parse_args(argv)
    manifest = load()
    before = dump(manifest)
    for log_path in args.train_log:
        print(f"registered {register_training_log(manifest, log_path, remove_variants=not args.check)}")
    refresh(manifest)
    for spec in args.accuracy:
        set_accuracy(manifest, spec)
    after = dump(manifest)
    if args.check:
        if after != before:
            print(f"error: {MANIFEST_PATH} is stale; run `python models/recipes/manifest.py`", file=sys.stderr)
            return 1
        print(f"ok: {MANIFEST_PATH} matches the files")
        return 0
    MANIFEST_PATH.write_text(after)
    print(f"wrote {MANIFEST_PATH} ({len(manifest['models'])} models)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
