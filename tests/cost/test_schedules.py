"""Pipeline schedules by hand: bubble, in-flight micro-batches, backward split, DualPipe's
parameter copies and the rules (cost/schedules.py, spec/schedules.py).

Reference numbers:
- Qi et al., "Zero Bubble Pipeline Parallelism" (arXiv 2401.10241) Table 2 and the authors'
  summary (sail-sg, T_F = T_B = T_W): bubble rate 1F1B (p-1)/m, ZB-H1 (p-1)/(3m), ZB-H2 0,
  ZBV 0; activation memory 1x, 1x, 2x, 1x of 1F1B;
- DeepSeek-V3 (arXiv 2412.19437) Table 2: 1F1B (PP-1)(F+B), ZB1P (PP-1)(F+B-2W), DualPipe
  (PP/2-1)(F&B+B-3W) with B the whole backward; parameters 2x, activations PP+1;
- GPipe: bubble (p-1)/(m+p-1) of the step, all m micro-batches held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel_cp.cost import schedules as S
from autoparallel_cp.cost import steptime
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.pass_order import SCHEDULES as ORDERS
from autoparallel_cp.cost.pass_replay import replay
from autoparallel_cp.cost.pipeline_sim import dualpipev_actions, makespan, zbv_actions
from autoparallel_cp.spec import RECIPES, ClusterSpec, GPUSpec, Job, LinkSpec, ModelSpec, NodeGroup
from autoparallel_cp.spec.plan import Plan, PlanError, parse_plan, plan_violations

EQUAL = (1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0)  # T_F = T_B = T_W


def _job(gpus: int = 16, batch: int = 16, layers: int = 16) -> Job:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, hbm_gbps=3350)
    cl = ClusterSpec(name="c", node_groups=[NodeGroup(
        name="n", gpu=gpu, gpus_per_node=8, num_nodes=gpus // 8,
        intra_node=LinkSpec(bandwidth_gbps=450), inter_node=LinkSpec(bandwidth_gbps=50))])
    m = ModelSpec(name="m", num_layers=layers, hidden_size=4096, ffn_hidden_size=14336,
                  num_attention_heads=32, num_kv_heads=8, vocab_size=128256)
    return Job(model=m, cluster=cl, recipe=RECIPES["megatron-bf16"], seq_len=4096,
               global_batch=batch)


def _fixed(monkeypatch: pytest.MonkeyPatch, compute: Sequence[float],
           split: tuple[float, float, float] = EQUAL) -> None:
    """Stage times fixed by hand (seconds per micro-batch) and the (F, B, W) split."""

    def fake(job: Job, plan: Plan, options: object = None) -> list[steptime.StageTime]:
        return [steptime.StageTime(stage=j, group=0, compute_s=c, tp_s=0.0, cp_s=0.0,
                                   ep_s=0.0, pp_s=0.0, zero3_s=0.0, dp_sync_s=0.0,
                                   optimizer_s=0.0) for j, c in enumerate(compute)]

    monkeypatch.setattr(steptime, "stage_times", fake)
    monkeypatch.setattr(steptime, "backward_split", lambda job, plan, options=None: split)


# --------------------------------------------------------------------------------------------
# Bubble: the papers' numbers with F = B = W = 1 s (t = 3 s per stage and micro-batch)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("schedule", "vpp", "bubble"), [
    ("1f1b", 1, 3 * 3.0),      # (p-1)(F+B+W) = 3*3
    ("gpipe", 1, 3 * 3.0),     # (p-1)/(m+p-1) of (m+p-1)*t
    ("zb-h1", 1, 3 * 1.0),     # (p-1)(F+B-W): a third of 1F1B's
    # (p-1)(F+B-2W) = 0 is each rank's idle time; the step still waits for the last rank,
    # which starts (p-1) F = 3 s late (no optimizer post-validation, Qi §4)
    ("zb-h2", 1, 3 * 1.0),
    ("interleaved", 2, 3 * 3.0 / 2),  # (p-1) t / v
    # torch's ZBV (replayed): rank p-1 waits for p-1 half-size forwards (0.5 s each), then
    # never idles: the paper's zero needs the optimizer post-validation torch does not run
    ("zbv", 2, 3 * 0.5),
    # DeepSeek Table 2: (PP/2-1)(F&B + B - 3W) = (2-1)(3 + 2 - 3) = 2 s for PP = 4
    ("dualpipe", 1, 2.0),
    # DualPipeV: 2p = 8 half-size chunks (F=B=W=0.5): (8/2-1)(1.5 + 1 - 1.5) = 3 s
    ("dualpipev", 2, 3.0),
])
def test_bubble_against_the_papers(monkeypatch: pytest.MonkeyPatch, schedule: str, vpp: int,
                                   bubble: float) -> None:
    _fixed(monkeypatch, [3.0] * 4)
    plan = Plan(dp=1, tp=4, pp=4, vpp=vpp, mbs=1, num_microbatches=16, schedule=schedule)
    assert plan_violations(_job(), plan) == []
    t = evaluate(_job(), plan).time
    assert t.bubble_s == pytest.approx(bubble)
    assert t.step_s == pytest.approx(16 * 3.0 + bubble)


def test_zero_bubble_rates_from_the_authors_table() -> None:
    """Bubble rate over m·t with T_F = T_B = T_W: ZB-H1 (p-1)/(3m) = a third of 1F1B's; ZB-H2's
    0 needs the post-validation, without it the last rank's ramp (p-1) F is left."""
    p = 8
    assert S.bubble_ratio("zb-h1", p, EQUAL, 3 * p) == pytest.approx(1 / 3)
    assert S.bubble_ratio("zb-h2", p, EQUAL, 3 * p) == pytest.approx(1 / 3)
    assert S.bubble_ratio("1f1b", p, EQUAL, 3 * p) == 1.0
    with pytest.raises(ValueError, match="no closed form"):
        S.bubble_ratio("zbv", p, EQUAL, 3 * p)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_torch_dualpipev_order_reproduces_deepseek_table_2(p: int) -> None:
    """PyTorch's DualPipeV actions replayed with chunk F = B = W = 1 (F&B = 3, B' = 2):
    (PP/2 - 1)(F&B + B' - 3W) over PP = 2p chunks = (p - 1) * 2 beyond the m * 6 of work."""
    m = 4 * p
    span = makespan([dualpipev_actions(p, r, m) for r in range(p)], 2 * p, lambda k, s: 1.0)
    assert span == pytest.approx(m * 6.0 + (p - 1) * 2.0)


