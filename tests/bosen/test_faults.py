"""``$BOSEN_FAULT`` (bosen/faults.py): off by default, a bad value named, and the hold before a
scale-in's boundary only for its rank and the plan's clock, until the release file exists."""

from __future__ import annotations

import json
import threading
import time

import pytest

from bosen import faults
from bosen.errors import BosenError, ConfigError


def test_no_fault_unless_set_and_a_bad_one_is_named(monkeypatch, tmp_path):
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faults.from_env() is None
    monkeypatch.setenv("BOSEN_RUN_DIR", str(tmp_path))
    for bad in ("hold-before-leave:x:/p", "hold-before-leave:1:", "exit:1:/p", "no-parts-from:1:x"):
        monkeypatch.setenv(faults.ENV, bad)
        with pytest.raises(ConfigError, match="expected hold-before-leave:RANK:PATH, "
                           "hold-before-clock:RANK:CLOCK:PATH, no-parts-from:RANK:CLOCK or hold-move:PATH"):
            faults.from_env()
    monkeypatch.setenv(faults.ENV, "hold-before-leave:2:/r")
    monkeypatch.delenv("BOSEN_RUN_DIR")
    with pytest.raises(ConfigError, match="BOSEN_RUN_DIR is not set"):
        faults.from_env()


def test_a_rank_holds_before_the_clock_of_a_plan_with_leavers_until_released(monkeypatch, tmp_path):
    monkeypatch.setenv("BOSEN_RUN_DIR", str(tmp_path))
    release = tmp_path / "go"
    monkeypatch.setenv(faults.ENV, f"hold-before-leave:2:{release}")
    fault = faults.from_env()
    assert fault is not None and fault.rank == 2
    fault.before_clock(2, 10)  # no plan: no hold
    (tmp_path / "tasks").mkdir()
    plan = tmp_path / "tasks" / "plan.json"
    plan.write_text(json.dumps({"id": 1, "clock": 10, "owners": [0, 1], "state": "proposed", "leave": []}))
    fault.before_clock(2, 10)  # a scale-out: nobody leaves
    plan.write_text(json.dumps({"id": 2, "clock": 10, "owners": [0, 1], "state": "proposed", "leave": [2]}))
    fault.before_clock(2, 9)  # not its clock
    fault.before_clock(1, 10)  # not its rank
    assert not (tmp_path / "go.held").exists()
    done = threading.Event()
    t = threading.Thread(target=lambda: (fault.before_clock(2, 10), done.set()), daemon=True)
    t.start()
    held = tmp_path / "go.held"
    for _ in range(500):
        if held.exists():
            break
        done.wait(0.01)
    assert json.loads(held.read_text()) == {"clock": 10} and not done.is_set()
    release.write_text("")
    t.join(timeout=10)
    assert done.is_set()


def test_a_first_process_writes_no_part_from_the_clock_on_and_its_replacement_does(monkeypatch, tmp_path):
    monkeypatch.setenv("BOSEN_RUN_DIR", str(tmp_path))
    monkeypatch.setenv(faults.ENV, "no-parts-from:1:20")
    monkeypatch.delenv("BOSEN_REJOIN", raising=False)
    monkeypatch.delenv("BOSEN_RESUME", raising=False)
    fault = faults.from_env()
    assert fault is not None
    assert [fault.skips_part(1, c) for c in (10, 20, 30)] == [False, True, True]
    assert not fault.skips_part(0, 20)  # not its rank
    fault.before_clock(1, 20)  # holds nothing
    monkeypatch.setenv("BOSEN_REJOIN", "10")
    replacement = faults.from_env()
    assert replacement is not None and not replacement.skips_part(1, 20)  # a replacement writes its parts
    monkeypatch.delenv("BOSEN_REJOIN")
    monkeypatch.setenv("BOSEN_RESUME", str(tmp_path / "clock-00000010"))
    resumed = faults.from_env()
    assert resumed is not None and not resumed.skips_part(1, 20)  # a resumed job's process writes its parts
    monkeypatch.delenv("BOSEN_RESUME")
    monkeypatch.setenv(faults.ENV, f"hold-before-clock:0:5:{tmp_path / 'go'};no-parts-from:1:20")
    both = faults.from_env()  # with another fault: each is asked
    assert isinstance(both, faults.Faults) and both.skips_part(1, 20) and not both.skips_part(0, 20)


