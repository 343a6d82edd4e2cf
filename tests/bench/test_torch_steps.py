"""bench.torch.steps (issue 31: hybrid mode beside DDP, ResNet-18's step split): a short run of both
cases, and what its records say."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.common import REPO, repo_env


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_short_run_times_every_system_and_splits_the_ps_steps():
    out = subprocess.run([sys.executable, "-m", "bench.torch.steps", "--quick", "--steps", "2", "--warm", "1",
                          "--batch", "2"], cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=280,
                         check=True)
    recs = {r["case"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(recs) == {"hybrid-vs-ddp", "split/ps", "split/ps-overlap"}
    h = recs["hybrid-vs-ddp"]
    assert h["workers"] == 2 and h["hybrid"][0]["allreduce_s"] > 0 and h["ratio"]["median"] > 0
    for case in ("split/ps", "split/ps-overlap"):
        r = recs[case]
        assert r["params"] == 11_173_962 and r["local_step_s"] > 0
        split = r["split"]
        assert split["push_s"] > 0 and split["pull_s"] >= 0
        # compute is the rest of the step
        assert split["compute_s"] <= r["step_s"] + 1e-9
