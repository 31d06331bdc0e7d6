"""Pipeline schedules by hand: absolute 1F1B and interleaved step times, in-flight micro-batches.

Step time (Narayanan et al. 2021, §2.2): with pp equal stages of per-micro-batch time t and m
micro-batches, 1F1B takes (m + pp - 1)·t, i.e. a bubble of (pp - 1)/m of the ideal m·t;
interleaving vpp chunks per stage shrinks the bubble to (pp - 1)/(vpp·m) of it. With unequal
stages the slowest paces the steady state: the last micro-batch starts its pass through the
slowest stage after (m - 1)·t_max and still has every stage to traverse.

In-flight micro-batches: Megatron-LM `schedules.py` warm-up counts, written out below.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from autoparallel_cp.cost import steptime
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.sync import inflight
from autoparallel_cp.spec import RECIPES, ClusterSpec, GPUSpec, Job, LinkSpec, ModelSpec, NodeGroup
from autoparallel_cp.spec.plan import Plan


def _job(gpus: int = 16, batch: int = 8) -> Job:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, hbm_gbps=3350)
    cl = ClusterSpec(name="c", node_groups=[NodeGroup(
        name="n", gpu=gpu, gpus_per_node=8, num_nodes=gpus // 8,
        intra_node=LinkSpec(bandwidth_gbps=450), inter_node=LinkSpec(bandwidth_gbps=50))])
    m = ModelSpec(name="m", num_layers=16, hidden_size=4096, ffn_hidden_size=14336,
                  num_attention_heads=32, num_kv_heads=8, vocab_size=128256)
    return Job(model=m, cluster=cl, recipe=RECIPES["megatron-bf16"], seq_len=4096,
               global_batch=batch)


# --------------------------------------------------------------------------------------------
# Absolute step times with stage times fixed by hand
# --------------------------------------------------------------------------------------------


def _fixed_stages(monkeypatch: pytest.MonkeyPatch, compute: Sequence[float],
                  optimizer: float = 0.0) -> None:
    """Replace the per-stage times by simple numbers (seconds per micro-batch)."""

    def fake(job: Job, plan: Plan, options: object = None) -> list[steptime.StageTime]:
        assert len(compute) == plan.pp
        return [steptime.StageTime(stage=j, group=0, compute_s=c, tp_s=0.0, cp_s=0.0,
                                   ep_s=0.0, pp_s=0.0, zero3_s=0.0, dp_sync_s=0.0,
                                   optimizer_s=optimizer)
                for j, c in enumerate(compute)]

    monkeypatch.setattr(steptime, "stage_times", fake)


def test_1f1b_equal_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """pp=4, m=8, t=1 s: (m + pp - 1)·t = 11 s; bubble (pp-1)/m of the ideal 8 s = 3 s."""
    _fixed_stages(monkeypatch, [1.0] * 4, optimizer=0.25)
    t = evaluate(_job(), Plan(dp=1, tp=4, pp=4, mbs=1, num_microbatches=8)).time
    assert t.step_s == pytest.approx(11.0 + 0.25)
    assert t.bubble_s == pytest.approx(3.0 / 8 * 8.0)
    assert t.compute_s == pytest.approx(8.0)
    assert t.optimizer_s == pytest.approx(0.25)


def test_interleaved_equal_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """pp=4, vpp=2, m=8, t=1 s: bubble (pp-1)/(vpp·m) of the ideal 8 s = 1.5 s; step 9.5 s."""
    _fixed_stages(monkeypatch, [1.0] * 4)
    t = evaluate(_job(), Plan(dp=1, tp=4, pp=4, vpp=2, mbs=1, num_microbatches=8)).time
    assert t.bubble_s == pytest.approx(3.0 / (2 * 8) * 8.0)
    assert t.step_s == pytest.approx(9.5)


def test_1f1b_two_stages_by_timeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """pp=2, m=4, t=2 s per micro-batch (F = 1 unit, B = 2 units, a unit = 2/3 s), drawn out:

        stage 1:    F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4
        time:    0  1  2  3  4  5  6  7  8  9 10 11 12 13
        stage 0: F1 F2 .. .. B1 B1 F3 B2 B2 F4 B3 B3 .. B4 B4   (ends at unit 15)

    15 units = 10 s = (m + pp - 1)·t; the bubble is (pp - 1)·t = 2 s."""
    _fixed_stages(monkeypatch, [2.0, 2.0])
    t = evaluate(_job(batch=8), Plan(dp=2, tp=4, pp=2, mbs=1, num_microbatches=4)).time
    assert t.step_s == pytest.approx(15 * 2.0 / 3)
    assert t.bubble_s == pytest.approx(2.0)


def test_1f1b_slowest_stage_paces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stages 1, 2, 1, 1 s, m=8: (m-1)·2 + (1+2+1+1) = 19 s (not 8·2 + 3·2 = 22 s, which
    would charge the bubble at the slowest stage's rate)."""
    _fixed_stages(monkeypatch, [1.0, 2.0, 1.0, 1.0])
    t = evaluate(_job(), Plan(dp=1, tp=4, pp=4, mbs=1, num_microbatches=8)).time
    assert t.step_s == pytest.approx(19.0)
    assert t.slowest_stage == 1


