"""apps/goodput.py: Pollux's job-level agent. Its choice is a function of the interval rows alone (so
workers that read the same rows switch alike), it follows the goodput model, and a launched MLR job
switches every worker at the same interval boundary and reaches its target."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from inprocess import InProcessClient, InProcessTable

from bosen.apps import goodput as gp
from bosen.apps.mlr.worker import MLRArgs, train
from bosen.config import from_dict
from bosen.goodput import Throughput, best_config

REPO = Path(__file__).resolve().parents[2]
TRUE = Throughput(alpha_grad=1e-4, beta_grad=2e-6, alpha_sync=1e-3)  # sync-heavy: larger batches pay


def _row(st: gp.Setting, phi: float, model: Throughput, workers_reporting: int | None = None,
         steps: int = 18) -> np.ndarray:
    """One interval's sums as ``workers`` workers would add them: ‖G‖² = 1, tr Σ = φ, exact step times."""
    k = st.workers if workers_reporting is None else workers_reporting
    row = np.zeros(gp.COLS)
    row[gp.C_STEPS], row[gp.C_SQNORM], row[gp.C_TRACE] = k * steps, k * steps * 1.0, k * steps * phi
    row[gp.C_SECONDS] = k * steps * float(model.t_iter(st.m, st.s, st.workers))
    row[gp.C_TIMED] = k * steps
    row[gp.C_K] = k * steps * st.workers
    row[gp.C_COMPUTE] = k * steps * (st.s + 1) * (model.alpha_grad + model.beta_grad * st.m**model.power)
    row[gp.C_M], row[gp.C_S], row[gp.C_WORKERS] = k * st.m, k * st.s, k
    return row


def _run(agent: gp.Agent, phis: list[float], model: Throughput = TRUE) -> list[gp.Setting]:
    out = []
    for i, phi in enumerate(phis):
        agent.observe(_row(agent.setting, phi, model))
        out.append(agent.decide(i + 1, agent.setting.workers))
    return out


def _agent(sync_alpha: float | None = None, **kw: object) -> gp.Agent:
    args = from_dict(gp.GoodputArgs, {"smoothing": 0.5, **kw}, "goodput")
    return gp.Agent(args, m0=64, workers=2, m_start=32, sync_alpha=sync_alpha)


def test_the_choice_is_a_function_of_the_rows_and_starts_at_m0_with_gain_1() -> None:
    a, b = _agent(), _agent()
    assert a.setting == gp.Setting(0, 32, 0, 2, 1.0) and a.setting.batch == 64
    phis = [50.0, 80.0, 200.0, 500.0, 2000.0]
    sa, sb = _run(a, phis), _run(b, phis)
    assert sa == sb  # two workers reading the same rows switch alike
    assert [s.interval for s in sa] == [1, 2, 3, 4, 5]
    batches = [s.batch for s in sa]
    assert all(x >= 64 for x in batches) and batches[-1] > batches[0], batches  # M grows with φ
    seen = [64] + batches
    assert all(b <= gp.EXPLORE * max(seen[:i + 1]) for i, b in enumerate(batches))  # no leap past 4x measured
    # with two batch sizes seen the fit is exact here, so the choice is the true model's
    st = sa[-1]
    want = best_config(TRUE, st.phi, 64, 2, 32 * 64, 4096)
    assert st.batch == pytest.approx(want.batch, rel=0.15), (st, want)
    assert st.gain == pytest.approx(st.batch / 64 * st.efficiency)  # AdaScale: S·EFFICIENCY
    # the square-root rule needs no φ: a job launched at 16·M0 (the fixed large baseline) steps at 4x
    # from its first iteration, not at 1x for its first interval (the Adam baseline ran so before)
    args = from_dict(gp.GoodputArgs, {"rule": "sqrt", "adapt": False}, "goodput")
    assert gp.Agent(args, m0=64, workers=2, m_start=512).setting.gain == pytest.approx(4.0)
    assert gp.Agent(args, m0=64, workers=2, m_start=32).setting.gain == pytest.approx(1.0)
    # and it prices batches by its own efficiency, the root of eq. 6: at a low φ, a larger batch than AdaScale's
    sq, ada = _run(_agent(rule="sqrt"), [50.0] * 3), _run(_agent(), [50.0] * 3)
    assert sq[-1].efficiency == pytest.approx(math.sqrt((sq[-1].phi + 64) / (sq[-1].phi + sq[-1].batch)))
    assert sq[-1].batch > ada[-1].batch and sq[-1].gain == pytest.approx(math.sqrt(sq[-1].batch / 64))


