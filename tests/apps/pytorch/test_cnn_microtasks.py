"""The CNN example's micro-tasks (issue 30 point 2): training shards with their own generator, epoch
order and step count that move between worker processes, through ``bosen launch`` (real processes).

Each task's saved state is checked against a task that never moved: after E epochs its generator and
its last epoch's order are those of ``default_rng(seed * 1000 + t)`` having drawn E permutations, and
its step count is E times the steps of an epoch; every clock record sums every task's ``clock_every``
mini-batches once (no task run twice, none skipped), whoever ran it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import PY, run_cmd

import bosen
from bosen import checkpoint
from bosen.apps import microtasks as M
from bosen.apps.datasets import images
from bosen.apps.state import rng_state

T, N, BATCH, EVERY, EPOCHS, SEED = 4, 1024, 32, 2, 6, 3
STEPS = (N // T) // BATCH  # 8 steps of each task per epoch
CLOCKS = EPOCHS * STEPS // EVERY  # 24 clocks, each EVERY steps of every task


@pytest.fixture
def fashion() -> None:
    if not images.FASHION_DIR.is_dir():
        pytest.skip(f"Debian package dataset-fashion-mnist not installed ({images.FASHION_DIR} missing): "
                    f"{images.FASHION_INSTALL}")


def _job(tmp_path: Path, epochs: int = EPOCHS) -> Path:
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 2},
           "consistency": {"staleness": 1}, "checkpoint": {"every_clocks": 2, "keep": 100},
           "app": {"module": "bosen.apps.pytorch.examples.cnn", "tables": "bosen.apps.pytorch.examples.cnn:tables",
                   "args": {"optimizer": "delta-sgd", "lr": 0.05, "batch_size": BATCH, "epochs": epochs,
                            "clock_every": EVERY, "train_samples": N, "test_samples": 100, "micro_tasks": T,
                            "seed": SEED}}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def _launch(path: Path, run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(path), "--run-dir", str(run), "--no-plot",
                             *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _until(p: subprocess.Popen, done: Callable[[], bool], what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert p.poll() is None, f"the job ended before {what}:\n{p.stdout.read() if p.stdout else ''}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:g}s"
        time.sleep(0.01)


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _checkpointed(run: Path, clock: int) -> bool:
    try:
        checkpoint.check_complete(run / "checkpoints", clock, 1, 2, None)
        return True
    except checkpoint.CheckpointError:
        return False


def _clocked(run: Path, clock: int) -> bool:
    try:
        lines = (run / "workers" / "0.jsonl").read_text().splitlines()
        return bool(lines) and json.loads(lines[-1]).get("clock", 0) >= clock
    except (OSError, ValueError):
        return False


def _check_tasks(run: Path, ranks: list[int], epochs: int = EPOCHS) -> list[dict]:
    """The final checkpoint holds every task once, made by ``ranks``, each task as one that never moved;
    the clock records, one per clock, each count every task's mini-batches of that clock once."""
    last = checkpoint.clocks(run / "checkpoints")[0]
    assert last == epochs * STEPS // EVERY
    assert checkpoint.checkpoint_ranks(checkpoint.clock_dir(run / "checkpoints", last)) == ranks
    parts = checkpoint.check_complete(run / "checkpoints", last, 1, None, None)
    states: dict[str, np.ndarray] = {}
    for name, part in parts.items():
        if name.startswith("worker-"):
            got = {k: v for k, v in part.load().items() if k.startswith("task.")}
            assert not set(got) & set(states)  # every task in one part
            states.update(got)
    assert M.saved_tasks(states) == T
    for t in range(T):
        rng = np.random.default_rng(SEED * 1000 + t)
        order = np.zeros(0)
        for _ in range(epochs):
            order = rng.permutation(N // T)  # positions in the task's images (every T-th from t)
        assert int(states[M.key(t, "steps")][0]) == epochs * STEPS, t
        np.testing.assert_array_equal(states[M.key(t, "order")], order)
        np.testing.assert_array_equal(states[M.key(t, "rng")], rng_state(rng))
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    clocks = [r for r in recs if r.get("kind") == "clock"]
    assert [r["clock"] for r in clocks] == list(range(epochs * STEPS // EVERY))
    assert all(r["samples"] == T * EVERY * BATCH for r in clocks), [r["samples"] for r in clocks]
    assert sum("heldout_correct" in r for r in clocks) == epochs  # rank 0 scores each epoch's end
    return clocks


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_cnn_checkpointed_by_two_workers_resumes_with_three(fashion, tmp_path):
    """Stopped (SIGTERM) after its checkpoint at clock 2 and resumed with 3 workers: the 4 tasks go on
    from their saved generators, orders and steps (rank 2 has no part of that checkpoint), and each
    ends with exactly its steps, none done twice."""
    path, run = _job(tmp_path), tmp_path / "run"
    p = _launch(path, run, "--quiet")
    try:
        _until(p, lambda: _checkpointed(run, 2), "the checkpoint at clock 2")
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)
    finally:
        _stop(p)
    r = run_cmd([PY, "-m", "bosen", "launch", str(path), "--resume", str(run), "--workers", "3",
                "--no-plot"], timeout=150)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"made by 2 workers; its {T} micro-tasks go to 3 workers" in r.stdout, r.stdout[-3000:]
    clocks = _check_tasks(run, [0, 1, 2])
    before = sum(c["workers"] == 2 for c in clocks)  # up to the checkpoint resumed from (2, or later)
    assert before >= 2 and [c["workers"] for c in clocks] == [2] * before + [3] * (CLOCKS - before)


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_bosen_scale_adds_a_worker_to_a_running_cnn_job(fashion, tmp_path):
    """``bosen scale RUN --workers 3`` (``bosen.scale``) on a running 2-worker CNN job: worker 2 joins at a clock
    boundary and takes its tasks (generator, epoch order, steps) from their givers; the job finishes
    with each task's steps done once, wherever they ran."""
    # long enough that the new worker (started ahead, it loads torch and its data while the job runs
    # on) is ready before the job ends
    epochs = 5 * EPOCHS
    path, run = _job(tmp_path, epochs), (tmp_path / "run").resolve()
    p = _launch(path, run)
    try:
        _until(p, lambda: _clocked(run, 1), "worker 0's clock 1")
        lines: list[str] = []  # bosen.scale is `bosen scale` without a process start, which may outlast this job
        bosen.scale(run, workers=3, out=lines.append)
        assert "the job runs with 3 workers (ranks [0, 1, 2])" in lines[-1], lines
        out, _ = p.communicate(timeout=150)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    moved = [int(x) for x in re.findall(r"committed: micro-tasks move at clock (\d+)", out)]
    total = epochs * STEPS // EVERY
    assert len(moved) == 1 and 0 < moved[0] < total, out[-3000:]
    clocks = _check_tasks(run, [0, 1, 2], epochs)
    assert [c["workers"] for c in clocks] == [2] * moved[0] + [3] * (total - moved[0])


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_a_synchronous_cnn_job_scaled_2_3_2_draws_from_its_tasks_wherever_they_run(fashion, tmp_path):
    """The CNN on a synchronous table (static k = the workers, 6 micro-tasks) scaled 2 -> 3 -> 2 workers
    mid-run: every iteration applied exactly the job's workers' gradients (2, then 3 from B1, then 2
    from B2; none dropped), and at a checkpoint past both boundaries every task's sampler (its pass's
    order, place, generator) is where a replay of the draws that moves the tasks at B1 and B2 has it."""
    tasks_n, batch = 6, 12
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 2}, "checkpoint": {"every_clocks": 20, "keep": 100},
           "app": {"module": "bosen.apps.pytorch.examples.cnn", "tables": "bosen.apps.pytorch.examples.cnn:tables",
                   "args": {"optimizer": "sgd", "lr": 0.05, "batch_size": batch, "iterations": 100_000,
                            "train_samples": N, "test_samples": 100, "micro_tasks": tasks_n, "seed": SEED,
                            "backup": {"mode": "static", "k": 2}}}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(cfg))
    run = (tmp_path / "run").resolve()
    with (tmp_path / "launch.out").open("w") as log:  # a line per clock: not piped, nobody reads it meanwhile
        p = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(path), "--run-dir", str(run), "--no-plot"],
                             stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _until(p, lambda: _clocked(run, 1), "worker 0's clock 1")
        lines: list[str] = []
        bosen.scale(run, workers=3, out=lines.append)
        bosen.scale(run, workers=2, out=lines.append)
        b1, b2 = (int(m) for m in re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines)))
        c = b2 + 40 - b2 % 20
        _until(p, lambda: _checkpointed(run, c), f"a checkpoint at {c}", timeout=120)
    finally:
        _stop(p)
    parts = checkpoint.check_complete(run / "checkpoints", c, 1, 2, None)
    server = parts["server-0"].load()
    [k_key] = [k for k in server if k.endswith(".k_history")]
    assert server[k_key].tolist() == [2] * b1 + [3] * (b2 - b1) + [2] * (c - b2), (b1, b2, c)
    assert server[k_key.replace("k_history", "counts")][1:3].tolist() == [0, 0]  # dropped late, repeat
    tasks = {t: M.Draws(N, [t], tasks_n, SEED) for t in range(tasks_n)}
    for it in range(c):
        owners = M.assign(tasks_n, [0, 1, 2] if b1 <= it < b2 else [0, 1])
        for r in np.unique(owners).tolist():
            mine = M.owned(owners, r)
            cuts = np.diff(np.linspace(0, batch, mine.size + 1).round().astype(np.int64))
            for t, n in zip(mine.tolist(), cuts.tolist(), strict=True):
                tasks[t].draw(n)
    states = {k: v for name, part in parts.items() if name.startswith("worker-") for k, v in part.load().items()
              if k.startswith("task.")}
    for t in range(tasks_n):
        for name, want in tasks[t].state(t).items():
            np.testing.assert_array_equal(states[M.key(t, name)], want, err_msg=f"task {t} {name}")


def test_a_dbw_workers_torch_generator_goes_back_to_its_saved_state_and_a_wrong_array_is_named():
    """The CNN's synchronous path with backup workers proper draws its images from a torch generator of
    the rank's, saved as its bytes (``sampler.generator``): put back, it draws on exactly; an array
    that is not a CPU generator's state is refused, naming the key."""
    import torch

    from bosen.apps.pytorch.examples import cnn
    from bosen.errors import ConfigError

    gen = torch.Generator().manual_seed(SEED * 1000 + 1)
    torch.randint(0, N, (BATCH,), generator=gen)
    saved = gen.get_state().numpy().copy()
    want = torch.randint(0, N, (BATCH,), generator=gen)
    other = torch.Generator().manual_seed(7)
    cnn._load_generator(other, saved, "job.yaml")
    assert torch.equal(torch.randint(0, N, (BATCH,), generator=other), want)
    with pytest.raises(ConfigError, match="job.yaml: the checkpoint's sampler.generator is int64"):
        cnn._load_generator(other, saved.astype(np.int64), "job.yaml")
