"""Static half of the apps' protocol check (tests/apps/test_protocol.py has the run-time half).

mypy checks this module with the package (``tests/typecheck.py``, ``make typecheck``): the real
Client, Table and Worker and the tests' in-process stand-in are assigned to the protocols, and every
app's ``train`` is passed where ``run_app`` expects a function of a real Client. The control at the end
must be an error that its ignore comment silences: with ``warn_unused_ignores`` an unused ignore is an
error too, so the check fails if mypy ever sees the client's types as Any.
"""
# mypy: warn-unused-ignores

from collections.abc import Callable, Mapping
from typing import Any

from inprocess import InProcessClient, InProcessTable

from bosen.apps.lda.worker import train as lda_train
from bosen.apps.mf.worker import train as mf_train
from bosen.apps.mlr.worker import train as mlr_train
from bosen.apps.protocol import JobConfig, PSClient, PSTable, PSWorker
from bosen.client import Client
from bosen.client.table import Table
from bosen.client.worker import Worker
from bosen.config import Config


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
    return t  # type: ignore[return-value]  # the control: a table is not a client (unused if mypy saw Any)
