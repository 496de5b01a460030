"""The deliberately broken variants: exactly the stated fault, nothing else changed."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import faults
import manifest


def test_scale_fault_scales_every_weight_scale_and_nothing_else(tmp_path) -> None:
    spec = faults.FAULTS["scale-480"]
    source = manifest.MODELS_DIR / manifest.variant_name("tiny-qwen3", spec.scheme, spec.fmt)
    faults.apply_fault(source, tmp_path / "broken", spec)
    good, bad = load_file(source / "model.safetensors"), load_file(tmp_path / "broken" / "model.safetensors")
    assert good.keys() == bad.keys()
    scales = [k for k in good if k.endswith(faults.SCALE_SUFFIXES)]
    assert len(scales) == 4 * 7  # every quantized linear of the 4 layers
    for key, tensor in good.items():
        if key in scales:
            expected = (tensor.double() * 480 / 448).float()
            assert bad[key].dtype == tensor.dtype and torch.equal(bad[key], expected), key
        else:
            assert torch.equal(bad[key].view(torch.uint8), tensor.view(torch.uint8)), key
    for other in ("config.json", "tokenizer.json"):
        assert (tmp_path / "broken" / other).read_bytes() == (source / other).read_bytes()


def test_a_folder_without_scales_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="no weight scales to break"):
        faults.apply_fault(manifest.MODELS_DIR / "tiny-qwen3", tmp_path / "broken", faults.FAULTS["scale-480"])
