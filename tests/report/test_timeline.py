"""The step timeline (cost/timeline.py) adds up to the cost model: its span is the predicted
step time and its critical slices' sums by kind are `Evaluation.time`'s breakdown, over pp,
vpp, cp, ep, ZeRO-3, uneven layouts and the presets (hypothesis)."""

from __future__ import annotations

from collections import defaultdict
from functools import cache

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from autoparallel_cp import api
from autoparallel_cp.cost.pass_order import (
    SCHEDULES,
    Op,
    dependencies,
    interleaved_1f1b,
    one_f_one_b,
    produces,
    zb_h1,
    zb_h2,
)
from autoparallel_cp.cost.timeline import KINDS, Timeline, timeline
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import PlanError
from autoparallel_cp.spec.schedules import SPLIT_BACKWARD

BREAKDOWN = {"compute": "compute_s", "bubble": "bubble_s", "tp": "tp_comm_s",
             "cp": "cp_comm_s", "ep": "ep_comm_s", "pp": "pp_comm_s", "dp": "dp_comm_s",
             "optimizer": "optimizer_s", "offload": "offload_s", "fixed": "fixed_s"}
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@cache
def _job(model: str, gpus: int, recipe: str, batch: int = 64) -> Job:
    return api.make_job(model, "dgx-h100", gpus=gpus, seq_len=2048, global_batch=batch,
                        recipe=recipe)


def check_dependencies(tl: Timeline) -> None:
    """Every pass starts no earlier than every pass it depends on ends (on any stage)."""
    begin: dict[tuple[int, Op], float] = {}
    end: dict[tuple[int, Op], float] = {}
    for s in tl.slices:
        if s.op is not None and s.exposed:
            key = (s.stage, s.op)
            begin[key] = min(begin.get(key, s.start_s), s.start_s)
            end[key] = max(end.get(key, s.end_s), s.end_s)
    ready = {produces(op, j): e for (j, op), e in end.items()}
    tol = 1e-9 * tl.step_s
    for (j, op), b in begin.items():
        for dep in dependencies(tl.schedule, tl.pp, tl.vpp, j, op):
            if dep != produces(op, j):
                assert ready[dep] <= b + tol, (tl.schedule, j, op, dep)
    for r_from, op_from, r_to, op_to in tl.links:  # the trace's arrows go forward in time
        assert r_from != r_to and end[r_from, op_from] <= begin[r_to, op_to] + tol


def check_adds_up(job: Job, plan_text: str, schedule: str | None = None) -> Timeline:
    """Span = step (+ the cost model's gap to the replay, `Timeline.model_gap_s`), critical
    sums = breakdown, per stage the passes = m x its stage time, dependencies respected."""
    ev = api.evaluate(job, plan_text)
    tl = timeline(job, ev.plan, schedule=schedule)
    start = min(s.start_s for s in tl.slices)
    end = max(s.end_s for s in tl.slices)
    assert start == pytest.approx(0.0, abs=1e-12)
    assert tl.model_gap_s >= 0.0
    assert end - start == pytest.approx(ev.time.step_s + tl.model_gap_s, rel=1e-9)
    sums = tl.kind_sums()
    assert set(sums) == set(KINDS)
    for kind, field in BREAKDOWN.items():
        want = getattr(ev.time, field) + (tl.model_gap_s if kind == "bubble" else 0.0)
        assert sums[kind] == pytest.approx(want, rel=1e-9, abs=1e-12), kind
    assert sum(sums.values()) == pytest.approx(ev.time.step_s + tl.model_gap_s, rel=1e-9)
    check_dependencies(tl)
    m = ev.plan.num_microbatches
    per_stage: dict[int, float] = defaultdict(float)
    for s in tl.slices:
        assert s.dur_s > 0
        if s.op is not None and s.exposed:
            per_stage[s.stage] += s.dur_s
        if not s.exposed:
            assert not s.critical
    for j, t in enumerate(ev.stage_time_s):
        assert per_stage[j] == pytest.approx(m * t, rel=1e-9)
        # no two slices of one row of a stage overlap, and the passes end with the pipeline
        rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for s in tl.slices:
            if s.stage == j and s.op is not None:
                rows[s.row + ("" if s.exposed else " hidden")].append((s.start_s, s.end_s))
                assert s.end_s <= tl.pipeline_s * (1 + 1e-9)
        for spans in rows.values():
            spans.sort()
            for (_, e0), (s1, _) in zip(spans, spans[1:], strict=False):
                assert s1 >= e0 - 1e-9 * tl.step_s
    # every pass of every micro-batch and chunk is drawn on every stage
    passes = {(s.stage, s.op) for s in tl.slices if s.op is not None and s.row == "compute"}
    split = tl.schedule in SPLIT_BACKWARD
    assert len(passes) >= ev.plan.pp * m * ev.plan.vpp * 2
    assert len(passes) <= ev.plan.pp * m * ev.plan.vpp * (3 if split else 2)
    return tl


