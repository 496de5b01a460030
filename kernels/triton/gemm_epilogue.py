"""The epilogue shared by the dense FP8 GEMMs: bias, cast, store, and a deterministic split-K.

Split-K (small M, where one tile per output block leaves most SMs idle): every K-slice writes
its float32 partial tile to `partial` [SPLIT_K, M, N] (a scratch buffer per device shared by all
layers, scratch.py), then bumps the tile's counter in the layer's workspace. The slice that
arrives last sums the partials in slice order (so results do not depend on arrival order),
writes the output and resets the counter to zero for the next launch. The workspace is therefore all
zeros between launches, which is what lets it be bound once with `bind_processed` and captured
in CUDA graphs. Launches that share a workspace or the scratch must be ordered (one stream), as
the layers of one model are.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .launch import cdiv
from .scratch import device_buffer
from .tuning import m_bucket

SPLIT_K_MAX = 32  # split_k is a runtime kernel argument: one compilation serves every split
# Partials live in one scratch buffer per device, shared by every layer (launches on one stream
# run in order). Split less rather than need more than this.
MAX_PARTIAL_BYTES = 16 << 20


def bias_operand(bias: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """The bias as the epilogue reads it (N contiguous values), or ValueError: a strided view
    would otherwise be read as if it were contiguous."""
    if bias is None:
        return None
    if tuple(bias.shape) != (n,):
        raise ValueError(f"bias of shape {tuple(bias.shape)} for an output of {n} features; expected ({n},)")
    return bias if bias.is_contiguous() else bias.contiguous()


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
            # Four slices per step, in slice order: their loads are in flight together.
            total = tl.zeros_like(acc)
            for s in range(0, split_k, 4):
                p0 = tl.load(partial_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
                p1 = tl.load(partial_ptr + (s + 1) * M * N + offs, mask=mask & (s + 1 < split_k), other=0.0,
                             cache_modifier=".cg")
                p2 = tl.load(partial_ptr + (s + 2) * M * N + offs, mask=mask & (s + 2 < split_k), other=0.0,
                             cache_modifier=".cg")
                p3 = tl.load(partial_ptr + (s + 3) * M * N + offs, mask=mask & (s + 3 < split_k), other=0.0,
                             cache_modifier=".cg")
                total += ((p0 + p1) + p2) + p3
            _bias_cast_store(total, c_ptr, bias_ptr, rm, rn, M, N, stride_cm, HAS_BIAS)
            tl.store(counter_ptr + tile_id, 0)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def target_programs(device: torch.device, per_sm: int) -> int:
    """`per_sm` programs for every SM of the device (a fixed 8 on CPU, where the interpreter runs)."""
    if device.type != "cuda":
        return 8
    return per_sm * _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def choose_split_k(tiles: int, k_tiles: int, target: int, m: int, n: int) -> int:
    """The largest split that keeps tiles * split within `target` programs (so a target of the
    resident programs per SM times the SMs fills one wave: a wave and a bit would take two),
    with at least two K tiles per slice, partials within MAX_PARTIAL_BYTES, and no empty or
    runt trailing slice."""
    limit = min(SPLIT_K_MAX, k_tiles // 2, MAX_PARTIAL_BYTES // (4 * m * n))
    split = max(1, min(target // tiles, limit))
    return cdiv(k_tiles, cdiv(k_tiles, split))


def automatic_split_k(m: int, n: int, k_tiles: int, block_m: int, n_tiles: int, split_per_sm: int,
                      workspace: torch.Tensor | None, device: torch.device) -> int:
    """The split-K of a launch of M rows in `block_m`-row tiles when the caller names none (1: no
    split), the same for every M of M's tuning bucket: within a bucket a row's summation order
    does not depend on how many rows share its batch (a config of 32-row tiles for the 64-row
    bucket split K at 32 rows and not at 33, so a request's answer depended on which requests
    arrived with it). Across buckets the tuned configs still differ (tuning.py). So a config
    splits only when one row tile holds every M of the bucket, and its split is chosen for a
    full tile."""
    if workspace is None or not split_per_sm or m_bucket(m) > block_m:
        return 1
    return choose_split_k(n_tiles, k_tiles, target_programs(device, split_per_sm), block_m, n)


def split_k_buffers(split_k: int, m: int, n: int, tiles: int, workspace: torch.Tensor | None,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(partials, counters) for a launch: the device scratch and the layer's zeroed counters.
    Without a split the kernel touches neither; placeholders of the right dtypes are passed."""
    if split_k == 1:
        counters = workspace if workspace is not None else device_buffer(device, "gemm_counters", 1, torch.int32)
        return device_buffer(device, "gemm_partials", 1, torch.float32), counters
    if workspace is None or workspace.numel() < tiles:
        have = 0 if workspace is None else workspace.numel()
        raise ValueError(f"split-K over {tiles} output tiles needs a workspace of >= {tiles} int32 counters, "
                         f"got {have}")
    if split_k * m * n * 4 > MAX_PARTIAL_BYTES:
        raise ValueError(f"split-K {split_k} of a [{m}, {n}] output needs {split_k * m * n * 4} bytes of partials "
                         f"(limit {MAX_PARTIAL_BYTES}); split less")
    return device_buffer(device, "gemm_partials", split_k * m * n, torch.float32), workspace
