"""Micro-tasks: assignment, state names, the npz hand-off, and a live hand-off in every numba app.

The apps' test runs two workers in one process, in lockstep (worker 0's tick, then worker 1's, on
shared in-process tables with exact reads): with contiguous blocks in rank order the tasks run in
the same global order whoever owns them, so a run whose tasks move mid-way must end where one whose
tasks never moved ends (LDA: the same assignments and counts; MF, MLR: the same generators, and the
same tables up to float rounding: a moved task reads a row as the table sums it, not as the giver's
local copy held it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import PY, run_cmd
from inprocess import InProcessClient, InProcessTable, InProcessView
from resume import run_until_checkpoint

from bosen import checkpoint
from bosen.apps import microtasks as M
from bosen.apps.lda.worker import LDAArgs, load_corpus
from bosen.apps.lda.worker import train as lda_train
from bosen.apps.mf.worker import train as mf_train
from bosen.apps.mlr.worker import train as mlr_train
from bosen.config import from_dict
from bosen.errors import BosenError, ConfigError


def test_assign_is_contiguous_balanced_blocks_in_rank_order():
    np.testing.assert_array_equal(M.assign(8, [0, 1]), [0, 0, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(M.assign(7, [2, 0, 5]), [0, 0, 0, 2, 2, 5, 5])
    np.testing.assert_array_equal(M.assign(3, [1]), [1, 1, 1])
    for T, k in [(8, 3), (100, 7), (5, 5)]:
        sizes = np.bincount(M.assign(T, range(k)), minlength=k)
        assert sizes.sum() == T and sizes.max() - sizes.min() <= 1
    with pytest.raises(ValueError, match="a rank twice"):
        M.assign(4, [0, 0])
    np.testing.assert_array_equal(M.owned(M.assign(8, [0, 1]), 1), [4, 5, 6, 7])


def test_count_fixed_for_the_jobs_life():
    assert M.count(0, 3) == 3 and M.count(16, 2) == 16
    saved = M.pack({t: {"x": np.zeros(1)} for t in range(6)})
    assert M.saved_tasks(saved) == 6 and M.count(0, 4, saved) == 6 and M.count(6, 4, saved) == 6
    with pytest.raises(ConfigError, match="holds 6 micro-tasks"):
        M.count(8, 2, saved)
    with pytest.raises(ConfigError, match="3 workers but 2 micro-tasks"):
        M.count(2, 3)
    with pytest.raises(ConfigError, match="micro_tasks: must be >= 0"):
        M.count(-1, 3)


def test_pack_unpack_and_a_missing_state_is_named():
    saved = M.pack({3: {"z": np.arange(4), "rng": np.ones(6, np.uint64)}})
    assert sorted(saved) == ["task.3.rng", "task.3.z"]
    got = M.unpack(saved, [3], ("z", "rng"))
    np.testing.assert_array_equal(got[3]["z"], np.arange(4))
    with pytest.raises(BosenError, match="no state 'task.4.z' of micro-task 4"):
        M.unpack(saved, [4], ("z",))


def test_give_and_take_move_states_through_npz_files(tmp_path):
    states = {1: {"z": np.arange(5, dtype=np.int32), "n": np.array([7])}, 2: {"z": np.zeros(0, np.int32)}}
    files = M.give(tmp_path, 12, states)
    assert sorted(p.name for p in files) == ["task-1.clock-12.npz", "task-2.clock-12.npz"]
    got = M.take(tmp_path, 12, [2, 1], timeout=1)
    np.testing.assert_array_equal(got[1]["z"], states[1]["z"])
    assert got[1]["z"].dtype == np.int32 and got[2]["z"].shape == (0,)
    # kept: a receiver lost before a checkpoint past clock 12 is complete takes them again when redone
    assert M.take(tmp_path, 12, [1], timeout=1)[1]["n"].tolist() == [7]
    with pytest.raises(BosenError, match="micro-task 3: no hand-off at clock 12"):
        M.take(tmp_path, 12, [3], timeout=0.05)
    M.give(tmp_path, 20, {1: states[1]})
    assert M.drop_handoffs(tmp_path, 12) == 0  # a replacement may restart before 12: it needs them
    assert M.drop_handoffs(tmp_path, 13) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["task-1.clock-20.npz"]


def test_handoff_gives_and_takes_between_two_workers(tmp_path):
    a, b = M.MicroTasks(4, M.assign(4, [0, 1]), 0), M.MicroTasks(4, M.assign(4, [0, 1]), 1)
    new = M.assign(4, [0])  # worker 1 leaves: it gives all away
    got_b = b.handoff(5, new, tmp_path, lambda t: {"v": np.array([t * 10])})
    got_a = a.handoff(5, new, tmp_path, lambda t: {"v": np.array([-1])})
    assert got_b == {} and sorted(got_a) == [2, 3] and int(got_a[3]["v"][0]) == 30
    assert list(a.mine) == [0, 1, 2, 3] and list(b.mine) == []


def test_file_plan_applies_at_its_clock_and_rejects_a_late_or_bad_plan(tmp_path):
    plan = M.FilePlan(tmp_path / "plan.json")
    assert plan.at(3, 4) is None
    (tmp_path / "plan.json").write_text(json.dumps({"clock": 5, "owners": [0, 0, 0, 1]}))
    assert plan.at(4, 4) is None
    np.testing.assert_array_equal(plan.at(5, 4), [0, 0, 0, 1])
    # a process that starts later (resumed, a replacement) runs the tasks where the plan put them
    default = M.assign(4, [0, 1])
    later = M.FilePlan(tmp_path / "plan.json")
    np.testing.assert_array_equal(later.initial(7, 4, default), [0, 0, 0, 1])
    assert later.at(8, 4) is None
    np.testing.assert_array_equal(M.FilePlan(tmp_path / "plan.json").initial(4, 4, default), default)
    saved = {"tick": np.array([5])}
    np.testing.assert_array_equal(M.start_owners(4, 2, saved, M.FilePlan(tmp_path / "plan.json")), [0, 0, 0, 1])
    np.testing.assert_array_equal(M.start_owners(4, 2, None, M.FilePlan(tmp_path / "plan.json")), default)
    late = M.FilePlan(tmp_path / "plan.json")
    with pytest.raises(BosenError, match="a plan for clock 5 reached this worker at clock 6"):
        late.at(6, 4)
    with pytest.raises(BosenError, match="3 owners for 4 micro-tasks"):
        (tmp_path / "plan.json").write_text(json.dumps({"clock": 9, "owners": [0, 0, 1]}))
        M.FilePlan(tmp_path / "plan.json").at(7, 4)


def test_a_replacement_takes_its_checkpoints_owners_and_redoes_the_steps_after_it(tmp_path, monkeypatch):
    """A job of 6 tasks scaled 2 -> 3 at clock 12 and 3 -> 2 at 32 (``plan.json`` holds the second step
    only; the scaler keeps each committed one as ``plan-<clock>.json``). A lost worker's replacement
    restarted from the checkpoint at 20 takes the owners 20's worker parts record, not plan.json's
    nor the start's; one from 10 takes the start's and moves its tasks at 12 and at 32 as the live
    workers did; one from 12 (a step at its own clock) takes that step's. A process that is no
    replacement never reads the kept plans; a resume drops every plan, and a
    replacement restarted from the checkpoint a run resumed from owns what that run's workers did."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    first, second = M.assign(6, [0, 1, 2]), M.assign(6, [0, 1])
    for b, owners in ((12, first), (32, second)):
        d = {"id": b, "clock": b, "owners": owners.tolist(), "state": "committed", "leave": []}
        M.keep_plan(folder, d)
        (folder / "plan.json").write_text(json.dumps(d))
    base = tmp_path / "ck"
    for c, ranks in ((10, [0, 1]), (12, [0, 1]), (20, [0, 1, 2])):
        owners = M.assign(6, ranks)
        checkpoint.write_part(base, c, "server", 0, {}, {"ranks": ranks}, "fp", 2)
        for r in ranks:
            checkpoint.write_part(base, c, "worker", r, {M.key(t, "z"): np.zeros(1) for t in M.owned(owners, r)},
                                  {}, "fp", 2)
    np.testing.assert_array_equal(checkpoint.task_owners(checkpoint.clock_dir(base, 20)), first)
    monkeypatch.setenv("BOSEN_REJOIN", "20")
    monkeypatch.setenv("BOSEN_RESUME", str(checkpoint.clock_dir(base, 20)))
    replay = M.FilePlan(folder / "plan.json", rank=2, replay=True)
    np.testing.assert_array_equal(M.start_owners(6, 2, {"tick": np.array([20])}, replay), first)
    np.testing.assert_array_equal(replay.at(32, 6), second)
    monkeypatch.setenv("BOSEN_RESUMED_AT", "20")  # a run resumed from 20: its workers' owners there, not the parts'
    np.testing.assert_array_equal(M.start_owners(6, 2, {"tick": np.array([20])}, replay), M.assign(6, [0, 1]))
    monkeypatch.delenv("BOSEN_RESUMED_AT")
    monkeypatch.setenv("BOSEN_REJOIN", "10")
    monkeypatch.setenv("BOSEN_RESUME", str(checkpoint.clock_dir(base, 10)))
    replay = M.FilePlan(folder / "plan.json", rank=1, replay=True)
    np.testing.assert_array_equal(M.start_owners(6, 2, {"tick": np.array([10])}, replay), M.assign(6, [0, 1]))
    assert replay.at(11, 6) is None
    np.testing.assert_array_equal(replay.at(12, 6), first)
    np.testing.assert_array_equal(replay.committed(12, 6), first)  # what adopt asks before CLOCK(12)
    np.testing.assert_array_equal(replay.at(32, 6), second)
    monkeypatch.setenv("BOSEN_RESUME", str(checkpoint.clock_dir(base, 12)))
    replay = M.FilePlan(folder / "plan.json", rank=1, replay=True)
    np.testing.assert_array_equal(M.start_owners(6, 2, {"tick": np.array([12])}, replay), first)
    assert M.FilePlan(folder / "plan.json", rank=1).at(12, 6) is None  # a live worker: plan.json only
    assert M.drop_handoffs(folder, 13) == 1 and sorted(p.name for p in folder.glob("plan-*.json")) == ["plan-32.json"]
    assert M.drop_run_plans(folder) == 2 and not list(folder.iterdir())  # a resume: plan.json and plan-32.json


