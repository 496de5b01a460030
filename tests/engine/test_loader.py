"""load_model: kernel selection rules, the kernel report, clear errors, and reloads in place."""

from __future__ import annotations

import json
import re
import logging
import shutil
from pathlib import Path

import pytest
import torch

from quantgate.engine import load_model
from quantgate.engine.checkpoint import INDEX, CheckpointError
from quantgate.engine.config import ModelConfigError
from quantgate.engine.kv_cache import KVCache
from quantgate.engine.loader import resolve_dtype
from quantgate.kernels import KernelSelectionError, Scheme

from .test_parity import _prefill_batch
from .tiny_models import quantize_folder, write_model

SHIPPED_MODELS = Path(__file__).resolve().parents[2] / "models"


def test_kernel_report_has_the_spec_shape_and_logs_each_selection(dense_dir, caplog):
    with caplog.at_level(logging.INFO, logger="quantgate.engine"):
        loaded = load_model(dense_dir, device="cpu")
    report = loaded.kernel_report()
    assert report["platform"]["device"] == "cpu"
    entry = report["modules"]["model.layers.0.self_attn.qkv_proj"]  # q, k and v: one merged GEMM
    assert set(entry) == {"layer", "scheme", "kernel", "backend", "scale_attr", "rejected"}
    assert entry["layer"] == "linear" and entry["scheme"] == "unquantized" and entry["scale_attr"] is None
    assert len(report["modules"]) == 2 * 4 + 1  # qkv, o, gate_up and down per layer, and lm_head
    assert "Selected UnquantizedLinearKernel for model.layers.1.mlp.down_proj" in caplog.messages


@pytest.mark.parametrize("scheme, fmt, scale_attr", [
    (Scheme.FP8_BLOCK, "fp8", "weight_scale_inv"),
    (Scheme.FP8_TENSOR, "fp8", "weight_scale"),
    (Scheme.FP8_BLOCK, "compressed-tensors", "weight_scale"),
])
def test_kernel_report_names_the_scale_attribute_each_quantized_module_read(tmp_path, scheme, fmt, scale_attr):
    # The shipped MoE model: block FP8 experts need an intermediate size of 128 or more.
    q_dir = quantize_folder(SHIPPED_MODELS / "tiny-qwen3-moe", tmp_path / "q", scheme, fmt)
    modules = load_model(q_dir, device="cpu").kernel_report()["modules"]
    quantized = {name: m for name, m in modules.items() if m["scheme"] != "unquantized"}
    assert {m["layer"] for m in quantized.values()} == {"linear", "moe"}
    assert {m["scale_attr"] for m in quantized.values()} == {scale_attr}
    assert modules["lm_head"]["scale_attr"] is None


def test_unquantized_checkpoint_with_a_weight_only_fp8_backend_is_a_strict_error(dense_dir):
    with pytest.raises(KernelSelectionError, match="^model.layers.0.self_attn.qkv_proj: .*MarlinFp8LinearKernel.* or 'auto'$"):
        load_model(dense_dir, device="cpu", linear_backend="marlin")


def test_emulation_backend_runs_every_linear_of_an_unquantized_checkpoint(dense_dir):
    modules = load_model(dense_dir, device="cpu", linear_backend="emulation").kernel_report()["modules"]
    assert {m["kernel"] for m in modules.values()} == {"EmulationLinearKernel"}


def test_fp8_checkpoint_on_cpu_with_a_gpu_backend_names_every_reason(dense_dir, tmp_path):
    q_dir = quantize_folder(dense_dir, tmp_path / "q", Scheme.FP8_BLOCK, "fp8")
    with pytest.raises(KernelSelectionError) as err:
        load_model(q_dir, device="cpu", linear_backend="triton")
    assert "TritonBlockFp8LinearKernel" in str(err.value) and "--linear-backend" in str(err.value)


def test_unsupported_or_broken_folders_get_clear_errors(dense_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(dense_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(config, architectures=["LlamaForCausalLM"])))
    with pytest.raises(ModelConfigError, match="LlamaForCausalLM.*engine: vllm"):
        load_model(bad, device="cpu")
    (bad / "config.json").write_text(json.dumps(dict(config, hidden_size=64)))
    with pytest.raises(CheckpointError, match="does not match"):
        load_model(bad, device="cpu")
    (bad / "config.json").write_text(json.dumps(dict(config, quantization_config={"quant_method": "gptq"})))
    with pytest.raises(ModelConfigError, match="gptq"):
        load_model(bad, device="cpu")
    with pytest.raises(ValueError, match="unknown --linear-backend 'trtion'; did you mean 'triton'"):
        load_model(dense_dir, device="cpu", linear_backend="trtion")


def _storage(loaded) -> dict[str, int]:
    return {name: t.data_ptr() for name, t in
            list(loaded.model.named_buffers()) + list(loaded.model.named_parameters())}


def _logits(loaded, prompt: list[int]) -> torch.Tensor:
    kv = KVCache(loaded.model_config, 1, 64, loaded.dtype, loaded.device)
    with torch.inference_mode():
        return loaded.model(_prefill_batch([prompt], [0]), kv)


