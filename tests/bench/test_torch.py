"""bench.torch (PyTorch workers beside DDP and the RPC PS): the paired final metrics and --systems."""

from __future__ import annotations

import pytest

from bench.torch.__main__ import cases, main, paired, selected


def test_final_metrics_pair_by_seed_with_ddps_spread_as_the_noise_floor():
    p = paired({"ours": [0.660, 0.665, 0.650], "ddp": [0.662, 0.664, 0.661]})
    assert p["ours"]["diffs"] == pytest.approx([-0.002, 0.001, -0.011])
    assert p["ours"]["median"] == pytest.approx(-0.002)
    assert (p["ours"]["min"], p["ours"]["max"]) == pytest.approx((-0.011, 0.001))
    floor = p["noise_floor"]
    assert floor["system"] == "ddp" and (floor["min"], floor["median"], floor["max"]) == (0.661, 0.662, 0.664)
    # |DDP(seed i) - DDP(seed j)| over the three pairs: 0.002, 0.001, 0.003
    assert floor["pair_abs_diff_median"] == pytest.approx(0.002)
    assert floor["pair_abs_diff_max"] == pytest.approx(0.003)
    with pytest.raises(ValueError):  # a system short of a seed is not paired with the wrong one
        paired({"ours": [0.66], "ddp": [0.66, 0.67]})


def test_an_unknown_system_is_named(capsys):
    with pytest.raises(SystemExit):
        main(["--tasks", "dlrm", "--systems", "ours,dpp"])
    assert "--systems: unknown system 'dpp'" in capsys.readouterr().err


def test_a_named_only_variant_runs_when_named_and_hybrid_mode_runs_by_default():
    dlrm = cases(True)["dlrm"]
    default = selected(dlrm, None)
    assert "ours-hybrid" in default and "ours-hybrid-s0" not in default and "ddp-dense" not in default
    assert dlrm["systems"]["ours-hybrid"]["args"] == {"dense": "allreduce"}
    assert selected(dlrm, ["ours-hybrid-s0", "ddp"]) == ["ours-hybrid-s0", "ddp"]