CASES = [
    ("gpt3-1.3b", 8, "megatron-bf16", "tp=2,pp=1,mbs=1"),
    ("gpt3-1.3b", 16, "megatron-bf16", "tp=2,pp=4,mbs=1,recompute=selective,zero=1"),
    ("gpt3-1.3b", 16, "megatron-bf16", "tp=1,pp=4,vpp=3,mbs=1,zero=1"),
    ("gpt3-1.3b", 16, "megatron-bf16", "tp=2,pp=2,cp=2,mbs=1,zero=1"),
    ("gpt3-1.3b", 16, "megatron-bf16", "tp=1,pp=4,mbs=2,stage_layers=5:7:7:5"),
    ("gpt3-1.3b", 16, "megatron-bf16", "tp=1,pp=4,vpp=2,mbs=1,stage_layers=4:7:7:6"),
    ("gpt3-1.3b", 16, "torchtitan-fsdp", "tp=2,pp=1,mbs=1,zero=3"),
    ("gpt3-1.3b", 16, "torchtitan-fsdp", "tp=1,pp=2,mbs=1,zero=3,recompute=full"),
    ("mixtral-8x7b", 32, "megatron-bf16", "tp=2,pp=2,ep=4,mbs=1,zero=1,recompute=full"),
    ("mixtral-8x7b", 32, "megatron-bf16", "tp=1,pp=4,vpp=2,ep=8,mbs=1,zero=1,recompute=full"),
]


@pytest.mark.parametrize(("model", "gpus", "recipe", "plan"), CASES)
def test_timeline_adds_up(model: str, gpus: int, recipe: str, plan: str) -> None:
    check_adds_up(_job(model, gpus, recipe), plan)


@SETTINGS
@given(model=st.sampled_from(["gpt3-1.3b", "llama3-8b", "mixtral-8x7b"]),
       recipe=st.sampled_from(["megatron-bf16", "torchtitan-fsdp", "pytorch-amp"]),
       tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 4]),
       vpp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2, 4]),
       zero=st.sampled_from([0, 1, 2, 3]), mbs=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]),
       uneven=st.booleans(), batch=st.sampled_from([32, 48, 64]))