def test_a_joiner_started_ahead_is_ready_then_joins_at_the_clock_named_for_its_rank(tmp_path, monkeypatch):
    """``BOSEN_JOIN=ahead``: the joiner writes ready-R.json; join.json of an earlier step (other ranks)
    is not its clock; the one naming it is; a garbled notice and no notice in time are errors."""
    monkeypatch.setenv("BOSEN_JOIN", M.JOIN_AHEAD)
    assert M.join_ahead() and M.join_clock() is None
    M.ready(tmp_path, 3)
    assert json.loads((tmp_path / "ready-3.json").read_text())["pid"] == os.getpid()
    M.announce_join(tmp_path, 7, [2])
    with pytest.raises(BosenError, match="no clock to join at for worker 3 within 0.05s"):
        M.await_join(tmp_path, 3, timeout=0.05)
    M.announce_join(tmp_path, 9, [3, 4])
    assert M.await_join(tmp_path, 3, timeout=1) == 9
    (tmp_path / M.JOIN_FILE).write_text("{")
    with pytest.raises(BosenError, match="not a join notice"):
        M.await_join(tmp_path, 3, timeout=1)
    monkeypatch.setenv("BOSEN_JOIN", "9")
    assert not M.join_ahead() and M.join_clock() == 9


def test_a_leaver_of_a_plan_with_durable_waits_for_its_release(tmp_path):
    """A committed plan with ``"durable": C`` (a scale-in in a checkpointed job) keeps a leaver in
    ``leaving`` until the scaler writes ``left-<id>.json`` (every server's part of C on disk), and
    fails naming the file if it does not come; a staying rank does not wait."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"id": 4, "clock": 10, "owners": [0, 0, 1, 1], "state": "committed",
                                "leave": [2], "durable": 10}))
    leaver, stayer = M.FilePlan(path, rank=2, timeout=5), M.FilePlan(path, rank=1, timeout=5)
    assert leaver.at(10, 4) is not None and stayer.at(10, 4) is not None
    assert not stayer.leaving()
    threading.Timer(0.2, (tmp_path / "left-4.json").write_text, args=("{}",)).start()
    t0 = time.monotonic()
    assert leaver.leaving() and time.monotonic() - t0 >= 0.15
    (tmp_path / "left-4.json").unlink()
    late = M.FilePlan(path, rank=2, timeout=0.1)
    assert late.at(10, 4) is not None
    with pytest.raises(BosenError, match="left-4.json: not written within 0.1s"):
        late.leaving()


def test_a_proposed_plan_is_answered_waited_for_at_its_clock_and_committed_or_withdrawn(tmp_path):
    """The two-phase plan ``bosen scale`` writes: a worker before the proposal's clock answers ok and
    waits there until the plan is committed (its owners) or withdrawn (None); one past it answers
    not ok and goes on as before; ``leaving`` names the ranks the committed plan lets go; a joining
    worker waits for the commit."""
    path = tmp_path / "plan.json"

    def write(state: str, pid: int = 7, clock: int = 5, leave: list[int] | None = None) -> None:
        tmp = tmp_path / ".p"
        tmp.write_text(json.dumps({"id": pid, "clock": clock, "owners": [0, 0, 1, 2], "state": state,
                                   "leave": leave or []}))
        os.replace(tmp, path)

    early, late = M.FilePlan(path, rank=0, timeout=5), M.FilePlan(path, rank=1, timeout=5)
    write("proposed")
    assert early.at(4, 4) is None and late.at(6, 4) is None
    assert json.loads((tmp_path / "ack-7.rank-0.json").read_text()) == {"ok": True, "at": 4}
    assert json.loads((tmp_path / "ack-7.rank-1.json").read_text()) == {"ok": False, "at": 6}
    threading.Timer(0.2, write, args=("committed",)).start()
    t0 = time.monotonic()
    np.testing.assert_array_equal(early.at(5, 4), [0, 0, 1, 2])  # waited at clock 5 for the commit
    assert time.monotonic() - t0 >= 0.15 and not early.leaving()
    assert M.FilePlan(path, rank=2).joined(5, 4).tolist() == [0, 0, 1, 2]
    write("proposed", pid=8, clock=9, leave=[2])
    assert early.at(8, 4) is None
    threading.Timer(0.1, write, args=("withdrawn", 8, 9, [2])).start()
    assert early.at(9, 4) is None  # withdrawn: nothing moves
    leaver = M.FilePlan(path, rank=2)
    write("committed", pid=9, clock=11, leave=[2])
    assert leaver.at(11, 4) is not None and leaver.leaving()
    write("withdrawn", pid=10, clock=13)
    with pytest.raises(BosenError, match="was withdrawn"):
        M.FilePlan(path, rank=3).joined(13, 4)
    write("proposed", pid=11, clock=15)
    with pytest.raises(BosenError, match="waited 0.2s at clock 15 for task plan 11"):
        M.FilePlan(path, rank=0, timeout=0.2).at(15, 4)


def test_a_proposal_at_or_past_the_end_of_a_workers_training_is_refused_saying_so(tmp_path):
    """A worker whose training ends at clock 20 (``ends_at``: it reads no plan past 20 and runs no tick
    after it) answers a proposal for 20 or later not ok, naming its end, and never waits there; one for
    19 it answers ok. ``job_end`` gives the scaler the earliest end of the ranks it asks about."""
    path = tmp_path / "plan.json"

    def propose(pid: int, clock: int) -> None:
        path.write_text(json.dumps({"id": pid, "clock": clock, "owners": [0, 1], "state": "proposed", "leave": []}))

    assert M.job_end(tmp_path, [0, 1]) is None  # nobody said
    w0, w1 = M.FilePlan(path, rank=0, timeout=5), M.FilePlan(path, rank=1, timeout=5)
    w0.ends_at(20)
    w1.ends_at(22)
    assert M.job_end(tmp_path, [0, 1]) == (20, 0) and M.job_end(tmp_path, [1, 5]) == (22, 1)
    propose(1, 20)
    assert w0.at(18, 2) is None and w0.at(20, 2) is None  # answered at 18; does not wait at 20
    assert json.loads((tmp_path / "ack-1.rank-0.json").read_text()) == {"ok": False, "at": 18, "ends": 20}
    propose(2, 19)
    assert w1.at(18, 2) is None
    assert json.loads((tmp_path / "ack-2.rank-1.json").read_text()) == {"ok": True, "at": 18}
    (tmp_path / "end-3.json").write_text("[")
    with pytest.raises(BosenError, match="end-3.json: not an end notice"):
        M.job_end(tmp_path, [3])


# ------------------------------------------------------------------------------------------------
# two workers in lockstep on shared in-process tables


class _Turns:
    """Worker r's table operations wait until it is r's turn; a clock() passes the turn on. Between
    a clock() and its next table operation a worker may do anything else (a hand-off)."""

    def __init__(self, k: int) -> None:
        self.k, self.step, self.done = k, 0, set[int]()
        self.cv = threading.Condition()
        self.rank: dict[int, int] = {}

    def gate(self) -> None:
        r = self.rank[threading.get_ident()]
        with self.cv:
            assert self.cv.wait_for(lambda: self.step % self.k == r, timeout=60), "lockstep stuck"

    def _advance(self) -> None:
        self.step += 1
        while len(self.done) < self.k and self.step % self.k in self.done:
            self.step += 1
        self.cv.notify_all()

    def clock(self) -> None:
        self.gate()
        with self.cv:
            self._advance()

    def finish(self, r: int) -> None:
        with self.cv:
            self.done.add(r)
            if self.step % self.k == r:
                self._advance()


class _Table(InProcessTable):
    def __init__(self, turns: _Turns, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.turns = turns

    def get_rows(self, rows: Any, ahead: int = 0) -> np.ndarray:
        self.turns.gate()
        return super().get_rows(rows)

    def inc_rows(self, rows: Any, deltas: Any, cols: Any = None) -> None:
        self.turns.gate()
        super().inc_rows(rows, deltas, cols)

    def view(self, rows: Any, base: bool = True) -> InProcessView:
        return InProcessView(self, np.asarray(rows, dtype=np.int64))


class _Client(InProcessClient):
    def __init__(self, turns: _Turns, *tables: InProcessTable, rank: int, num_workers: int) -> None:
        super().__init__(*tables, rank=rank, num_workers=num_workers)
        self.turns = turns

    def clock(self) -> None:
        self.turns.clock()
        super().clock()


def _lockstep(train: Callable[..., None], tables: Callable[[_Turns], list[InProcessTable]], args: dict,
              run_dir: Path, plan: dict | None, monkeypatch: pytest.MonkeyPatch) -> tuple[list[_Client], dict]:
    """Two workers of ``train`` in lockstep; ``plan`` (written before they start) moves tasks. Returns
    the clients and every task's final state (from the checkpoint providers), merged."""
    monkeypatch.setenv("BOSEN_RUN_DIR", str(run_dir))
    if plan is not None:
        (run_dir / "tasks").mkdir(parents=True)
        (run_dir / "tasks" / "plan.json").write_text(json.dumps(plan))
    turns = _Turns(2)
    ts = tables(turns)
    clients = [_Client(turns, *ts, rank=r, num_workers=2) for r in range(2)]
    errors: list[BaseException] = []

    def run(c: _Client) -> None:
        turns.rank[threading.get_ident()] = c.rank
        try:
            train(c, args)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            turns.finish(c.rank)

    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    states: dict[str, np.ndarray] = {}
    for c in clients:
        assert c.provider is not None
        states.update({k: v for k, v in c.provider().items() if k.startswith("task.")})
    return clients, states


