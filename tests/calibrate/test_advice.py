"""Near-ties by interval overlap, the sensitivity of the winner, and --mem-headroom as a
capacity reduction on the CLI."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autoparallel_cp.api import as_plan, make_job
from autoparallel_cp.calibrate.advice import knob_ranges, near_tie_line, near_ties, sensitivity
from autoparallel_cp.cli import main
from autoparallel_cp.cost.uncertainty import default_mem_headroom
from autoparallel_cp.spec.calibration import Calibration


def _plan(step: float, lo: float, hi: float, need: float = 50.0) -> dict:
    return {"plan": {}, "time": {"step_s": step, "step_s_interval": [lo, hi]},
            "memory": {"required_bytes": need, "capacity_bytes": 100.0}}


def test_near_ties_are_the_overlapping_intervals() -> None:
    plans = [_plan(1.0, 0.9, 1.1), _plan(1.05, 1.0, 1.2, need=20.0), _plan(1.5, 1.2, 1.8)]
    assert near_ties(plans) == [2]
    line = near_tie_line(plans, lambda d: 0 if d is plans[1] else 1)
    assert line is not None and "#2" in line and "#3" not in line
    assert "#2 is the simplest" in line and "#2 leaves the most memory free (80%)" in line
    assert near_tie_line(plans[:1] + plans[2:], lambda d: 0) is None


def test_sensitivity_names_the_knob_that_flips_the_winner() -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=64)
    # 4 micro-batches of 1 (faster) against 2 of 2: a fixed time per micro-batch flips them
    plans = [as_plan(job, "tp=1,mbs=1,zero=1"), as_plan(job, "tp=1,mbs=2,zero=1")]
    from autoparallel_cp.cost.evaluate import evaluate

    assert evaluate(job, plans[0]).time.step_s < evaluate(job, plans[1]).time.step_s
    lines = sensitivity(job, plans, {"per_microbatch_s": (0.0, 0.1), "net_inter": (0.5, 2.0)})
    assert lines == ["loses to #2 if the fixed time per micro-batch is 100 ms longer",
                     "stays best if the inter-node network is 50% slower or 100% faster"]
    r = knob_ranges(job)
    assert r["net_inter"][0] < 1.0 < r["net_inter"][1]
    fitted = job.calibrated(Calibration(net_inter=0.8, std={"net_inter": 0.008}))
    lo, hi = knob_ranges(fitted)["net_inter"]
    assert 0.98 < lo < 1.0 < hi < 1.02  # a fitted knob's 80% range, not the prior's


def test_mem_headroom_marks_near_capacity_plans_on_the_cli() -> None:
    """--mem-headroom is the margin above which a plan is near capacity: the capacity shown is
    the GPU's whole memory, the plan carries the margin, the flag and its OOM risk."""
    args = ["solve", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--global-batch", "16", "--top-k", "1", "--time-limit", "20", "--json", "-", "-q"]
    out = {}
    for h in (None, "0", "0.3"):
        r = CliRunner().invoke(main, args + ([] if h is None else ["--mem-headroom", h]))
        assert r.exit_code == 0, r.output
        out[h] = json.loads(r.stdout)["plans"][0]["memory"]
    total = out["0"]["capacity_bytes"]
    assert out[None]["capacity_bytes"] == out["0.3"]["capacity_bytes"] == total
    assert out[None]["mem_headroom"] == default_mem_headroom()
    for h, mem in out.items():
        margin = 0.0 if h == "0" else default_mem_headroom() if h is None else 0.3
        assert mem["near_capacity"] == (mem["required_bytes"] > total * (1 - margin))
        assert 0.0 <= mem["oom_risk"] <= 1.0
    bad = CliRunner().invoke(main, args + ["--mem-headroom", "0.9"])
    assert bad.exit_code == 2