def test_timeline_adds_up_on_many_plans(model: str, recipe: str, tp: int, pp: int, vpp: int,
                                        cp: int, ep: int, zero: int, mbs: int, recompute: str,
                                        uneven: bool, batch: int) -> None:
    job = _job(model, 32, recipe, batch)
    text = f"tp={tp},pp={pp},vpp={vpp},cp={cp},ep={ep},zero={zero},mbs={mbs},recompute={recompute}"
    if uneven and pp > 1:
        n = job.model.num_layers
        base = [n // pp] * pp
        base[0] -= 1
        base[-1] += 1 + n - sum(base) - 1
        base[1] += 1
        text += ",stage_layers=" + ":".join(str(x) for x in base)
    try:
        api.evaluate(job, text)
    except (PlanError, UserError, ValueError):
        assume(False)
    check_adds_up(job, text)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize(("pp", "m"), [(1, 3), (2, 2), (2, 4), (4, 4), (4, 6), (4, 8), (4, 9),
                                       (3, 7), (6, 12), (8, 16)])
def test_schedules_run_every_pass_once_without_deadlock(name: str, pp: int, m: int) -> None:
    from autoparallel_cp.cost.pass_replay import replay
    from autoparallel_cp.spec.schedules import schedule_violations

    vpp = {"interleaved": 3, "zbv": 2, "dualpipev": 2}.get(name, 1)
    if schedule_violations(name, pp, vpp, m) or (pp == 1 and name != "1f1b"):
        return
    orders = [SCHEDULES[name](pp, vpp, m, j) for j in range(pp)]
    for j in range(pp):
        ops = [op for step in orders[j] for op in step]
        assert len(ops) == len(set(ops))
        lines = 2 if name == "dualpipe" else 1
        fwd = sorted((op.microbatch, op.chunk) for op in ops if op.phase == "F")
        assert len(fwd) == m * vpp * (1 if lines == 1 else 1)
        seen: set[Op] = set()
        for op in ops:  # a pass's own inputs come first; every F has its backward
            if op.phase in ("B", "BW"):
                assert Op(op.microbatch, op.chunk, "F") in seen
            if op.phase == "W":
                assert Op(op.microbatch, op.chunk, "B") in seen
            seen.add(op)
        for op in ops:
            if op.phase == "F":
                assert (Op(op.microbatch, op.chunk, "B") in seen) != (
                    Op(op.microbatch, op.chunk, "BW") in seen)
            if op.phase == "B" and name in SPLIT_BACKWARD:
                assert Op(op.microbatch, op.chunk, "W") in seen
    # the orders run to the end under any per-pass durations (no deadlock)
    for unit in (lambda r, op: 1.0, lambda r, op: 1.0 + r + 0.5 * (op.phase == "F")):
        runs = replay(name, pp, vpp, orders, unit)
        assert sum(len(r) for r in runs) == sum(len(o) for o in orders)


def test_one_f_one_b_order() -> None:
    # Narayanan et al. 2021 Fig. 4 (top): 4 stages, the first runs 3 warm-up forwards
    assert [f"{o.phase}{o.microbatch}" for o in one_f_one_b(4, 1, 6, 0)] == [
        "F0", "F1", "F2", "F3", "B0", "F4", "B1", "F5", "B2", "B3", "B4", "B5"]
    assert [f"{o.phase}{o.microbatch}" for o in one_f_one_b(4, 1, 6, 3)] == [
        "F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3", "F4", "B4", "F5", "B5"]


def test_interleaved_order() -> None:
    # Megatron: pp=2, vpp=2, m=4: groups of 2 micro-batches, chunk by chunk; stage 0 warms up
    # with 2(pp-1) + (vpp-1)·2 = 4 forwards; backwards run chunk 1 first
    order = [f"{o.phase}{o.microbatch}c{o.chunk}" for o in interleaved_1f1b(2, 2, 4, 0)]
    assert order[:4] == ["F0c0", "F1c0", "F0c1", "F1c1"]
    assert order[4:6] == ["F2c0", "B0c1"]
    assert order[-1] == "B3c0"


def test_bubble_is_visible_and_pipeline_fill_is_ordered() -> None:
    job = _job("gpt3-1.3b", 16, "megatron-bf16")
    tl = check_adds_up(job, "tp=1,pp=4,mbs=1,zero=1")
    first = {j: min(s.start_s for s in tl.slices if s.stage == j and s.row == "compute")
             for j in range(4)}
    assert first[0] < first[1] < first[2] < first[3]  # the fill runs down the pipeline
    bubbles = [s for s in tl.slices if s.kind == "bubble" and s.stage == 3]
    assert bubbles and bubbles[0].start_s == 0.0


def test_gpipe_placement_adds_up_like_1f1b() -> None:
    job = _job("gpt3-1.3b", 16, "megatron-bf16")
    ev = api.evaluate(job, "tp=1,pp=4,mbs=1,zero=1")
    one = timeline(job, ev.plan)
    gp = timeline(job, ev.plan, schedule="gpipe")
    assert gp.schedule == "gpipe" and one.schedule == "1f1b"
    assert gp.kind_sums() == pytest.approx(one.kind_sums(), rel=1e-9)
    # GPipe: the first stage runs every forward before its first backward
    s0 = sorted((s.start_s, s.op.phase) for s in gp.slices
                if s.stage == 0 and s.op is not None and s.row == "compute")
    phases = [p for _, p in s0]
    assert phases == ["F"] * ev.plan.num_microbatches + ["B"] * ev.plan.num_microbatches
    # the interleaved order is not drawn for a plan without model chunks
    assert timeline(job, ev.plan, schedule="interleaved").schedule == "1f1b"
    assert timeline(job, ev.plan, schedule="zbv").schedule == "1f1b"


def test_calibrated_fixed_time_and_per_microbatch_time_add_up() -> None:
    from autoparallel_cp.spec.calibration import Calibration

    base = _job("gpt3-1.3b", 16, "megatron-bf16")
    job = base.model_copy(update={"calibration": Calibration(per_step_s=0.4,
                                                             per_microbatch_s=0.01)})
    tl = check_adds_up(job, "tp=1,pp=4,vpp=2,mbs=1,zero=1")
    fixed = [s for s in tl.slices if s.kind == "fixed"]
    assert len(fixed) == 1 and fixed[0].dur_s == pytest.approx(0.4)
    assert fixed[0].end_s == pytest.approx(tl.step_s, rel=1e-12)


def test_the_same_plan_gives_the_same_slices() -> None:
    job = _job("mixtral-8x7b", 32, "megatron-bf16")
    ev = api.evaluate(job, "tp=1,pp=4,vpp=2,ep=8,mbs=1,zero=1,recompute=full")
    assert timeline(job, ev.plan) == timeline(job, ev.plan)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 1, 8), (4, 1, 2), (4, 2, 8), (4, 3, 6),
                                              (2, 4, 5), (8, 2, 12), (3, 2, 7)])
