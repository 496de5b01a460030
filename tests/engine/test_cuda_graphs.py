"""CUDA graphs for decode: replay equals eager, stays equal after a weight reload, and overlapped
decode changes no output (GPU only)."""

from __future__ import annotations

import shutil

import pytest
import torch

from quantgate.engine import LLMEngine, SamplingParams, load_model
from quantgate.kernels import Scheme

from .conftest import random_prompts, run_to_completion
from .test_overlapped_decode import serve_mixed_workload
from .tiny_models import quantize_folder, write_model

pytestmark = pytest.mark.gpu

# Multiples of 128 so every FP8 GPU kernel can serve the layers; positions up to MAX_MODEL_LEN
# (context buckets 256, 512 and the 600 itself).
MAX_MODEL_LEN = 600
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             max_position_embeddings=1024)
VARIANTS = [("bf16", "auto"), ("fp8-block", "auto"), ("fp8-block", "marlin")]
# Captured too: auto on fp8-tensor (the torch kernel, dynamic per-tensor activation scales) and the
# linear emulation kernels, whose scale computation once copied a constant from the host.
CAPTURED_TOO = [("fp8-tensor", "auto"), ("fp8-block", "emulation")]
# Qwen3-MoE: layer 0 routes over 4 experts of 128 (the FP8 block MoE kernels' 128-wide groups),
# layer 1 is a dense MLP. The backend names both the linear and the MoE backend.
MOE_VARIANTS = [("moe-fp8-block", "auto"), ("moe-fp8-block", "marlin")]


def _folder(tmp_path, name: str, seed: int, variant: str):
    moe = variant.startswith("moe")
    experts = {"moe_intermediate_size": 128} if moe else {}
    src = write_model(tmp_path / f"{name}-src", moe=moe, seed=seed, **SHAPE, **experts)
    if variant == "bf16":
        return src
    scheme = Scheme.FP8_TENSOR if variant.endswith("fp8-tensor") else Scheme.FP8_BLOCK
    return quantize_folder(src, tmp_path / name, scheme, "fp8")


def _engine(path, backend: str, eager: bool) -> LLMEngine:
    loaded = load_model(path, device="cuda", dtype="bfloat16", linear_backend=backend, moe_backend=backend)
    return LLMEngine(loaded, max_num_seqs=8, max_model_len=MAX_MODEL_LEN, enforce_eager=eager, kv_cache_memory=2**28)


def _greedy_tokens(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    outs = run_to_completion(engine)
    return [[t for o in outs[str(i)] for t in o.new_token_ids] for i in range(len(prompts))]


def _graph_vs_eager_logits(engine: LLMEngine, batch_size: int, first_position: int = 4):
    """One decode batch through the captured graph, then eagerly through the model on the same inputs
    (the bucket's padding rows dropped)."""
    slots = list(range(batch_size))
    positions = [first_position + 3 * i for i in slots]
    with torch.inference_mode():
        replayed, greedy = (t.clone() for t in engine.graphs.run([7 + i for i in slots], positions, slots))
        assert torch.equal(greedy, replayed.argmax(dim=-1))
        eager = engine.model(engine.graphs.batch(*engine.graphs.buckets(batch_size, max(positions) + 1)), engine.kv)
    return replayed, eager[:batch_size]


@pytest.mark.parametrize("variant,backend", VARIANTS + MOE_VARIANTS + CAPTURED_TOO)
def test_graph_replay_equals_eager(tmp_path, variant, backend):
    path = _folder(tmp_path, "m", 0, variant)
    graphs = _engine(path, backend, eager=False)
    assert graphs.graphs is not None
    modules = list(graphs.loaded.kernel_report()["modules"].values())
    assert any(m["layer"] == "moe" for m in modules) == variant.startswith("moe")
    quantized = [m["backend"] for m in modules if m["scheme"] != "unquantized"]
    assert bool(quantized) == (variant != "bf16")
    assert all(b == backend if backend != "auto" else b != "emulation" for b in quantized)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9] * 20]
    assert _greedy_tokens(graphs, prompts) == _greedy_tokens(_engine(path, backend, eager=True), prompts)
    assert graphs.graphs.contexts == [256, 512, 600] and graphs.graphs.buckets(3, 300) == (4, 512)
    # Every bucket was captured at start-up, and serving captured nothing more.
    assert graphs.graphs.num_captures == len(graphs.graphs.sizes) * len(graphs.graphs.contexts) == 4 * 3
    for size, first_position in ((1, 4), (3, 300), (8, 570)):
        replayed, eager = _graph_vs_eager_logits(graphs, size, first_position)
        torch.testing.assert_close(replayed, eager, rtol=1e-3, atol=1e-3)
    assert graphs.graphs.num_captures == 4 * 3


def test_a_kernel_that_cannot_be_captured_turns_graphs_off_with_the_reason(tmp_path):
    """MoE emulation reads each expert's token count on the host: the engine decodes eagerly and
    says why, instead of failing at capture."""
    path = _folder(tmp_path, "m", 0, "moe-fp8-block")
    engine = _engine(path, "emulation", eager=False)
    assert engine.graphs is None
    assert engine.graphs_off_reason.startswith("EmulationMoEKernel (serving model.layers.0.mlp.experts) "
                                               "synchronizes with the host")
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    assert _greedy_tokens(engine, prompts) == _greedy_tokens(_engine(path, "emulation", eager=True), prompts)


@pytest.mark.parametrize("variant,backend", VARIANTS)
def test_reload_under_captured_graphs_uses_the_new_weights(tmp_path, variant, backend):
    old, new = _folder(tmp_path, "old", 1, variant), _folder(tmp_path, "new", 2, variant)
    served = tmp_path / "served"
    shutil.copytree(old, served)
    engine = _engine(served, backend, eager=False)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    before = _greedy_tokens(engine, prompts)
    shutil.copy(new / "model.safetensors", served / "model.safetensors")
    engine.loaded.reload_weights()
    replayed, eager = _graph_vs_eager_logits(engine, 3)
    torch.testing.assert_close(replayed, eager, rtol=1e-3, atol=1e-3)
    after = _greedy_tokens(engine, prompts)
    assert after == _greedy_tokens(_engine(new, backend, eager=True), prompts)
    assert after != before


@pytest.mark.parametrize("variant,backend", VARIANTS)
def test_overlapped_decode_equals_reading_every_step_first(tmp_path, variant, backend):
    """Without stops and aborts every step has the same batch either way, so the tokens are equal
    bit for bit. (A sequence that stops or is aborted keeps its row in the one step launched
    ahead of the read; in bf16 a different batch may round differently: the CPU test in float32
    covers those.)"""
    engine = _engine(_folder(tmp_path, "m", 3, variant), backend, eager=False)
    prompts = random_prompts(12, engine.vocab_size, torch.Generator().manual_seed(0), high=40)
    engine.overlap_decode = False
    expected = serve_mixed_workload(engine, prompts, {}, abort_at=None)
    assert engine.num_overlapped_steps == 0
    engine.overlap_decode = True
    assert serve_mixed_workload(engine, prompts, {}, abort_at=None) == expected
    assert engine.num_overlapped_steps > 10
