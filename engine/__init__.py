"""quantgate.engine: the built-in engine that runs HF checkpoints through the kernel layer.

Python API (DESIGN.md "Engine"): `load_model` -> `LoadedModel`, `LLMEngine` (synchronous
steps), `AsyncEngine` (a background thread for the server), `SamplingParams`,
`RequestOutput`. `InvalidRequestError` (a ValueError) marks requests the engine refuses.
"""

from .async_engine import AsyncEngine, EngineDeadError
from .llm_engine import LLMEngine
from .loader import LoadedModel, load_model
from .sampling_params import InvalidRequestError, RequestOutput, SamplingParams

__all__ = [
    "AsyncEngine", "EngineDeadError", "LLMEngine", "LoadedModel", "load_model",
    "InvalidRequestError", "RequestOutput", "SamplingParams",
]