def test_schedule_orders_hold_what_the_memory_model_holds(pp: int, vpp: int, m: int) -> None:
    """The peak of forwards run and not yet backed up is cost/sync.py `inflight` (in chunks):
    the timeline's order is the one the memory model counts."""
    from autoparallel_cp.cost.sync import inflight

    order_of = one_f_one_b if vpp == 1 else interleaved_1f1b
    for j in range(pp):
        held = peak = 0
        for op in order_of(pp, vpp, m, j):
            held += 1 if op.phase == "F" else -1
            peak = max(peak, held)
        assert peak == pytest.approx(float(inflight(pp, vpp, m, j)) * vpp)


@pytest.mark.parametrize("recipe", ["megatron-bf16", "pytorch-amp", "torchtitan-fsdp",
                                    "pytorch-fsdp", "deepspeed", "megatron-fp8"])
def test_every_recipe_preset_adds_up(recipe: str) -> None:
    """Each framework's behaviour (DeepSpeed's per-micro-batch ZeRO-2 reduce, BF16_Optimizer's
    accumulation, FSDP's per-unit calls, fp8) lands in its kind of slice."""
    job = _job("llama3-8b", 32, recipe)
    for text in ("tp=2,pp=2,mbs=1,zero=1", "tp=2,pp=2,mbs=1,zero=2", "tp=1,pp=2,mbs=1,zero=3"):
        try:
            api.evaluate(job, text)
        except (PlanError, UserError, ValueError):
            continue
        check_adds_up(job, text)


def test_mtp_and_experts_add_up() -> None:
    """DeepSeek-V3: MLA, 256 experts over ep, and the MTP depth on the last stage."""
    job = api.make_job("deepseek-v3", "dgx-h100", gpus=256, seq_len=4096, global_batch=256)
    assert job.model.mtp_layers == 1
    check_adds_up(job, "tp=1,pp=8,ep=32,mbs=1,zero=1,recompute=full")


