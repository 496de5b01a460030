"""Launches by the compiled kernel's handle (kernels/triton/launch.py): the same results as the
JIT's launches for every specialization the caller keys (interpreted on CPU, where every launch
goes through the JIT; by handle on a GPU), and the host-side integer helpers."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.knobs import HookChain

from quantgate.kernels.triton.launch import DirectLaunch, _active, aligned, cdiv, next_power_of_2, tma_device

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit(do_not_specialize=["n"])
def _scaled_copy_kernel(src_ptr, dst_ptr, n, stride, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs * stride, mask=mask) * SCALE, mask=mask)


_copy = DirectLaunch(_scaled_copy_kernel)


def _launch(src: torch.Tensor, dst: torch.Tensor, scale: float) -> None:
    n, stride = dst.numel(), src.stride(0)
    key = (src.dtype, aligned(src.data_ptr()), aligned(dst.data_ptr()), stride, scale)
    _copy(key, (cdiv(n, 64),), (src, dst, n, stride), SCALE=scale, BLOCK=64)


def test_each_specialization_gets_its_own_kernel(seed):
    """Aligned and misaligned pointers, unit and wider strides, other lengths (not specialized),
    another constexpr, and each again after the others: a handle cached for one must not run
    another's arguments."""
    base = torch.randn(1000, device=DEVICE)
    cases = [(base[:300], 2.0), (base[1:301], 2.0), (base[::2][:200], 2.0), (base[:77], 2.0), (base[:300], 3.0)]
    for src, scale in cases + cases:
        dst = torch.empty(src.numel(), device=DEVICE)
        _launch(src, dst, scale)
        assert torch.equal(dst, src * scale)


def test_host_integer_helpers_match_triton():
    for a in [0, 1, 2, 15, 16, 17, 127, 128, 129, 4095, 4096, 4097, 14336, 2**31 + 3]:
        assert next_power_of_2(a) == triton.next_power_of_2(a), a
        for b in (1, 3, 16, 128):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)


def test_alignment_is_to_16_bytes_and_tma_needs_a_gpu():
    """Triton specializes a pointer as aligned when it is a multiple of 16 bytes: a key that called
    8-byte offsets aligned would reuse an aligned compilation for them on a GPU."""
    base = torch.empty(64, dtype=torch.float32)
    assert aligned(base.data_ptr()) and aligned(base[4:].data_ptr()) and aligned(0)
    assert not any(aligned(base[i:].data_ptr()) for i in (1, 2, 3, 6))
    assert [aligned(p) for p in (16, 48, 8, 24, 4, 1)] == [True, True, False, False, False, False]
    assert tma_device(torch.device("cpu")) is False


def test_empty_hook_chains_are_not_passed_to_the_launcher():
    chain = HookChain()
    assert _active(chain) is None
    chain.add(print)
    assert _active(chain) is chain
    assert _active(print) is print and _active(None) is None


@pytest.mark.gpu
def test_gpu_launches_after_the_first_go_by_handle():
    assert isinstance(_scaled_copy_kernel, triton.runtime.JITFunction)
    src = torch.randn(100, device="cuda")
    dst = torch.empty_like(src)
    _launch(src, dst, 2.0)
    _launch(src, dst, 2.0)
    assert any(isinstance(v[0], triton.compiler.CompiledKernel) for v in _copy._compiled.values())