def test_a_costlier_sync_makes_the_first_choice_larger() -> None:
    cheap = Throughput(alpha_grad=1e-4, beta_grad=2e-6, alpha_sync=1e-4)
    dear = Throughput(alpha_grad=1e-4, beta_grad=2e-6, alpha_sync=5e-3)
    # measured: the step less its computation is the sync
    assert _run(_agent(), [100.0], dear)[0].batch > _run(_agent(), [100.0], cheap)[0].batch
    # computation not timed: the bandwidth budget's seed (sync_seed) is α_s; a tighter budget, a larger M
    untimed = [_agent(sync_alpha=x) for x in (1e-4, 5e-3)]
    for a in untimed:
        row = _row(a.setting, 100.0, dear)
        row[gp.C_COMPUTE] = 0
        a.observe(row)
    loose, tight = (a.decide(1, 2) for a in untimed)
    priors = [a.prior for a in untimed]
    assert priors[0] is not None and priors[1] is not None and priors[0].alpha_sync == 1e-4
    assert priors[1].alpha_sync == pytest.approx(0.9 * float(dear.t_iter(32, 0, 2)))  # capped: 90% of the step
    assert tight.batch > loose.batch


def test_a_computation_that_batches_well_is_fitted_as_a_curve_once_three_sizes_are_measured() -> None:
    # a CNN-like job: time per example falls as m grows (p = 0.6); a line through the first two sizes
    # overprices the large batches, the curve fitted from three does not, and the choice becomes the true one
    curve = Throughput(alpha_grad=1e-3, beta_grad=1e-3, alpha_sync=2e-3, power=0.6)
    agent = _agent(rule="sqrt")
    out = []
    for _ in range(2):
        (st,) = _run(agent, [100.0], curve)
        out.append((st.batch, agent.model.power))
    assert [p for _, p in out] == [1.0, 1.0]  # one size measured, then two: linear
    sizes = {64, out[0][0], out[1][0]}
    assert len(sizes) == 3
    later = _run(agent, [100.0] * 3, curve)
    assert agent.model.power == pytest.approx(0.6, abs=1e-3)
    want = best_config(curve, later[-1].phi, 64, 2, 32 * 64, 4096, rule="sqrt")
    assert later[-1].batch == pytest.approx(want.batch, rel=0.05), (later[-1], want)
    assert later[-1].batch > 2 * out[1][0]  # the line's choice was well short of it


def test_no_statistics_keeps_the_setting_and_a_fixed_agent_scales_only_the_lr() -> None:
    a = _agent()
    empty = _row(a.setting, 1.0, TRUE)
    empty[[gp.C_STEPS, gp.C_SQNORM, gp.C_TRACE]] = 0  # φ not measured yet
    a.observe(empty)
    assert a.decide(1, 2) == gp.Setting(1, 32, 0, 2, 1.0)
    fixed = gp.Agent(from_dict(gp.GoodputArgs, {"adapt": False, "smoothing": 0.5}, "g"), m0=64, workers=2,
                     m_start=256)
    st = _run(fixed, [100.0, 300.0])
    phi = st[1].phi
    assert [s.m for s in st] == [256, 256] and phi == pytest.approx(300.0)  # smoothing 0.5: the last interval
    assert st[1].gain == pytest.approx(8 * (phi + 64) / (phi + 512)) and math.isfinite(phi)


def test_the_fit_takes_each_configurations_median_interval() -> None:
    """An interval slowed 10x by the machine's other load, among three of one (m, s), leaves the fit
    where the other two put it."""
    steady, spiked = _agent(), _agent()
    for a, slow in ((steady, 1.0), (spiked, 10.0)):
        for i, factor in enumerate((1.0, slow, 1.0)):
            row = _row(a.setting, 100.0, TRUE)
            row[[gp.C_SECONDS, gp.C_COMPUTE]] *= factor
            a.observe(row)
            a.setting = gp.Setting(i + 1, 32, 0, 2, 1.0)  # the same (m, s) three intervals running
    assert spiked._fit() == steady._fit()