@pytest.mark.parametrize("variant", ["fp32", "fp32-bias", "fp8-block-native", "fp8-tensor-ct", "fp8-tensor-ct-bias"])
def test_reload_reads_new_weights_into_the_same_storage(tmp_path, variant):
    """Biases too: no kernel processes them, so a reload copies them into their first storage."""
    def build(seed: int):
        src = write_model(tmp_path / f"src{seed}", seed=seed, tie_word_embeddings=True,
                          attention_bias=variant.endswith("-bias"))
        if variant == "fp32":
            return src
        scheme, fmt = (Scheme.FP8_BLOCK, "fp8") if "block" in variant else (Scheme.FP8_TENSOR, "compressed-tensors")
        return quantize_folder(src, tmp_path / f"q{seed}", scheme, fmt)

    old, new = build(10), build(11)
    served = tmp_path / "served"
    shutil.copytree(old, served)
    loaded = load_model(served, device="cpu", linear_backend="emulation" if variant != "fp32" else "auto")
    before, prompt = _storage(loaded), [3, 1, 4, 1, 5, 9, 2, 6]
    first = _logits(loaded, prompt)
    shutil.copy(new / "model.safetensors", served / "model.safetensors")
    # The file rewritten in place serves nothing until the reload (on the CPU the model held views of
    # the memory-mapped file, and served its new bytes at once)
    assert torch.equal(_logits(loaded, prompt), first)
    loaded.reload_weights()
    assert _storage(loaded) == before
    assert any(name.endswith(".bias") for name in before) is variant.endswith("-bias")
    reloaded = _logits(loaded, prompt)
    assert not torch.equal(reloaded, first)
    assert torch.equal(reloaded, _logits(load_model(new, device="cpu", linear_backend="emulation"
                                                    if variant != "fp32" else "auto"), prompt))


def test_fp8_tensors_of_a_module_the_config_leaves_unquantized_are_an_error(dense_dir, tmp_path):
    q_dir = quantize_folder(dense_dir, tmp_path / "q", Scheme.FP8_TENSOR, "compressed-tensors")
    config = json.loads((q_dir / "config.json").read_text())
    config["quantization_config"]["ignore"].append("model.layers.0.mlp.up_proj")
    (q_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="model.layers.0.mlp.up_proj is stored in FP8 but runs unquantized"):
        load_model(q_dir, device="cpu")


EXPERTS = r".*mlp\.experts\."  # every expert projection, as an ignore regex


def test_an_explicit_moe_backend_applies_to_experts_an_fp8_checkpoint_leaves_unquantized(moe_dir, tmp_path):
    # As for a bf16 checkpoint: the requested backend serves them or loading fails with its reasons,
    # never a silent fallback to another backend (lm_head, a linear, still selects with auto).
    q_dir = quantize_folder(moe_dir, tmp_path / "q", Scheme.FP8_TENSOR, "compressed-tensors", ignore=EXPERTS)
    with pytest.raises(KernelSelectionError, match=r"^model\.layers\.0\.mlp\.experts: .*--moe-backend.*MarlinMoEKernel: .* or 'auto'$"):
        load_model(q_dir, device="cpu", moe_backend="marlin")
    modules = load_model(q_dir, device="cpu", linear_backend="emulation", moe_backend="emulation").kernel_report()[
        "modules"]
    assert (modules["model.layers.0.mlp.experts"]["scheme"], modules["model.layers.0.mlp.experts"]["kernel"]) == (
        "unquantized", "EmulationMoEKernel")
    assert modules["model.layers.0.self_attn.o_proj"]["scheme"] == "fp8-tensor"


def test_fp8_experts_the_config_leaves_unquantized_are_named_as_weights(moe_dir, tmp_path):
    q_dir = quantize_folder(moe_dir, tmp_path / "q", Scheme.FP8_TENSOR, "compressed-tensors")
    config = json.loads((q_dir / "config.json").read_text())
    config["quantization_config"]["ignore"].append(f"re:{EXPERTS}")
    (q_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="model.layers.0.mlp.experts is stored in FP8 but runs unquantized .*fix "
                                              "the config's ignore list"):
        load_model(q_dir, device="cpu")


def test_a_config_that_quantizes_part_of_a_moe_layer_is_refused(moe_dir, tmp_path):
    # Its experts run stacked in one kernel: gate/up FP8 and down unquantized cannot be served.
    q_dir = quantize_folder(moe_dir, tmp_path / "q", Scheme.FP8_CHANNEL, "compressed-tensors",
                            targets=r".*mlp\.experts\.\d+\.(gate|up)_proj$")
    with pytest.raises(ModelConfigError, match=re.escape(
            "quantizes some expert projections of model.layers.0.mlp.experts and not others "
            "(model.layers.0.mlp.experts.0.gate_proj is fp8-channel, model.layers.0.mlp.experts.0.down_proj is "
            "unquantized)") + ".*targets and ignore list cover all of them or none"):
        load_model(q_dir, device="cpu")


def test_moe_block_checkpoint_whose_experts_cannot_stack_is_refused_at_selection(moe_dir, tmp_path):
    q_dir = quantize_folder(moe_dir, tmp_path / "q", Scheme.FP8_BLOCK, "fp8")  # moe_intermediate_size 64
    with pytest.raises(KernelSelectionError, match="intermediate size .64. to be a multiple of the block"):
        load_model(q_dir, device="cpu")


# ---- malformed FP8 checkpoints: refused with the tensor or field named, never served wrong ---------------

DOWN = "model.layers.0.mlp.down_proj"


def _edited(q_dir, tmp_path, name: str, edit) -> object:
    """A copy of `q_dir` whose safetensors dict went through `edit` (in place)."""
    from safetensors.torch import load_file, save_file

    bad = tmp_path / name
    shutil.copytree(q_dir, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(bad / "model.safetensors"))
    return bad


def _set(key: str, value):
    def edit(tensors):
        tensors[key] = value(tensors[key])
    return edit


def _rename(old: str, new: str):
    def edit(tensors):
        tensors[new] = tensors.pop(old)
    return edit


def _add(key: str, value):
    def edit(tensors):
        tensors[key] = value(tensors)
    return edit


def _copy_layer(src: int, dst: int):
    def edit(tensors):
        for name in [n for n in tensors if n.startswith(f"model.layers.{src}.")]:
            tensors[name.replace(f".{src}.", f".{dst}.", 1)] = tensors[name].clone()
    return edit


WIDE = dict(hidden_size=256, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2, head_dim=64)


