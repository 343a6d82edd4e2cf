"""Worker state in checkpoints (apps/state.py): the generator's words, and MF / MLR jobs resumed
through ``bosen launch --resume`` continuing their curves exactly (LDA's: tests/apps/test_lda.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO
from resume import whole_and_resumed

from bosen.apps.state import restored, rng_state, set_rng_state
from bosen.errors import BosenError


def test_rng_state_round_trips() -> None:
    rng = np.random.default_rng([3, 1])
    rng.random(7)
    words = rng_state(rng)
    ahead = rng.random(5)
    other = np.random.default_rng(99)
    set_rng_state(other, words)
    np.testing.assert_array_equal(other.random(5), ahead)


def test_restored_names_what_is_missing() -> None:
    assert restored(None, ("tick",)) is None
    with pytest.raises(BosenError, match="no worker state 'rng'.*holds: tick"):
        restored({"tick": np.array([3])}, ("tick", "rng"))


JOBS = {
    "mf": {"tables": {"L": {"rows": 400, "cols": 8, "init": {"normal": 0.1, "seed": 1}},
                      "R": {"rows": 100, "cols": 8, "init": {"normal": 0.1, "seed": 2}}},
           "app": {"module": "bosen.apps.mf", "args": {"nnz": 8000, "epochs": 9, "batches_per_clock": 3}}},
    "mlr": {"tables": {"W": {"rows": 10, "cols": 65, "init": {"zeros": True}}},
            "app": {"module": "bosen.apps.mlr", "args": {"data": "digits", "epochs": 4, "clocks_per_epoch": 2,
                                                          "batches_per_clock": 2, "eval_every": 1}}},
}


def _clocks(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [x for x in lines if x.get("kind") == "clock"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("app", sorted(JOBS))
@pytest.mark.slow
def test_resumed_job_continues_the_curve_exactly(tmp_path: Path, app: str) -> None:
    """One worker at staleness 0: stopped after its checkpoint at clock 3 and resumed, the job reports
    the objective and held-out measure of the job that ran through, to float32 rounding (the client's
    cache, which the resumed job reads from the servers, sums a clock's increments in another order
    than the servers do; int tables resume bit for bit, tests/apps/test_lda.py)."""
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 1}, "consistency": {"staleness": 0},
           "checkpoint": {"every_clocks": 3}, **JOBS[app]}  # one server: the worker's state is the point
    da, db = whole_and_resumed(cfg, tmp_path, 3, 1, 1)
    keys = ("clock", "objective", "heldout_rmse", "heldout_accuracy")
    a = [{k: x.get(k) for k in keys} for x in _clocks(da)]
    b = [{k: x.get(k) for k in keys} for x in _clocks(db)]
    assert [x["clock"] for x in b] == [x["clock"] for x in a]
    for x, y in zip(b, a, strict=True):
        for k in keys[1:]:
            assert x[k] == (None if y[k] is None else pytest.approx(y[k], rel=1e-6)), (x, y)


@pytest.mark.timeout(200)
def test_resumed_pytorch_job_goes_on_from_its_step(tmp_path: Path) -> None:
    """The CNN example (PSModule.resume: the step count in the worker's part; parameters from the
    tables): stopped after its checkpoint at clock 8 (32 steps, mid-epoch) and resumed, it reports the
    clocks of the job that ran through, its training loss within 0.2% (float32 rounding differences,
    grown over ~30 SGD steps)."""
    from bosen.apps.datasets import images

    if not images.FASHION_DIR.is_dir():
        pytest.skip(f"{images.FASHION_DIR} missing: {images.FASHION_INSTALL}")
    cfg = yaml.safe_load((REPO / "configs" / "torch-cnn.yaml").read_text())
    cfg["cluster"] = {"servers": ["127.0.0.1:0"], "workers": 1}  # one server: the step count is the point
    cfg["consistency"]["staleness"] = 0
    cfg["app"]["args"].update(train_samples=4000, test_samples=500, epochs=1)  # 62 steps per epoch
    cfg["checkpoint"] = {"every_clocks": 4}
    da, db = whole_and_resumed(cfg, tmp_path, 8, 1, 1)
    a, b = _clocks(da), _clocks(db)
    # a record per clock (4 steps of its one micro-task; the epoch's last clock has the 2 steps left):
    # 16 clocks, the first 8 kept from before the stop, the rest reported by the resumed job
    assert [x["clock"] for x in b] == [x["clock"] for x in a] == list(range(16))
    assert [x["samples"] for x in b] == [x["samples"] for x in a] == [4 * 64] * 15 + [2 * 64]
    # the loss of the clocks after the resume (each clock's sum, as the per-epoch record was)
    assert sum(x["objective"] for x in b[8:]) == pytest.approx(sum(x["objective"] for x in a[8:]), rel=2e-3)
    ends_a, ends_b = [x for x in a if "heldout_correct" in x], [x for x in b if "heldout_correct" in x]
    assert len(ends_a) == len(ends_b) == 1  # rank 0 scores the epoch's end
    assert abs(ends_b[-1]["heldout_correct"] - ends_a[-1]["heldout_correct"]) <= 5