def test_workers_that_ran_another_setting_are_an_error() -> None:
    a = _agent()
    wrong = _row(gp.Setting(0, 48, 0, 2, 1.0), 100.0, TRUE)
    with pytest.raises(ValueError, match="the workers disagree"):
        a.observe(wrong)


def _two_agents() -> tuple[InProcessTable, gp.GoodputArgs, list[gp.WorkerAgent]]:
    """Two workers' agents through one goodput table (5 clocks an interval)."""
    table = InProcessTable("goodput", 4, gp.COLS, "float64", staleness=0)
    args = from_dict(gp.GoodputArgs, {"interval_clocks": 5, "smoothing": 0.5}, "goodput")
    return table, args, [gp.WorkerAgent(table, args, gp.Agent(args, 64, 2, 32)) for _ in range(2)]


def test_two_workers_through_one_table_switch_at_the_same_iteration() -> None:
    table, args, ws = _two_agents()
    rng = np.random.default_rng(0)
    seen: list[list[tuple[int, int, float]]] = [[], []]
    for it in range(15):
        for r, w in enumerate(ws):  # lockstep: each iteration every worker, then the clock
            st = w.at(it, it * 0.01 + r * 1e-4, 2)
            seen[r].append((st.m, st.s, st.gain))
            g = rng.normal(1.0, 3.0, (2, 10))
            w.rec.moments(g, st.m // 2)
            w.before_clock(it)
    assert seen[0] == seen[1]
    assert len({x for x in seen[0][:5]}) == 1 and seen[0][5] != seen[0][0]  # switched at iteration 5
    assert table.data[0, gp.C_WORKERS] == 2 and table.data[0, gp.C_TIMED] == 2 * 3  # steps 1-3 timed


def test_a_new_worker_count_re_picks_at_once_and_a_joiner_replays_the_same_agent() -> None:
    """Two workers, a third joins at iteration 13 (mid-interval): from there all three run the same
    setting, re-picked for K = 3 at 13 by the old workers and rebuilt from the rows by the joiner (its
    agent made as any worker's, for the launched 2); the mixed interval's timings are not a sample.
    It leaves at 23 (mid-interval too), handing its sums of iterations 20-22 to worker 1 with its
    tasks: interval 4's row holds every step measured in it, and the two left agree on the count 2."""
    table = InProcessTable("goodput", 6, gp.COLS, "float64", staleness=0)
    args = from_dict(gp.GoodputArgs, {"interval_clocks": 5, "smoothing": 0.5}, "goodput")
    ws = [gp.WorkerAgent(table, args, gp.Agent(args, 64, 2, 32)) for _ in range(2)]
    rng = np.random.default_rng(0)
    seen: dict[int, list[tuple[int, int, int, float]]] = {}
    for it in range(30):
        if it == 13:
            ws.append(gp.WorkerAgent(table, args, gp.Agent(args, 64, 2, 32)))
        if it == 23:
            assert ws[2].agent.noise.phi == ws[0].agent.noise.phi  # the joiner's agent is every worker's
            ws[1].take_over(ws.pop().hand_over())
        for r, w in enumerate(ws):
            st = w.at(it, it * 0.01 + r * 1e-4, len(ws))
            seen.setdefault(it, []).append((st.m, st.s, st.workers, st.gain))
            w.rec.moments(rng.normal(1.0, 3.0, (2, 10)), st.m // 2)
            w.before_clock(it)
    assert all(len(set(v)) == 1 for v in seen.values()), seen
    assert seen[12][0][2] == 2 and seen[13][0][2] == 3 and seen[13][0][:2] != seen[12][0][:2]
    assert table.data[2, gp.C_WORKERS] == 3 and table.data[3, gp.C_WORKERS] == 3
    assert [k for _, _, k, _ in ws[0].agent.obs] == [2, 2, 3]  # interval 2 (K 2 and 3) is not a sample
    assert seen[22][0][2] == 3 and seen[23][0][2] == 2
    # interval 4 (20-24): 5 steps measured by each of the two and 3 by the leaver; steps timed: 22 (K 3)
    # by all three, 24 (K 2) by the two (21 follows the interval's first, 23 crosses the change)
    row = table.data[4]
    assert (row[gp.C_STEPS], row[gp.C_WORKERS], row[gp.C_TIMED], row[gp.C_K]) == (13, 2, 5, 13), row
    assert ws[0].agent.noise.phi == ws[1].agent.noise.phi and len(ws[0].agent.obs) == 3  # nor is interval 4
    with pytest.raises(ValueError, match="hand-over has shape"):
        ws[0].take_over(np.zeros(3))


def test_a_replacement_catching_up_gets_each_skipped_iterations_setting_and_times_no_step() -> None:
    """Worker 1 is lost after iteration 11 and replaced from a checkpoint at 5: its fresh agent, told of
    iterations 5-11 it clocks past without a gradient (``skipped``), gives the settings its lost agent
    had there (what the synchronous path draws and drops), then runs as the other from 12; neither
    the catch-up nor the step across it is timed (interval 2 times 12-14 of worker 0, 13-14 of it)."""
    table, args, ws = _two_agents()
    rng = np.random.default_rng(0)
    seen: list[list[tuple[int, int, float]]] = [[], []]
    for it in range(15):
        if it == 12:
            ws[1] = gp.WorkerAgent(table, args, gp.Agent(args, 64, 2, 32))
            skipped = [ws[1].skipped(i, 2) for i in range(5, 12)]
            assert [(st.m, st.s, st.gain) for st in skipped] == seen[1][5:12]
        for r, w in enumerate(ws):
            st = w.at(it, it * 0.01 + r * 1e-4, 2)
            seen[r].append((st.m, st.s, st.gain))
            w.rec.moments(rng.normal(1.0, 3.0, (2, 10)), st.m // 2)
            w.before_clock(it)
    assert seen[0] == seen[1] and seen[0][5] != seen[0][0]  # one setting a step; switched at 5
    assert table.data[2, gp.C_TIMED] == 3 + 2


@pytest.mark.parametrize(("args", "match"), [
    ({"goodput": {"intervals": 5}}, "app.args.goodput.intervals: unknown key"),
    ({"goodput": {"interval_clocks": 2}}, "app.args.goodput.interval_clocks: must be an integer >= 3"),
    ({"goodput": {"rule": "lars"}}, "app.args.goodput.rule: 'lars' is not one of"),
    ({"goodput": {"interval_clocks": 20}, "eval_every": 10}, "app.args.eval_every: with goodput, a multiple"),
])
def test_bad_goodput_args_name_the_key(args: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        from_dict(MLRArgs, args, "app.args")


def test_goodput_on_an_ssp_table_says_it_needs_a_synchronous_one() -> None:
    client = InProcessClient(InProcessTable("W", 10, 65, "float64"))
    with pytest.raises(ValueError, match="needs a synchronous table"):
        train(client, {"data": "digits", "epochs": 1, "goodput": {}, "eval_every": 0})


@pytest.mark.slow
def test_launched_job_switches_every_worker_at_a_boundary_and_reaches_its_target(tmp_path: Path) -> None:
    from bosen.jobs.job import run_job

    every, iters = 10, 120
    run = run_job(REPO / "configs" / "mlr-goodput.yaml", tmp_path / "run", timeout=90, cwd=REPO,
                  sets={"app.args.epochs": iters, "app.args.eval_every": every,
                        "app.args.goodput.interval_clocks": every}).check()
    steps = [r for r in run.kind("worker") if "iteration" in r]
    by_it: dict[int, set[tuple[int, int, float]]] = {}
    for r in steps:
        by_it.setdefault(r["iteration"], set()).add((r["m"], r["s"], r["lr_gain"]))
    assert sorted(by_it) == list(range(iters))
    assert all(len(v) == 1 for v in by_it.values()), "workers ran different settings in one iteration"
    per = [next(iter(by_it[i])) for i in range(iters)]
    changes = [i for i in range(1, iters) if per[i] != per[i - 1]]
    assert changes and all(i % every == 0 for i in changes), changes  # only at interval boundaries
    chosen = [r for r in steps if r.get("rank") == 0 and "goodput_batch" in r]
    assert [r["goodput_interval"] for r in chosen] == list(range(iters // every))
    assert max(r["goodput_batch"] for r in chosen) > 64 and min(r["goodput_batch"] for r in chosen) >= 64
    last = max((r for r in steps if "heldout_correct" in r), key=lambda r: r["iteration"])
    assert last["heldout_correct"] / last["heldout_total"] >= 0.9, last  # digits' target