@pytest.fixture(scope="module")
def wide_block_dir(tmp_path_factory):
    """Block FP8 with scales of two or more blocks per side (down_proj [2, 3]), so a transposed
    scale has the same size and another shape."""
    root = tmp_path_factory.mktemp("wide")
    src = write_model(root / "src", seed=2, **WIDE)
    return quantize_folder(src, root / "q", Scheme.FP8_BLOCK, "fp8")


@pytest.mark.parametrize("case,edit,message", [
    ("nan", _set(f"{DOWN}.weight_scale_inv", lambda s: s.index_fill(0, torch.tensor([0]), float("nan"))),
     "scales are not finite and positive"),
    ("zero", _set(f"{DOWN}.weight_scale_inv", torch.zeros_like), "scales are not finite and positive"),
    ("negative", _set(f"{DOWN}.weight_scale_inv", lambda s: -s), "scales are not finite and positive"),
    # the last of the 6 block scales: the message counts them and shows a bad one, not the first
    ("inf", _set(f"{DOWN}.weight_scale_inv", lambda s: s.index_put((torch.tensor([1]), torch.tensor([2])),
                                                                    torch.tensor(float("inf")))),
     f"{DOWN}.weight_scale_inv: 1 of 6 scales are not finite and positive (e.g. inf); a scale must be > 0: "
     "re-quantize the checkpoint"),
    ("transposed", _set(f"{DOWN}.weight_scale_inv", lambda s: s.t().contiguous()), "does not match"),
    ("fp8 scale", _set(f"{DOWN}.weight_scale_inv", lambda s: (s * 1e3).to(torch.float8_e4m3fn)), "scales must be stored"),
    ("merged part", _set("model.layers.0.self_attn.k_proj.weight_scale_inv", lambda s: s[:, :1].contiguous()),
     "cannot be joined"),
    ("scale name", _rename(f"{DOWN}.weight_scale_inv", f"{DOWN}.weight_scale"),
     f"it has {DOWN}.weight_scale instead. native FP8 names block scales `weight_scale_inv`"),
    ("both scale names", _add(f"{DOWN}.weight_scale", lambda t: t[f"{DOWN}.weight_scale_inv"] * 7),
     f"{DOWN} has both weight_scale_inv and weight_scale; native FP8 names block scales `weight_scale_inv` "
     "(quant_method fp8 with weight_block_size) and per-tensor scales `weight_scale`; compressed-tensors always "
     f"`weight_scale`. config.json reads weight_scale_inv: remove {DOWN}.weight_scale or re-export the checkpoint"),
    ("extra scale", _add(f"{DOWN}.input_scale", lambda t: torch.tensor(0.02)),
     f"1 tensors of this model's modules are not read by it: {DOWN}.input_scale"),
    ("extra layer", _copy_layer(1, 2), "the checkpoint has tensors of layers 2 (e.g. model.layers.2."),
    ("int8 embedding", _set("model.embed_tokens.weight", lambda w: w.to(torch.int8)),
     "model.embed_tokens.weight: stored as torch.int8; embeddings and norms are never quantized"),
    ("fp8 norm", _set("model.norm.weight", lambda w: w.to(torch.float8_e4m3fn)),
     "model.norm.weight: stored as torch.float8_e4m3fn"),
])
def test_a_malformed_block_checkpoint_is_refused_naming_the_tensor(wide_block_dir, tmp_path, case, edit, message):
    q_dir = wide_block_dir
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_model(_edited(q_dir, tmp_path, case.replace(" ", "-"), edit), device="cpu")


@pytest.mark.parametrize("case,edit,message", [
    ("short", _set("model.layers.0.mlp.experts.2.up_proj.weight", lambda w: w[:32].contiguous()),
     "model.layers.0.mlp.experts.2.up_proj.weight: shape (32, 96) torch.float32 differs from the other experts' "
     "(64, 96) torch.float32"),
    ("fp8", _set("model.layers.0.mlp.experts.0.down_proj.weight", lambda w: w.to(torch.float8_e4m3fn)),
     "model.layers.0.mlp.experts.0.down_proj.weight: shape (96, 64) torch.float8_e4m3fn differs from the other "
     "experts' (96, 64) torch.float32"),
])
def test_an_expert_tensor_unlike_the_others_is_named(moe_dir, tmp_path, case, edit, message):
    with pytest.raises(CheckpointError, match=re.escape(message) + ".*re-export the checkpoint"):
        load_model(_edited(moe_dir, tmp_path, case, edit), device="cpu")


def test_a_per_tensor_expert_scale_of_two_values_is_named(tmp_path):
    """It failed as a bare reshape error."""
    key = "model.layers.0.mlp.experts.1.up_proj.weight_scale"
    with pytest.raises(CheckpointError, match=re.escape(
            "model.layers.0.mlp.experts.*.up_proj.weight_scale: a per-tensor scale has one value, found shape (2,); "
            "every expert stores one per projection: re-export the checkpoint")):
        load_model(_edited(SHIPPED_MODELS / "tiny-qwen3-moe-fp8-tensor-ct", tmp_path, "two",
                           _set(key, lambda s: s.repeat(2))), device="cpu")


def test_channel_scales_saved_as_n_serve_what_n_by_1_scales_serve(tmp_path):
    """Exports save per-channel scales as [N] or [N, 1]: both load, into merged projections and
    stacked experts alike, and serve the same logits."""
    model = SHIPPED_MODELS / "tiny-qwen3-moe-fp8-channel-ct"
    flat = _edited(model, tmp_path, "flat", lambda tensors: tensors.update(
        {name: s.reshape(-1) for name, s in tensors.items() if name.endswith(".weight_scale")}))
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert torch.equal(_logits(load_model(flat, device="cpu"), prompt), _logits(load_model(model, device="cpu"), prompt))


