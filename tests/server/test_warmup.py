"""The server's numba warm-up (server/warmup.py): it runs every table's increment path on scratch
shards, for each kind of stored procedure and dtype, without skipping a table."""

from __future__ import annotations

import logging

import pytest

from bosen import config as config_mod
from bosen.server.warmup import warm_up

TABLES = {
    "A": {"rows": 5, "cols": 3, "dtype": "float32"},
    "B": {"rows": 7, "cols": 2, "dtype": "int32"},
    "G": {"rows": 4, "cols": 3, "dtype": "float32", "update": "adagrad"},
    "R": {"rows": 4, "cols": 3, "dtype": "float64", "update": "adarevision"},
    "S": {"rows": 3, "cols": 2, "dtype": "float32", "update": "sgd"},
    "V": {"rows": 6, "cols": 2, "dtype": "float32", "update": "adarevision", "storage": "sparse"},
}


@pytest.mark.parametrize("servers", [1, 3])
@pytest.mark.parametrize("managed", [False, True], ids=["bsp", "managed"])
def test_warm_up_runs_every_table(caplog, servers, managed):
    data = {"cluster": {"servers": [f"127.0.0.1:{7000 + i}" for i in range(servers)], "workers": 2},
            "tables": TABLES}
    if managed:
        data["comm"] = {"enabled": True, "priority": "relative", "wire_dtype": "float16"}
    cfg = config_mod.load(data)
    with caplog.at_level(logging.DEBUG, logger="bosen.server.warmup"):
        for rank in range(servers):
            assert warm_up(cfg, rank) >= 0
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]