PLANS = {"move": {"clock": 5, "owners": [0, 0, 0, 1, 1, 1, 1, 1]},
         "leave": {"clock": 5, "owners": [0] * 8}}


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_lda_tasks_moved_mid_run_end_with_the_assignments_of_a_run_that_never_moved(tmp_path, monkeypatch, plan):
    args = {"data": "synthetic", "K": 6, "synth_docs": 120, "synth_vocab": 80, "synth_doc_len": 30.0, "seed": 3,
            "iterations": 10, "batches_per_clock": 1, "micro_tasks": 8, "sampler": "dense", "save_model": False}

    def tables(turns: _Turns) -> list[InProcessTable]:
        return [_Table(turns, "word_topic", 80, 6, "int32", staleness=0),
                _Table(turns, "topic_summary", 1, 6, "int32", staleness=0)]

    still, s0 = _lockstep(lda_train, tables, args, tmp_path / "still", None, monkeypatch)
    moved, s1 = _lockstep(lda_train, tables, args, tmp_path / "moved", PLANS[plan], monkeypatch)
    assert sorted(s0) == sorted(s1) and M.saved_tasks(s1) == 8
    for k in s0:
        np.testing.assert_array_equal(s0[k], s1[k], err_msg=k)
    for name in ("word_topic", "topic_summary"):
        np.testing.assert_array_equal(still[0].tables[name].data, moved[0].tables[name].data)
    # every token counted once, after the move as before
    assert moved[0].tables["word_topic"].data.sum() == sum(v.size for k, v in s1.items() if k.endswith(".z"))
    ticks = [r for r in moved[1].reports if "tokens" in r]
    if plan == "move":  # worker 1 took task 3 at clock 5 (after 1 barrier clock and 4 ticks)
        assert ticks[3]["tokens"] == ticks[0]["tokens"] < ticks[4]["tokens"] == ticks[9]["tokens"]
    else:  # worker 1 gave all away and clocked on with nothing to do
        assert ticks[3]["tokens"] > 0 and ticks[4]["tokens"] == ticks[9]["tokens"] == 0


