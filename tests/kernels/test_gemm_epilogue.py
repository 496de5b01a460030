"""Split-K of the dense GEMMs (kernels/triton/gemm_epilogue.py): how many slices a launch gets."""

from __future__ import annotations

import pytest
import torch

from quantgate.kernels.triton.gemm_epilogue import MAX_PARTIAL_BYTES, automatic_split_k, choose_split_k, split_k_buffers
from quantgate.kernels.triton.tuning import m_bucket

CPU = torch.device("cpu")  # 8 target programs there
WORKSPACE = torch.zeros(1, dtype=torch.int32)


def _bucket_configs() -> list[tuple[int, int, int]]:
    """(bucket, block_m, split_per_sm) of every W8A8 and W8A16 candidate the tuner offers a bucket."""
    from quantgate.kernels.triton.fp8_block_gemm import SMALL_M, SMALL_M_CANDIDATES, TILED_CANDIDATES
    from quantgate.kernels.triton.w8a16_gemm import CANDIDATES, SM90_CANDIDATES

    found = {(SMALL_M, c.block_m, c.split_per_sm) for c in SMALL_M_CANDIDATES}
    for table in (TILED_CANDIDATES, CANDIDATES, SM90_CANDIDATES):
        found |= {(bucket, c.block_m, c.split_per_sm) for bucket, cands in table.items() for c in cands}
    return sorted(found)


@pytest.mark.parametrize("bucket, block_m, split_per_sm", _bucket_configs())
def test_every_m_of_a_bucket_gets_the_same_split(bucket, block_m, split_per_sm):
    """Within a bucket a row's summation order must not depend on how many rows share its batch
    (a 32-row config of the 64-row bucket split K at up to 32 rows and not above)."""
    first = 1 if bucket == 1 else next(m for m in range(1, bucket + 1) if m_bucket(m) == bucket)
    for n, k_tiles in ((256, 6), (4096, 32), (14336, 112)):
        splits = {automatic_split_k(m, n, k_tiles, block_m, -(-n // 64), split_per_sm, WORKSPACE, CPU)
                  for m in range(first, bucket + 1)}
        assert len(splits) == 1, (bucket, block_m, n, splits)
        split = splits.pop()
        assert split * block_m * n * 4 <= MAX_PARTIAL_BYTES  # the partials of any M of the bucket fit


def test_a_split_needs_a_tile_that_holds_the_bucket_a_workspace_and_a_target():
    # One column tile, 6 K tiles: 3 slices of 2 (at least two K tiles a slice).
    assert automatic_split_k(20, 64, 6, 64, 1, 2, WORKSPACE, CPU) == 3
    assert automatic_split_k(20, 64, 6, 32, 1, 2, WORKSPACE, CPU) == 1  # 32 rows < the 64-row bucket
    assert automatic_split_k(20, 64, 6, 64, 1, 2, None, CPU) == 1
    assert automatic_split_k(20, 64, 6, 64, 1, 0, WORKSPACE, CPU) == 1
    assert automatic_split_k(1, 256, 6, 1, 4, 5, WORKSPACE, CPU) == 2  # 8 CPU programs over 4 column tiles


def test_a_split_leaves_no_empty_slice_and_its_counters_may_fill_the_workspace():
    # A target of 4 slices over 9 K tiles: slices of cdiv(9, 4) = 3 tiles, so 3 slices, not a
    # fourth with nothing to sum.
    assert choose_split_k(1, 9, 4, 16, 64) == 3
    assert choose_split_k(1, 10, 4, 16, 64) == 4  # 3 + 3 + 3 + 1
    workspace = torch.zeros(3, dtype=torch.int32)
    partials, counters = split_k_buffers(2, 4, 64, 3, workspace, CPU)  # exactly one counter per tile
    assert counters is workspace and partials.numel() >= 2 * 4 * 64
    with pytest.raises(ValueError, match=">= 4 int32 counters, got 3"):
        split_k_buffers(2, 4, 64, 4, workspace, CPU)
