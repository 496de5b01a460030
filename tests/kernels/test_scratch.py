"""Per-device scratch buffers: zero when allocated, separate per purpose, and grown by
replacement so that a buffer a captured graph holds stays valid."""

from __future__ import annotations

import torch

from quantgate.kernels.triton.scratch import device_buffer


def test_buffers_are_zeroed_per_purpose_and_grow_by_replacement():
    cpu = torch.device("cpu")
    first = device_buffer(cpu, "test_counters", 10, torch.int32)
    assert first.dtype == torch.int32 and first.numel() >= 10 and not first.any()
    assert device_buffer(cpu, "test_counters", 5, torch.int32) is first
    other = device_buffer(cpu, "test_partials", 10, torch.float32)
    assert other.data_ptr() != first.data_ptr()
    first[0] = 7
    grown = device_buffer(cpu, "test_counters", 4 * first.numel(), torch.int32)
    assert grown is not first and grown.numel() >= 4 * first.numel() and not grown.any()
    assert first[0] == 7  # the old buffer is kept, not freed or cleared