def test_an_lda_worker_left_alone_by_a_plan_samples_a_tick_in_one_mini_batch(tmp_path, monkeypatch):
    """Mini-batches per tick follow the workers the job has now (``LDAArgs.batches``: 8 beside other
    workers, whose counts arrive mid-tick; 1 alone, where more only cost): a worker that takes every
    task at a boundary goes on with one, as a job started with one worker does."""
    args = {"data": "synthetic", "K": 6, "synth_docs": 120, "synth_vocab": 80, "synth_doc_len": 30.0, "seed": 3,
            "iterations": 10, "micro_tasks": 8, "sampler": "dense", "save_model": False}

    def tables(turns: _Turns) -> list[InProcessTable]:
        return [_Table(turns, "word_topic", 80, 6, "int32", staleness=0),
                _Table(turns, "topic_summary", 1, 6, "int32", staleness=0)]

    clients, states = _lockstep(lda_train, tables, args, tmp_path / "leave", PLANS["leave"], monkeypatch)
    ticks = [r for r in clients[0].reports if "tokens" in r]
    assert [r["batches"] for r in ticks] == [8.0] * 4 + [1.0] * 6, ticks
    assert clients[0].tables["word_topic"].data.sum() == sum(v.size for k, v in states.items() if k.endswith(".z"))


