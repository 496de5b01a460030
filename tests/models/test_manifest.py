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
    err = capsys.readouterr().err
    assert f"{names[1]}/model.safetensors: sha256" in err
    # The cause and both ways out: the pinned library versions, or re-pinning an intended change.
    assert "constraints.txt" in err and "python models/recipes/manifest.py" in err


def test_build_variants_refuses_a_missing_or_unreadable_manifest(tmp_path, capsys) -> None:
    """No manifest is an error naming the fix, not 'no model is shipped yet' with exit 0 (after
    which `quantgate run` said to run `make models`, which said there was nothing to build)."""
    path = tmp_path / "MANIFEST.json"
    assert build_variants.build(path, tmp_path) == build_variants.EXIT_MISMATCH
    captured = capsys.readouterr()
    assert "no model is shipped yet" not in captured.out
    assert f"{path} is missing" in captured.err and "git checkout --" in captured.err

    path.write_text('{\n<<<<<<< HEAD\n  "models": {}\n=======\n')  # a merge conflict: was a traceback, exit 1
    assert build_variants.build(path, tmp_path) == build_variants.EXIT_MISMATCH
    err = capsys.readouterr().err
    assert f"{path} cannot be read" in err and "merge conflict" in err and "Traceback" not in err


def test_a_changed_bf16_model_is_named_as_such_with_its_fix(tmp_path, capsys) -> None:
    """A tracked bf16 model that differs from the manifest is not 'the FP8 variants do not
    reproduce': nothing was built from it, and the fix is to restore it (or register a retrained one)."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}\n")
    path = tmp_path / "MANIFEST.json"
    path.write_text(json.dumps({"models": {"base": {"files": manifest.folder_hashes(base), "variants": {}}}}))
    (base / "config.json").write_text('{"edited": true}\n')
    assert build_variants.build(path, tmp_path) == build_variants.EXIT_MISMATCH
    err = capsys.readouterr().err
    assert "the shipped bf16 models differ" in err and f"{base / 'config.json'}: sha256" in err
    assert f"git checkout -- {base}" in err and "manifest.py --train-log" in err
    assert "FP8 variants do not reproduce" not in err
    assert not (tmp_path / manifest.variant_name("base", "fp8-block", "native")).exists()


def test_a_registered_retrained_model_unpins_its_variants(tmp_path, monkeypatch) -> None:
    """The old variants still match their old pins: kept, build_variants.py would call them up to
    date and the new model would ship with FP8 variants of the weights it replaced."""
    monkeypatch.setattr(manifest, "MODELS_DIR", tmp_path)
    (tmp_path / "tiny").mkdir()
    log = tmp_path / "tiny.json"
    log.write_text(json.dumps({
        "model": "tiny", "architecture": "Qwen3ForCausalLM", "parameters": 1, "reproduce": "train.py ...",
        "seed": 0, "steps": 2, "chosen": {"step": 1, "final_eval": {"accuracy": 0.8, "n": 10}},
        "device_name": "cpu", "versions": {}, "wall_s": 1.0, "data": {"version": "v2", "sha256": {}}}))
    pinned, unpinned = manifest.variant_name("tiny", "fp8-block", "native"), manifest.variant_name("tiny", "fp8-tensor", "compressed-tensors")
    for name in (pinned, unpinned):  # a variant built but never pinned was made from the old weights too
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"old")
    entry = {"variants": {pinned: {"accuracy": 0.9, "files": {"model.safetensors": "0" * 64}}}}
    man = {"models": {"tiny": entry}}
    assert manifest.register_training_log(man, log, remove_variants=False) == "tiny"  # --check changes no file
    assert (tmp_path / pinned).is_dir() and (tmp_path / unpinned).is_dir()
    assert manifest.register_training_log(man, log) == "tiny"
    assert man["models"]["tiny"]["variants"] == {}
    assert not (tmp_path / pinned).exists() and not (tmp_path / unpinned).exists() and (tmp_path / "tiny").is_dir()
    assert man["models"]["tiny"]["accuracy"]["strict_match"] == 0.8
