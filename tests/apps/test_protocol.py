"""The client protocol apps are typed with: bosen.client.Client satisfies it, and the apps use nothing else.

Two checks. mypy (signatures): the real Client, Table and Worker, and the tests' in-process stand-in,
are assigned to the protocols, every app's ``train`` is passed where ``run_app`` expects a function of
a real Client, and the apps' own code is checked against the protocols (so a client attribute an app
uses but the protocol lacks is an error). At run time (members present): ``isinstance`` on a client
connected to a real server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import InProcessClient, InProcessTable
from typecheck import build_tree

from bosen.apps.protocol import JobConfig, PSClient, PSTable, PSWorker, require_table
from bosen.client import Client
from bosen.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

SNIPPET = '''\
from collections.abc import Callable, Mapping
from typing import Any

from bosen.apps.lda.worker import train as lda_train
from bosen.apps.mf.worker import train as mf_train
from bosen.apps.mlr.worker import train as mlr_train
from bosen.apps.protocol import JobConfig, PSClient, PSTable, PSWorker
from bosen.client import Client
from bosen.client.table import Table
from bosen.client.worker import Worker
from bosen.config import Config
from inprocess import InProcessClient, InProcessTable


def client(c: Client) -> PSClient:
    return c


def table(t: Table) -> PSTable:
    return t


def worker(w: Worker) -> PSWorker:
    return w


def config(c: Config) -> JobConfig:
    return c


def stand_in(c: InProcessClient, t: InProcessTable) -> tuple[PSClient, PSTable]:
    return c, t


trains: list[Callable[[Client, Mapping[str, Any]], None]] = [lda_train, mf_train, mlr_train]  # run_app's type


def control(t: Table) -> PSClient:
    return t  # the one error expected: a table is not a client
'''


@pytest.mark.slow
def test_client_and_apps_type_check_against_the_protocols(tmp_path):
    pytest.importorskip("mypy", reason="the static check needs mypy (pip install mypy)")
    root = tmp_path / "tree"
    build_tree(root)
    (root / "snippet.py").write_text(SNIPPET)
    control_line = SNIPPET.splitlines().index("    return t  # the one error expected: a table is not a client") + 1
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--python-version", "3.11",
         "--follow-imports=silent", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
         "bosen/apps", "snippet.py"],
        cwd=root, capture_output=True, text=True, timeout=240,
        env={"PATH": "/usr/bin:/bin", "MYPYPATH": str(Path(__file__).parent)})
    errors = [ln for ln in r.stdout.splitlines() if ": error:" in ln]
    assert len(errors) == 1 and errors[0].startswith(f"snippet.py:{control_line}: error:"), r.stdout + r.stderr
    assert "PSClient" in errors[0]  # the control proves mypy saw the real types, not Any


def test_client_satisfies_the_protocols_at_run_time(bosen_cluster):
    c = bosen_cluster(n_servers=1, tables={"W": {"rows": 4, "cols": 3, "dtype": "float32"}})
    client = Client.connect(c.path)
    try:
        assert isinstance(client, PSClient) and isinstance(client.config, JobConfig)
        assert isinstance(client.table("W"), PSTable)
        with client.worker() as w:
            assert isinstance(w, PSWorker) and isinstance(w.table("W"), PSTable)
        with pytest.raises(ConfigError, match=rf"{c.path}: MLR needs W2; table W2 is missing"):
            require_table(client, "W2", "MLR needs W2")
        assert not isinstance(client.table("W"), PSClient)
    finally:
        client.close()


def test_in_process_stand_in_satisfies_the_protocols():
    c = InProcessClient(InProcessTable("W", 2, 2))
    assert isinstance(c, PSClient) and isinstance(c.table("W"), PSTable)
    with c.worker() as w:
        assert isinstance(w, PSWorker)
