"""bosen.apps.pytorch layout, declared tables and ranks: no servers needed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from bosen.apps.pytorch import Layout, declare, ranks_from_env
from bosen.apps.pytorch.tables import layout_file, step_args
from bosen.errors import ConfigError


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def test_parameters_are_laid_end_to_end_in_fixed_width_rows():
    m = net()
    lay = Layout.of(m, prefix="cnn.", row_width=16)
    assert lay.table == "cnn.params"
    assert [(s.name, s.shape, s.offset) for s in lay.slots] == [
        ("0.weight", (7, 5), 0), ("0.bias", (7,), 35), ("2.weight", (3, 7), 42), ("2.bias", (3,), 63)]
    assert lay.numel == 66 and lay.rows == 5  # ceil(66 / 16)
    v = lay.values(m)
    assert v.shape == (5, 16) and v.dtype == np.float32
    flat = v.reshape(-1)
    np.testing.assert_array_equal(flat[42:63], m[2].weight.detach().numpy().reshape(-1))
    assert not flat[66:].any()  # padding


def test_frozen_parameters_stay_local_and_mixed_dtypes_are_refused():
    m = net()
    m[0].weight.requires_grad_(False)
    assert [s.name for s in Layout.of(m).slots] == ["0.bias", "2.weight", "2.bias"]
    m[2].double()
    with pytest.raises(ConfigError, match=r"mixes parameter dtypes \(float32, float64\)"):
        Layout.of(m)
    with pytest.raises(ConfigError, match="no trainable parameters"):
        Layout.of(nn.ReLU())
    with pytest.raises(ConfigError, match="parameter weight: dtype torch.float16 is not supported"):
        Layout.of(nn.Linear(2, 2).half())


def test_declare_writes_initial_values_and_layout_for_the_servers(tmp_path):
    m = net()
    tables = declare(m, tmp_path, update="adagrad", lr=0.05, row_width=32, staleness=1)
    (name, entry), = tables.items()
    assert name == "params"
    assert entry["rows"] == 3 and entry["cols"] == 32 and entry["dtype"] == "float32"
    # AdaGrad as torch's: the accumulator starts near 0
    assert entry["update"] == "adagrad" and entry["update_args"] == {"init_z": 1e-8, "alpha": 0.05}
    assert entry["staleness"] == 1
    np.testing.assert_array_equal(np.load(entry["init"]["file"]), Layout.of(m, row_width=32).values(m))
    saved = json.loads(layout_file(entry["init"]["file"]).read_text())
    assert Layout.of(m, row_width=32).differences(saved) == []
    bigger = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    assert Layout.of(bigger, row_width=32).differences(saved)[:2] == [
        "parameter 0.weight: shape (8, 5) here, (7, 5) when the tables were made",
        "parameter 0.bias: shape (8,) here, (7,) when the tables were made"]


class _Embedded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4, sparse=True)
        self.top = nn.Linear(4, 1)


def test_the_dense_table_alone_takes_its_own_staleness(tmp_path):
    torch.manual_seed(0)
    tables = declare(_Embedded(), tmp_path, update="adagrad", lr=0.05, staleness=2, dense_staleness=0)
    assert {n: e["staleness"] for n, e in tables.items()} == {"params": 0, "emb": 2}
    # without it, every table takes staleness (or the job's, where that is None too)
    assert {n: e.get("staleness") for n, e in declare(_Embedded(), tmp_path, update="adagrad", lr=0.05).items()} \
        == {"params": None, "emb": None}
    with pytest.raises(ValueError, match="dense_staleness: a number of clocks >= 0, or None, got -1"):
        declare(_Embedded(), tmp_path, update="adagrad", lr=0.05, dense_staleness=-1)


def test_step_sizes_go_to_each_procedures_own_argument():
    assert step_args("sgd", 0.1) == {"lr": 0.1}
    assert step_args("adarevision", 0.2) == {"alpha": 0.2}
    assert step_args("adagrad", 0.2, {"init_z": 1.0}) == {"init_z": 1.0, "alpha": 0.2}  # told otherwise
    assert step_args("add", None) == {}
    with pytest.raises(ValueError, match="'add' table takes deltas"):
        step_args("add", 0.1)
    with pytest.raises(ValueError, match="sgd needs a positive step size"):
        step_args("sgd", None)
    with pytest.raises(ValueError, match="'adam' is not a server optimizer"):
        step_args("adam", 0.1)


@pytest.mark.parametrize("env, want", [
    ({}, (None, None, None, "")),
    ({"BOSEN_RANK": "2", "RANK": "5"}, (2, None, None, "BOSEN_RANK")),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, (1, 4, 1, "RANK")),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0"}, (3, 8, 0, "SLURM_PROCID")),
])
def test_ranks_come_from_the_launcher_in_use(env, want):
    r = ranks_from_env(env)
    assert (r.rank, r.world_size, r.local_rank, r.source) == want


def test_the_device_follows_the_local_rank_and_bad_rank_variables_are_named():
    assert ranks_from_env({"RANK": "1", "LOCAL_RANK": "1"}).device(cuda_available=True) == "cuda:1"
    assert ranks_from_env({"RANK": "1", "LOCAL_RANK": "1"}).device(cuda_available=False) == "cpu"
    assert ranks_from_env({}).device(cuda_available=True) == "cuda:0"
    with pytest.raises(ConfigError, match=r"RANK='x': expected a non-negative integer"):
        ranks_from_env({"RANK": "x"})
    with pytest.raises(ConfigError, match="RANK=4 is outside WORLD_SIZE=4"):
        ranks_from_env({"RANK": "4", "WORLD_SIZE": "4"})
