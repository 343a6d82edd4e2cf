"""The PyTorch examples' micro-task shards: the clock schedule and a shard's state (no processes)."""

from __future__ import annotations

import numpy as np
import pytest

from bosen.apps.pytorch.examples.shards import STATE, Schedule, Shard
from bosen.errors import ConfigError


def test_schedule_keeps_every_task_in_step_and_ends_each_epoch_on_a_clock():
    s = Schedule(1000, 3, 32, 4)  # shards of 333 or 334 samples: 10 steps each, in clocks of 4, 4, 2
    assert (s.steps, s.clocks) == (10, 3)
    assert [s.span(c) for c in range(6)] == [(0, 4), (4, 8), (8, 10), (10, 14), (14, 18), (18, 20)]
    with pytest.raises(ConfigError, match="100 training samples in 4 micro-tasks give a task no batch of 32"):
        Schedule(100, 4, 32, 2)


def test_a_shard_moved_mid_epoch_goes_on_as_one_that_stayed():
    s = Schedule(64, 2, 4, 2)  # 8 steps of 4 samples per epoch
    a, b = Shard(32, 7), Shard(32, 7)
    for step in range(12):  # a runs 12 steps here; b runs 5, moves (its state through npz-able arrays)
        got = a.batch(step, s)
        a.steps += 1
        if step < 5:
            assert a.peek(step, s) is not None or step == 0
            assert np.array_equal(b.batch(step, s), got)
            b.steps += 1
        if step == 4:
            st = {k: np.array(v) for k, v in b.state().items()}
            assert sorted(st) == sorted(STATE)
            b = Shard(32, 0)  # another worker's fresh shard, other seed: the state replaces it all
            b.load(st, 1, 5, "job.yaml")
        if step >= 5:
            assert np.array_equal(b.batch(step, s), got)
            b.steps += 1
    assert a.steps == b.steps == 12
    np.testing.assert_array_equal(a.state()["rng"], b.state()["rng"])
    assert sorted(np.concatenate([a.batch(k, s).numpy() for k in range(8, 16)]).tolist()) == list(range(32))
    assert a.peek(16, s) is None  # the next epoch's order is not drawn yet


def test_a_state_of_another_shape_or_step_is_named():
    st = Shard(32, 1).state()
    with pytest.raises(ConfigError, match="micro-task 3 was saved with 32 samples at step 0, this job gives it 30 "
                                          "at step 0"):
        Shard(30, 1).load(st, 3, 0, "job.yaml")
    with pytest.raises(ConfigError, match="at step 0, this job gives it 32 at step 4"):
        Shard(32, 1).load(st, 3, 4, "job.yaml")
