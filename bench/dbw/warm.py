"""Imported by the zygote of ``bench/dbw/processes.py``: the MLR worker's modules, sklearn's digits,
the numba kernels of a worker's step and of a server's (its warm-up, a backup step's estimator)
loaded once, so each job's forked processes start in a fraction of a second instead of each
spending its own second or more on them (the machine has 2 cores)."""

import numpy as np

from bench.dbw.sim import simulate
from bosen.apps.delays import DelayArgs
from bosen.apps.mlr import data as D
from bosen.apps.mlr import kernels as K
from bosen.apps.mlr import worker  # noqa: F401  (the worker's imports)
from bosen.apps.mlr.model import LocalModel
from bosen.config import BackupConfig, load
from bosen.jobs.job import job_config
from bosen.server.warmup import warm_up

_ds = D.digits()
_W = np.zeros((_ds.classes, _ds.features + 1))
K.loss_grad(_ds.indptr, _ds.indices, _ds.values, _ds.labels, np.arange(4, dtype=np.int64), _W)
_m = LocalModel(_ds.classes, _ds.features)
_m.load(_W)
_m.evaluate(_ds)
_backup = {"mode": "dynamic", "lr": 1.0}
warm_up(load(job_config(["127.0.0.1:1"], 8, tables={"W": {"rows": 10, "cols": 65, "dtype": "float64",
                                                            "backup": _backup}})), 0)
simulate(_ds, BackupConfig(mode="dynamic"), 8, 16, DelayArgs(mean_s=1.0, alpha=1.0), 0.0, 1e9, max_steps=30)
del _ds, _W, _m, _backup
