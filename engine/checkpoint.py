"""Safetensors checkpoint access: every tensor of a model folder by its HF name.

Reads single-file and sharded (`model.safetensors.index.json`) checkpoints lazily, one tensor
at a time, so a reload re-reads from disk without holding a second copy of the model. With an
index, only the files it names are read, each tensor from the file it names; without one, a
tensor in two files is an error (a stale shard must never win silently). Scales are checked
as they are read: a NaN, infinite, zero or negative scale would serve wrong numbers, and a
module with both scale names (`weight_scale` and `weight_scale_inv`) is refused rather than
one of them silently picked.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .config import unreadable

INDEX = "model.safetensors.index.json"
SCALE_SUFFIXES = ("weight_scale", "weight_scale_inv", "input_scale")
# The two names FP8 formats give a weight's scale (the historical crash: a format wrote one,
# a kernel read the other), and what decides which one a checkpoint must use.
_OTHER_SCALE_NAME = {"weight_scale": "weight_scale_inv", "weight_scale_inv": "weight_scale"}
_SCALE_NAME_RULE = ("native FP8 names block scales `weight_scale_inv` (quant_method fp8 with weight_block_size) "
                    "and per-tensor scales `weight_scale`; compressed-tensors always `weight_scale`")


class CheckpointError(ValueError):
    """The weights on disk do not match what config.json describes."""


FUSED_EXPERT_SUFFIXES = ("experts.gate_up_proj", "experts.down_proj")  # one [E, ...] tensor for all experts


def fused_experts_advice(name: str) -> str:
    return (f"stores fused MoE experts ({name}); save it with per-expert "
            "`mlp.experts.<e>.<gate|up|down>_proj.weight` tensors (transformers' save_pretrained does)")


class Checkpoint:
    """Name -> tensor over the safetensors files of one folder. Use as a context manager."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._map: dict[str, str] | None = None  # tensor -> file, from the index
        index = self.path / INDEX
        if index.is_file():
            try:
                self._map = dict(json.loads(index.read_text())["weight_map"])
                entry = next(((name, file) for name, file in self._map.items() if not isinstance(file, str)), None)
                if entry:  # caught below: the folder's path joined with it would fail outside this check
                    raise TypeError(f"weight_map maps {entry[0]!r} to {entry[1]!r}, not a file name")
            except OSError as exc:
                raise CheckpointError(unreadable(index, exc)) from None
            except (ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index}: not a safetensors index ({exc}); fix or remove it") from None
            files = sorted({self.path / name for name in self._map.values()})
            missing = [os.path.relpath(f, self.path) for f in files if not f.is_file()]
            if missing:
                raise CheckpointError(f"{index} names files that are not there: {', '.join(missing)}; copy them into "
                                      f"{self.path} again (or re-download the checkpoint)")
        else:
            files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.path} has no *.safetensors files (only safetensors checkpoints load): check the "
                                  "path, or save the model with transformers' save_pretrained, which writes them")
        self._files = files
        self._stack: ExitStack | None = None
        self._where: dict[str, tuple[object, Path]] = {}
        self._unindexed: dict[str, list[str]] = {}  # tensor -> files holding it that the index does not name for it

    def __enter__(self) -> Checkpoint:
        self._stack = ExitStack()
        for file in self._files:
            try:
                handle = self._stack.enter_context(safe_open(str(file), framework="pt"))
            except (SafetensorError, OSError) as exc:
                self._stack.close()
                raise CheckpointError(_unopenable(file, exc)) from None
            for name in handle.keys():
                if self._map is not None:
                    # Index entries are paths relative to the folder (a shard may sit in a subfolder).
                    if name in self._map and self.path / self._map[name] == file:
                        self._where[name] = (handle, file)
                    else:  # not read, but the cause when the tensor is missing where the index says
                        self._unindexed.setdefault(name, []).append(os.path.relpath(file, self.path))
                elif name in self._where:
                    self._stack.close()
                    raise CheckpointError(f"{self.path}: tensor {name!r} is in both {self._where[name][1].name} and "
                                          f"{file.name}; remove the stale file (or add {INDEX})")
                else:
                    self._where[name] = (handle, file)
        return self

    def __exit__(self, *exc) -> None:
        assert self._stack is not None
        self._stack.close()
        self._stack = None
        self._where.clear()
        self._unindexed.clear()

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def get(self, name: str) -> torch.Tensor:
        entry = self._where.get(name)
        if entry is None:
            raise CheckpointError(self.missing(name))
        handle, file = entry
        stem, _, attr = name.rpartition(".")
        other = _OTHER_SCALE_NAME.get(attr)
        if other and f"{stem}.{other}" in self._where:  # which one the checkpoint's writer meant is unknowable
            raise CheckpointError(f"{file}: {stem} has both {attr} and {other}; {_SCALE_NAME_RULE}. config.json "
                                  f"reads {attr}: remove {stem}.{other} or re-export the checkpoint")
        tensor = handle.get_tensor(name)
        if name.endswith(SCALE_SUFFIXES):
            _check_scale(tensor, f"{file}: {name}")
        return tensor

    def missing(self, name: str, config_cause: str = "") -> str:
        """Why `name` cannot be read, with the cause where the files show it; `config_cause` (what
        config.json asks for that the checkpoint lacks) when they do not."""
        message = f"{self.path}: tensor {name!r} is missing from the checkpoint"
        stem, _, attr = name.rpartition(".")
        other = _OTHER_SCALE_NAME.get(attr)
        if other and f"{stem}.{other}" in self._where:
            return message + (f"; it has {stem}.{other} instead. {_SCALE_NAME_RULE}: the checkpoint's scale names "
                              "do not match its config.json (re-export it, or fix quantization_config)")
        index_cause = self._index_cause(name)
        return message + (f"; {index_cause}" if index_cause else f"; {config_cause}" if config_cause else "")

    def _index_cause(self, name: str) -> str:
        """A tensor the index sends to a file that lacks it, or one a file holds that the index omits."""
        if self._map is None:
            return ""
        holders = " and ".join(self._unindexed.get(name, []))
        if name in self._map:
            where = (f"{holders} holds it: correct the index's weight_map entry" if holders else
                     "no file the index names holds it: copy that file again, or re-download the checkpoint")
            return f"{INDEX} maps it to {self._map[name]}, which does not hold it; {where}"
        if holders:
            return (f"{INDEX} does not list it, though {holders} holds it: add it to the index's weight_map "
                    "(or regenerate the index)")
        return ""


def _unopenable(file: Path, exc: Exception) -> str:
    try:  # safetensors reports any failure to open a file as "No such file or directory"
        with open(file, "rb"):
            pass
    except OSError as os_exc:
        return unreadable(file, os_exc)
    return f"{file}: not a readable safetensors file ({exc}); it may be truncated: copy or download it again"


def _check_scale(tensor: torch.Tensor, where: str) -> None:
    values = tensor.float()
    bad = ~torch.isfinite(values) | (values <= 0)
    if bool(bad.any()):
        first = values.reshape(-1)[bad.reshape(-1)][0].item()
        raise CheckpointError(f"{where}: {int(bad.sum())} of {values.numel()} scales are not finite and positive "
                              f"(e.g. {first}); a scale must be > 0: re-quantize the checkpoint")