@pytest.mark.parametrize("make", [zbv_actions, dualpipev_actions])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_replayed_bubble_is_constant_past_the_warm_up(make: Callable[..., Any], p: int) -> None:
    """Unequal ranks (0.8-1.2 s), F : B : W = 0.3 : 0.4 : 0.3: the makespan beyond m x the
    slowest rank is the same at 8p and 32p micro-batches (what lets `simulated_bubble` stop
    at SIM_MICROBATCHES_PER_RANK x p)."""
    rt = [0.8 + 0.4 * ((7 * r) % p) / max(p - 1, 1) for r in range(p)]
    part = {"F": 0.3, "I": 0.4, "W": 0.3}

    def dur(k: str, s: int) -> float:
        return 0.5 * rt[s if s < p else 2 * p - 1 - s] * part[k]

    got = [makespan([make(p, r, m) for r in range(p)], 2 * p, dur) - m * max(rt)
           for m in (S.SIM_MICROBATCHES_PER_RANK * p, 32 * p)]
    assert got[0] == pytest.approx(got[1], abs=1e-9)


@pytest.mark.parametrize(("p", "m"), [(2, 2), (2, 3), (4, 3), (4, 7), (4, 16), (8, 20)])
def test_torch_zbv_order_ramp(p: int, m: int) -> None:
    """ZBV with chunk F = B = W = 1: the last rank's first forward starts after p - 1 chunk
    forwards, and from then torch's order keeps every rank busy: m * 6 + (p - 1) once
    m >= 2p - 1 (fewer micro-batches leave the slots torch plans for 2p - 1 of them empty)."""
    span = makespan([zbv_actions(p, r, m) for r in range(p)], 2 * p, lambda k, s: 1.0)
    if m >= 2 * p - 1:
        assert span == pytest.approx(m * 6.0 + (p - 1))
    else:
        assert span > m * 6.0 + (p - 1)
    # every rank runs every action of its two chunks once
    for r in range(p):
        acts = zbv_actions(p, r, m)
        assert sorted(acts) == sorted((k, s, i) for s in (r, 2 * p - 1 - r)
                                      for i in range(m) for k in "FIW")


