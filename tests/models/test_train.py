"""The training recipe's parts that decide what the model sees and what gets shipped."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest
import torch

import fewshot
import synth_gsm8k
import tokenizer as tokenizer_recipe
import train

TOKENIZER_FILE = tokenizer_recipe.TOKENIZER_DIR / "tokenizer.json"


@pytest.fixture(scope="module")
def pool() -> train.Pool:
    return train.Pool.build(40, [], TOKENIZER_FILE, workers=1)


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_recipe.TOKENIZER_DIR)


def test_packed_shots_tokenize_exactly_like_the_joined_prompt(pool, hf_tokenizer) -> None:
    docs = [synth_gsm8k.problem(synth_gsm8k.VERSION, "stream", i) for i in (3, 17, 5)]
    joined = "".join(fewshot.format_example(d) for d in docs) + "Question:"
    packed = np.concatenate([pool.ids[pool.starts[i]:pool.starts[i] + pool.lengths[i]] for i in (3, 17, 5)])
    assert packed.tolist() == hf_tokenizer(joined)["input_ids"][: len(packed)]


def test_loss_mask_hides_exactly_the_question_bodies(pool, hf_tokenizer) -> None:
    for i in (0, 7, 21):
        doc = synth_gsm8k.problem(synth_gsm8k.VERSION, "stream", i)
        s, n = pool.starts[i], pool.lengths[i]
        ids, mask = pool.ids[s:s + n].tolist(), pool.mask[s:s + n]
        hidden = hf_tokenizer.decode([t for t, m in zip(ids, mask) if not m])
        shown = hf_tokenizer.decode([t for t, m in zip(ids, mask) if m])
        assert hidden == f" {doc['question']}\nAnswer:"
        assert shown == f"Question: {doc['answer']}\n\n"


def test_pool_excludes_the_twins_of_held_out_problems() -> None:
    original = synth_gsm8k.problem(synth_gsm8k.VERSION, "stream", 2)
    twin = dict(original)
    for name in synth_gsm8k.NAMES:
        twin["question"] = twin["question"].replace(name, "Someone")
    assert twin["question"] != original["question"]  # excluded as a twin, not as the same text
    assert len(train.Pool.build(10, [twin], TOKENIZER_FILE, workers=1).lengths) == 9


def test_batches_are_a_function_of_seed_and_step(pool, hf_tokenizer) -> None:
    ids, labels = pool.batch(step=4, seed=0, batch_size=3, seq_len=512)
    again, _ = pool.batch(step=4, seed=0, batch_size=3, seq_len=512)
    other, _ = pool.batch(step=5, seed=0, batch_size=3, seq_len=512)
    assert torch.equal(ids, again) and not torch.equal(ids, other)
    for row, lab in zip(ids, labels):
        assert hf_tokenizer.decode(row.tolist()).startswith("Question:")
        real = (lab != train.IGNORE_INDEX).nonzero().max().item()
        assert (lab[real + 1:] == train.IGNORE_INDEX).all() and (row[real + 1:] == 0).all()


def test_choose_checkpoint_prefers_the_target_inside_the_range() -> None:
    evals = [{"step": s, "accuracy": a} for s, a in [(100, 0.5), (200, 0.80), (300, 0.88), (400, 0.99)]]
    assert train.choose_checkpoint(evals)["step"] == 300
    assert train.choose_checkpoint(evals[:1])["step"] == 100
    assert train.choose_checkpoint([{"step": 1, "accuracy": 0.99}, {"step": 2, "accuracy": 0.985}])["step"] == 2


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    r = train.Recipe(warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert train.lr_at(0, 100, r) == pytest.approx(1e-4)
    assert train.lr_at(9, 100, r) == pytest.approx(1e-3)
    assert train.lr_at(100, 100, r) == pytest.approx(1e-4)
    assert all(train.lr_at(s, 100, r) >= train.lr_at(s + 1, 100, r) for s in range(10, 100))


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_saved_folder_reloads_with_identical_logits(kind, hf_tokenizer, tmp_path, seed) -> None:
    """Per-expert MoE layout on disk, bf16, tied embeddings: transformers' reload is bit-identical."""
    from safetensors import safe_open

    model = train.to_bf16(train.build_model(kind, len(hf_tokenizer), hf_tokenizer.eos_token_id, tiny=True, training=False))
    folder = tmp_path / "m"
    train.save_hf_folder(model, folder, tokenizer_recipe.TOKENIZER_DIR)
    assert train.check_reload(model, folder, hf_tokenizer, torch.device("cpu")) == 0.0
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in keys)
    assert "lm_head.weight" not in keys
    if kind == "moe":
        assert not any(k.endswith(("gate_up_proj", "experts.down_proj")) for k in keys)
        assert {f"model.layers.0.mlp.experts.7.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")} <= keys
    assert {p.name for p in folder.iterdir()} == {"config.json", "generation_config.json", "model.safetensors",
                                                   "tokenizer.json", "tokenizer_config.json"}


def test_tar_is_deterministic(tmp_path) -> None:
    folder = tmp_path / "tiny-qwen3"
    folder.mkdir()
    for name in ("b.json", "a.bin"):
        (folder / name).write_bytes(name.encode() * 100)
    train.write_tar(folder, tmp_path / "1.tar")
    (folder / "a.bin").touch()
    train.write_tar(folder, tmp_path / "2.tar")
    assert (tmp_path / "1.tar").read_bytes() == (tmp_path / "2.tar").read_bytes()
    with tarfile.open(tmp_path / "1.tar") as tar:
        assert tar.getnames() == ["tiny-qwen3/a.bin", "tiny-qwen3/b.json"]
        assert {m.mtime for m in tar.getmembers()} == {0}