def test_a_behaviour_override_adds_up_like_evaluate() -> None:
    """`options` (a FrameworkBehaviour override) reach the timeline as they reach evaluate."""
    from autoparallel_cp.cost.evaluate import evaluate

    job = _job("gpt3-1.3b", 16, "megatron-bf16")
    ev0 = api.evaluate(job, "tp=1,pp=4,mbs=1,zero=1")
    opts = job.recipe.behaviour.model_copy(update={"dp_overlap": False,
                                                   "pp_scatter_gather": True})
    ev = evaluate(job, ev0.plan, opts)
    tl = timeline(job, ev0.plan, opts)
    assert tl.step_s == pytest.approx(ev.time.step_s, rel=1e-12)
    assert tl.step_s != pytest.approx(ev0.time.step_s, rel=1e-9)
    sums = tl.kind_sums()
    for kind, field in BREAKDOWN.items():
        assert sums[kind] == pytest.approx(getattr(ev.time, field), rel=1e-9, abs=1e-12)


def _names(order: list[Op]) -> list[str]:
    return [f"{o.phase}{o.microbatch}" for o in order]


def test_zero_bubble_orders_pp4_m8() -> None:
    """Qi et al. 2401.10241 Figure 3, pp = 4, m = 8 (0-indexed stages): ZB-H1 keeps 1F1B's
    warm-up (3, 2, 1, 0 forwards) and each stage j holds back j weight-gradient passes, run in
    the drain; ZB-H2 runs 2(pp - j) - 1 forwards before its first B (7 on the first stage,
    Qi Figure 3: the last stage runs its B right after its first F)."""
    assert _names(zb_h1(4, 1, 8, 0)) == [
        "F0", "F1", "F2", "F3", "B0", "W0", "F4", "B1", "W1", "F5", "B2", "W2", "F6", "B3", "W3",
        "F7", "B4", "W4", "B5", "W5", "B6", "W6", "B7", "W7"]
    assert _names(zb_h1(4, 1, 8, 3)) == [
        "F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3", "W0", "F4", "B4", "W1", "F5", "B5", "W2",
        "F6", "B6", "W3", "F7", "B7", "W4", "W5", "W6", "W7"]
    assert _names(zb_h2(4, 1, 8, 0))[:9] == [f"F{i}" for i in range(7)] + ["B0", "W0"]
    assert _names(zb_h2(4, 1, 8, 3))[:3] == ["F0", "B0", "F1"]


def test_dualpipe_runs_both_directions_pp4_m8() -> None:
    """DualPipe (2412.19437 Figure 5, 8 ranks / 20 micro-batches in the paper; here pp 4, m 8):
    rank 0 starts line 0 and rank 3 line 1 at once, each with 2(pp/2 - 1) + 1 forwards before
    the other line's first forward reaches it, and the steady state runs F&B pairs."""
    r0 = SCHEDULES["dualpipe"](4, 1, 8, 0)
    r3 = SCHEDULES["dualpipe"](4, 1, 8, 3)
    assert [s[0].chunk for s in r0[:3]] == [0, 0, 0] and r0[3][0].chunk == 1
    assert [s[0].chunk for s in r3[:3]] == [1, 1, 1] and r3[3][0].chunk == 0
    assert any(len(s) == 2 for s in r0) and all(len(s) <= 2 for s in r0)
    # each rank runs m/2 micro-batches per line, m forwards in all
    assert sum(op.phase == "F" for s in r0 for op in s) == 8


def test_replayed_bubble_is_the_papers_for_equal_stages() -> None:
    """With F = B = W and equal stages, the replay of each order has the paper's bubble over
    the last rank's m·t (2401.10241 Table 2, 2412.19437 Table 2; the V ones cost/schedules.py's
    replay): the orders are the ones the cost model prices."""
    from autoparallel_cp.cost.pass_replay import replay

    pp, m = 4, 8
    for name, vpp, want in [("1f1b", 1, 3.0), ("gpipe", 1, 3.0), ("zb-h1", 1, 1.0),
                            ("zb-h2", 1, 1.0), ("dualpipe", 1, 2.0 / 3.0),
                            ("interleaved", 2, 1.5)]:
        split = name in SPLIT_BACKWARD
        part = {"F": 1 / 3, "B": 1 / 3 if split else 2 / 3, "W": 1 / 3, "BW": 2 / 3}
        orders = [SCHEDULES[name](pp, vpp, m, j) for j in range(pp)]
        runs = replay(name, pp, vpp, orders, lambda r, op, v=vpp, p=part: p[op.phase] / v)
        span = max(e for run in runs for _, _, e in run)
        assert span - m == pytest.approx(want), name


