"""bench.pollux's real-jobs experiment (bench/pollux/jobs.py): its job configs are valid jobs that
`bosen scale` can move (checkpoints, micro-tasks that divide the slots), and differ only in size. The
experiment itself runs minutes of real jobs: docs/evaluation.md, "Pollux: real jobs under the scheduler"."""

from __future__ import annotations

from bench.pollux import jobs
from bosen import config as config_mod


def test_job_configs_are_checkpointed_microtask_jobs_of_the_asked_length() -> None:
    for kind in jobs.KINDS:
        cfg = config_mod.load(jobs.job_config(kind, 123))
        assert cfg.checkpoint is not None and cfg.app.args["epochs"] == 123
        assert all(jobs.MICRO_TASKS % k == 0 for k in (1, 2, 3, 4))
    small, large = (jobs.job_config(k, 1)["app"]["args"] for k in ("small", "large"))
    assert {k for k in small if small[k] != large[k]} == {"synthetic", "batch_size"}



def test_agent_job_configs_are_synchronous_jobs_with_a_goodput_agent_that_can_scale() -> None:
    from bosen.config import follows_workers

    for kind in jobs.AGENT_KINDS:
        for workers in (1, 2):
            cfg = config_mod.load(jobs.job_config(kind, 400, agent=True, workers=workers))
            W = cfg.table("W")
            assert W.backup is not None and follows_workers(W.backup, workers) and cfg.checkpoint is not None
            assert cfg.table("goodput").rows * jobs.AGENT_INTERVAL > 400 and cfg.app.args["epochs"] == 400
            assert cfg.app.args["goodput"]["m0"] == jobs.AGENT_M0 == workers * cfg.app.args["batch_size"]
