"""Token sorting for the fused MoE GEMMs: slots grouped by expert, each expert padded to BLOCK_M.

A slot is one (token, choice) pair, `slot = token * top_k + choice`. After alignment,
`sorted_slots[p]` is the slot at row p of the grouped GEMMs (or `num_slots` for a padding row),
every BLOCK_M rows belong to one expert, `block_expert[b]` names it, and `num_padded[0]` is the
number of rows in use. The GEMM grids cover the host-side bound `max_padded_rows` and the
programs past `num_padded` return at once, so nothing here waits for the device.

One program does it all (one launch, which is what small decode batches care about): a
histogram of the expert ids, padded prefix sums, the block -> expert table, then a scatter in
which an atomic cursor per expert hands out rows. The order of slots inside an expert is
therefore not fixed; the GEMMs treat rows independently, so results do not depend on it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import DirectLaunch, aligned, cdiv, next_power_of_2
from .pdl import await_inputs, launch_options


def max_padded_rows(num_slots: int, num_experts: int, block_m: int) -> int:
    """Rows the aligned layout can need (a multiple of block_m): every non-empty expert adds
    fewer than block_m padding rows."""
    return cdiv(num_slots + min(num_experts, num_slots) * (block_m - 1), block_m) * block_m


@triton.jit(do_not_specialize=["num_slots", "max_rows", "max_blocks"])
def _moe_align_kernel(
    topk_ids_ptr, sorted_slots_ptr, block_expert_ptr, num_padded_ptr, cursor_ptr,
    num_slots, num_experts, max_rows, max_blocks,
    BLOCK_M: tl.constexpr, EXPERTS_POW2: tl.constexpr, CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    await_inputs(PDL)
    offs = tl.arange(0, CHUNK)
    counts = tl.zeros((EXPERTS_POW2,), dtype=tl.int32)
    for start in range(0, num_slots, CHUNK):
        live = start + offs < num_slots
        ids = tl.load(topk_ids_ptr + start + offs, mask=live, other=0)
        counts += tl.histogram(ids, EXPERTS_POW2, mask=live)

    padded = tl.cdiv(counts, BLOCK_M) * BLOCK_M
    ends = tl.cumsum(padded, 0)
    experts = tl.arange(0, EXPERTS_POW2)
    tl.store(cursor_ptr + experts, ends - padded, mask=experts < num_experts)
    tl.store(num_padded_ptr, tl.sum(padded, 0))

    # Block b starts at row b * BLOCK_M; its expert is the number of experts ending at or before it.
    for start in range(0, max_blocks, BLOCK_CHUNK):
        blocks = start + tl.arange(0, BLOCK_CHUNK)
        expert = tl.sum((ends[None, :] <= (blocks * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + blocks, tl.where(expert < num_experts, expert, -1), mask=blocks < max_blocks)
    for start in range(0, max_rows, CHUNK):
        tl.store(sorted_slots_ptr + start + offs, num_slots, mask=start + offs < max_rows)

    # The cursors and padding rows above must be visible to every thread before the scatter.
    tl.debug_barrier()
    for start in range(0, num_slots, CHUNK):
        live = start + offs < num_slots
        ids = tl.load(topk_ids_ptr + start + offs, mask=live, other=0)
        row = tl.atomic_add(cursor_ptr + ids, 1, mask=live)
        tl.store(sorted_slots_ptr + row, start + offs, mask=live)


_moe_align = DirectLaunch(_moe_align_kernel)


def moe_align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, cursor: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] int32 -> (sorted_slots [max_padded_rows] int32, block_expert [blocks] int32,
    num_padded [1] int32). `cursor`: int32 scratch of >= num_experts elements (a layer's bound
    workspace; allocated here when None). Ids must lie in [0, num_experts)."""
    if topk_ids.dtype != torch.int32 or not topk_ids.is_contiguous():
        raise ValueError(f"topk_ids must be contiguous int32 (routing.select_experts returns that), "
                         f"got {topk_ids.dtype}")
    num_slots = topk_ids.numel()
    rows = max_padded_rows(num_slots, num_experts, block_m)
    blocks = rows // block_m
    device = topk_ids.device
    sorted_slots = torch.empty(rows, dtype=torch.int32, device=device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    if cursor is None:
        cursor = torch.empty(num_experts, dtype=torch.int32, device=device)
    elif cursor.numel() < num_experts or cursor.dtype != torch.int32:
        raise ValueError(f"cursor workspace must be int32 with >= {num_experts} elements")
    # Large batches keep more atomics in flight per thread; small ones a short loop.
    chunk = 4096 if num_slots > 4096 else 1024
    # By handle (launch.py): eager MoE calls are bound by host time. The outputs are fresh, so
    # aligned; num_experts is the one specialized integer.
    options = launch_options(device)
    key = (block_m, num_experts, chunk, aligned(topk_ids.data_ptr()), aligned(cursor.data_ptr()), options["PDL"])
    _moe_align(
        key, (1,),
        (topk_ids, sorted_slots, block_expert, num_padded, cursor, num_slots, num_experts, rows, blocks),
        BLOCK_M=block_m, EXPERTS_POW2=next_power_of_2(num_experts), CHUNK=chunk,
        BLOCK_CHUNK=max(16, 8192 // next_power_of_2(num_experts)),
        num_warps=8 if num_slots > 4096 else 4, **options,
    )
    return sorted_slots, block_expert, num_padded
