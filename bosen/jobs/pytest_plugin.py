"""pytest fixtures for code that runs against a Bösen cluster (the ``bosen`` plugin, an entry point).

- ``bosen_cluster``: a factory. ``bosen_cluster(n_servers=2, workers=1, tables=..., staleness=...,
  read_timeout_s=..., comm=..., app=...)`` (or ``config=`` full config data) writes the job's YAML
  to the test's ``tmp_path``, starts its servers on free ports and returns a running
  ``bosen.jobs.cluster.LocalCluster`` once each answers STATUS (``.path`` is the YAML for
  ``Client.connect``, ``.config`` the data, ``.servers`` the processes). After the test every server
  is stopped; one that died on its own, or did not exit cleanly on SIGTERM, fails the test
  (``stop_server(i)`` stops one on purpose).
- ``bosen_procs``: a ``bosen.jobs.supervise.ProcessGroup`` for worker processes
  (``bosen_procs.python(NAME, SCRIPT, ARGS...)``), stopped after the test.
- ``bosen_zygote``: the session's fork server (``bosen.jobs.zygote``): the processes of both
  fixtures are forked from it, with numpy, numba, pyzmq and Bösen already imported, where they can
  be (``BOSEN_FORK=0``: all exec'd). It is stopped with the session.

A failing test's report carries the last lines of the log of every process these fixtures started.
Their processes run with ``PYTHONUNBUFFERED=1`` (logs are current when a test fails) and without the
``BOSEN_*`` variables of a launched worker (a test's processes never join an outer job).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from bosen.jobs.cluster import READY_TIMEOUT_S, LocalCluster, start_cluster
from bosen.jobs.job import job_config
from bosen.jobs.supervise import ProcessFailed, ProcessGroup
from bosen.jobs.zygote import Zygote

TEST_ENV = {"PYTHONUNBUFFERED": "1", "BOSEN_CONFIG": None, "BOSEN_RANK": None, "BOSEN_RUN_DIR": None,
            "BOSEN_T0": None}
LOG_LINES = 40

_GROUPS = pytest.StashKey[list[ProcessGroup]]()


def _track(node: pytest.Item, group: ProcessGroup) -> None:
    """Attach ``group``'s logs to the report of ``node`` should it fail."""
    node.stash.setdefault(_GROUPS, []).append(group)


@pytest.fixture(scope="session")
def bosen_zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    """The session's fork server (started at its first child, stopped with the session)."""
    with Zygote(tmp_path_factory.mktemp("zygote") / "zygote.log") as zygote:
        yield zygote


@pytest.fixture
def bosen_procs(tmp_path: Path, request: pytest.FixtureRequest, bosen_zygote: Zygote) -> Iterator[ProcessGroup]:
    """Worker processes of one test (logs in ``tmp_path/logs``); all stopped after it."""
    with ProcessGroup(tmp_path / "logs", env=TEST_ENV, zygote=bosen_zygote) as group:
        _track(request.node, group)
        yield group


ClusterFactory = Callable[..., LocalCluster]


@pytest.fixture
def bosen_cluster(tmp_path: Path, request: pytest.FixtureRequest,
                  bosen_zygote: Zygote) -> Generator[ClusterFactory, None, None]:
    """Factory of running clusters on free local ports; every server stopped (and checked) after the test."""
    group = ProcessGroup(tmp_path / "logs", env=TEST_ENV, zygote=bosen_zygote)
    _track(request.node, group)
    clusters: list[LocalCluster] = []

    def start(n_servers: int = 2, workers: int = 1, *, config: dict[str, Any] | None = None, name: str | None = None,
              ready_timeout: float = READY_TIMEOUT_S, server_args: Sequence[str] = (), **job: Any) -> LocalCluster:
        """Servers for ``config`` (config data), or for ``job_config(..., **job)`` (tables, staleness,
        read_timeout_s, comm, app); ``workers`` is ``cluster.workers``, used only without ``config``;
        ``server_args`` go to every ``bosen-server``."""
        if config is not None and job:
            raise TypeError(f"bosen_cluster: give config= or job settings ({', '.join(job)}), not both")
        data = config if config is not None else job_config([], workers, **job)
        c = start_cluster(data, tmp_path, n_servers, group=group, name=name or f"job{len(clusters)}",
                          ready_timeout=ready_timeout, server_args=server_args)
        clusters.append(c)
        return c

    try:
        yield start
    finally:
        for c in clusters:  # every server gets SIGTERM first, so they shut down in parallel
            c.terminate()
        problems = []
        for c in clusters:
            try:
                c.stop(check=True)
            except ProcessFailed as e:
                problems.append(str(e))
        group.stop_all()  # servers of a cluster that failed to start
        if problems:
            pytest.fail("\n".join(problems), pytrace=False)


@pytest.hookimpl(hookwrapper=True)  # the older style, so pytest 7 projects can load the plugin too
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for group in item.stash.get(_GROUPS, []):
            for p in group:
                report.sections.append((f"log of {p!r}", p.tail(LOG_LINES)))