def test_unequal_passes_follow_the_formulas() -> None:
    """F=1, B=3 (input grad), W=1 (t=5): ZB-H1 (p-1)(F+B-W) = 3/5 of 1F1B; ZB-H2
    (p-1)(F+B-2W) = 2/5 (above the ramp F = 1/5); DualPipe at p=8: (p/2-1)(F + 2B - W) =
    3*6 = 18 against 7*5."""
    split = (0.2, 0.6, 0.2)
    assert S.bubble_ratio("zb-h1", 8, split, 16) == pytest.approx(0.6)
    assert S.bubble_ratio("zb-h2", 8, split, 16) == pytest.approx(0.4)
    assert S.bubble_ratio("dualpipe", 8, split, 16) == pytest.approx(18 / 35)
    # W larger than F + B: the W passes more than fill the warm-up; the ramp is left
    assert S.bubble_ratio("zb-h2", 8, (0.2, 0.2, 0.6), 16) == pytest.approx(0.2)
    assert S.bubble_ratio("dualpipe", 8, (0.1, 0.1, 0.8), 16) == 0.0


def test_dualpipe_balances_a_heavy_last_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank j runs half its micro-batches on stage j and half on stage p-1-j: stage times
    1,1,1,3 become 2,1,1,2 per micro-batch (T_max 2, sum 6), bubble (2-1)(F+2B-W)/3 of
    (6-2) = 4/3 * 1 with F=B=W."""
    def fake_raw(job: Job, plan: Plan, options: object = None) -> list[steptime.StageTime]:
        raw = [steptime.StageTime(stage=j, group=0, compute_s=c, tp_s=0.0, cp_s=0.0,
                                  ep_s=0.0, pp_s=0.0, zero3_s=0.0, dp_sync_s=0.5,
                                  optimizer_s=0.1) for j, c in enumerate([1.0, 1.0, 1.0, 3.0])]
        return [steptime._dualpipe_rank(raw[j], raw[3 - j]) for j in range(4)]

    monkeypatch.setattr(steptime, "stage_times", fake_raw)
    monkeypatch.setattr(steptime, "backward_split", lambda job, plan, options=None: EQUAL)
    plan = Plan(dp=1, tp=4, pp=4, mbs=1, num_microbatches=16, schedule="dualpipe")
    t = steptime.step_time(_job(), plan)
    assert [s.total_s for s in t.stages] == [2.0, 1.0, 1.0, 2.0]
    assert t.bubble_s == pytest.approx((1 / 3) * (2 / 3) * 4.0)
    assert t.optimizer_s == pytest.approx(0.2)  # both copies of the parameters


# --------------------------------------------------------------------------------------------
# In-flight micro-batches (whole-rank units), pp = 4
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("schedule", "vpp", "m", "want"), [
    ("1f1b", 1, 8, [4, 3, 2, 1]),
    ("zb-h1", 1, 8, [4, 4, 4, 4]),     # 1F1B's p - j + j deferred W: p everywhere
    ("zb-h2", 1, 8, [7, 7, 7, 7]),     # 2(p-j)-1 + 2j held W: (2p-1) M_B everywhere
    ("zb-h2", 1, 5, [5, 5, 5, 5]),     # capped at m
    ("gpipe", 1, 8, [8, 8, 8, 8]),
    ("zbv", 2, 8, [4, 4, 4, 4]),       # 2p half-size chunks on every rank
    ("dualpipev", 2, 8, [4.5] * 4),    # PP+1 of 2p half chunks
    ("dualpipe", 1, 8, [4, 3, 2, 1]),  # stage j: p - j; rank j's two stages: p + 1 = 5
])
def test_inflight(schedule: str, vpp: int, m: int, want: list[float]) -> None:
    plan = Plan(pp=4, vpp=vpp, num_microbatches=m, schedule=schedule)
    got = [S.inflight_units(plan, j, (4 // vpp,) * vpp) for j in range(4)]
    assert got == pytest.approx(want)


def _zbv_peak(p: int, rank: int) -> int:
    """Held half-size chunks on `rank`, walking torch's ZBV warm-up and steady state
    (schedules.py ScheduleZBVZeroBubble: 2(p-r)-1 F0; r x (F1, F0); p-r x (F1, I1, W1); then
    F0, I0, W0, F1, I1, W1): a chunk is held from its F until its W."""
    held = peak = 0
    ops = ["F"] * (2 * (p - rank) - 1) + ["F", "F"] * rank + ["F", "W"] * (p - rank) \
        + ["F", "W", "F", "W"] * 3
    for op in ops:
        held += 1 if op == "F" else -1
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zbv_inflight_walks_torch_warmup(p: int) -> None:
    for r in range(p):
        assert _zbv_peak(p, r) == 2 * p  # 2p chunks of half a rank = p micro-batches
        assert S.inflight_units(Plan(pp=p, vpp=2, num_microbatches=4 * p, schedule="zbv"),
                                r, (2, 2)) == p


def test_gpipe_and_zb_h2_memory_grow_as_stated() -> None:
    """Activations of the first rank: GPipe holds m, ZB-H2 2p-1, 1F1B p micro-batches."""
    job = _job()
    base = dict(dp=1, tp=4, pp=4, mbs=1, num_microbatches=16)
    act = {s: stage_memory(job, Plan(**base, schedule=s))[1].activations_bytes
           for s in ("1f1b", "zb-h2", "gpipe")}
    one = act["1f1b"]
    # stage 1 (no embedding or head): 1F1B holds p-1 = 3, ZB-H2 2p-1 = 7, GPipe 16
    work = stage_memory(job, Plan(**base))[1].activations_bytes - 3 * (
        (act["gpipe"] - one) / 13)
    per_mb = (act["gpipe"] - one) / 13
    assert act["zb-h2"] == pytest.approx(work + 7 * per_mb)
    assert act["gpipe"] == pytest.approx(work + 16 * per_mb)


def test_dualpipe_holds_two_copies_of_the_parameters() -> None:
    job = _job()
    one = stage_memory(job, Plan(dp=1, tp=4, pp=4, mbs=1, num_microbatches=16))
    two = stage_memory(job, Plan(dp=1, tp=4, pp=4, mbs=1, num_microbatches=16,
                                 schedule="dualpipe"))
    for j in range(4):
        assert two[j].params_bytes == pytest.approx(one[j].params_bytes
                                                    + one[3 - j].params_bytes)
        assert two[j].optimizer_bytes == pytest.approx(one[j].optimizer_bytes
                                                       + one[3 - j].optimizer_bytes)


def test_v_shape_puts_the_head_on_rank_zero() -> None:
    """ZBV / DualPipeV: chunk 2p-1 (final norm, LM head, loss) sits on rank 0."""
    job = _job()
    base = dict(dp=1, tp=4, pp=4, vpp=2, mbs=1, num_microbatches=16)
    inter = stage_memory(job, Plan(**base))
    v = stage_memory(job, Plan(**base, schedule="zbv"))
    assert v[0].params_bytes > inter[0].params_bytes  # embedding + head
    assert v[3].params_bytes < inter[3].params_bytes  # no head on the last rank
    assert S.head_stage(Plan(**base, schedule="zbv")) == 0
    assert S.head_stage(Plan(**base)) == 3


# --------------------------------------------------------------------------------------------
# Backward split from the per-op FLOPs, EP overlap share
# --------------------------------------------------------------------------------------------


def test_backward_split_from_per_op_times() -> None:
    """cost/pass_split.py by hand on the 16-layer Llama-8B-shaped job (tp 1, mbs 1, 4096
    tokens): W is the weight-gradient GEMMs alone, each at its own shape's efficiency
    (gemm_time(k, m, n) of every `layer_gemms` GEMM, the head's (h, T, V/tp)), plus two of the
    embedding's three HBM passes; F + B + W is the model's whole time (layers' time_s, head,
    embedding), so B is everything else; the weightless ops put W below F and B above it
    (W = F and B = F + 1.5 x attention under the FLOP count); full recompute adds the
    layers' replayed forward to B alone."""
    from autoparallel_cp.cost import factors as fx
    from autoparallel_cp.cost.efficiency import gemm_time
    from autoparallel_cp.cost.flops import head_gemm, layer_gemms
    from autoparallel_cp.cost.pass_split import backward_split, pass_times
    from autoparallel_cp.cost.straggler import job_compute_stretch

    job = _job()
    plan = Plan(dp=4, tp=1, pp=4, mbs=1, num_microbatches=4)
    gpu = job.cluster.node_groups[0].gpu
    T, L = 4096.0, job.model.num_layers
    f, b, w = pass_times(job, plan)
    wg = sum(g.count * float(gemm_time(gpu, g.k, g.m, g.n, "bf16"))
             for g in layer_gemms(job.model, False, np.float64(T), np.float64(1.0),
                                  np.float64(1.0)))
    hg = head_gemm(job.model, np.float64(T), np.float64(1.0))
    lf = fx.layer_factors(job, 0, 1, 1, 1, 0, 1, "none")
    e = fx.edge_factors(job, 0, 1, 1, 0, 1)
    slow = job_compute_stretch(job)  # the slowest GPU's pace (straggler.py), every GEMM
    w_want = slow * (L * wg + float(gemm_time(gpu, hg.k, hg.m, hg.n, "bf16"))) \
        + 2.0 * float(e.emb_time_s) / 3.0
    assert w == pytest.approx(w_want, rel=1e-9)
    assert f + b + w == pytest.approx(
        L * float(lf.time_s) + float(e.head_time_s) + float(e.emb_time_s), rel=1e-12)
    assert 0.5 < w / f < 1.0 and b > f
    assert backward_split(job, plan) == pytest.approx((f / (f + b + w), b / (f + b + w),
                                                       w / (f + b + w)))
    f2, b2, w2 = pass_times(job, Plan(dp=4, tp=1, pp=4, mbs=1, num_microbatches=4,
                                      recompute="full"))
    full = fx.layer_factors(job, 0, 1, 1, 1, 0, 1, "full")
    assert (f2, w2) == pytest.approx((f, w), rel=1e-12)
    assert b2 - b == pytest.approx(L * float(full.recompute_s), rel=1e-9)


def test_ep_hidden_share() -> None:
    """DualPipe, p = 4, m = 16: 2(m/2 - p + 1) + (p/2 - 1) = 11 overlapped pairs of 16;
    DualPipeV: 2(m - 2p + 1) + (p - 1) = 21 of its 2m = 32 chunks; none for the others."""
    assert S.ep_hidden_share(Plan(pp=4, num_microbatches=16, schedule="dualpipe")) == 11 / 16
    assert S.ep_hidden_share(Plan(pp=4, vpp=2, num_microbatches=16,
                                  schedule="dualpipev")) == 21 / 32
    assert S.ep_hidden_share(Plan(pp=4, num_microbatches=16, schedule="zb-h1")) == 0.0


# --------------------------------------------------------------------------------------------
# Plan field and rules
# --------------------------------------------------------------------------------------------


def test_old_plans_keep_their_meaning() -> None:
    job = _job()
    a = evaluate(job, Plan(dp=1, tp=4, pp=4, mbs=1, num_microbatches=16))
    b = evaluate(job, Plan(dp=1, tp=4, pp=4, mbs=1, num_microbatches=16, schedule="1f1b"))
    assert a.time.step_s == b.time.step_s and a.memory == b.memory
    assert Plan(vpp=2).pipeline_schedule == "interleaved"
    p = parse_plan("tp=4,pp=4,schedule=zb-h1", job)
    assert parse_plan(p.short(), job) == p and "schedule=zb-h1" in p.short()
    assert "schedule" not in Plan().short()
    assert Plan().key() == Plan(schedule=None).key()


@pytest.mark.parametrize(("text", "msg"), [
    ("tp=4,pp=4,schedule=zbv", "needs vpp=2"),
    ("tp=4,pp=4,vpp=2,schedule=zb-h1", "vpp must be 1"),
    ("tp=4,pp=4,schedule=interleaved", "needs vpp > 1"),
    ("tp=4,pp=4,schedule=dualpipe,mbs=4", "needs an even num_microbatches >= 2*pp"),
    ("tp=2,pp=8,schedule=dualpipev,vpp=2,mbs=2", "needs num_microbatches >= 2*pp"),
    ("tp=8,pp=2,schedule=dualpipe,mbs=16", "needs an even num_microbatches"),
    ("tp=16,pp=1,schedule=zb-h1", "needs pp > 1"),
])
def test_schedule_rules(text: str, msg: str) -> None:
    job = _job()
    bad = plan_violations(job, parse_plan(text, job))
    assert any(msg in b for b in bad), bad


def test_dualpipe_needs_even_pp() -> None:
    job = _job(gpus=24, batch=24, layers=24)
    bad = plan_violations(job, parse_plan("tp=8,pp=3,schedule=dualpipe,mbs=1", job))
    assert any("even pp" in b for b in bad)


def test_bad_schedule_names_the_field() -> None:
    with pytest.raises(PlanError, match="field 'schedule'"):
        parse_plan("schedule=zb")


# --------------------------------------------------------------------------------------------
# ZB-H1 / ZB-H2: the closed form is the replay of their own pass order (cost/pass_order.py)
# --------------------------------------------------------------------------------------------


def _replayed_bubble(schedule: str, p: int, m: int, split: tuple[float, float, float]) -> float:
    """Span of the event-driven replay of the schedule's per-rank orders, equal stages with
    t = 1, beyond the m·t of work: in units of t."""
    part = dict(zip("FBW", split, strict=True))
    runs = replay(schedule, p, 1, [ORDERS[schedule](p, 1, m, r) for r in range(p)],
                  lambda r, op: part[op.phase])
    return max(e for run in runs for _, _, e in run) - m


def test_zb_h2_skewed_split_by_hand() -> None:
    """pp 4, m 8, F, B, W = .2, .5, .3 of t. Rank 0 runs its 2p-1 = 7 warm-up forwards by
    7F = 1.4; micro-batch 0 leaves rank 3 at 4F = 0.8, its B runs down ranks 3..1 (3B = 1.5)
    and reaches rank 0 at 2.3: rank 0 waits 0.9 = (p-1)(B-F) with no W ready, and never again
    (the paper's (p-1)(F+B-2W) = 0.3 and the ramp (p-1)F = 0.6 are both below)."""
    split = (0.2, 0.5, 0.3)
    assert S.bubble_ratio("zb-h2", 4, split, 8) * 3 == pytest.approx(0.9)
    assert _replayed_bubble("zb-h2", 4, 8, split) == pytest.approx(0.9)
    # ZB-H1's first rank holds p = 4: it waits (p-1)B = 1.5 (F+B-W = .4 per stage below it)
    assert S.bubble_ratio("zb-h1", 4, split, 8) * 3 == pytest.approx(1.5)
    assert _replayed_bubble("zb-h1", 4, 8, split) == pytest.approx(1.5)
    # memory: every rank of the order holds 2p-1 = 7 micro-batches' inputs at its peak
    for r in range(4):
        held = peak = 0
        for (op,) in ORDERS["zb-h2"](4, 1, 8, r):
            held += {"F": 1, "B": 0, "W": -1}[op.phase]
            peak = max(peak, held)
        assert peak == S.inflight_units(Plan(pp=4, num_microbatches=8, schedule="zb-h2"),
                                        r, (1,)) == 7


_SHARE = st.floats(min_value=0.01, max_value=1.0, allow_nan=False)


@settings(max_examples=150, deadline=None)
@given(schedule=st.sampled_from(["zb-h1", "zb-h2"]), p=st.integers(2, 8),
       m_over_p=st.floats(min_value=0.0, max_value=3.0), f=_SHARE, b=_SHARE, w=_SHARE)
def test_zero_bubble_closed_form_is_the_replay(schedule: str, p: int, m_over_p: float,
                                               f: float, b: float, w: float) -> None:
    """For equal stages, any F/B/W split and every m (1 .. 3p: few micro-batches too, Qi
    Appendix H), `bubble_ratio` x (p-1) t equals the replay of the schedule's own order:
    cost, timeline and memory describe one schedule; the ratio is in [0, F + B] and does not
    grow with m (schedule_axis.py's bounds rely on both)."""
    m = max(1, round(m_over_p * p))
    total = f + b + w
    split = (f / total, b / total, w / total)
    want = _replayed_bubble(schedule, p, m, split)
    rho = S.bubble_ratio(schedule, p, split, m)
    assert rho * (p - 1) == pytest.approx(want, abs=1e-9)
    assert -1e-12 <= rho <= split[0] + split[1] + 1e-12
    assert S.bubble_ratio(schedule, p, split, m + 1) <= rho + 1e-12


def test_few_microbatches_by_hand() -> None:
    """Qi et al. Appendix H: with m <= p and all W deferred a step takes (m+p-1)(F+B) + W, a
    bubble of (p-1)(F+B) - (m-1)W. F, B, W = .4, .4, .2 (Table 9's 1.5B shape), p = 8:
    ZB-H2 at m = 2: 7·.8 - .2 = 5.4 of 1F1B's 7 (0.771), at m = 4: 7·.8 - .6 = 5.0 beside
    the (p-h-1)F + (p-h)B = 5·.4 + 6·.4 = 4.4 path; at m >= 2p - 1 = 15 the steady
    max(F+B-2W, B-F, F) = .4 (2.8 of 7). ZB-H1 at m = 2: 5.4 too, at m >= p: F+B-W = .6."""
    split = (0.4, 0.4, 0.2)
    assert S.bubble_ratio("zb-h2", 8, split, 2) * 7 == pytest.approx(5.4)
    assert _replayed_bubble("zb-h2", 8, 2, split) == pytest.approx(5.4)
    assert S.bubble_ratio("zb-h2", 8, split, 4) * 7 == pytest.approx(5.0)
    assert _replayed_bubble("zb-h2", 8, 4, split) == pytest.approx(5.0)
    assert S.bubble_ratio("zb-h2", 8, split, 15) == pytest.approx(0.4)
    assert S.bubble_ratio("zb-h2", 8, split, 1) == pytest.approx(0.8)
    assert S.bubble_ratio("zb-h1", 8, split, 2) * 7 == pytest.approx(5.4)
    assert S.bubble_ratio("zb-h1", 8, split, 8) == pytest.approx(0.6)
    assert _replayed_bubble("zb-h1", 8, 8, split) == pytest.approx(0.6 * 7)


def test_the_compiled_replay_is_the_replay_step_for_step() -> None:
    """`pipeline_sim.makespan` runs the compiled steps (`compile_dag`); a direct
    event replay written here (each rank in order, a step once its inputs have ended) gives
    the same float, bit for bit, on ZBV and DualPipeV lists with random durations; a list
    that waits on an action never run is a ValueError."""
    import random

    from autoparallel_cp.cost.pipeline_sim import dualpipev_actions, makespan, zbv_actions

    def direct(orders: list, stages: int, dur: Any) -> float:
        done: dict = {}
        free = [0.0] * len(orders)
        idx = [0] * len(orders)
        left = sum(map(len, orders))

        def deps(a: tuple) -> list:
            k, s, i = a
            if k == "F":
                return [("F", s - 1, i)] if s > 0 else []
            if k in ("I", "B"):
                return [("F", s, i)] + ([("I", s + 1, i)] if s < stages - 1 else [])
            return [("I", s, i)]

        while left:
            for r, order in enumerate(orders):
                while idx[r] < len(order):
                    step = order[idx[r]]
                    parts = [step[1], step[2]] if step[0] == "FB" else [step]
                    need = [d for a in parts for d in deps(a)]
                    if any(d not in done for d in need):
                        break
                    start = max([free[r]] + [done[d] for d in need])
                    end = start + sum(dur("I", a[1]) + dur("W", a[1]) if a[0] == "B"
                                      else dur(a[0], a[1]) for a in parts)
                    for k, s, i in parts:
                        done[k, s, i] = end
                        if k == "B":
                            done["I", s, i] = end
                    free[r] = end
                    idx[r] += 1
                    left -= 1
        return max(free)

    rnd = random.Random(7)
    for make, p, m in [(zbv_actions, 3, 2), (zbv_actions, 4, 9), (zbv_actions, 6, 30),
                       (dualpipev_actions, 2, 4), (dualpipev_actions, 4, 11),
                       (dualpipev_actions, 6, 40)]:
        orders = [make(p, r, m) for r in range(p)]
        for _ in range(4):
            t = [rnd.uniform(0.1, 3.0) for _ in range(p)]
            sh = {"F": rnd.random(), "I": rnd.random(), "W": rnd.random()}

            def dur(k: str, s: int, t: list = t, sh: dict = sh, p: int = p) -> float:
                return 0.5 * t[s if s < p else 2 * p - 1 - s] * sh[k]

            assert makespan(orders, 2 * p, dur) == direct(orders, 2 * p, dur)
    with pytest.raises(ValueError, match="deadlocks"):
        makespan([[("I", 0, 0)]], 1, lambda k, s: 1.0)
