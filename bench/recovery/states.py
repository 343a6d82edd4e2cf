"""The baseline run's state after every clock, read from its per-clock checkpoints, and resumable
run directories written from it (``python -m bench.recovery`` and its spread analysis)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np

from bosen import checkpoint
from bosen.config import load as load_config
from bosen.rowmath import init_rows


class States:
    """The baseline's state after every clock: per table the whole array (rows in global order)."""

    def __init__(self, run_dir: Path, cfg_path: Path) -> None:
        self.run_dir = run_dir
        self.base = run_dir / "checkpoints"
        self.config = load_config(cfg_path)
        self.tables = list(self.config.tables)
        self.servers = len(self.config.cluster.servers)
        self._cache: dict[int, list[np.ndarray]] = {}
        part = checkpoint.read_part(checkpoint.clock_dir(self.base, 1) / "server-0", verify=False)
        self.fingerprint = part.meta["fingerprint"]

    def reading(self, run_dir: Path) -> States:
        """This reader (same config, tables, fingerprint) on another run's checkpoints, e.g. a run
        resumed from one written by ``write_resume``."""
        other = copy.copy(self)
        other.run_dir, other.base, other._cache = run_dir, run_dir / "checkpoints", {}
        return other

    def initial(self) -> list[np.ndarray]:
        out = []
        for i, t in enumerate(self.tables):
            rows = np.arange(t.rows, dtype=np.int64)
            out.append(init_rows(t.init, rows, (t.rows, t.cols), np.dtype(t.dtype), i))
        return out

    def at(self, clock: int) -> list[np.ndarray]:
        """Every table's values after ``clock`` clocks (the checkpoint at boundary ``clock``)."""
        if clock == 0:
            return self.initial()
        if clock not in self._cache:
            arrays = [np.zeros((t.rows, t.cols), np.dtype(t.dtype)) for t in self.tables]
            for j in range(self.servers):
                a = checkpoint.read_part(checkpoint.clock_dir(self.base, clock) / f"server-{j}", verify=False).load()
                for i in range(len(self.tables)):
                    arrays[i][a[f"t{i}.rows"]] = a[f"t{i}.values"]
            self._cache[clock] = arrays
        return self._cache[clock]

    def write_resume(self, dst: Path, clock: int, values: list[np.ndarray],
                     workers: list[dict[str, np.ndarray]] | None = None) -> None:
        """A run directory ``dst`` to resume at ``clock``: the baseline's records, its checkpoint at
        ``clock`` (worker parts as saved, or holding ``workers``), the server parts holding ``values``."""
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        shutil.copytree(self.run_dir / "workers", dst / "workers")
        shutil.copy(self.run_dir / "metrics.jsonl", dst / "metrics.jsonl")
        src = checkpoint.clock_dir(self.base, clock)
        shutil.copytree(src, checkpoint.clock_dir(dst / "checkpoints", clock))
        for j in range(self.servers):
            part = checkpoint.read_part(src / f"server-{j}", self.fingerprint)
            arrays = part.load()
            for i in range(len(self.tables)):
                arrays[f"t{i}.values"] = values[i][arrays[f"t{i}.rows"]]
            checkpoint.write_part(dst / "checkpoints", clock, "server", j, arrays, part.info, self.fingerprint)
        for r, arrays in enumerate(workers or []):
            part = checkpoint.read_part(src / f"worker-{r}", self.fingerprint)
            checkpoint.write_part(dst / "checkpoints", clock, "worker", r, arrays, part.info, self.fingerprint)
