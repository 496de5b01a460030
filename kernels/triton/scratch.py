"""Per-device scratch buffers shared by launches on one stream (split-K partials, counters).

A buffer is zero when allocated, and grows by replacement: the old one is kept, never freed,
so a CUDA graph captured with it keeps reading valid memory. Launches that share a buffer must
be ordered (one stream), as the layers of one model are. Users that need zeros between
launches (counters) restore them themselves.
"""

from __future__ import annotations

import torch

_buffers: dict[tuple[torch.device, str], list[torch.Tensor]] = {}


def device_buffer(device: torch.device, purpose: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A buffer of at least `numel` elements for `purpose` on `device`."""
    buffers = _buffers.setdefault((torch.device(device), purpose), [])
    current = buffers[-1] if buffers else None
    if current is None or current.numel() < numel or current.dtype != dtype:
        size = max(numel, 1024, 2 * current.numel() if current is not None else 0)
        current = torch.zeros(size, dtype=dtype, device=device)
        buffers.append(current)
    return current
