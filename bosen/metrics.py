"""Small helpers for the numbers server and client report."""

from __future__ import annotations

import numpy as np


def send_histogram(send_count: np.ndarray) -> dict[str, int]:
    """How many rows were sent how many times (rows never sent are left out): the thesis's
    Fig 3.5 shows this distribution as a CDF. Keys are strings so the dict is valid JSON."""
    counts = np.bincount(send_count[send_count > 0]) if send_count.any() else np.zeros(0, dtype=np.int64)
    return {str(i): int(n) for i, n in enumerate(counts) if n}


def mbps(nbytes: float, seconds: float) -> float:
    return nbytes * 8 / 1e6 / seconds if seconds > 0 else 0.0
