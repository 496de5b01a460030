"""The engine's Triton kernels against float64 references (under the interpreter on CPU), and the
whole model with them against the eager PyTorch path."""

from __future__ import annotations

import pytest
import torch

from quantgate.engine import LLMEngine, SamplingParams, layers, load_model
from quantgate.engine.layers import RMSNorm, RotaryEmbedding, apply_rotary

from .conftest import mostly_equal, run_to_completion

triton_ops = pytest.importorskip("quantgate.engine.triton_ops")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Tolerances against float64: the kernels round to the dtype where eager PyTorch does, a few times per op.
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}
DTYPES = list(TOLERANCE)


def _random(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64).to(device=DEVICE, dtype=dtype)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x = x.double()
    return w.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [96, 200])
def test_rms_norm_with_and_without_residual(seed, dtype, n):
    x, residual, w = _random(5, n, dtype=dtype), _random(5, n, dtype=dtype), _random(n, dtype=dtype).abs() + 0.5
    torch.testing.assert_close(triton_ops.rms_norm(x, w, 1e-6).double(), _rms(x, w), **TOLERANCE[dtype])
    updated = residual.clone()
    out = triton_ops.rms_norm(x, w, 1e-6, updated)
    expected_sum = x.double() + residual.double()
    torch.testing.assert_close(updated.double(), expected_sum, **TOLERANCE[dtype])
    torch.testing.assert_close(out.double(), _rms(expected_sum, w), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(seed, dtype):
    gate, up = _random(3, 1100, dtype=dtype), _random(3, 1100, dtype=dtype)  # two programs, the second partial
    expected = torch.nn.functional.silu(gate.double()) * up.double()
    torch.testing.assert_close(triton_ops.silu_and_mul(gate, up).double(), expected, **TOLERANCE[dtype])
    merged = torch.cat([gate, up], dim=1)  # the column views of a gate_up projection's output
    out = triton_ops.silu_and_mul(merged[:, :1100], merged[:, 1100:])
    assert out.is_contiguous()
    torch.testing.assert_close(out.double(), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rope_writes_the_cache_at_slot_and_position(seed, dtype):
    tokens, heads, kv_heads, head_dim, slots, max_len = 5, 4, 2, 32, 3, 40
    rotary = RotaryEmbedding(head_dim, 1e6, 64, torch.device(DEVICE))
    q, k, v = (_random(tokens, h * head_dim, dtype=dtype) for h in (heads, kv_heads, kv_heads))
    q_w, k_w = (_random(head_dim, dtype=dtype).abs() + 0.5 for _ in range(2))
    positions = torch.tensor([0, 7, 39, 3, 8], device=DEVICE)
    slot_ids = torch.tensor([0, 2, 1, 3, 2], device=DEVICE)  # slot 3: the scratch slot
    k_cache = torch.zeros(slots + 1, kv_heads, max_len, head_dim, dtype=dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    q_out, k_out = triton_ops.qk_norm_rope_to_cache(q, k, v, q_w, k_w, 1e-6, rotary.cos, rotary.sin, positions,
                                                     slot_ids, k_cache, v_cache)
    cos, sin = (t[positions].double()[:, None, :] for t in (rotary.cos, rotary.sin))
    expected_q = _rotate(_rms(q.view(tokens, heads, head_dim), q_w), cos, sin)
    expected_k = _rotate(_rms(k.view(tokens, kv_heads, head_dim), k_w), cos, sin)
    torch.testing.assert_close(q_out.double(), expected_q, **TOLERANCE[dtype])
    torch.testing.assert_close(k_out.double(), expected_k, **TOLERANCE[dtype])
    written = torch.zeros(slots + 1, max_len, dtype=torch.bool, device=DEVICE)
    written[slot_ids, positions] = True
    torch.testing.assert_close(k_cache[slot_ids, :, positions].double(), expected_k, **TOLERANCE[dtype])
    assert torch.equal(v_cache[slot_ids, :, positions], v.view(tokens, kv_heads, head_dim))
    assert not k_cache.transpose(1, 2)[~written].any() and not v_cache.transpose(1, 2)[~written].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_reads_each_sequence_up_to_its_length(seed, dtype):
    # Lengths: one key; one past a 64-key block; 3 splits of 2 blocks (last one partial); past
    # MAX_SPLITS x SPLIT_KEYS (16 splits of 3 blocks); one block short of that.
    heads, kv_heads, head_dim, max_len = 4, 2, 32, 2200
    k_cache, v_cache = (_random(6, kv_heads, max_len, head_dim, dtype=dtype) for _ in range(2))
    slots = torch.tensor([2, 0, 3, 5, 1], device=DEVICE)
    lens = torch.tensor([1, 65, 300, 2200, 2048 - 64], device=DEVICE)
    q = _random(5, heads, head_dim, dtype=dtype)
    out = torch.full_like(q, float("nan"))
    triton_ops.decode_attention(q, k_cache, v_cache, slots, lens, head_dim**-0.5, out, max_len)
    for b, (slot, length) in enumerate(zip(slots.tolist(), lens.tolist())):
        keys = k_cache[slot, :, :length].double().repeat_interleave(heads // kv_heads, dim=0)
        values = v_cache[slot, :, :length].double().repeat_interleave(heads // kv_heads, dim=0)
        weights = torch.softmax(q[b].double()[:, None, :] @ keys.transpose(1, 2) * head_dim**-0.5, dim=-1)
        ref = (weights @ values)[:, 0]
        if dtype == torch.float32:
            torch.testing.assert_close(out[b].double(), ref, **TOLERANCE[dtype])
        else:  # an average of many values is small (about 0.03 at 2200 keys): bf16's atol would pass zeros
            error = (out[b].double() - ref).abs().mean() / ref.abs().mean()
            assert error < 1e-2, (length, error.item())
    counters = triton_ops.device_buffer(q.device, "attention_counters", 1, torch.int32)
    assert not counters.any()  # the merging programs reset them for the next launch

    # The split follows each sequence's length, not the batch or the bound the caller passes
    # (a graph's context bucket): the same sums, bit for bit.
    for b, bound in ((3, 4096), (2, 300)):  # 16 programs per (sequence, head) above; here 16 and 3
        alone = torch.full_like(q[:1], float("nan"))
        triton_ops.decode_attention(q[b:b + 1], k_cache, v_cache, slots[b:b + 1], lens[b:b + 1], head_dim**-0.5,
                                    alone, bound)
        assert torch.equal(alone, out[b:b + 1])


def test_rms_norm_reads_row_strides_and_honours_eps(seed):
    """Column views of wider buffers (rows not n apart), inputs small enough that eps moves the
    result, and without a residual the input is left as it was."""
    n, eps = 200, 0.5
    wide_x, wide_res = _random(5, 256, dtype=torch.float32) * 0.3, _random(5, 232, dtype=torch.float32) * 0.3
    x, residual, w = wide_x[:, 16:16 + n], wide_res[:, :n], _random(n, dtype=torch.float32).abs() + 0.5
    before_x, before_res = wide_x.clone(), wide_res.clone()
    torch.testing.assert_close(triton_ops.rms_norm(x, w, eps).double(), _rms(x, w, eps), **TOLERANCE[torch.float32])
    assert torch.equal(wide_x, before_x)
    out = triton_ops.rms_norm(x, w, eps, residual)
    expected_sum = x.double() + before_res[:, :n].double()
    torch.testing.assert_close(residual.double(), expected_sum, **TOLERANCE[torch.float32])
    assert torch.equal(wide_res[:, n:], before_res[:, n:]) and torch.equal(wide_x, before_x)
    torch.testing.assert_close(out.double(), _rms(expected_sum, w, eps), **TOLERANCE[torch.float32])


def test_kernels_round_where_the_eager_path_does(seed, monkeypatch):
    """In float16 (the interpreter truncates float32 to bfloat16, where a GPU rounds to nearest) each kernel
    gives the eager layers' bits: the residual sum, the normalised value and silu are rounded to
    the dtype before the next step, as the eager ops store them. A float64 reference cannot see a
    missing rounding: it is within the dtype's tolerance."""
    dtype, device = torch.float16, torch.device(DEVICE)
    tokens, n = 7, 200
    norm = RMSNorm(n, 1e-6, dtype, device)
    norm.weight.copy_(_random(n, dtype=dtype).abs() + 0.5)
    x, residual = _random(tokens, n, dtype=dtype), _random(tokens, n, dtype=dtype)
    monkeypatch.setattr(layers, "uses_triton_ops", lambda x: False)  # the layers' eager path, on any device
    eager_out, eager_sum = norm(x, residual.clone())
    updated = residual.clone()
    mostly_equal(triton_ops.rms_norm(x, norm.weight, 1e-6, updated), eager_out)
    assert torch.equal(updated, eager_sum)

    gate, up = _random(tokens, 1100, dtype=dtype), _random(tokens, 1100, dtype=dtype)
    mostly_equal(triton_ops.silu_and_mul(gate, up), layers.silu_and_mul(gate.clone(), up))


@pytest.mark.skipif(DEVICE == "cuda", reason="compiled, the kernel's sqrt and division are approximate: 8% of "
                    "float16 elements one ulp off the eager path on the H200 (run 27), as many as a lost rounding")
def test_qk_norm_rope_rounds_where_the_eager_path_does(seed):
    """As above for the rotary tables and each rotary product of QK-norm/RoPE, under the interpreter."""
    dtype, device = torch.float16, torch.device(DEVICE)
    tokens, heads, kv_heads, head_dim = 7, 4, 2, 64
    rotary = RotaryEmbedding(head_dim, 1e6, 64, device)
    q, k, v = (_random(tokens, h * head_dim, dtype=dtype) for h in (heads, kv_heads, kv_heads))
    q_norm, k_norm = RMSNorm(head_dim, 1e-6, dtype, device), RMSNorm(head_dim, 1e-6, dtype, device)
    for m in (q_norm, k_norm):
        m.weight.copy_(_random(head_dim, dtype=dtype).abs() + 0.5)
    positions = torch.tensor([0, 5, 63, 17, 2, 40, 9], device=DEVICE)
    k_cache = torch.zeros(tokens, kv_heads, 64, head_dim, dtype=dtype, device=DEVICE)
    q_out, k_out = triton_ops.qk_norm_rope_to_cache(q, k, v, q_norm.weight, k_norm.weight, 1e-6, rotary.cos,
                                                     rotary.sin, positions, torch.arange(tokens, device=DEVICE),
                                                     k_cache, torch.zeros_like(k_cache))
    cos, sin = rotary(positions, dtype)
    mostly_equal(q_out, apply_rotary(q_norm(q.view(tokens, heads, head_dim)), cos, sin))
    mostly_equal(k_out, apply_rotary(k_norm(k.view(tokens, kv_heads, head_dim)), cos, sin))


def test_qk_norm_rope_reads_strided_projections_and_any_rotary_table(seed):
    """q, k, v as the column views of one merged qkv projection's output (as the model passes them),
    then from buffers of three other row strides; cos/sin tables whose halves differ (the kernel
    reads both) and whose rows are wider than a head; inputs small enough that eps matters."""
    tokens, heads, kv_heads, head_dim, max_len, eps = 5, 4, 2, 32, 40, 0.25
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    merged = _random(tokens, q_size + 2 * kv_size, dtype=torch.float32) * 0.2
    separate = [(_random(tokens, size + pad, dtype=torch.float32) * 0.2)[:, pad:]
                for size, pad in ((q_size, 8), (kv_size, 24), (kv_size, 40))]
    assert [t.stride(0) for t in separate] == [q_size + 8, kv_size + 24, kv_size + 40]
    cos_table, sin_table = (_random(64, head_dim + 16, dtype=torch.float32)[:, :head_dim] for _ in range(2))
    q_w, k_w = (_random(head_dim, dtype=torch.float32).abs() + 0.5 for _ in range(2))
    positions = torch.tensor([3, 39, 0, 12, 7], device=DEVICE)
    slot_ids = torch.tensor([1, 0, 2, 3, 4], device=DEVICE)
    cos, sin = (t[positions].double()[:, None, :] for t in (cos_table, sin_table))
    for q, k, v in (merged.split([q_size, kv_size, kv_size], dim=1), separate):
        k_cache = torch.zeros(5, kv_heads, max_len, head_dim, device=DEVICE)
        v_cache = torch.zeros_like(k_cache)
        q_out, k_out = triton_ops.qk_norm_rope_to_cache(q, k, v, q_w, k_w, eps, cos_table, sin_table, positions,
                                                         slot_ids, k_cache, v_cache)
        expected_q = _rotate(_rms(q.reshape(tokens, heads, head_dim), q_w, eps), cos, sin)
        expected_k = _rotate(_rms(k.reshape(tokens, kv_heads, head_dim), k_w, eps), cos, sin)
        torch.testing.assert_close(q_out.double(), expected_q, **TOLERANCE[torch.float32])
        torch.testing.assert_close(k_out.double(), expected_k, **TOLERANCE[torch.float32])
        torch.testing.assert_close(k_cache[slot_ids, :, positions].double(), expected_k, **TOLERANCE[torch.float32])
        assert torch.equal(v_cache[slot_ids, :, positions], v.reshape(tokens, kv_heads, head_dim))


def test_silu_and_mul_takes_operands_of_other_layouts(seed):
    """gate and up of different row strides, and a gate whose columns are not contiguous (copied first)."""
    gate = _random(3, 1200, dtype=torch.float32)[:, 50:1150]
    up = _random(3, 1100, dtype=torch.float32)
    expected = torch.nn.functional.silu(gate.double()) * up.double()
    torch.testing.assert_close(triton_ops.silu_and_mul(gate, up).double(), expected, **TOLERANCE[torch.float32])
    transposed = gate.t().contiguous().t()  # stride (1, 3)
    torch.testing.assert_close(triton_ops.silu_and_mul(transposed, up).double(), expected,
                               **TOLERANCE[torch.float32])
    torch.testing.assert_close(triton_ops.silu_and_mul(up, transposed).double(),
                               torch.nn.functional.silu(up.double()) * gate.double(), **TOLERANCE[torch.float32])


def test_engine_with_triton_ops_matches_the_eager_path(dense_dir, monkeypatch):
    """Prefills batched with decodes, sequences finishing at different steps: same tokens and logprobs."""
    prompts = [[5, 6, 7], list(range(1, 10)), [9] * 4]

    def generate() -> dict[str, list]:
        engine = LLMEngine(load_model(dense_dir, device=DEVICE), max_num_seqs=4, max_model_len=64)
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, SamplingParams(max_tokens=1 + i, temperature=0, logprobs=2,
                                                              ignore_eos=True))
        outs = run_to_completion(engine)
        return {rid: [(o.new_token_ids, o.token_logprobs) for o in seq] for rid, seq in outs.items()}

    monkeypatch.setattr(layers, "uses_triton_ops", lambda x: False)
    eager = generate()
    monkeypatch.setattr(layers, "uses_triton_ops", lambda x: True)
    fused = generate()
    assert fused.keys() == eager.keys()
    for rid in eager:
        assert [tokens for tokens, _ in fused[rid]] == [tokens for tokens, _ in eager[rid]]
        torch.testing.assert_close([lp for _, lp in fused[rid]], [lp for _, lp in eager[rid]], rtol=1e-4, atol=1e-4)
