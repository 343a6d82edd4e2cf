"""The client protocol apps are typed with: bosen.client.Client satisfies it, and the apps use nothing else.

Two checks. mypy (signatures) runs with the package in ``tests/typecheck.py`` (``make test`` runs it
before pytest): the apps' own code against the protocols (a client attribute an app uses but the
protocol lacks is an error) and ``protocol_conformance.py`` (the real Client, Table and Worker and the
in-process stand-in assigned to the protocols). Here, at run time (members present): ``isinstance`` on
a client connected to a real server.
"""

from __future__ import annotations

import pytest
from inprocess import InProcessClient, InProcessTable

from bosen.apps.protocol import JobConfig, PSClient, PSTable, PSWorker, require_table
from bosen.client import Client
from bosen.errors import ConfigError


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
