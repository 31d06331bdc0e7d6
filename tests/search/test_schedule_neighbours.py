"""`explain`'s single changes include the schedule and offload fields (search/neighbours.py)."""

from __future__ import annotations

import pytest

from autoparallel_cp.api import make_job
from autoparallel_cp.search.neighbours import neighbours, single_changes
from autoparallel_cp.spec.plan import parse_plan


def test_schedule_and_offload_neighbours_are_legal() -> None:
    job = make_job("llama3-70b", "dgx-h100", gpus=64, global_batch=128)
    plan = parse_plan("tp=8,pp=8,mbs=1", job)
    got = {label: p for label, p in neighbours(job, plan)}
    assert got["schedule 1f1b -> zb-h1"].schedule == "zb-h1"
    zbv = got["schedule 1f1b -> zbv"]
    assert (zbv.vpp, zbv.stage_layers) == (2, None)
    assert got["optimizer_offload 0 -> 0.5"].optimizer_offload == 0.5
    assert got["activation_offload 0 -> 5"].activation_offload == 5  # half of 10 layers
    # a pipeline-less plan has no schedule to change
    flat = parse_plan("tp=8,mbs=1", job)
    assert not any(label.startswith("schedule") for label, _ in neighbours(job, flat))


def test_search_pins_the_new_axes() -> None:
    from autoparallel_cp.search.act_offload import act_layers
    from autoparallel_cp.search.space import SearchSpace

    job = make_job("llama3-8b", "dgx-h100", gpus=32, global_batch=64)
    # activation offload is searched (search/act_offload.py): a pin narrows the space to it,
    # pipelined plans included, with every recompute mode and interleaving (their own parts)
    pinned = SearchSpace.for_job(job, fix="activation_offload=2")
    free = SearchSpace.for_job(job)
    assert act_layers(pinned) == 2 and 1 in pinned.pp and max(pinned.pp) > 1
    assert pinned.vpp == free.vpp and pinned.recompute == free.recompute
    # DualPipe is searched (search/model_scored.py): a pin narrows the space to it
    assert SearchSpace.for_job(job, fix="schedule=dualpipe").schedule == "dualpipe"
    # the optimizer share is searched (search/offload_axis.py): a pin is its one value
    assert SearchSpace.for_job(job, fix="optimizer_offload=0.5").off_axis == (0.5,)


def test_a_zero_bubble_schedule_beats_1f1b_here() -> None:
    """70B on 64 H100, pp 8, m 128: 1F1B's bubble is 7 of 135 micro-batch times; ZB-H2 fills
    all but rho = max(F+B-2W, B-F, F) of it (cost/schedules.py; 0.39 with the per-op split,
    cost/pass_split.py), so it saves (1 - rho) of 1F1B's bubble, about 3% of the step, and
    still fits."""
    from autoparallel_cp.cost.evaluate import evaluate
    from autoparallel_cp.cost.pass_split import backward_split
    from autoparallel_cp.cost.schedules import bubble_ratio

    job = make_job("llama3-70b", "dgx-h100", gpus=64, global_batch=128)
    plan = parse_plan("tp=8,pp=8,mbs=1", job)
    changes = {c.change: c for c in single_changes(job, plan)}
    zb = changes["schedule 1f1b -> zb-h2"]
    assert zb.fits and zb.delta < -0.02
    base = evaluate(job, plan).time
    rho = bubble_ratio("zb-h2", 8, backward_split(job, zb.plan), 128)
    assert 0.3 < rho < 0.5
    saved = (1.0 - rho) * base.bubble_s
    assert zb.step_s == pytest.approx(base.step_s - saved, rel=2e-3)
