"""bosen/backup.py (k_t: the round-trip estimator of eq. 17, the gains of eq. 16, the three modes) and
the ``backup`` table key's checks."""

from __future__ import annotations

import numpy as np
import pytest

from bosen.backup import BackupPolicy, RoundTrips, gains, isotonic_grid
from bosen.config import BackupConfig, from_dict, load
from bosen.errors import ConfigError
from bosen.gradstats import Moments


def _feasible(x: np.ndarray) -> bool:
    eps = 1e-9
    return bool((np.diff(x, axis=1) >= -eps).all() and (np.diff(x, axis=0) <= eps).all()
                and (np.diff(np.diag(x)) >= -eps).all())


def test_isotonic_grid_keeps_feasible_means_and_fixes_the_rest() -> None:
    n = 5
    h, i = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    y = 1.0 + i - 0.1 * h  # rising with arrival rank, falling with idle workers, rising on the diagonal
    w = np.random.default_rng(0).uniform(1, 5, (n, n))
    assert np.allclose(isotonic_grid(y, w, 300), y)
    noisy = y + np.random.default_rng(1).normal(0, 1.0, (n, n))
    x = isotonic_grid(noisy, w, 300)
    assert _feasible(x)
    assert ((x - noisy) ** 2 * w).sum() <= ((y - noisy) ** 2 * w).sum() + 1e-9  # y is feasible too


def test_round_trips_estimate_unobserved_k_from_their_column() -> None:
    rt = RoundTrips(4, memory=1.0)
    assert not rt.observed
    for _ in range(3):
        for rank, dt in enumerate((1.0, 2.0, 3.0, 4.0), start=1):
            rt.add(4, rank, dt)  # only k_{t-1} = 4 seen (the warm-up)
    T = rt.expected()
    assert np.isfinite(T).all() and _feasible(rt.grid())
    assert T == pytest.approx([1.0, 2.0, 3.0, 4.0], rel=1e-3)
    rt.add(9, 1, 5.0)  # out of the grid: ignored
    assert rt.counts.sum() == 12


def test_memory_fades_old_samples() -> None:
    rt = RoundTrips(2, memory=0.5)
    rt.add(2, 2, 1.0)
    rt.age()
    rt.add(2, 2, 4.0)
    assert rt.grid()[1, 1] == pytest.approx((0.5 * 1.0 + 4.0) / 1.5)


def _policy(mode: str, n: int = 4, **kw) -> BackupPolicy:
    return BackupPolicy(BackupConfig(mode=mode, lr=0.5, window=3, **kw), n)


def _feed(p: BackupPolicy, times: list[float], m: Moments, cross: float, steps: int = 4) -> None:
    for _ in range(steps):
        for rank, dt in enumerate(times, start=1):
            p.rtt.add(p.n, rank, dt)
        p.observe(m, cross)


def test_static_takes_k_and_the_proportional_rate() -> None:
    p = _policy("static", k=3)
    assert p.choose(4) == 3 and p.choose(2) == 2  # never more than the workers left
    assert p.lr(3) == pytest.approx(0.5 * 3 / 4)
    with pytest.raises(ValueError, match="k: 5 gradients per step, but the job has 4 workers"):
        BackupPolicy(BackupConfig(mode="static", k=5), 4)


def test_blind_maximizes_gradients_per_time() -> None:
    p = _policy("blind")
    assert p.choose(4) == 4  # nothing measured yet: everyone
    _feed(p, [1.0, 1.1, 1.2, 10.0], Moments(4, 1.0, 0.5), 0.4)
    assert p.choose(4) == 3 and p.lr(3) == 0.5


def test_dynamic_waits_for_all_when_noise_is_small_and_times_equal() -> None:
    p = _policy("dynamic")
    assert p.choose(4) == 4  # warm-up
    # |grad|^2 = 1, variance 0.4: every gain positive and growing with k; equal times -> k = n
    _feed(p, [1.0, 1.0, 1.0, 1.0], Moments(4, 1.1, 1.0 + 0.1 * 0), 0.9)
    assert p.choose(4) == 4


def test_dynamic_drops_the_slow_half_when_their_time_outweighs_the_gain() -> None:
    p = _policy("dynamic")
    _feed(p, [1.0, 1.0, 5.0, 5.0], Moments(4, 1.1, 1.0), 0.9)
    assert p.choose(4) == 2
    assert p.choose(1) == 1


