"""Every file models/MANIFEST.json lists has the recorded sha256; variants rebuild byte for byte."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import build_variants
import manifest

MANIFEST = manifest.load()


@pytest.mark.parametrize("path", sorted(MANIFEST["data"]["files"]))
def test_data_files_match(path) -> None:
    assert manifest.sha256(manifest.REPO / path) == MANIFEST["data"]["files"][path]


@pytest.mark.parametrize("name", sorted(MANIFEST["models"]))
def test_shipped_models_match(name) -> None:
    entry = MANIFEST["models"][name]
    assert entry["files"], f"{name} lists no files"
    assert manifest.mismatches(manifest.MODELS_DIR / name, entry["files"]) == []
    assert entry["parameters"] == manifest.safetensors_parameters(manifest.MODELS_DIR / name / "model.safetensors")
    for variant, v in entry.get("variants", {}).items():
        folder = manifest.MODELS_DIR / variant
        if folder.is_dir():  # built by `make models`, not tracked in git
            assert manifest.mismatches(folder, v["files"]) == []


def test_manifest_is_current() -> None:
    assert manifest.dump(manifest.refresh(manifest.load())) == manifest.dump(MANIFEST)


def test_build_variants_without_models_is_a_no_op(tmp_path, capsys) -> None:
    path = tmp_path / "MANIFEST.json"
    path.write_text(json.dumps({"schema_version": 1, "data": {}, "models": {}}))
    assert build_variants.build(path, tmp_path) == 0
    assert "no model is shipped yet" in capsys.readouterr().out


def test_build_variants_pins_and_detects_changes(tmp_path, capsys) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "base")
    path = tmp_path / "MANIFEST.json"
    entry = {"files": manifest.folder_hashes(tmp_path / "base"), "variants": {}}
    path.write_text(json.dumps({"models": {"base": entry}}))

    assert build_variants.build(path, tmp_path) == 0
    names = [manifest.variant_name("base", s, f) for s, f in manifest.VARIANTS]
    assert all((tmp_path / n / "model.safetensors").is_file() for n in names)
    assert "not pinned" in capsys.readouterr().out

    entry["variants"] = {n: {"files": manifest.folder_hashes(tmp_path / n)} for n in names}
    path.write_text(json.dumps({"models": {"base": entry}}))
    shutil.rmtree(tmp_path / names[0])
    assert build_variants.build(path, tmp_path) == 0  # rebuilt byte for byte
    out = capsys.readouterr().out
    assert f"{names[0]}: built, matches the manifest" in out and f"{names[1]}: up to date" in out

    entry["variants"][names[1]]["files"]["model.safetensors"] = "0" * 64
    path.write_text(json.dumps({"models": {"base": entry}}))
    assert build_variants.build(path, tmp_path) == build_variants.EXIT_MISMATCH == 3
    assert f"{names[1]}/model.safetensors: sha256" in capsys.readouterr().err
