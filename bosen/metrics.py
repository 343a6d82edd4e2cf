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


# Held-out quality: workers report sums (each scores its share of the held-out data); the clock
# record gets the quality measure of the whole job, derived from the sums over workers.
HELDOUT_MEASURES: dict[str, tuple[str, str, bool]] = {
    # measure: (numerator, denominator, square root of the ratio)
    "heldout_accuracy": ("heldout_correct", "heldout_total", False),
    "heldout_rmse": ("heldout_se", "heldout_count", True),
    "heldout_ll_per_token": ("heldout_ll", "heldout_tokens", False),
}


def derive_heldout(rec: dict) -> dict:
    """The held-out measures whose sums ``rec`` holds (a denominator of 0 gives none)."""
    out = {}
    for name, (num, den, root) in HELDOUT_MEASURES.items():
        if num in rec and rec.get(den, 0) > 0:
            v = rec[num] / rec[den]
            out[name] = float(np.sqrt(max(v, 0.0))) if root else float(v)
    return out


class Durations:
    """Count, mean and largest of some durations (seconds in, milliseconds out): what STATUS says of
    an event's time without keeping every sample. The sum of squares tells how long something that
    arrives at a random time waits behind them: sum(d^2) / (2 * elapsed) on average."""

    __slots__ = ("n", "total", "most", "squares")

    def __init__(self) -> None:
        self.n, self.total, self.most, self.squares = 0, 0.0, 0.0, 0.0

    def add(self, seconds: float) -> None:
        self.n += 1
        self.total += seconds
        self.squares += seconds * seconds
        if seconds > self.most:
            self.most = seconds

    def stats(self) -> dict[str, float | int]:
        return {"n": self.n, "mean_ms": round(self.total * 1e3 / self.n, 4) if self.n else 0.0,
                "max_ms": round(self.most * 1e3, 4), "total_s": round(self.total, 6),
                "squares_s2": self.squares}