@pytest.mark.parametrize("app", ["mf", "mlr"])
def test_sgd_tasks_moved_mid_run_make_the_same_updates(tmp_path, monkeypatch, app):
    if app == "mf":
        train = mf_train
        args = {"nnz": 3000, "epochs": 4, "clocks_per_epoch": 2, "batches_per_clock": 1, "micro_tasks": 8,
                "eval_every": 0}

        def tables(turns: _Turns) -> list[InProcessTable]:
            rng = np.random.default_rng(0)
            return [_Table(turns, n, r, 8, "float32", (rng.standard_normal((r, 8)) * 0.1).astype(np.float32))
                    for n, r in (("L", 200), ("R", 60))]
        names = ("L", "R")
    else:
        train = mlr_train
        args = {"data": "digits", "epochs": 3, "clocks_per_epoch": 2, "batches_per_clock": 1, "micro_tasks": 8,
                "eval_every": 0, "batch_size": 16}

        def tables(turns: _Turns) -> list[InProcessTable]:
            return [_Table(turns, "W", 10, 65, "float32")]
        names = ("W",)
    still, s0 = _lockstep(train, tables, args, tmp_path / "still", None, monkeypatch)
    moved, s1 = _lockstep(train, tables, args, tmp_path / "moved", PLANS["move"], monkeypatch)
    assert sorted(s0) == sorted(s1) and M.saved_tasks(s1) == 8
    for k in s0:  # generators (and MLR's epoch orders): bit for bit
        np.testing.assert_array_equal(s0[k], s1[k], err_msg=k)
    start = {t.name: t.data for t in tables(_Turns(1))}
    for n in names:
        a, b = still[0].tables[n].data, moved[0].tables[n].data
        assert not np.allclose(a, start[n], atol=1e-3)  # training changed them
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    samples = [r["samples"] for r in moved[1].reports]
    assert samples[5] > samples[3]  # worker 1 took task 3 at clock 5


