"""bench_gemv_floor's read floor reads every byte it counts (in Triton's interpreter on CPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
import bench_gemv_floor as floor  # noqa: E402 - benchmarks/ is put on the path by conftest.py


@pytest.mark.parametrize("n, k, programs", [(2048, 2048, 1056), (4096, 2048, 1056), (2048, 6144, 264), (40, 500, 3)])
def test_the_read_floor_reads_every_word_it_counts(n, k, programs):
    # The rate is n * k bytes over the time: every one of those bytes must be read. At 2048 x 2048
    # with 1056 programs, whole-block shares rounded down read none of them.
    words = torch.ones(n * k // 4, dtype=torch.int32)
    out = torch.zeros(programs, dtype=torch.int32)
    floor.read_words(words, out)
    assert int(out.sum()) == words.numel()
