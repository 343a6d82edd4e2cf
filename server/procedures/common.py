"""Helpers shared by the built-in procedures: argument checks and the gradient array of a batch."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bosen.wire import UpdateBatch


def positive(name: str, value: Any) -> float:
    """A finite number > 0 from update_args (ValueError naming the argument otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")
    return float(value)


def count(name: str, value: Any) -> int:
    """An integer >= 0 from update_args."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
    return value


def gradients(values: np.ndarray, batch: UpdateBatch) -> np.ndarray:
    """The batch's values in a dtype numba kernels take: the float16 wire becomes the table dtype."""
    g = batch.values
    return g.astype(values.dtype) if g.dtype == np.float16 else g