def test_single_stage_has_no_bubble(monkeypatch: pytest.MonkeyPatch) -> None:
    _fixed_stages(monkeypatch, [1.5])
    t = evaluate(_job(8, 64), Plan(dp=2, tp=4, pp=1, mbs=1, num_microbatches=32)).time
    assert t.bubble_s == 0.0
    assert t.step_s == pytest.approx(32 * 1.5)


# --------------------------------------------------------------------------------------------
# The same compositions on the real stage times
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vpp,m", [(1, 8), (1, 16), (2, 8), (2, 16)])
def test_real_stage_times_compose_as_narayanan(vpp: int, m: int) -> None:
    """dp=1 (no gradient sync): step = m·t_max + (Σ t_j - t_max)/vpp + optimizer, where t_j
    are the reported per-micro-batch stage times; one more micro-batch adds exactly t_max."""
    job = _job(batch=m)
    plan = Plan(dp=1, tp=4, pp=4, vpp=vpp, mbs=1, num_microbatches=m)
    ev = evaluate(job, plan)
    ts = ev.stage_time_s
    assert len(ts) == 4 and min(ts) > 0
    assert ev.time.dp_comm_s == 0.0
    expect = m * max(ts) + (sum(ts) - max(ts)) / vpp + ev.time.optimizer_s
    assert ev.time.step_s == pytest.approx(expect, rel=1e-12)
    assert ev.time.bubble_s == pytest.approx((sum(ts) - max(ts)) / vpp, rel=1e-12)
    more = evaluate(_job(batch=m + 4), plan.model_copy(update={"num_microbatches": m + 4}))
    assert more.time.step_s - ev.time.step_s == pytest.approx(4 * max(ts), rel=1e-9)


# --------------------------------------------------------------------------------------------
# In-flight micro-batches: Megatron-LM's warm-up counts
# --------------------------------------------------------------------------------------------


def _megatron_peak(pp: int, vpp: int, m: int, rank: int) -> float:
    """Activations held at the peak of rank `rank`, in full-stage micro-batches.

    Megatron-LM `schedules.py`: without interleaving (`forward_backward_pipelining_without_
    interleaving`) num_warmup = min(pp - rank - 1, m), then one more forward before the first
    backward if any micro-batch remains. With interleaving (`..._with_interleaving`, vpp model
    chunks) num_warmup = min((pp - rank - 1)·2 + (vpp - 1)·pp, m·vpp), except that m == pp
    runs every forward first (`all_warmup_microbatches`); each chunk holds 1/vpp of the stage.
    """
    if vpp == 1:
        warm = min(pp - rank - 1, m)
        return warm + (1 if m - warm > 0 else 0)
    total = m * vpp
    warm = total if m == pp else min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
    return (warm + (1 if total - warm > 0 else 0)) / vpp


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_inflight_1f1b_matches_megatron_warmup(pp: int) -> None:
    for m in (1, pp - 1, pp, pp + 1, 4 * pp):
        if m < 1:
            continue
        for rank in range(pp):
            assert float(inflight(pp, 1, m, rank)) == _megatron_peak(pp, 1, m, rank), \
                (pp, m, rank)


@pytest.mark.parametrize("pp,vpp", [(2, 2), (4, 2), (4, 4), (8, 3)])
def test_inflight_interleaved_matches_megatron_warmup(pp: int, vpp: int) -> None:
    for m in (pp, 2 * pp, 3 * pp, 8 * pp):
        for rank in range(pp):
            assert float(inflight(pp, vpp, m, rank)) == pytest.approx(
                _megatron_peak(pp, vpp, m, rank)), (pp, vpp, m, rank)


def test_inflight_first_stage_korthikanti() -> None:
    """Korthikanti et al. 2022 §4.2.3: the first stage holds pp micro-batches under 1F1B and
    pp·(1 + (pp-1)/(pp·vpp)) with interleaving (m large)."""
    for pp, vpp in ((4, 2), (8, 4), (16, 2)):
        assert float(inflight(pp, 1, 64, 0)) == pp
        assert float(inflight(pp, vpp, 64, 0)) == pytest.approx(pp * (1 + (pp - 1) / (pp * vpp)))
