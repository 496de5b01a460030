"""On/off environment switches of the Triton kernels.

They exist for debugging and for reproducing a run bit for bit, so a value that is neither 0 nor
1 is refused: `QUANTGATE_AUTOTUNE=false` that left tuning on would defeat the reproduction
without a word.
"""

from __future__ import annotations

import os

AUTOTUNE_ENV = "QUANTGATE_AUTOTUNE"  # 0: launch each GEMM's default config, time nothing
PDL_ENV = "QUANTGATE_PDL"  # 0: no programmatic dependent launch in CUDA graphs


def switched_on(name: str) -> bool:
    """The switch `name`: on unless set to 0 (set but empty counts as unset, as `NAME= cmd` is
    written to clear it); ValueError naming it for any value but 0 and 1."""
    value = os.environ.get(name, "").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"{name}={value!r} is neither 0 nor 1: set {name}=0 to turn it off, or unset it")
    return value == "1"


def switch_problem() -> str | None:
    """What is wrong with the switches set in this environment, before a server loads a model."""
    for name in (AUTOTUNE_ENV, PDL_ENV):
        try:
            switched_on(name)
        except ValueError as exc:
            return str(exc)
    return None