def test_a_snapshot_restores_what_k_depends_on() -> None:
    p = _policy("dynamic")
    _feed(p, [1.0, 1.0, 5.0, 5.0], Moments(4, 1.1, 1.0), 0.9)
    q = _policy("dynamic")
    q.restore({k: v.copy() for k, v in p.snapshot().items()})
    assert q.choose(4) == p.choose(4) == 2
    assert q.state() == p.state() and q._prev == p._prev
    np.testing.assert_array_equal(q.rtt.grid(), p.rtt.grid())
    other = BackupPolicy(BackupConfig(mode="dynamic", lr=0.5), 6)  # another worker count: the grid does not fit
    with pytest.raises(ValueError, match="round-trip samples of shape \\(4, 4\\).*6 workers"):
        other.restore(p.snapshot())
    assert other.state() == p.state() and not other.rtt.observed  # the windows came back, the grid did not


def test_dynamic_takes_everyone_when_every_gain_is_negative() -> None:
    p = _policy("dynamic")
    # huge curvature: L*lr/2 > 1, so every gain is negative -> k = n (eq. 18)
    _feed(p, [1.0, 1.0, 5.0, 5.0], Moments(4, 1.1, 1.0), -100.0)
    assert p.smooth.mean() > 4 / 0.5
    assert (gains(0.5, p.smooth.mean(), p.sqnorm.mean(), p.variance.mean(), 4) < 0).all()
    assert p.choose(4) == 4


@pytest.mark.parametrize(("table", "message"), [
    ({"backup": {"mode": "static"}}, "tables.W.backup.k: mode static needs k"),
    ({"backup": {"mode": "dynamic", "k": 2}}, "tables.W.backup.k: only mode static takes k"),
    ({"backup": {"mode": "static", "k": 0}}, "tables.W.backup.k: must be an integer >= 1"),
    ({"backup": {"mode": "fast"}}, "tables.W.backup.mode: 'fast' is not one of dynamic, static, blind"),
    ({"backup": {"lr": -1}}, "tables.W.backup.lr: must be > 0"),
    ({"backup": {"memory": 0}}, "tables.W.backup.memory: must be in (0, 1]"),
    ({"backup": {"window": 0}}, "tables.W.backup.window: must be an integer >= 1"),
    ({"backup": {"speed": 1}}, "tables.W.backup.speed: unknown key"),
    ({"backup": {}, "staleness": 2}, "tables.W.staleness: a backup table is synchronous"),
    ({"backup": {}, "update": "sgd"}, "tables.W.update: a backup table's servers take raw gradients"),
    ({"backup": {}, "dtype": "int64"}, "tables.W.dtype: a backup table needs a float dtype"),
    ({"backup": {}, "read_my_writes": True}, "tables.W.read_my_writes: a backup table's clients send gradients"),
])
def test_bad_backup_keys_are_named(tmp_path, table, message) -> None:
    path = tmp_path / "job.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"cluster": {"servers": ["127.0.0.1:9600"], "workers": 2},
                                    "tables": {"W": {"rows": 2, "cols": 3, "dtype": "float32", **table}}}))
    with pytest.raises(ConfigError) as e:
        load(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_a_backup_table_is_synchronous_and_pulled(tmp_path) -> None:
    import yaml

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"cluster": {"servers": ["127.0.0.1:9600"], "workers": 2},
                                    "consistency": {"staleness": 3},
                                    "tables": {"W": {"rows": 2, "cols": 3, "backup": {"mode": "blind"}}}}))
    cfg = load(path)
    table = cfg.table("W")
    assert table.backup == from_dict(BackupConfig, {"mode": "blind"}, "backup")
    assert table.backup.lr == 0.1 and table.backup.window == 20 and table.backup.memory == 0.9
    assert table.push is False and table.shows_own_writes is False and cfg.staleness_of(table) == 0


def test_gradients_of_a_backup_table_are_never_rounded_on_the_wire(tmp_path) -> None:
    import yaml

    path = tmp_path / "job.yaml"
    table = {"rows": 2, "cols": 3, "dtype": "float32", "backup": {}}
    path.write_text(yaml.safe_dump({"cluster": {"servers": ["127.0.0.1:9600"]},
                                    "comm": {"enabled": True, "wire_dtype": "float16"}, "tables": {"W": table}}))
    with pytest.raises(ConfigError, match="tables.W.backup: the table's gradients must travel unrounded"):
        load(path)
    path.write_text(yaml.safe_dump({"cluster": {"servers": ["127.0.0.1:9600"]},
                                    "tables": {"W": {**table, "wire_dtype": "bfloat16"}}}))
    with pytest.raises(ConfigError, match="tables.W.wire_dtype: a backup table's gradients travel unrounded"):
        load(path)
    path.write_text(yaml.safe_dump({"cluster": {"servers": ["127.0.0.1:9600"]}, "comm": {"enabled": True},
                                    "tables": {"W": table}}))
    assert load(path).table("W").backup is not None  # float32 on a float32 wire
