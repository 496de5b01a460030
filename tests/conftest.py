"""Suite-wide set-up. Triton kernels run under the interpreter when there is no GPU, so
their correctness is tested on CPU CI; the variable must be set before triton is imported."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def seed() -> int:
    """A fresh seed per test run (printed on failure) so numerics are checked on new inputs."""
    value = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(value)
    print(f"seed={value}")
    return value
