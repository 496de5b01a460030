"""load_model: kernel selection rules, the kernel report, clear errors, and reloads in place."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from quantgate.engine import load_model
from quantgate.engine.checkpoint import CheckpointError
from quantgate.engine.config import ModelConfigError
from quantgate.engine.kv_cache import KVCache
from quantgate.kernels import KernelSelectionError, Scheme

from .test_parity import _prefill_batch
from .tiny_models import quantize_folder, write_model


def test_kernel_report_has_the_spec_shape_and_logs_each_selection(dense_dir, caplog):
    with caplog.at_level(logging.INFO, logger="quantgate.engine"):
        loaded = load_model(dense_dir, device="cpu")
    report = loaded.kernel_report()
    assert report["platform"]["device"] == "cpu"
    entry = report["modules"]["model.layers.0.self_attn.qkv_proj"]  # q, k and v: one merged GEMM
    assert set(entry) == {"layer", "scheme", "kernel", "backend", "rejected"}
    assert entry["layer"] == "linear" and entry["scheme"] == "unquantized"
    assert len(report["modules"]) == 2 * 4 + 1  # qkv, o, gate_up and down per layer, and lm_head
    assert "Selected UnquantizedLinearKernel for model.layers.1.mlp.down_proj" in caplog.messages


def test_unquantized_checkpoint_with_a_weight_only_fp8_backend_is_a_strict_error(dense_dir):
    with pytest.raises(KernelSelectionError, match="MarlinFp8LinearKernel.*model.layers.0.self_attn.qkv_proj"):
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


@pytest.mark.parametrize("variant", ["fp32", "fp8-block-native", "fp8-tensor-ct"])
def test_reload_reads_new_weights_into_the_same_storage(tmp_path, variant):
    def build(seed: int):
        src = write_model(tmp_path / f"src{seed}", seed=seed, tie_word_embeddings=True)
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
    loaded.reload_weights()
    assert _storage(loaded) == before
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


def test_moe_block_checkpoint_whose_experts_cannot_stack_is_refused_at_selection(moe_dir, tmp_path):
    q_dir = quantize_folder(moe_dir, tmp_path / "q", Scheme.FP8_BLOCK, "fp8")  # moe_intermediate_size 64
    with pytest.raises(KernelSelectionError, match="intermediate size .64. to be a multiple of the block"):
        load_model(q_dir, device="cpu")
