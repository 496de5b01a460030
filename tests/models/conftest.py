"""The recipes are scripts under models/recipes, not an installed package: make them importable."""

from __future__ import annotations

import sys
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[2] / "models" / "recipes"
if str(RECIPES) not in sys.path:
    sys.path.insert(0, str(RECIPES))
