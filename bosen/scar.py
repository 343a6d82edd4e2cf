"""SCAR's checkpoint policy (Qiao, thesis ch. 5): how far each row is from its last-saved copy, and
which rows a partial checkpoint saves.

A *running checkpoint* starts as the initial values w(0) and is updated row by row each time a
partial checkpoint saves some rows, so it may mix rows of different clocks. After a failure only the
lost rows go back to it (partial recovery); the smaller the distance between the live rows and their
saved copies, the smaller the perturbation a failure causes and the less rework follows (Theorem
5.3.1). Priority checkpoints save the fraction r of rows farthest from their saved copy every r·C
clocks: the same bytes per C clocks as a full checkpoint every C clocks.

Distances, per row:

- ``"l2"`` (float rows: MF factors, MLR weights): the Euclidean norm of the row's change.
- ``"tv"`` (count rows, e.g. LDA's document-topic counts): the total-variation distance between the
  row's two distributions (counts over their sum), scaled by the row's length (its current count
  sum, the document's length): unscaled, re-sampling one token of a short document would weigh more
  than one of a long document and bias the choice towards short documents (thesis T:1644).

Policies for ``choose``: ``"priority"`` (the farthest rows; ties go to the lower row), ``"round_robin"``
(consecutive blocks of rows, wrapping around), ``"random"`` (a uniform sample without replacement).

No event loop, no threads: the server calls these from its own loop, the benchmarks offline.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Policy = Literal["priority", "round_robin", "random"]
Metric = Literal["l2", "tv"]
POLICIES: tuple[str, ...] = ("priority", "round_robin", "random")
METRICS: tuple[str, ...] = ("l2", "tv")


def row_distance(current: np.ndarray, saved: np.ndarray, metric: Metric = "l2",
                 lengths: np.ndarray | None = None) -> np.ndarray:
    """Distance of each row of ``current`` from the same row of ``saved`` (float64, one per row).

    ``"tv"`` scales each row's total variation by ``lengths`` (default: the current row sums); a row
    whose counts sum to zero is the zero distribution."""
    if current.shape != saved.shape or current.ndim != 2:
        raise ValueError(f"row_distance: current {current.shape} and saved {saved.shape} must be equal 2-D shapes")
    if metric == "l2":
        d = current.astype(np.float64) - saved.astype(np.float64)
        return np.sqrt(np.einsum("ij,ij->i", d, d))
    if metric == "tv":
        a = current.astype(np.float64)
        b = saved.astype(np.float64)
        sa = a.sum(axis=1)
        sb = b.sum(axis=1)
        pa = np.divide(a, sa[:, None], out=np.zeros_like(a), where=sa[:, None] != 0)
        pb = np.divide(b, sb[:, None], out=np.zeros_like(b), where=sb[:, None] != 0)
        tv = 0.5 * np.abs(pa - pb).sum(axis=1)
        scale = sa if lengths is None else np.asarray(lengths, dtype=np.float64)
        if scale.shape != tv.shape:
            raise ValueError(f"row_distance: lengths has shape {scale.shape}, expected {tv.shape}")
        return tv * scale
    raise ValueError(f"row_distance: metric {metric!r}: choose one of {', '.join(METRICS)}")


def rows_for(fraction: float, n_rows: int) -> int:
    """How many of ``n_rows`` rows a checkpoint of ``fraction`` saves (at least one, at most all)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction {fraction!r}: must be in (0, 1]")
    return min(n_rows, max(1, int(round(fraction * n_rows))))


def choose(policy: Policy, n_rows: int, fraction: float, *, distance: np.ndarray | None = None,
           rng: np.random.Generator | None = None, start: int = 0) -> np.ndarray:
    """The rows (sorted int64 indices into ``0..n_rows-1``) a partial checkpoint of ``fraction`` saves.

    ``priority`` needs ``distance`` (one per row); ``random`` needs ``rng``; ``round_robin`` takes the
    block starting at row ``start`` (``RoundRobin`` keeps that cursor between checkpoints)."""
    k = rows_for(fraction, n_rows)
    if policy == "priority":
        if distance is None or distance.shape != (n_rows,):
            raise ValueError(f"choose('priority'): needs distance of shape ({n_rows},)")
        order = np.argsort(-distance, kind="stable")  # ties: the lower row first, so the choice is deterministic
        return np.sort(order[:k]).astype(np.int64)
    if policy == "round_robin":
        return np.sort((start + np.arange(k, dtype=np.int64)) % n_rows)
    if policy == "random":
        if rng is None:
            raise ValueError("choose('random'): needs rng")
        return np.sort(rng.choice(n_rows, size=k, replace=False).astype(np.int64))
    raise ValueError(f"choose: policy {policy!r}: choose one of {', '.join(POLICIES)}")


