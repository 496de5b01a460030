"""Safetensors checkpoint access: every tensor of a model folder by its HF name.

Reads single-file and sharded (`model.safetensors.index.json`) checkpoints lazily, one tensor
at a time, so a reload re-reads from disk without holding a second copy of the model.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open


class CheckpointError(ValueError):
    """The weights on disk do not match what config.json describes."""


class Checkpoint:
    """Name -> tensor over the safetensors files of one folder. Use as a context manager."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.path} has no *.safetensors files (only safetensors checkpoints load)")
        self._files = files
        self._stack: ExitStack | None = None
        self._where: dict[str, object] = {}

    def __enter__(self) -> Checkpoint:
        self._stack = ExitStack()
        for file in self._files:
            handle = self._stack.enter_context(safe_open(str(file), framework="pt"))
            for name in handle.keys():
                self._where[name] = handle
        return self

    def __exit__(self, *exc) -> None:
        assert self._stack is not None
        self._stack.close()
        self._stack = None
        self._where.clear()

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def get(self, name: str) -> torch.Tensor:
        handle = self._where.get(name)
        if handle is None:
            raise CheckpointError(f"{self.path}: tensor {name!r} is missing from the checkpoint")
        return handle.get_tensor(name)
