"""What run 28's experiment scripts share: copies of the W8A16 kernel module edited by exact
string replacement, a block-scaled FP8 layer, and the bf16 cuBLAS peer's time."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import torch

from quantgate.kernels.triton import w8a16_gemm as base
from quantgate.kernels.triton.tuning import graph_time_ms

Edit = tuple[str, str, int]  # (old, new, occurrences expected)


def edited_copy(name: str, edits: list[Edit]) -> ModuleType:
    """w8a16_gemm.py with every edit applied, each asserted to match as often as expected (so a
    script only runs against the source it was written for), imported as
    quantgate.kernels.triton._exp_<name>: written next to the kernel, as Triton compiles kernels
    from their source files."""
    src = Path(base.__file__).read_text()
    for old, new, count in edits:
        assert src.count(old) == count, (name, old)
        src = src.replace(old, new)
    (Path(base.__file__).parent / f"_exp_{name}.py").write_text(src)
    return importlib.import_module(f"quantgate.kernels.triton._exp_{name}")


def block_layer(k: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random FP8 weight [N, K], its packed form, bf16 block scales [K/128, N] (the marlin
    layout) and a zeroed split-K workspace, on the GPU."""
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
    scale = (torch.rand(k // 128, n, device="cuda") + 0.5).to(torch.bfloat16) * 1e-2
    workspace = torch.zeros(base.workspace_size(n), dtype=torch.int32, device="cuda")
    return w, base.pack_weight(w), scale, workspace


def one_row_case(k: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """block_layer's tensors, one bf16 activation row and the bf16 peer's time for it."""
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    return (*block_layer(k, n), x, bf16_peer_us(x, n))


def bf16_peer_us(x: torch.Tensor, n: int) -> float:
    """GPU time of bf16 cuBLAS x @ W.t() for a random [N, K] weight (freed afterwards)."""
    weight = torch.randn(n, x.shape[1], device="cuda", dtype=torch.bfloat16)
    return 1e3 * graph_time_ms(lambda: x @ weight.t())
