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
from autoparallel_cp.cost.sync import inflight, stage_inflight
from autoparallel_cp.spec import RECIPES, ClusterSpec, GPUSpec, Job, LinkSpec, ModelSpec, NodeGroup
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.splits import microbatch_group


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
    are the reported per-micro-batch stage times. With every pipeline send exposed a stage's
    time per micro-batch does not depend on m, so one more micro-batch adds exactly t_max; with
    Megatron's interleaved p2p overlap (the megatron-bf16 preset's, vpp > 1) the exposed
    warm-up / cool-down share of the sends shrinks as m grows, so it adds less."""
    plan = Plan(dp=1, tp=4, pp=4, vpp=vpp, mbs=1, num_microbatches=m)
    grown = plan.model_copy(update={"num_microbatches": m + 4})
    for overlap in (False, True):
        def job(batch: int, overlap: bool = overlap) -> Job:
            j = _job(batch=batch)
            return j.model_copy(update={"recipe": j.recipe.with_behaviour(
                overlap_p2p_comm=overlap)})
        ev = evaluate(job(m), plan)
        ts = ev.stage_time_s
        assert len(ts) == 4 and min(ts) > 0
        assert ev.time.dp_comm_s == 0.0
        expect = m * max(ts) + (sum(ts) - max(ts)) / vpp + ev.time.optimizer_s
        assert ev.time.step_s == pytest.approx(expect, rel=1e-12)
        assert ev.time.bubble_s == pytest.approx((sum(ts) - max(ts)) / vpp, rel=1e-12)
        added = evaluate(job(m + 4), grown).time.step_s - ev.time.step_s
        if overlap and vpp > 1:
            assert added < 4 * max(ts) * (1 - 1e-6)
        else:
            assert added == pytest.approx(4 * max(ts), rel=1e-9)


# --------------------------------------------------------------------------------------------
# In-flight micro-batches: Megatron-LM's warm-up counts
# --------------------------------------------------------------------------------------------


def _megatron_peak(pp: int, vpp: int, m: int, rank: int, group: int | None = None) -> float:
    """Activations held at the peak of rank `rank`, in full-stage micro-batches.

    Megatron-LM d98e8a64 `schedules.py`: without interleaving (`forward_backward_pipelining_
    without_interleaving`) num_warmup = min(pp - rank - 1, m), then one more forward before the
    first backward if any micro-batch remains. With interleaving (`get_pp_rank_microbatches`,
    vpp model chunks, micro-batch groups of N = pp by default) num_warmup =
    min((pp - rank - 1)·2 + (vpp - 1)·N, m·vpp) (since 4295be1a6c, 2024-11, m == pp is no
    longer all warm-up on every rank); each chunk holds 1/vpp of the stage.
    """
    if vpp == 1:
        warm = min(pp - rank - 1, m)
        return warm + (1 if m - warm > 0 else 0)
    total = m * vpp
    warm = min((pp - rank - 1) * 2 + (vpp - 1) * (group or pp), total)
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


def test_interleaved_m_equal_pp_is_not_all_warmup() -> None:
    """pp=4, vpp=2, m=4 (8 chunks per step): rank 3 warms up (4-3-1)·2 + 1·4 = 4 chunks and
    holds 5 at its peak = 2.5 stages; rank 0 warms up 6 + 4 = 10 >= 8: all 8 = 4 stages."""
    assert float(inflight(4, 2, 4, 3)) == 2.5
    assert float(inflight(4, 2, 4, 0)) == 4.0


@pytest.mark.parametrize("pp,m,group", [(4, 10, 5), (4, 9, 5), (4, 7, 7), (4, 6, 6),
                                        (8, 12, 12), (8, 20, 10), (8, 17, 9)])
def test_microbatch_group_when_pp_does_not_divide_m(pp: int, m: int, group: int) -> None:
    """Megatron d98e8a64 schedules.py raises unless pp <= N <= m and m % N is 0 or >= pp; the
    least such N, by hand: m=10, pp=4: N=4 leaves 2 < 4, N=5 leaves 0; m=9: N=4 leaves 1, N=5
    leaves 4 >= 4; m=7: 3, 2, 1 left for N=4..6, N=7 leaves 0; m=17, pp=8: N=8 leaves 1, N=9
    leaves 8. The warm-up then counts (vpp - 1)·N chunks."""
    assert microbatch_group(pp, m) == group
    for rank in range(pp):
        assert float(inflight(pp, 3, m, rank)) == pytest.approx(
            _megatron_peak(pp, 3, m, rank, group))
    assert microbatch_group(pp, pp - 1) == 0  # too few micro-batches to interleave


def test_uneven_chunks_inflight_by_hand() -> None:
    """4 stages x 2 chunks, m = 4 (N = 4), the first stage holding chunks of 1 and 2 layers
    (embedding slot), the last 2 and 1 (loss slot), the middle ones 2 and 2 (14 layers).

    Rank 0: warm-up (4-0-1)·2 + 1·4 = 10 >= 8 chunks, so all 8 forwards run first: 4·1 + 4·2
    = 12 layers held = 12/3 = 4 stages (equal chunks would also give 4).
    Rank 3: warm-up 0·2 + 4 = 4 forwards of chunk 0 (4·2 = 8 layers); the steady state then
    runs forward k+4 and backward k: forwards are chunk 1 of micro-batches 0..3 (1 layer each),
    backwards chunk 1 of micro-batches 0..3 (backward ids mirror the chunk) then chunk 0:
    held after each forward 9, 9, 9, 9 -> peak 9 layers = 9/3 = 3 stages (equal chunks of 1.5
    would hold 5 chunks = 2.5 stages: the heavy chunk 0 stays in flight longer).
    Rank 1 (2, 2): warm-up 2·2 + 4 = 8 = all: 8 chunks = 4 stages; rank 2: warm-up 6 forwards,
    peak 7 chunks = 3.5 stages (equal chunks: the closed form)."""
    chunks = [(1, 2), (2, 2), (2, 2), (2, 1)]
    got = [stage_inflight(4, 2, 4, j, c) for j, c in enumerate(chunks)]
    assert got == [4.0, 4.0, 3.5, 3.0]
    plan = Plan(dp=1, tp=4, pp=4, vpp=2, mbs=1, num_microbatches=4, stage_layers=(3, 4, 4, 3))
    assert plan.chunks_per_stage(14) == tuple(chunks)


def test_uneven_chunks_126_layers_by_hand() -> None:
    """126 layers on pp 8 x vpp 8 with embedding and loss as slots, m = 64 (N = 8): the first
    stage holds chunks 1,2,...,2 (15 layers). Warm-up (8-0-1)·2 + 7·8 = 70 forwards: the first
    group's 64 chunk-passes (8 x 15 = 120 layers) and 6 forwards of chunk 0 of the second group
    (6 x 1); the first steady-state forward adds one more chunk 0 (1 layer): 127 layers held =
    127/15 stages, where equal chunks would hold 71/8."""
    plan = Plan(pp=8, vpp=8)
    ch = plan.chunks_per_stage(126)
    assert ch[0] == (1,) + (2,) * 7 and ch[7] == (2,) * 7 + (1,) and ch[3] == (2,) * 8
    assert stage_inflight(8, 8, 64, 0, ch[0]) == pytest.approx(127 / 15)
    assert float(inflight(8, 8, 64, 0)) == pytest.approx(71 / 8)
    # middle stages hold equal chunks: the closed form
    assert stage_inflight(8, 8, 64, 3, ch[3]) == float(inflight(8, 8, 64, 3))