class RunningCheckpoint:
    """The last-saved copy of a table's rows (in memory), with the clock each row was saved at.

    ``save(values, rows)`` copies ``values[rows]`` into it; ``distance(values)`` says how far every
    row of ``values`` is from its saved copy; ``step`` chooses and saves in one call, keeping the
    round-robin cursor and the random generator of the policy between checkpoints."""

    def __init__(self, initial: np.ndarray, metric: Metric = "l2", *, clock: int = 0, seed: int = 0) -> None:
        if initial.ndim != 2:
            raise ValueError(f"RunningCheckpoint: initial values must be 2-D, got shape {initial.shape}")
        if metric not in METRICS:
            raise ValueError(f"RunningCheckpoint: metric {metric!r}: choose one of {', '.join(METRICS)}")
        self.values = np.array(initial, copy=True)
        self.metric: Metric = metric
        self.saved_clock = np.full(initial.shape[0], clock, dtype=np.int64)
        self.cursor = 0  # round robin: the next row to save
        self.rng = np.random.default_rng(seed)
        self.rows_saved = 0  # over all saves: bytes written = rows_saved * row bytes

    @property
    def n_rows(self) -> int:
        return int(self.values.shape[0])

    def extend(self, initial: np.ndarray, clock: int = 0) -> None:
        """Rows ``n_rows, n_rows + 1, ...`` are new (a sparse shard stored them since): their saved
        copy is ``initial``, what a restore that finds them in no checkpoint gives them."""
        if initial.ndim != 2 or initial.shape[1:] != self.values.shape[1:]:
            raise ValueError(f"RunningCheckpoint.extend: rows of shape {initial.shape[1:]}, the checkpoint holds "
                             f"{self.values.shape[1:]}")
        self.values = np.concatenate([self.values, initial.astype(self.values.dtype, copy=False)])
        self.saved_clock = np.concatenate([self.saved_clock, np.full(initial.shape[0], clock, dtype=np.int64)])

    def distance(self, values: np.ndarray) -> np.ndarray:
        return row_distance(values, self.values, self.metric)

    def save(self, values: np.ndarray, rows: np.ndarray, clock: int = 0) -> None:
        """Save ``values[rows]`` (``values`` holds every row of the table)."""
        if values.shape != self.values.shape:
            raise ValueError(f"RunningCheckpoint.save: values {values.shape}, the checkpoint holds {self.values.shape}")
        rows = np.asarray(rows, dtype=np.int64)
        self.values[rows] = values[rows]
        self.saved_clock[rows] = clock
        self.rows_saved += int(rows.shape[0])

    def choose(self, policy: Policy, values: np.ndarray, fraction: float) -> np.ndarray:
        """The rows ``policy`` would save now (advances nothing; ``step`` does)."""
        if policy == "priority":
            return choose(policy, self.n_rows, fraction, distance=self.distance(values))
        if policy == "random":
            return choose(policy, self.n_rows, fraction, rng=self.rng)
        return choose(policy, self.n_rows, fraction, start=self.cursor)

    def step(self, policy: Policy, values: np.ndarray, fraction: float, clock: int = 0) -> np.ndarray:
        """Choose the rows to save, save them, and return them."""
        if self.n_rows == 0:  # a sparse shard that stores no row yet
            return np.empty(0, dtype=np.int64)
        rows = self.choose(policy, values, fraction)
        if policy == "round_robin":
            self.cursor = (self.cursor + rows.shape[0]) % self.n_rows
        self.save(values, rows, clock)
        return rows

    def recover(self, live: np.ndarray, lost: np.ndarray) -> np.ndarray:
        """Partial recovery: ``live`` with the ``lost`` rows put back to their saved copies (a new array)."""
        out = np.array(live, copy=True)
        lost = np.asarray(lost, dtype=np.int64)
        out[lost] = self.values[lost]
        return out
