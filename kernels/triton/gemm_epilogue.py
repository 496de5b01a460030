"""The epilogue shared by the dense FP8 GEMMs: bias, cast, store, and a deterministic split-K.

Split-K (small M, where one tile per output block leaves most SMs idle): every K-slice writes
its float32 partial tile to `partial` [SPLIT_K, M, N], then bumps the tile's counter in the
layer's workspace. The slice that arrives last sums the partials in slice order (so results do
not depend on arrival order), writes the output and resets the counter to zero for the next
launch. The workspace is therefore all zeros between launches, which is what lets it be bound
once with `bind_processed` and captured in CUDA graphs. Launches that share a workspace must be
ordered (one stream), as the layers of one model are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT_K_CHOICES = (1, 2, 4, 8, 16)  # split_k is a runtime kernel argument: one compilation serves all
# Transient partials are allocated per call; split less rather than allocate more than this.
MAX_PARTIAL_BYTES = 8 << 20


@triton.jit
def _bias_cast_store(acc, c_ptr, bias_ptr, rm, rn, M, N, stride_cm, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_tile(
    acc, c_ptr, bias_ptr, partial_ptr, counter_ptr, rm, rn, M, N, stride_cm, pid_k, split_k, tile_id,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
):
    """Write the float32 tile `acc` for rows rm, columns rn: directly, or (SPLIT) as slice pid_k
    of split_k. split_k is a runtime value so every split shares one compilation."""
    if not SPLIT:
        _bias_cast_store(acc, c_ptr, bias_ptr, rm, rn, M, N, stride_cm, HAS_BIAS)
    else:
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        offs = rm[:, None] * N + rn[None, :]
        tl.store(partial_ptr + pid_k * M * N + offs, acc, mask=mask)
        # All threads' partial stores precede the (single-thread, release) counter update.
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
        if arrived == split_k - 1:
            # .cg: read from L2, never from this SM's L1, the tiles other SMs wrote.
            total = tl.load(partial_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
            for s in range(1, split_k):
                total += tl.load(partial_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
            _bias_cast_store(total, c_ptr, bias_ptr, rm, rn, M, N, stride_cm, HAS_BIAS)
            tl.store(counter_ptr + tile_id, 0)


def choose_split_k(tiles: int, k_tiles: int, m: int, n: int, target_programs: int) -> int:
    """Largest power-of-two split (<= 16, <= k_tiles) that brings tiles*split up to the target."""
    split = 1
    for choice in SPLIT_K_CHOICES[1:]:
        if tiles * split >= target_programs or choice > k_tiles or choice * m * n * 4 > MAX_PARTIAL_BYTES:
            break
        split = choice
    return split


def split_k_buffers(split_k: int, m: int, n: int, tiles: int, workspace: torch.Tensor | None,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, counters) for a launch; placeholders when split_k == 1."""
    if split_k == 1:  # the kernel never touches them
        counters = workspace if workspace is not None else torch.empty(1, dtype=torch.int32, device=device)
        return torch.empty(1, dtype=torch.float32, device=device), counters
    if workspace is None or workspace.numel() < tiles:
        have = 0 if workspace is None else workspace.numel()
        raise ValueError(f"split-K over {tiles} output tiles needs a workspace of >= {tiles} int32 counters, got {have}")
    return torch.empty((split_k, m, n), dtype=torch.float32, device=device), workspace