def test_a_config_with_fewer_layers_than_the_checkpoint_is_refused(wide_block_dir, tmp_path):
    fewer = tmp_path / "fewer"
    shutil.copytree(wide_block_dir, fewer)
    config = json.loads((fewer / "config.json").read_text())
    (fewer / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=1)))
    with pytest.raises(CheckpointError, match=re.escape("the checkpoint has tensors of layers 1 (e.g. model.layers.1.")
                       + ".*beyond the 1 layers config.json's num_hidden_layers gives"):
        load_model(fewer, device="cpu")


def test_tensors_of_heads_this_architecture_lacks_only_warn(wide_block_dir, tmp_path, caplog):
    foreign = {"mtp.layers.0.eh_proj.weight": torch.zeros(4, 4), "model.visual.patch_embed.weight": torch.zeros(4),
               "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(16),  # older exports saved this buffer
               "model.layers.0.self_attn.k_scale": torch.ones(()),  # an FP8 KV cache's: the cache stays bf16
               "model.layers.0.self_attn.v_scale": torch.ones(()),
               "model.layers.0.self_attn.v_proj.output_scale": torch.ones(())}
    extra = _edited(wide_block_dir, tmp_path, "heads", lambda tensors: tensors.update(foreign))
    with caplog.at_level(logging.WARNING, logger="quantgate.engine"):
        load_model(extra, device="cpu")
    assert "6 checkpoint tensors are not used (other heads, rotary buffers, FP8 KV-cache scales" in caplog.text
    assert all(name in caplog.text for name in sorted(foreign)[:5])  # the first five, as examples


def test_unreadable_checkpoint_files_are_named_with_their_cause(dense_dir, tmp_path, monkeypatch):
    from .test_config import deny_reading

    def folder(name: str) -> Path:
        shutil.copytree(dense_dir, tmp_path / name)
        (tmp_path / name / "model.safetensors").unlink()
        return tmp_path / name

    dangling = folder("dangling")
    (dangling / "model.safetensors").symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(CheckpointError, match=re.escape(
            f"{dangling / 'model.safetensors'} cannot be read (it is a symbolic link to {tmp_path / 'gone.safetensors'}, "
            "which does not exist: fix or remove the link)")):
        load_model(dangling, device="cpu")
    directory = folder("directory")
    (directory / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError, match=re.escape(f"{directory / 'model.safetensors'} cannot be read (it is a "
                                                        "directory")):
        load_model(directory, device="cpu")
    indexed = tmp_path / "indexed"
    shutil.copytree(dense_dir, indexed)
    (indexed / INDEX).write_text(json.dumps({"weight_map": {}}))
    deny_reading(monkeypatch, INDEX)
    with pytest.raises(CheckpointError, match=re.escape(f"{indexed / INDEX} cannot be read (permission denied: fix its "
                                                        "permissions")):
        load_model(indexed, device="cpu")


