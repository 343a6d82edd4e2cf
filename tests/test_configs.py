"""Every shipped config validates, and names an app module that imports."""

import importlib
from pathlib import Path

import pytest

from bosen import config
from bosen.jobs import app_tables

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_config_is_valid(path, tmp_path):
    cfg = app_tables.resolve(config.load(path), tmp_path)  # tables an app declares from its model, too
    assert cfg.tables and cfg.app.module
    importlib.import_module(cfg.app.module)


def test_there_is_a_config_per_app_and_a_cluster_example():
    names = {p.name for p in CONFIGS}
    assert {"mf.yaml", "mlr.yaml", "lda.yaml", "mf-adarev.yaml", "cluster-example.yaml"} <= names
