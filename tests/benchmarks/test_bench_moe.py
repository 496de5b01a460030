"""bench_moe's acceptance on CPU, from rows as the GPU run records them."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
import bench_moe as bm  # noqa: E402 - benchmarks/ is put on the path by conftest.py


def rows(graph_failed: str | None = None) -> list[dict]:
    out = []
    for tokens in bm.TOKENS:
        for method in ("grouped_mm_bf16", "scaled_grouped_mm_fp8_rowwise", "triton_fp8_block", "marlin_fp8_block"):
            ms = 0.1 if method.endswith(("bf16", "rowwise")) else 0.05
            r = {"shape": "qwen3-30b-a3b", "tokens": tokens, "method": method, "ms": ms}
            if tokens <= bm.GRAPH_MAX_TOKENS:
                if method == graph_failed:
                    r["graph_error"] = "RuntimeError: operation not permitted when stream is capturing"
                else:
                    r["graph_ms"] = ms
            out.append(r)
    return out


def test_a_failed_graph_capture_fails_its_checks_instead_of_dropping_them():
    checks = bm._acceptance(rows(graph_failed="triton_fp8_block"))
    graph = [c for c in checks if c["ours"] == "triton_fp8_block" and c["timing"] == "graph_ms"]
    assert [c["tokens"] for c in graph] == [1, 16, 256]
    assert all(c["passed"] is False and c["speedup"] is None for c in graph)


def test_every_check_passes_when_every_time_is_there():
    checks = bm._acceptance(rows())
    assert checks and all(c["passed"] for c in checks)
    # large batches have no graph time: their checks are on eager time only
    assert {c["timing"] for c in checks if c["tokens"] > bm.GRAPH_MAX_TOKENS} == {"ms"}
