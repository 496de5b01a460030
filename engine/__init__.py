"""quantgate.engine: the built-in engine that runs HF checkpoints through the kernel layer.

Python API (DESIGN.md "Engine"): `load_model` -> `LoadedModel`, `LLMEngine` (synchronous
steps), `AsyncEngine` (a background thread for the server), `SamplingParams`,
`RequestOutput`. `InvalidRequestError` (a ValueError) marks requests the engine refuses;
`RequestAborted` ends the stream of a request `AsyncEngine.abort` stopped.

The names load on first use, so the harness can read `serve_args` (the server's flags) without
importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "AsyncEngine": "async_engine", "EngineDeadError": "async_engine", "RequestAborted": "async_engine",
    "LLMEngine": "llm_engine",
    "LoadedModel": "loader", "load_model": "loader", "InvalidRequestError": "sampling_params",
    "RequestOutput": "sampling_params", "SamplingParams": "sampling_params",
}
__all__ = list(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
