"""bosen.scheduling: Pollux's cluster policy (SPEEDUP over the fair share, FITNESS_p, the re-allocation
penalty) and its exact search against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bosen.goodput import Throughput, best_config
from bosen.scheduling import (
    EPSILON,
    Job,
    allocate,
    fair_share,
    fitness,
    goodput_curve,
    realloc_factor,
    runnable,
    service_level,
    speedups,
)

# computation only (no sync): K workers are K times one (perfect scaling at a fixed per-worker batch)
LINEAR = Throughput(alpha_grad=1e-3, beta_grad=1e-5, alpha_sync=0.0)
# a push and pull of 5 ms a step that more workers do not shrink: scales worse
FLAT = Throughput(alpha_grad=1e-3, beta_grad=1e-5, alpha_sync=5e-3)


def job(model: Throughput = LINEAR, **kw: object) -> Job:
    args: dict[str, object] = {"throughput": model, "phi": 1e9, "m0": 64, "max_batch": 64 * 32, "max_local": 256,
                               "age": 600.0}
    args.update(kw)
    return Job(**args)  # type: ignore[arg-type]


def brute(jobs: list[Job], slots: int, p: float, delay: float) -> tuple[tuple[int, ...], float]:
    """Every allocation: the best fitness (penalised), the fewest workers among equals."""
    best: tuple[float, int, tuple[int, ...]] = (-np.inf, 0, ())
    tables = []
    for j in jobs:
        sp = speedups(j, max(slots, 1), len(jobs))
        f = realloc_factor(j.age, j.reallocations, delay)
        tables.append([sp[k] if k == j.workers else sp[k] * f for k in range(slots + 1)])
    ranges = []
    for j in jobs:
        top = slots if j.max_workers is None else min(slots, j.max_workers)
        ranges.append([0] + list(range(j.min_workers, top + 1)))
    for ks in itertools.product(*ranges):
        if sum(ks) > slots:
            continue
        fit = fitness([tables[i][k] for i, k in enumerate(ks)], p)
        if fit > best[0] * (1 + 1e-9) + 1e-300 or (abs(fit - best[0]) <= 1e-9 * abs(fit) and sum(ks) < best[1]):
            best = (fit, sum(ks), tuple(ks))
    return best[2], best[0]


def test_goodput_curve_is_best_config_at_every_worker_count() -> None:
    model = Throughput(alpha_grad=2e-4, beta_grad=3e-6, alpha_sync=1e-3, beta_sync=5e-4, gamma=1.5)
    j = job(model, phi=800.0, max_local=128)
    curve = goodput_curve(j, 8)
    assert curve[0] == 0.0
    for k in range(1, 9):
        assert curve[k] == pytest.approx(best_config(model, 800.0, 64, k, 64 * 32, 128).goodput, rel=1e-12)
    fixed = goodput_curve(job(model, phi=800.0, adaptive=False), 4)
    for k in range(1, 5):  # M0 only: m = 64/K, efficiency 1 up to the rounding
        assert fixed[k] == pytest.approx(float(model.throughput(int(np.ceil(64 / k)), 0, k)) *
                                         (800 + 64) / (800 + k * int(np.ceil(64 / k))), rel=1e-12)


def test_speedup_is_one_at_the_fair_share_and_linear_where_computation_is_all() -> None:
    assert fair_share(16, 3) == 6 and fair_share(4, 8) == 1
    sp = speedups(job(adaptive=False, m0=1024, max_batch=1024, max_local=1024), 8, 4)  # K_fair = 2
    assert sp[0] == 0.0 and sp[2] == pytest.approx(1.0)
    # M = 1024 at m = 1024/K: T_iter = α + β·1024/K against the fair share's α + β·512
    for k in (1, 4, 8):
        t_k = 1e-3 + 1e-5 * 1024 / k
        assert sp[k] == pytest.approx((1e-3 + 1e-5 * 512) / t_k / 1.0, rel=1e-9)


def test_fitness_and_penalty_known_values() -> None:
    assert fitness([1.0, 1.0], -1) == pytest.approx(1 + EPSILON)
    assert fitness([1.0, 3.0], 1) == pytest.approx(2 + EPSILON)
    assert fitness([1.0, 3.0], -1) == pytest.approx(2 / (1 / (1 + EPSILON) + 1 / (3 + EPSILON)))
    assert fitness([0.0, 4.0], -1) < 2 * EPSILON  # a pending job drags p = -1 to near 0
    assert fitness([1.0, 4.0], 0) == pytest.approx(np.sqrt((1 + EPSILON) * (4 + EPSILON)))
    assert realloc_factor(600.0, 0, 30.0) == pytest.approx(600 / 630)
    assert realloc_factor(600.0, 4, 30.0) == pytest.approx(480 / 630)
    assert realloc_factor(100.0, 10, 30.0) == 0.0
    with pytest.raises(ValueError, match="speed-up"):
        fitness([], -1)


def test_identical_jobs_split_evenly_and_every_job_runs_under_p_minus_one() -> None:
    a = allocate([job(), job()], 8)
    assert a.workers == (4, 4)
    assert a.speedups == pytest.approx((1.0, 1.0))
    many = allocate([job() for _ in range(5)], 4)  # more jobs than slots: all slots out, one pending
    assert many.workers == (1, 1, 1, 1, 0)  # a tie: the earlier jobs run (the caller's order is priority)


def test_p_one_favours_the_job_that_scales_and_p_minus_one_evens_the_speedups() -> None:
    jobs = [job(LINEAR, adaptive=False, m0=1024, max_batch=1024, max_local=1024),
            job(FLAT, adaptive=False, m0=1024, max_batch=1024, max_local=1024)]
    mean = allocate(jobs, 8, p=1)
    fair = allocate(jobs, 8, p=-1)
    assert mean.workers == (6, 2) and fair.workers == (5, 3)  # checked against brute force below
    assert max(fair.speedups) / min(fair.speedups) < max(mean.speedups) / min(mean.speedups)
    assert mean.fitness >= fitness(fair.speedups, 1) and fair.fitness >= fitness(mean.speedups, -1)


def test_a_job_moved_often_stays_put_unless_the_gain_pays() -> None:
    # two identical jobs at 3 and 5 of 8: an even split is better by a little
    young = [job(workers=3, age=120.0, reallocations=3), job(workers=5, age=120.0, reallocations=3)]
    assert allocate(young, 8, delay=0.0).workers == (4, 4)
    assert allocate(young, 8, delay=30.0).workers == (3, 5)  # factor (120 - 90)/150 = 0.2: not worth it
    old = [job(workers=3, age=36000.0), job(workers=5, age=36000.0)]
    assert allocate(old, 8, delay=30.0).workers == (4, 4)


def test_min_and_max_workers_hold() -> None:
    a = allocate([job(max_workers=2), job(min_workers=3), job()], 12)
    assert a.workers[0] <= 2 and a.workers[1] >= 3 and sum(a.workers) <= 12
    b = allocate([job(min_workers=5), job(min_workers=5)], 8)  # both cannot run: one waits
    assert sorted(b.workers) == [0, 8]


@pytest.mark.parametrize("seed", range(12))
def test_exact_search_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    jobs = []
    for _ in range(int(rng.integers(2, 5))):
        model = Throughput(alpha_grad=float(rng.uniform(1e-4, 2e-3)), beta_grad=float(rng.uniform(1e-7, 1e-5)),
                           alpha_sync=float(rng.uniform(0, 2e-3)), beta_sync=float(rng.uniform(0, 1e-3)),
                           gamma=float(rng.uniform(1, 4)))
        mn = int(rng.integers(1, 3))
        jobs.append(Job(model, phi=float(rng.uniform(10, 5000)), m0=int(rng.choice([32, 64, 128])),
                        max_batch=4096, max_local=int(rng.choice([64, 512])), workers=int(rng.integers(0, 4)),
                        age=float(rng.uniform(0, 3000)), reallocations=int(rng.integers(0, 5)), min_workers=mn,
                        max_workers=None if rng.random() < 0.5 else mn + int(rng.integers(0, 4)),
                        adaptive=bool(rng.random() < 0.7)))
    slots = int(rng.integers(1, 9))
    for p in (-1.0, 1.0):
        got = allocate(jobs, slots, p=p, delay=30.0, overload="paper")
        want, fit = brute(jobs, slots, p, 30.0)
        assert got.fitness == pytest.approx(fit, rel=1e-9), (got, want)
        assert sum(got.workers) <= slots


def test_overload_runs_the_least_attained_service_where_the_paper_keeps_the_running_jobs() -> None:
    # three identical jobs, two slots: every SPEEDUP(1) is 1, so only the penalty tells them apart
    a = job(workers=1, attained=3600.0)  # δ = 6 s: levels from 600 worker-s, 3600 is level 3
    b = job(workers=1, attained=700.0)  # level 1
    c = job(workers=0, attained=0.0)  # just arrived: level 0
    assert allocate([a, b, c], 2, delay=6.0, overload="paper").workers == (1, 1, 0)  # first come, first served
    for p in (-1.0, 1.0):
        assert allocate([a, b, c], 2, p=p, delay=6.0).workers == (0, 1, 1)  # the longest-served waits
    # within a level the running job keeps its slot (no churn); with free moves (δ = 0) plain LAS
    held = job(workers=1, attained=1000.0)
    waiting = job(workers=0, attained=650.0)
    assert service_level(1000.0, 600.0) == service_level(650.0, 600.0) == 1.0
    assert allocate([waiting, held], 1, delay=6.0).workers == (0, 1)
    assert allocate([waiting, held], 1, delay=0.0).workers == (1, 0)
    # a job whose minimum does not fit is skipped, the next runs; what is left over goes by FITNESS_p
    wide = job(workers=0, min_workers=3)
    assert runnable([c, wide, job(workers=0, attained=10.0)], 3, 6.0) == [True, False, True]
    assert sum(allocate([c, wide, job(workers=0, attained=10.0)], 3, delay=6.0).workers) == 3
    # not overloaded: the tie-break changes nothing
    fits = [job(LINEAR, workers=2, attained=5000.0), job(FLAT, workers=0), job(workers=1, attained=50.0)]
    assert runnable(fits, 8, 6.0) is None
    assert allocate(fits, 8, delay=6.0).workers == allocate(fits, 8, delay=6.0, overload="paper").workers


def test_bad_input_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        job(max_batch=10)
    with pytest.raises(ValueError, match="min_workers"):
        job(min_workers=3, max_workers=2)
    with pytest.raises(ValueError, match="slots"):
        allocate([job()], -1)
    with pytest.raises(ValueError, match="phi"):
        job(phi=float("nan"))
    assert allocate([], 4).workers == ()
    with pytest.raises(ValueError, match="overload"):
        allocate([job()], 4, overload="fifo")
    with pytest.raises(ValueError, match="attained"):
        job(attained=-1.0)
