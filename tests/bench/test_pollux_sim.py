"""bench.pollux's cluster simulator (bench/pollux/sim.py): a job alone finishes when its goodput says,
Tiresias demotes by attained service and skips what does not fit, and a small run of the experiment
puts Pollux ahead of the static fair share at M0."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.pollux import sim
from bench.pollux.__main__ import main
from bench.pollux.profiles import load
from bosen.goodput import Throughput


def kind(name: str = "k", phi: float = 1e9) -> sim.Kind:
    tp = Throughput(alpha_grad=1e-3, beta_grad=1e-5, alpha_sync=1e-3, beta_sync=5e-4)
    return sim.Kind(name, 64, tp, np.array([0.0, sim.STEPS]), np.array([phi, phi]))


def test_a_job_alone_finishes_after_its_stall_and_its_steps_at_the_fair_share() -> None:
    k = kind()
    steps = 200_000.0
    job = sim.TraceJob("a", "k", 30.0, steps, 1, 64)
    st = sim.simulate([job], {"k": k}, sim.fair_policy, 4, False, lambda s, w: s.kind.m0, 60.0, 6.0)
    rate = sim.fixed_goodput(k, 4, 64, 1e9) / 64  # 4 workers, M0: m = 16
    assert st[0].finish == pytest.approx(60.0 + 6.0 + steps / rate)  # decided at the next interval
    assert st[0].workers == 4 and st[0].reallocations == 0
    assert sim.metrics(st, {"k": k}, 4)["contended"] == 0.0  # one job, four slots
    two = [job, sim.TraceJob("b", "k", 30.0, steps, 1, 64)]
    crowded = sim.metrics(sim.simulate(two, {"k": k}, sim.fair_policy, 1, False, lambda s, w: s.kind.m0, 60.0, 6.0),
                          {"k": k}, 1)
    assert 0.3 < crowded["contended"] <= 1.0  # two jobs, one slot: crowded until the first ends
    ad = sim.simulate([job], {"k": k}, sim.pollux_policy(-1.0, 6.0), 4, True, sim._no_batch, 60.0, 6.0)
    assert ad[0].finish is not None and ad[0].finish < st[0].finish  # the batch grows: φ is large


def test_tiresias_demotes_by_attained_service_and_skips_what_does_not_fit() -> None:
    k = kind()
    big = sim._State(sim.TraceJob("big", "k", 0.0, 1e9, 3, 64), k, attained=2 * 3600.0)
    old = sim._State(sim.TraceJob("old", "k", 1.0, 1e9, 2, 64), k)
    new = sim._State(sim.TraceJob("new", "k", 2.0, 1e9, 1, 64), k)
    got = sim.tiresias_policy(1.0)(0.0, [big, old, new], 4)
    assert big.queue == 1 and got == {"old": 2, "new": 1, "big": 0}  # 1 slot left: big (3) waits
    assert sim.tiresias_policy(4.0)(0.0, [big, old], 4) == {"big": 0, "old": 2}  # still in queue 1


def test_fitness_p_minus_one_runs_every_job_when_slots_allow() -> None:
    ks = {"k": kind()}
    active = [sim._State(sim.TraceJob(f"j{i}", "k", 0.0, 1e9, 1, 64), ks["k"]) for i in range(3)]
    got = sim.pollux_policy(-1.0, 6.0)(600.0, active, 4)
    assert sorted(got.values())[0] >= 1 and sum(got.values()) <= 4


def test_pollux_runs_the_least_attained_service_first_when_jobs_tie() -> None:
    ks = {"k": kind()}
    served = sim._State(sim.TraceJob("served", "k", 0.0, 1e9, 1, 64), ks["k"], attained=3600.0)
    fresh = [sim._State(sim.TraceJob(f"f{i}", "k", 0.0, 1e9, 1, 64), ks["k"]) for i in range(2)]
    got = sim.pollux_policy(-1.0, 6.0)(600.0, [served, *fresh], 2)  # same age, all pending: a tie
    assert got == {"served": 0, "f0": 1, "f1": 1}  # the paper's simulator orders by attained service


def test_traces_are_seeded_and_sized_from_the_classes() -> None:
    kinds = sim.kinds_from_profiles(load())
    assert set(kinds) == {"digits", "fashion", "resnet18"}
    a = sim.make_trace(kinds, 3, 20, 2.0, 8)
    assert a == sim.make_trace(kinds, 3, 20, 2.0, 8) and a != sim.make_trace(kinds, 4, 20, 2.0, 8)
    assert all(0 <= j.arrival <= 7200 and j.steps > 0 and 1 <= j.workers <= 8 for j in a)
    assert all(math.isfinite(kinds[j.kind].phi_at(0.5)) for j in a)


def test_quick_sim_puts_pollux_ahead_of_the_fair_share_at_m0(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--experiments", "sim", "--quick", "--traces", "1", "--jobs", "8", "--slots", "4", "--hours", "1"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    runs = {r["policy"]: r for r in lines if r.get("experiment") == "sim" and not r.get("summary")}
    assert set(runs) == set(sim.POLICIES)
    assert all(r["jobs"] == 8 and r["avg_jct_h"] > 0 for r in runs.values())
    summ = {r["case"]: r for r in lines if r.get("summary")}
    ratio = summ["sim avg_jct_h fair M0 / pollux p=-1"]
    assert ratio["ours"] > 1.3, ratio  # the batch alone: fixed M0 is far from the best goodput
    assert "sim rho_max pollux p=1 / p=-1" in summ


def test_overload_lets_a_short_job_pass_a_long_one_where_the_paper_serves_first_come() -> None:
    ks = {"k": kind()}
    rate = sim.adaptive_speed(ks["k"], 1)  # steps of M0 a second at one worker
    long = sim.TraceJob("long", "k", 0.0, rate * 6 * 3600, 1, 64)  # 6 h alone
    short = sim.TraceJob("short", "k", 1800.0, rate * 600, 1, 64)  # 10 min alone, arrives after 30 min
    ends = {}
    for mode in ("las", "paper"):
        st = sim.simulate([long, short], ks, sim.pollux_policy(-1.0, 6.0, mode), 1, True, sim._no_batch, 60.0, 6.0)
        ends[mode] = {s.job.name: s.finish for s in st}
    assert ends["paper"]["short"] > ends["paper"]["long"]  # first come, first served: it waited 6 h
    assert ends["las"]["short"] < 1800.0 + 2 * 600.0  # LAS: the long job (level >= 1) gave up its slot
    assert ends["las"]["long"] > ends["paper"]["long"]  # and finished later for it