# ------------------------------------------------------------------------------------------------
# a checkpointed job resumed with another number of workers (bosen launch --resume RUN --workers K')


def _lda_job(tmp_path: Path, micro_tasks: int) -> tuple[Path, dict]:
    """One server: the micro-tasks' hand-off is the point (a replaced worker's take-back on two
    servers: tests/bosen/jobs/test_replace_worker.py)."""
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 2},
           "consistency": {"staleness": 0}, "checkpoint": {"every_clocks": 3, "keep": 5},
           "tables": {"word_topic": {"rows": 150, "cols": 5, "dtype": "int32"},
                      "topic_summary": {"rows": 1, "cols": 5, "dtype": "int32"}},
           "app": {"module": "bosen.apps.lda",
                   "args": {"data": "synthetic", "K": 5, "synth_docs": 240, "synth_vocab": 150,
                            "synth_doc_len": 20.0, "iterations": 11, "micro_tasks": micro_tasks, "seed": 2}}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(cfg))
    return path, cfg


def _resume(path: Path, run_dir: Path, workers: int) -> subprocess.CompletedProcess:
    return run_cmd([PY, "-m", "bosen", "launch", str(path), "--resume", str(run_dir),
                   "--workers", str(workers), "--no-plot"], timeout=120)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("workers", [1, 3])