@SETTINGS
@given(schedule=st.sampled_from(["1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipe",
                                 "dualpipev", "gpipe"]),
       pp=st.sampled_from([2, 4, 8]), zero=st.sampled_from([1, 3]),
       recompute=st.sampled_from(["none", "full"]), uneven=st.booleans(),
       batch=st.sampled_from([32, 64]), ep=st.sampled_from([1, 2]))
def test_every_schedule_adds_up_and_respects_dependencies(
        schedule: str, pp: int, zero: int, recompute: str, uneven: bool, batch: int,
        ep: int) -> None:
    """Span, sums and rows as `check_adds_up`, and every pass after those it depends on, for
    each schedule on pp > 2, vpp > 1 and uneven stages."""
    model = "mixtral-8x7b" if ep > 1 else "llama3-8b"
    job = _job(model, 32, "megatron-bf16", batch)
    vpp = 2 if schedule in ("interleaved", "zbv", "dualpipev") else 1
    text = (f"tp=2,pp={pp},vpp={vpp},ep={ep},zero={zero},mbs=1,recompute={recompute},"
            f"schedule={schedule}")
    if uneven:
        n = job.model.num_layers
        base = [n // pp] * pp
        base[0] -= 1
        base[1] += 1
        text += ",stage_layers=" + ":".join(str(x) for x in base)
    try:
        api.evaluate(job, text)
    except (PlanError, UserError, ValueError):
        assume(False)
    tl = check_adds_up(job, text)
    assert tl.schedule == schedule


def test_v_orders_are_torchs_pp4_m8() -> None:
    """ZBV and DualPipeV on pp 4, m 8 are cost/pipeline_sim.py's action lists (torch v2.13.0
    `ScheduleZBVZeroBubble` / `ScheduleDualPipeV`): rank 0 warms up with 2·pp - 1 forwards of
    its first chunk (ZBV) and runs its first chunk-1 forward once stage 2pp-1's input reaches
    it; the last rank starts F0 of both its chunks back to back (the V's turn)."""
    def names(steps: list[tuple[Op, ...]]) -> list[str]:
        return ["&".join(f"{o.phase}{o.microbatch}c{o.chunk}" for o in s) for s in steps]

    z0 = names(SCHEDULES["zbv"](4, 2, 8, 0))
    assert z0[:8] == [f"F{i}c0" for i in range(7)] + ["F0c1"]
    z3 = names(SCHEDULES["zbv"](4, 2, 8, 3))
    assert z3[:3] == ["F0c0", "F0c1", "F1c0"]
    d0 = names(SCHEDULES["dualpipev"](4, 2, 8, 0))
    assert d0[:8] == [f"F{i}c0" for i in range(7)] + ["F0c1"]
    assert any("&" in s for s in d0)  # the overlapped F&B pairs


def test_a_gap_between_the_model_and_the_replay_is_shown() -> None:
    """ZB-H2 on gpt3-1.3b pp 2: the cost model's closed form (equal stages) is below the
    replay of the order for these unequal ones (embedding, head); the timeline draws the
    replay (dependencies held), its span step + model_gap_s, and the trace and the page say
    so."""
    from autoparallel_cp.html_report.figures import timeline_caption
    from autoparallel_cp.trace import chrome_trace

    job = _job("gpt3-1.3b", 32, "megatron-bf16")
    text = "tp=2,pp=2,mbs=1,zero=1,schedule=zb-h2"
    tl = check_adds_up(job, text)
    assert 0.0 < tl.model_gap_s < 0.01 * tl.step_s
    assert "longer than the predicted step" in timeline_caption(tl)
    ev = api.evaluate(job, text)
    assert chrome_trace(job, ev.plan)["otherData"]["model_gap_s"] == tl.model_gap_s
    # the default schedules have none
    assert check_adds_up(job, "tp=2,pp=2,mbs=1,zero=1").model_gap_s == 0.0