def test_checkpoint_files_config_and_tokenizer_problems_name_their_file(dense_dir, tmp_path):
    from safetensors.torch import save_file

    q_dir = quantize_folder(dense_dir, tmp_path / "q", Scheme.FP8_BLOCK, "fp8")
    stale = tmp_path / "stale"
    shutil.copytree(q_dir, stale)
    save_file({f"{DOWN}.weight_scale_inv": torch.ones(1, 1)}, str(stale / "model.zz-old.safetensors"))
    with pytest.raises(CheckpointError, match="is in both model.safetensors and model.zz-old.safetensors"):
        load_model(stale, device="cpu")
    torn = tmp_path / "torn"
    shutil.copytree(q_dir, torn)
    data = (torn / "model.safetensors").read_bytes()
    (torn / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_model(torn, device="cpu")
    config = json.loads((q_dir / "config.json").read_text())
    for field, value, message in (("weight_block_size", [0, 128], "two positive integers"),
                                  ("weight_block_size", [128], "two positive integers")):
        bad = tmp_path / f"block-{len(value)}"
        shutil.copytree(q_dir, bad)
        (bad / "config.json").write_text(json.dumps(dict(config, quantization_config={
            **config["quantization_config"], field: value})))
        with pytest.raises(ModelConfigError, match=message):
            load_model(bad, device="cpu")
    (bad / "config.json").write_text(json.dumps(dict(config, hidden_size="abc")))
    with pytest.raises(ModelConfigError, match="a field has the wrong type"):
        load_model(bad, device="cpu")
    (bad / "config.json").write_text("[]")
    with pytest.raises(ModelConfigError, match="not an object of fields"):
        load_model(bad, device="cpu")
    broken_tok = tmp_path / "tok"
    shutil.copytree(q_dir, broken_tok)
    (broken_tok / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="tokenizer.json: not a valid tokenizer.json .*copy it again"):
        load_model(broken_tok, device="cpu")
    # A file that cannot be read is not a bad copy: the message says what to fix instead.
    (broken_tok / "tokenizer.json").unlink()
    (broken_tok / "tokenizer.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(CheckpointError, match="tokenizer.json cannot be read .*symbolic link to .*gone.json, which "
                                              "does not exist: fix or remove the link"):
        load_model(broken_tok, device="cpu")
    (broken_tok / "tokenizer.json").unlink()
    (broken_tok / "tokenizer.json").mkdir()
    with pytest.raises(CheckpointError, match="it is a directory, not a file"):
        load_model(broken_tok, device="cpu")
    (broken_tok / "tokenizer.json").rmdir()
    (broken_tok / "tokenizer.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match="tokenizer.json is not UTF-8 text"):
        load_model(broken_tok, device="cpu")


def test_asymmetric_compressed_tensors_weights_are_refused(dense_dir, tmp_path):
    q_dir = quantize_folder(dense_dir, tmp_path / "q", Scheme.FP8_CHANNEL, "compressed-tensors")
    config = json.loads((q_dir / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = False
    (q_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match="asymmetric weights"):
        load_model(q_dir, device="cpu")


def test_a_failed_reload_leaves_the_served_weights_as_they_were(wide_block_dir, tmp_path):
    """New weights (another seed) with one bad scale: the check pass reads every tensor and writes
    none, so the served logits stay exactly as they were, embeddings and norms included."""
    q_dir = tmp_path / "served"
    shutil.copytree(wide_block_dir, q_dir)
    loaded = load_model(q_dir, device="cpu", linear_backend="emulation")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    before = _logits(loaded, prompt)
    good = (q_dir / "model.safetensors").read_bytes()
    other = quantize_folder(write_model(tmp_path / "src", seed=7, **WIDE), tmp_path / "other", Scheme.FP8_BLOCK, "fp8")
    _edited(other, tmp_path, "later", _set(f"{DOWN}.weight_scale_inv", lambda s: s.t().contiguous()))
    shutil.copy(tmp_path / "later" / "model.safetensors", q_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="does not match"):
        loaded.reload_weights()
    assert torch.equal(_logits(loaded, prompt), before)  # nothing was half replaced
    (q_dir / "model.safetensors").write_bytes(good)


def test_moe_sizes_in_config_json_are_checked_as_fields(moe_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(moe_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    experts = config.get("num_experts", config.get("num_local_experts"))
    for field, value in (("num_experts_per_tok", 0), ("num_experts_per_tok", experts + 1),
                         ("moe_intermediate_size", 0)):
        (bad / "config.json").write_text(json.dumps(dict(config, **{field: value})))
        with pytest.raises(ModelConfigError, match="num_experts_per_tok at most num_experts"):
            load_model(bad, device="cpu")


def test_fused_expert_tensors_are_refused_with_how_to_resave(moe_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    fused_dir = tmp_path / "fused"
    shutil.copytree(moe_dir, fused_dir)
    tensors = load_file(str(fused_dir / "model.safetensors"))
    experts = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")
    per_layer: dict[str, list[torch.Tensor]] = {}
    for name in sorted(tensors):
        match = experts.fullmatch(name)
        if match and match[3] == "down":
            per_layer.setdefault(match[1], []).append(tensors[name])
        if match:
            del tensors[name]
    for prefix, downs in per_layer.items():
        tensors[f"{prefix}.down_proj"] = torch.stack(downs)
    save_file(tensors, str(fused_dir / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"stores fused MoE experts \(model\.layers\.0\.mlp\.experts\.down_proj\)"):
        load_model(fused_dir, device="cpu")


# ---- integer or bool tensors where floats belong: refused, never cast to floats ---------------------------

O_PROJ = "model.layers.0.self_attn.o_proj"


def _as_int8(w: torch.Tensor) -> torch.Tensor:
    return (w.float() * 100).round().clamp(-127, 127).to(torch.int8)


@pytest.mark.parametrize("case,model,edit,message", [
    ("int8 weight", "tiny-qwen3", _set(f"{O_PROJ}.weight", _as_int8),
     f"{O_PROJ}.weight: stored as torch.int8; unquantized weights must be float32, bfloat16 or float16"),
    ("bool weight", "tiny-qwen3", _set(f"{O_PROJ}.weight", lambda w: w > 0), f"{O_PROJ}.weight: stored as torch.bool"),
    ("int lm_head", "tiny-qwen3-fp8-block-native",
     _add("lm_head.weight", lambda t: _as_int8(t["model.embed_tokens.weight"])),
     "lm_head.weight: stored as torch.int8; unquantized weights"),
    ("int scale", "tiny-qwen3-fp8-block-native",
     _set(f"{DOWN}.weight_scale_inv", lambda s: (s * 1e4).to(torch.int32) + 1),
     f"{DOWN}.weight_scale_inv: stored as torch.int32; scales must be float32, bfloat16 or float16"),
    ("int experts", "tiny-qwen3-moe", lambda t: t.update({n: _as_int8(w) for n, w in t.items() if ".experts." in n}),
     "model.layers.0.mlp.experts.*: stored as torch.int8; unquantized weights"),
    ("int merged part", "tiny-qwen3", _set("model.layers.0.self_attn.k_proj.weight", _as_int8),
     "model.layers.0.self_attn.q_proj.weight + model.layers.0.self_attn.k_proj.weight + "
     "model.layers.0.self_attn.v_proj.weight: these tensors cannot be joined ((256, 256) torch.bfloat16, (128, 256) "
     "torch.int8, (128, 256) torch.bfloat16): an integer or bool tensor among floats would be cast"),
])
def test_integer_or_bool_tensors_where_floats_belong_are_refused_naming_them(tmp_path, case, model, edit, message):
    """They were cast to floats silently (int8 codes served as weights); embeddings and norms were refused."""
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_model(_edited(SHIPPED_MODELS / model, tmp_path, case.replace(" ", "-"), edit), device="cpu")


def test_float_tensors_of_another_float_dtype_still_load(tmp_path):
    """Scales in bf16/fp16 and weights in fp16/fp32 are read as their values: the same numbers
    stored in the checkpoint's own dtypes serve the same logits."""
    scales = (f"{DOWN}.weight_scale_inv", "model.layers.0.self_attn.k_proj.weight_scale_inv")

    def rounded(stored_as):
        def edit(tensors):
            for name, dtype in zip(scales, (torch.bfloat16, torch.float16)):
                value = tensors[name].to(dtype)
                tensors[name] = value if stored_as == "narrow" else value.float()
        return edit

    def half_o_proj(stored_as):
        return _set(f"{O_PROJ}.weight", lambda w: w.half() if stored_as == "narrow" else w.half().to(w.dtype))

    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    for model, edit in ((SHIPPED_MODELS / "tiny-qwen3-fp8-block-native", rounded),
                        (SHIPPED_MODELS / "tiny-qwen3", half_o_proj)):
        narrow, wide = (load_model(_edited(model, tmp_path, f"{model.name}-{kind}", edit(kind)), device="cpu")
                        for kind in ("narrow", "wide"))
        assert torch.equal(_logits(narrow, prompt), _logits(wide, prompt))


def test_a_reload_after_a_re_export_in_another_format_says_to_restart(tmp_path):
    """It blamed the new folder's scale names and said to re-export it, though the folder is fine:
    the model was built for the old format, and only a restart serves the new one."""
    from quantgate.engine import quantize

    served = tmp_path / "served"
    quantize.quantize_checkpoint(SHIPPED_MODELS / "tiny-qwen3", served, "fp8-block", "native")
    loaded = load_model(served, device="cpu", linear_backend="emulation")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    before = _logits(loaded, prompt)
    quantize.quantize_checkpoint(SHIPPED_MODELS / "tiny-qwen3", served, "fp8-block", "compressed-tensors", force=True)
    with pytest.raises(CheckpointError) as info:
        loaded.reload_weights()
    assert str(info.value) == (
        f"{served / 'config.json'}: the checkpoint's config changed since the server started (quantization_config: "
        "native fp8-block with `weight_scale_inv` scales in 128x128 blocks -> compressed-tensors fp8-block with "
        "`weight_scale` scales in 128x128 blocks); restart the server to serve the new format (reload only swaps "
        "weights of the same format and shapes)")
    assert torch.equal(_logits(loaded, prompt), before)
    load_model(served, device="cpu")  # what a restart does
    config = json.loads((served / "config.json").read_text())
    (served / "config.json").write_text(json.dumps(dict(config, intermediate_size=640)))
    with pytest.raises(CheckpointError, match=re.escape("intermediate_size: 768 -> 640")):
        loaded.reload_weights()


def test_a_reload_of_the_same_config_written_otherwise_still_reloads(tmp_path):
    """The same ignore list in another order (or keys reordered, indented) is the same format."""
    from quantgate.engine import quantize

    served = tmp_path / "served"
    quantize.quantize_checkpoint(SHIPPED_MODELS / "tiny-qwen3-moe", served, "fp8-block", "compressed-tensors")
    loaded = load_model(served, device="cpu", linear_backend="emulation", moe_backend="emulation")
    config = json.loads((served / "config.json").read_text())
    assert len(config["quantization_config"]["ignore"]) > 1
    config["quantization_config"]["ignore"].reverse()
    (served / "config.json").write_text(json.dumps(dict(reversed(config.items())), indent=4))
    loaded.reload_weights()


# ---- a tensor missing from the checkpoint: the cause, where the files or config.json show it --------------

def _sharded(src: Path, dst: Path, edit_index, drop: tuple[str, ...] = ()) -> Path:
    """`src` in two shards, without the tensors `drop`, and an index whose weight_map went through
    `edit_index`."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    (dst / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate([names[: len(names) // 2], names[len(names) // 2:]]):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({name: tensors[name] for name in part if name not in drop}, str(dst / file))
        weight_map.update({name: file for name in part})
    edit_index(weight_map)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def _configured(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def _static(config: dict) -> None:
    qc = config["quantization_config"]
    if qc["quant_method"] == "fp8":
        qc["activation_scheme"] = "static"
    else:
        qc["config_groups"]["group_0"]["input_activations"]["dynamic"] = False


O_SCALE = f"{O_PROJ}.weight_scale_inv"  # in the first of the two shards
SHARD_1, SHARD_2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
BLOCK_NATIVE = "tiny-qwen3-fp8-block-native"
STATIC_NO_SCALES = ("config.json's quantization_config has static activations ({}), which need an input_scale for "
                    "every quantized linear, and the checkpoint has none (it was quantized for dynamic activations): "
                    "set {}")


@pytest.mark.parametrize("case,model,folder,message", [
    ("index names another shard", BLOCK_NATIVE, lambda src, dst: _sharded(src, dst, lambda wm: wm.update(
        {O_SCALE: SHARD_2})),
     f"tensor '{O_SCALE}' is missing from the checkpoint; model.safetensors.index.json maps it to {SHARD_2}, which "
     f"does not hold it; {SHARD_1} holds it: correct the index's weight_map entry"),
    ("index names a shard, none holds it", BLOCK_NATIVE, lambda src, dst: _sharded(src, dst, lambda wm: None,
                                                                                    drop=(O_SCALE,)),
     f"tensor '{O_SCALE}' is missing from the checkpoint; model.safetensors.index.json maps it to {SHARD_1}, which "
     "does not hold it; no file the index names holds it: copy that file again, or re-download the checkpoint"),
    ("index omits it", BLOCK_NATIVE, lambda src, dst: _sharded(src, dst, lambda wm: wm.pop(O_SCALE)),
     f"tensor '{O_SCALE}' is missing from the checkpoint; model.safetensors.index.json does not list it, though "
     f"{SHARD_1} holds it: add it to the index's weight_map (or regenerate the index)"),
    ("index names a shard, none holds lm_head, config untied", BLOCK_NATIVE, lambda src, dst: _sharded(
        _configured(src, dst.with_name("untied"), lambda c: c.update(tie_word_embeddings=False)), dst,
        lambda wm: wm.update({"lm_head.weight": SHARD_1})),  # the files show the cause: re-tying would be wrong
     f"tensor 'lm_head.weight' is missing from the checkpoint; model.safetensors.index.json maps it to {SHARD_1}, "
     "which does not hold it; no file the index names holds it: copy that file again, or re-download the checkpoint"),
    ("untied without lm_head", BLOCK_NATIVE, lambda src, dst: _configured(
        src, dst, lambda c: c.update(tie_word_embeddings=False)),
     "tensor 'lm_head.weight' is missing from the checkpoint; config.json has tie_word_embeddings: false, so lm_head "
     "needs a weight of its own; if the model ties lm_head to the embeddings (transformers then saves no "
     "lm_head.weight), set tie_word_embeddings: true"),
    ("static native", "tiny-qwen3-fp8-tensor-native", lambda src, dst: _configured(src, dst, _static),
     "tensor 'model.layers.0.self_attn.q_proj.input_scale' is missing from the checkpoint; "
     + STATIC_NO_SCALES.format("activation_scheme: static", "activation_scheme: dynamic")),
    ("static compressed-tensors", "tiny-qwen3-moe-fp8-tensor-ct", lambda src, dst: _configured(src, dst, _static),
     "tensor 'model.layers.0.self_attn.q_proj.input_scale' is missing from the checkpoint; "
     + STATIC_NO_SCALES.format("input_activations with dynamic: false", "dynamic: true")),
])
def test_a_missing_tensor_is_named_with_its_cause_and_fix(tmp_path, case, model, folder, message):
    """It said only "tensor X is missing from the checkpoint"."""
    with pytest.raises(CheckpointError, match=re.escape(message) + "$"):
        load_model(folder(SHIPPED_MODELS / model, tmp_path / "m"), device="cpu")


def _with_index(src: Path, dst: Path, weight_map) -> Path:
    shutil.copytree(src, dst)
    (dst / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def _without(folder: Path, name: str) -> Path:
    (folder / name).unlink()
    return folder


@pytest.mark.parametrize("case,folder,message", [
    ("weight_map not an object", lambda src, dst: _with_index(src, dst, 5),
     f"{INDEX}: not a safetensors index ('int' object is not iterable); fix or remove it"),
    ("weight_map entry not a file name", lambda src, dst: _with_index(src, dst, {"lm_head.weight": None}),
     f"{INDEX}: not a safetensors index (weight_map maps 'lm_head.weight' to None, not a file name); fix or remove it"),
    ("index names a shard that is gone", lambda src, dst: _without(_sharded(src, dst, lambda wm: None), SHARD_2),
     f"{INDEX} names files that are not there: {SHARD_2}; copy them into {{folder}} again (or re-download the "
     "checkpoint)"),
    ("no safetensors", lambda src, dst: _without(Path(shutil.copytree(src, dst)), "model.safetensors"),
     "{folder} has no *.safetensors files (only safetensors checkpoints load): check the path, or save the model "
     "with transformers' save_pretrained, which writes them"),
])
def test_a_folder_whose_index_or_files_cannot_serve_is_refused_with_the_fix(tmp_path, case, folder, message):
    """A weight_map entry that is no file name crashed with a bare TypeError."""
    with pytest.raises(CheckpointError, match=re.escape(message.format(folder=tmp_path / "m")) + "$"):
        load_model(folder(SHIPPED_MODELS / BLOCK_NATIVE, tmp_path / "m"), device="cpu")


def test_an_index_may_place_a_shard_in_a_subfolder(tmp_path):
    """Index entries are paths relative to the folder: a shard in a subfolder loaded as "missing",
    blamed on the index mapping it to a file that does not hold it."""
    sharded = _sharded(SHIPPED_MODELS / BLOCK_NATIVE, tmp_path / "m",
                       lambda wm: wm.update({name: f"shards/{file}" for name, file in wm.items() if file == SHARD_2}))
    (sharded / "shards").mkdir()
    (sharded / SHARD_2).rename(sharded / "shards" / SHARD_2)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert torch.equal(_logits(load_model(sharded, device="cpu"), prompt),
                       _logits(load_model(SHIPPED_MODELS / BLOCK_NATIVE, device="cpu"), prompt))
    (sharded / "shards" / SHARD_2).unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"names files that are not there: shards/{SHARD_2}; ")):
        load_model(sharded, device="cpu")


def test_with_an_index_only_the_files_it_names_are_read(tmp_path):
    """A leftover *.safetensors the index does not name (an older export, a partial download) is
    never opened: the model serves what the indexed shards hold."""
    sharded = _sharded(SHIPPED_MODELS / BLOCK_NATIVE, tmp_path / "m", lambda wm: None)
    (sharded / "model.safetensors.partial.safetensors").write_bytes(b"\x08\x00")  # a torn download
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert torch.equal(_logits(load_model(sharded, device="cpu"), prompt),
                       _logits(load_model(SHIPPED_MODELS / BLOCK_NATIVE, device="cpu"), prompt))


def test_static_activations_with_some_input_scales_missing_say_which_is_missing(tmp_path):
    static = quantize_folder(SHIPPED_MODELS / "tiny-qwen3", tmp_path / "q", Scheme.FP8_TENSOR, "fp8", static_input=True)
    key = "model.layers.1.mlp.down_proj.input_scale"
    with pytest.raises(CheckpointError, match=re.escape(
            f"tensor '{key}' is missing from the checkpoint; config.json's quantization_config has static activations "
            "(activation_scheme: static), which need an input_scale for every quantized linear, and other linears have "
            "one: re-export the checkpoint with all of them (or set activation_scheme: dynamic")):
        load_model(_edited(static, tmp_path, "partial", lambda t: t.pop(key)), device="cpu")


@pytest.mark.parametrize("value", [0.0, float("nan")])
def test_a_static_input_scale_that_is_not_positive_is_refused_naming_it(tmp_path, value):
    """Activations are divided by it: like a weight scale, a zero or NaN one would serve wrong numbers."""
    static = quantize_folder(SHIPPED_MODELS / "tiny-qwen3", tmp_path / "q", Scheme.FP8_TENSOR, "fp8", static_input=True)
    key = "model.layers.1.mlp.down_proj.input_scale"
    with pytest.raises(CheckpointError, match=re.escape(f"{key}: 1 of 1 scales are not finite and positive (e.g. {value})")):
        load_model(_edited(static, tmp_path, "bad", _set(key, lambda s: torch.full_like(s, value))), device="cpu")


@pytest.mark.parametrize("requested, checkpoint, device, expected", [
    ("auto", torch.float16, "cpu", torch.bfloat16),  # float16 matmuls are slow on CPU
    ("auto", torch.bfloat16, "cpu", torch.bfloat16),
    ("auto", torch.float32, "cpu", torch.float32),
    ("auto", torch.float16, "cuda", torch.float16),
    (" FP16 ", torch.bfloat16, "cpu", torch.float16),
])
def test_dtype_auto_is_the_checkpoints_except_float16_on_cpu(requested, checkpoint, device, expected):
    assert resolve_dtype(requested, checkpoint, torch.device(device)) is expected


def test_a_model_served_in_another_dtype_reloads(dense_dir, tmp_path):
    """--dtype is chosen at start and new weights are cast to it as the first were: no config change."""
    served = Path(shutil.copytree(dense_dir, tmp_path / "served"))
    loaded = load_model(served, device="cpu", dtype="bfloat16")
    new = write_model(tmp_path / "new", seed=5)
    shutil.copy(new / "model.safetensors", served / "model.safetensors")
    loaded.reload_weights()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert torch.equal(_logits(loaded, prompt), _logits(load_model(new, device="cpu", dtype="bfloat16"), prompt))


def test_block_projections_merge_only_where_each_part_is_whole_row_blocks(dense_dir, tmp_path):
    """The row side of a block (block_size[0]) decides: with 128x64 blocks the 64-row k and v
    projections are not whole row blocks, so q/k/v keep their own GEMMs (merged, one scale row
    would span two projections, and their scales do not concatenate to the merged shape)."""
    q_dir = quantize_folder(dense_dir, tmp_path / "q", Scheme.FP8_BLOCK, "fp8", block=(128, 64))
    modules = load_model(q_dir, device="cpu", linear_backend="emulation").kernel_report()["modules"]
    assert "model.layers.0.self_attn.qkv_proj" not in modules
    assert modules["model.layers.0.self_attn.k_proj"]["scheme"] == "fp8-block"


def test_a_bias_stored_as_integers_is_named_as_a_bias(tmp_path):
    src = write_model(tmp_path / "src", seed=5, attention_bias=True)
    bad = _edited(src, tmp_path, "int-bias", _set(f"{O_PROJ}.bias", lambda b: (b * 100).round().to(torch.int32)))
    with pytest.raises(CheckpointError, match=re.escape(
            f"{O_PROJ}.bias: stored as torch.int32; biases must be float32, bfloat16 or float16 (a cast to floats "
            "would serve its integer codes as values): re-export the checkpoint with it in the model dtype")):
        load_model(bad, device="cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e5m2])
def test_a_plain_weight_where_the_config_says_fp8_is_refused_not_cast(tmp_path, dtype):
    """A bf16/fp32 weight among FP8 ones (a module left out of the ignore list) was a candidate for
    a silent cast to FP8: its values would be served clipped and rounded, against unit scales."""
    folder = SHIPPED_MODELS / "tiny-qwen3-fp8-block-native"
    bad = _edited(folder, tmp_path, "plain", _set(f"{O_PROJ}.weight", lambda w: w.float().to(dtype)))
    with pytest.raises(CheckpointError, match=re.escape(
            f"{O_PROJ}.weight: expected float8_e4m3fn weights for {O_PROJ} (quantization_config says it is quantized), "
            f"found {dtype}; add it to the ignore list")):
        load_model(bad, device="cpu")


def test_the_kernel_report_says_why_each_faster_kernel_was_passed_over(tmp_path):
    modules = load_model(SHIPPED_MODELS / "tiny-qwen3-fp8-block-native", device="cpu").kernel_report()["modules"]
    entry = modules["model.layers.0.self_attn.qkv_proj"]
    assert entry["kernel"] == "EmulationLinearKernel"
    rejected = {r["kernel"]: r["reason"] for r in entry["rejected"]}
    assert rejected["TritonBlockFp8LinearKernel"] == ("requires CUDA (compute capability >= 8.9, FP8 tensor cores); "
                                                      "this is cpu")
    assert all(reason.endswith("this is cpu") for reason in rejected.values())
    assert modules["lm_head"]["rejected"] == []


def test_biases_are_served_in_the_model_dtype(dense_tied_dir):
    """A bias kept in float32 next to bf16 weights would be added in another precision than
    transformers adds it (or fail the GEMM's dtype check)."""
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    loaded = load_model(dense_tied_dir, device="cpu", dtype="bfloat16")
    biases = {name: b.dtype for name, b in loaded.model.named_buffers() if name.endswith(".bias")}
    assert len(biases) == 4 and set(biases.values()) == {torch.bfloat16}
    ours, ref = _logits(loaded, prompt), _logits(load_model(dense_tied_dir, device="cpu"), prompt)
    assert float((ours - ref).abs().max() / ref.abs().max()) < 0.05


def test_static_input_scales_stay_float32_in_a_bf16_model(dense_dir, tmp_path):
    """The checkpoint's 0.02 must be the scale the activations are divided by, not its bf16
    rounding (0.0200195...), whatever dtype the model is served in."""
    q_dir = quantize_folder(dense_dir, tmp_path / "q", Scheme.FP8_TENSOR, "fp8", static_input=True)
    loaded = load_model(q_dir, device="cpu", dtype="bfloat16")
    scales = {name: s for name, s in loaded.model.named_buffers() if name.endswith(".input_scale")}
    assert len(scales) == 2 * 7  # q, k, v, o, gate, up and down per layer
    for name, scale in scales.items():
        assert scale.dtype == torch.float32 and torch.equal(scale.reshape(()), torch.tensor(0.02)), name


def test_a_tied_lm_head_reads_the_embeddings_not_a_copy(dense_tied_dir):
    """Checkpoint tensors are copied (on the CPU they are views of the memory-mapped file), but
    not the embeddings a tied lm_head reads: a copy would hold the vocabulary matrix twice."""
    loaded = load_model(dense_tied_dir, device="cpu")
    embeddings = loaded.model.model.embed_tokens.weight
    assert loaded.model.lm_head.weight.data_ptr() == embeddings.data_ptr()
