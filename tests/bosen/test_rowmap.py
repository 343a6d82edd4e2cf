"""The sparse tables' row id -> slot map, against a dict and on ids chosen to collide."""

import numpy as np
import pytest

from bosen.rowmap import RowMap

MAX = 2**63 - 1


def test_extreme_ids_get_slots_in_order_of_first_insertion():
    m = RowMap()
    slots, before = m.insert(np.array([0, MAX, 0, 5, MAX], dtype=np.int64))
    assert before == 0 and slots.tolist() == [0, 1, 0, 2, 1]
    assert m.ids.tolist() == [0, MAX, 5] and len(m) == 3
    assert m.lookup(np.array([MAX, 1, 0, 5, MAX - 1], dtype=np.int64)).tolist() == [1, -1, 0, 2, -1]


def test_ids_congruent_modulo_the_table_size_and_growth_by_rehash():
    m = RowMap()
    keys = np.arange(20_000, dtype=np.int64) * 1024 + 3  # all equal modulo any table size up to 1024
    slots, before = m.insert(keys)
    assert before == 0 and np.array_equal(slots, np.arange(keys.shape[0]))
    assert np.array_equal(m.lookup(keys[::-1]), slots[::-1])
    again, before = m.insert(keys[::7])
    assert before == len(m) == keys.shape[0] and np.array_equal(again, slots[::7])
    assert m.nbytes < keys.shape[0] * 20  # int32 slots at load >= 0.375, ids once


def test_against_a_dict():
    rng = np.random.default_rng(7)
    m, ref = RowMap(), {}
    for step in range(200):
        # small ranges repeat ids, huge ones spread them; some batches hold duplicates
        hi = [50, 5000, MAX][step % 3]
        keys = rng.integers(0, hi, size=int(rng.integers(0, 300)), dtype=np.int64)
        if step % 2:
            before = len(ref)
            slots, got_before = m.insert(keys)
            for k in keys.tolist():
                ref.setdefault(k, len(ref))
            assert got_before == before
            assert slots.tolist() == [ref[k] for k in keys.tolist()]
        else:
            assert m.lookup(keys).tolist() == [ref.get(k, -1) for k in keys.tolist()]
        assert len(m) == len(ref)
    assert m.ids.tolist() == list(ref)


def test_find_counts_the_absent_and_fill_inserts_only_those():
    m = RowMap()
    m.insert(np.array([5, 9], dtype=np.int64))
    keys = np.array([9, 2**40, 5, 2**40, 3], dtype=np.int64)
    slots, missing = m.find(keys)
    assert missing == 3 and slots.tolist() == [1, -1, 0, -1, -1]
    out, before = m.fill(keys, slots)
    assert out is slots and before == 2 and slots.tolist() == [1, 2, 0, 2, 3]
    assert m.ids.tolist() == [5, 9, 2**40, 3]
    assert m.find(keys)[1] == 0


def test_of_restores_slots_and_refuses_repeats():
    ids = np.array([9, 2**40, 0], dtype=np.int64)
    m = RowMap.of(ids)
    assert m.lookup(ids).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="distinct"):
        RowMap.of(np.array([1, 1], dtype=np.int64))


def test_bad_ids_are_named():
    m = RowMap()
    with pytest.raises(ValueError, match=">= 0, got -3"):
        m.insert(np.array([1, -3], dtype=np.int64))
    with pytest.raises(ValueError, match="< 2\\*\\*63"):
        m.insert(np.array([2**63], dtype=np.uint64))
    with pytest.raises(ValueError, match="1-d integer array"):
        m.lookup(np.array([1.5]))
    assert len(m) == 0
