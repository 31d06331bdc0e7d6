"""search/neighbours.py: the single-axis changes `explain` offers, listed by hand for one plan
(each axis doubled and halved, every other recompute mode and ZeRO stage, sp flipped, dp and
the micro-batch count re-derived), and `single_changes` checked against `evaluate` for every
neighbour (issue 16, mutation testing pass 4)."""

from __future__ import annotations

import pytest

from autoparallel_cp import api
from autoparallel_cp.search.neighbours import neighbours, single_changes


def _job() -> api.Job:
    return api.make_job("gpt3-1.3b", "dgx-h100", gpus=8, seq_len=2048, global_batch=32)


def test_neighbours_of_a_plan_by_hand() -> None:
    job = _job()
    plan = api.as_plan(job, "dp=2,tp=2,pp=2,mbs=1,zero=1,recompute=selective,sp=1")
    got = {label: p for label, p in neighbours(job, plan)}
    # 8 GPUs, batch 32, 24 layers, 16 heads; the other fields follow the change
    want = {
        "tp 2 -> 4": dict(tp=4, dp=1, num_microbatches=32),
        "tp 2 -> 1": dict(tp=1, sp=0, dp=4, num_microbatches=8),
        "pp 2 -> 4": dict(pp=4, dp=1, num_microbatches=32),
        "pp 2 -> 1": dict(pp=1, dp=4, num_microbatches=8),
        "cp 1 -> 2": dict(cp=2, dp=1, num_microbatches=32),
        "mbs 1 -> 2": dict(mbs=2, num_microbatches=8),
        "vpp 1 -> 2": dict(vpp=2),
        "recompute selective -> none": dict(recompute="none"),
        "recompute selective -> full": dict(recompute="full"),
        "zero 1 -> 0": dict(zero=0),
        "zero 1 -> 2": dict(zero=2),
        "zero 1 -> 3": dict(zero=3),
        "sp 1 -> 0": dict(sp=0),
        # schedules (spec/schedules.py; a V at vpp 2) and host offload (the preset has a host)
        "schedule 1f1b -> zb-h1": dict(schedule="zb-h1"),
        "schedule 1f1b -> zb-h2": dict(schedule="zb-h2"),
        "schedule 1f1b -> zbv": dict(schedule="zbv", vpp=2),
        "schedule 1f1b -> dualpipe": dict(schedule="dualpipe"),
        "schedule 1f1b -> dualpipev": dict(schedule="dualpipev", vpp=2),
        "schedule 1f1b -> gpipe": dict(schedule="gpipe"),
        "optimizer_offload 0 -> 0.5": dict(optimizer_offload=0.5),
        "optimizer_offload 0 -> 1": dict(optimizer_offload=1.0),
        "activation_offload 0 -> 1": dict(activation_offload=1),
        "activation_offload 0 -> 6": dict(activation_offload=6),
        # hybrid sharding (zero >= 1): two replicas of the dp/2 shard group
        "dp_replicate 1 -> 2": dict(dp_replicate=2),
    }
    assert list(got) == list(want)  # in the order the axes are tried
    for label, upd in want.items():
        assert got[label] == plan.model_copy(update=upd), label


def test_neighbours_drop_illegal_and_out_of_domain_changes() -> None:
    job = _job()
    # tp = 8, mbs = 32 (outside the searched 1..8): tp 8 -> 16, pp 1 -> 2 and cp 1 -> 2 need 16
    # GPUs, tp 8 -> 4 gives dp = 2 and 2 x 32 > the batch of 32, mbs 32 -> 16 / 64 leave the mbs
    # domain, vpp and a schedule need pp > 1: only recompute, ZeRO, sp and host offload remain
    plan = api.as_plan(job, "dp=1,tp=8,pp=1,mbs=32,zero=0,recompute=none,sp=0")
    assert [label for label, _ in neighbours(job, plan)] == [
        "recompute none -> selective", "recompute none -> full", "zero 0 -> 1", "zero 0 -> 2",
        "zero 0 -> 3", "sp 0 -> 1", "optimizer_offload 0 -> 0.5", "optimizer_offload 0 -> 1",
        "activation_offload 0 -> 1", "activation_offload 0 -> 12"]
    # an MoE model adds ep and the folding change
    moe = api.make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=64)
    p = api.as_plan(moe, "dp=8,tp=2,pp=4,ep=8,mbs=1,zero=1,recompute=full,sp=1")
    mlabels = [label for label, _ in neighbours(moe, p)]
    assert "ep 8 -> 4" in mlabels and "etp 2 -> 1" in mlabels
    folded = dict(neighbours(moe, p))["etp 2 -> 1"]
    assert folded.etp == 1 and folded.sp == 1
    back = dict(neighbours(moe, folded))
    assert "etp 1 -> 2" in back and back["etp 1 -> 2"].etp is None


@pytest.mark.parametrize("text", ["dp=2,tp=2,pp=2,mbs=1,zero=1,recompute=selective,sp=1",
                                  "dp=8,mbs=4,zero=0,recompute=none"])
def test_single_changes_are_every_faster_fitting_neighbour(text: str) -> None:
    job = _job()
    plan = api.as_plan(job, text)
    now = api.evaluate(job, plan)
    changes = single_changes(job, plan)
    by_label = {c.change: c for c in changes}
    for label, p in neighbours(job, plan):
        ev = api.evaluate(job, p)
        if not now.fits or (ev.fits and ev.time.step_s < now.time.step_s):
            if not ev.fits:
                assert label not in by_label
                continue
            c = by_label[label]
            assert c.plan == p and c.fits
            assert c.step_s == pytest.approx(ev.time.step_s, rel=1e-12)
            assert c.delta == pytest.approx(ev.time.step_s / now.time.step_s - 1, rel=1e-9)
            assert c.peak_bytes == pytest.approx(ev.memory.required_bytes, rel=1e-12)
            assert c.capacity_bytes == pytest.approx(ev.memory.capacity_bytes, rel=1e-12)
        else:
            assert label not in by_label
    assert [c.step_s for c in changes] == sorted(c.step_s for c in changes)


def test_single_changes_of_a_plan_that_does_not_fit() -> None:
    """A plan over the memory gets every neighbour that fits, slower ones included."""
    job = api.make_job("gpt3-13b", "dgx-h100", gpus=8, seq_len=2048, global_batch=32)
    plan = api.as_plan(job, "dp=8,mbs=1,zero=0,recompute=none")
    assert not api.evaluate(job, plan).fits
    changes = single_changes(job, plan)
    fitting = [label for label, p in neighbours(job, plan) if api.evaluate(job, p).fits]
    assert fitting and sorted(c.change for c in changes) == sorted(fitting)
    assert all(c.delta == pytest.approx(c.step_s / api.evaluate(job, plan).time.step_s - 1)
               for c in changes)