def test_a_rank_holds_before_a_given_clock_until_released(monkeypatch, tmp_path):
    """``hold-before-clock:RANK:CLOCK:PATH``: that rank holds before CLOCK(CLOCK) only, saying so in
    PATH.held, until PATH exists, answering ok a task plan proposed meanwhile for CLOCK or later; a
    malformed one is named, and several are separated by ``;``."""
    monkeypatch.setenv(faults.ENV, "hold-before-clock:1:x:/p")
    with pytest.raises(ConfigError, match="expected hold-before-clock:RANK:CLOCK:PATH"):
        faults.from_env()
    release = tmp_path / "release"
    monkeypatch.setenv("BOSEN_RUN_DIR", str(tmp_path))
    (tmp_path / "tasks").mkdir()
    monkeypatch.setenv(faults.ENV, f"hold-before-clock:1:19:{release};hold-before-clock:2:30:{release}")
    both = faults.from_env()
    assert isinstance(both, faults.Faults) and [f.rank for f in both.each] == [1, 2]
    monkeypatch.setenv(faults.ENV, f"hold-before-clock:1:19:{release}")
    fault = faults.from_env()
    assert isinstance(fault, faults.HoldBeforeClock) and (fault.rank, fault.clock) == (1, 19)
    fault.before_clock(1, 18)  # not its clock
    fault.before_clock(0, 19)  # not its rank
    done = threading.Event()
    t = threading.Thread(target=lambda: (fault.before_clock(1, 19), done.set()), daemon=True)
    t.start()
    held = tmp_path / "release.held"
    deadline = time.monotonic() + 30
    while not held.exists():
        assert time.monotonic() < deadline, "it did not hold"
        time.sleep(0.01)
    assert json.loads(held.read_text()) == {"clock": 19} and not done.is_set()
    plan = tmp_path / "tasks" / "plan.json"
    plan.write_text(json.dumps({"id": 5, "clock": 21, "owners": [0, 1], "state": "proposed"}))
    ack = tmp_path / "tasks" / "ack-5.rank-1.json"
    while not ack.exists():  # 21: it will wait there
        assert time.monotonic() < deadline, "it did not answer the proposal"
        time.sleep(0.01)
    assert json.loads(ack.read_text()) == {"ok": True, "at": 18}
    release.write_text("go")
    t.join(timeout=30)
    assert done.is_set()


def test_the_mover_holds_before_its_plan_until_released_and_the_workers_ignore_it(monkeypatch, tmp_path):
    """``hold-move:PATH``: whoever moves partitions holds before its plan, saying so in PATH.held, until
    PATH exists (a move given up meanwhile stops holding), failing after the map where PATH says
    ``fail-after-map`` and once server 0 took it where it says ``fail-mid-map`` (after asking for
    server 0's answer); read with ``only`` it leaves the other
    processes' faults to them, and a worker's ``before_clock`` holds nothing for it."""
    monkeypatch.setenv(faults.ENV, "hold-move:")
    with pytest.raises(ConfigError, match="expected hold-move:PATH"):
        faults.from_env()
    release = tmp_path / "move"
    monkeypatch.delenv("BOSEN_RUN_DIR", raising=False)  # the launcher's environment has none
    monkeypatch.setenv(faults.ENV, f"hold-before-leave:2:/r;hold-move:{release}")
    fault = faults.from_env(only=("hold-move",))  # the worker's fault, not parsed here
    assert isinstance(fault, faults.HoldMove)
    fault.before_clock(0, 5)  # holds nothing
    done = threading.Event()
    t = threading.Thread(target=lambda: (fault.before_plan(), done.set()), daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "move.held").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not done.wait(0.2)
    release.write_text("")
    t.join(timeout=10)
    assert done.is_set()
    fault.after_map()  # nothing to fail
    release.write_text("fail-after-map")
    fault.before_plan()  # the plan goes on; the move fails once the map is taken
    with pytest.raises(BosenError, match="failed on purpose after its map"):
        fault.after_map()
    answered: list[bool] = []
    fault.mid_map(lambda: answered.append(True))  # not this fault's point
    release.write_text("fail-mid-map")
    fault.before_plan()
    with pytest.raises(BosenError, match="failed on purpose with server 0 alone on the new map"):
        fault.mid_map(lambda: answered.append(True))
    assert answered == [True]  # server 0's answer was awaited first
    fault.after_map()  # a move cut off mid-map never gets here; nothing to fail
    release.unlink()
    cancelled = threading.Event()
    cancelled.set()

    def check() -> None:
        if cancelled.is_set():
            raise BosenError("given up")

    with pytest.raises(BosenError, match="given up"):
        fault.before_plan(check)
    monkeypatch.setenv(faults.ENV, "hold-before-clock:0:5:/p")
    assert faults.from_env(only=("hold-move",)) is None