def test_lda_job_checkpointed_by_two_workers_resumes_with_another_count(tmp_path, workers):
    """Stopped after its checkpoint at clock 6 and resumed with 1 or 3 workers: every micro-task goes
    on from its saved chain on the worker that owns it now (not where a step of the first run after
    6 put it), and the job ends with the counts of the
    final assignments (each token counted once) and every task swept once per batch and iteration."""
    path, cfg = _lda_job(tmp_path, 8)
    run = tmp_path / "run"
    run_until_checkpoint(path, run, 6, 1, 2)
    # as if the first run had scaled 2 -> 3 at clock 8, after its checkpoint, before it stopped: that
    # step is not this run's (its workers start at 6 with their own assignment), so nothing moves at 8
    step = {"id": 7, "clock": 8, "owners": M.assign(8, [0, 1, 2]).tolist(), "state": "committed", "leave": []}
    for name in ("plan.json", "plan-8.json"):
        (run / "tasks").mkdir(exist_ok=True)
        (run / "tasks" / name).write_text(json.dumps(step))
    p = _resume(path, run, workers)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"made by 2 workers; its 8 micro-tasks go to {workers} workers" in p.stdout
    last = checkpoint.clocks(run / "checkpoints")[0]
    assert last == 12  # 1 opening clock + 11 iterations: the final clock is a boundary
    parts = checkpoint.check_complete(run / "checkpoints", last, 1, None, None)
    assert checkpoint.checkpoint_workers(checkpoint.clock_dir(run / "checkpoints", last)) == workers
    states: dict[str, np.ndarray] = {}
    for name, part in parts.items():
        if name.startswith("worker-"):
            got = {k: v for k, v in part.load().items() if k.startswith("task.")}
            assert not set(got) & set(states)  # every task in one part
            states.update(got)
    assert M.saved_tasks(states) == 8
    # bosen status RUN_DIR: the servers are gone, the micro-tasks each worker held are on disk
    by = checkpoint.tasks_by_worker(parts)
    assert len(by) == workers and sorted(t for ts in by.values() for t in ts) == list(range(8))
    r = run_cmd([PY, "-m", "bosen", "status", str(run), "--timeout", "0.5"], timeout=60)
    assert r.returncode == 1 and "DOWN" in r.stdout, r.stdout + r.stderr
    want = "; ".join(f"worker {k}: {ts[0]}-{ts[-1]}" if len(ts) > 1 else f"worker {k}: {ts[0]}" for k, ts in by.items())
    assert f"micro-tasks at the checkpoint of clock {last}: {want}" in r.stdout, r.stdout
    args: LDAArgs = from_dict(LDAArgs, cfg["app"]["args"], "app.args")
    corpus = load_corpus(args)
    z = np.concatenate([states[M.key(t, "z")] for t in range(M.saved_tasks(states))])
    counts = np.zeros((150, 5), np.int64)
    np.add.at(counts, (corpus.words, z), 1)
    np.testing.assert_array_equal(np.load(run / "word_topic.npy"), counts)
    # one clock record per clock, in order, each summing the workers of its time (2 before, K' after)
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    clocks = [r for r in recs if r.get("kind") == "clock" and "tokens" in r]
    assert [r["clock"] for r in clocks] == list(range(1, 12))
    # resumed from the checkpoint at clock 6, or a later one the first run reached before it stopped
    before = sum(r["workers"] == 2 for r in clocks)
    assert before >= 5 and [r["workers"] for r in clocks] == [2] * before + [workers] * (11 - before)
    assert all(r["tokens"] == corpus.n_tokens for r in clocks)
    # each task sweeps once per mini-batch: 8 a tick with several workers, 1 with one (LDAArgs.batches);
    # `before` ticks with 2 workers (after the opening clock, up to the checkpoint resumed from), the rest after
    for t in range(8):
        assert int(states[M.key(t, "sweeps")][0]) == before * 8 + (11 - before) * args.batches(workers)
    assert not (run / "tasks" / "plan.json").exists()  # the first run's step went with the resume


