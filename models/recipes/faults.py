"""Deliberately broken FP8 variants, for negative checks: the gates must FAIL them.

A fault variant is an FP8 variant with one realistic conversion bug applied to its files. Each
is small enough that an absolute threshold set for other machines' rounding passes it, which is
the point: `eval_configs/tiny/negative-check-*` configs evaluate them with a paired gate against
the good variant and must FAIL. Built by build_variants.py after the variants (`make models`),
pinned byte for byte in MANIFEST.json under the base model's `variants`, like the others.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


@dataclass(frozen=True)
class Fault:
    scheme: str  # the variant it breaks, as in manifest.VARIANTS
    fmt: str
    description: str
    scale_factor: float  # every weight scale is multiplied by this (the one kind of fault so far)


# The wrong FP8 maximum: a converter that divides amax by 480 (no e4m3 dialect's maximum) where
# the weights were quantized against e4m3fn's 448 writes every scale 7% too large.
FAULTS: dict[str, Fault] = {
    "scale-480": Fault("fp8-block", "native", "every weight_scale_inv x 480/448 (a converter's wrong FP8 maximum)",
                       480 / 448),
}
# Which base models get which faults: the demo's model only (what its negative check serves).
FAULTS_OF = {"tiny-qwen3": ("scale-480",)}
SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale")


def apply_fault(source: Path, dest: Path, fault: Fault) -> None:
    """dest = the FP8 variant folder `source` with `fault` applied (every other file copied)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest)
    for path in sorted(dest.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        scaled = [k for k in tensors if k.endswith(SCALE_SUFFIXES)]
        if not scaled:
            raise ValueError(f"{path}: no weight scales to break; is {source} an FP8 variant?")
        for key in scaled:
            tensors[key] = (tensors[key].to(torch.float64) * fault.scale_factor).to(tensors[key].dtype)
        save_file(tensors, str(path), metadata=metadata)