@pytest.mark.timeout(120)
def test_resume_with_more_workers_than_tasks_is_refused(tmp_path):
    path, _ = _lda_job(tmp_path, 0)  # one task per worker: 2
    run = tmp_path / "run"
    run_until_checkpoint(path, run, 3, 1, 2)
    p = _resume(path, run, 3)
    assert p.returncode == 1
    assert "made by 2 workers, which hold 2 micro-tasks: --workers 3 leaves workers without one (at most 2)" \
        in p.stderr, p.stdout[-2000:] + p.stderr[-2000:]


def _pid_of_worker(run_dir: Path, rank: int) -> int | None:
    """The process of worker ``rank`` of the job in ``run_dir`` (its environment names both)."""
    want = {f"BOSEN_RUN_DIR={run_dir}".encode(), f"BOSEN_RANK={rank}".encode()}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            return int(proc.name)
    return None


@pytest.mark.timeout(200)
def test_lda_worker_sigkilled_has_its_micro_tasks_restored_and_the_job_finishes(tmp_path):
    """Worker 1 of an LDA job with 8 micro-tasks is SIGKILLed after the checkpoint at clock 6: its
    replacement restores its 4 tasks from the newest checkpoint (each task's sweeps go on from the
    saved count: every task ends with exactly one sweep per mini-batch of every tick), the servers take
    back its counts since (server/undo.py), and the job finishes with every token counted once."""
    path, cfg = _lda_job(tmp_path, 8)
    iterations = 89  # long enough that the kill lands mid-job, not after worker 1 left (then nothing is redone)
    cfg["app"]["args"].update(iterations=iterations, synth_docs=600)
    cfg["checkpoint"]["keep"] = 20
    path.write_text(json.dumps(cfg))
    run = (tmp_path / "run").resolve()
    p = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(path), "--run-dir", str(run), "--no-plot"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert p.poll() is None and time.monotonic() < deadline, "the job ended or stalled before clock 6"
            try:
                checkpoint.check_complete(run / "checkpoints", 6, 1, 2, None)
                break
            except checkpoint.CheckpointError:
                time.sleep(0.02)
        pid = _pid_of_worker(run, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=150)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 0, out[-3000:]
    m = re.search(r"worker-1 was killed by SIGKILL: replacing it from the checkpoint at clock (\d+)", out)
    assert m is not None and int(m.group(1)) >= 6, out[-3000:]
    last = checkpoint.clocks(run / "checkpoints")[0]
    assert last == iterations + 1
    parts = checkpoint.check_complete(run / "checkpoints", last, 1, 2, None)
    states = {k: v for name, part in parts.items() if name.startswith("worker-")
              for k, v in part.load().items() if k.startswith("task.")}
    assert M.saved_tasks(states) == 8
    for t in range(8):
        assert int(states[M.key(t, "sweeps")][0]) == iterations * 8
    corpus = load_corpus(from_dict(LDAArgs, cfg["app"]["args"], "app.args"))
    final = np.load(run / "word_topic.npy")
    assert final.min() >= 0 and final.sum() == corpus.n_tokens
    # the model rank 0 wrote at the end is the counts of the final assignments: nothing counted twice
    z = np.concatenate([states[M.key(t, "z")] for t in range(8)])
    counts = np.zeros(final.shape, dtype=np.int64)
    np.add.at(counts, (corpus.words, z), 1)
    np.testing.assert_array_equal(final, counts)
