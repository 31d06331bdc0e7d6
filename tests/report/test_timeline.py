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
    depends_on,
    interleaved_1f1b,
    one_f_one_b,
)
from autoparallel_cp.cost.timeline import KINDS, Timeline, timeline
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import PlanError

BREAKDOWN = {"compute": "compute_s", "bubble": "bubble_s", "tp": "tp_comm_s",
             "cp": "cp_comm_s", "ep": "ep_comm_s", "pp": "pp_comm_s", "dp": "dp_comm_s",
             "optimizer": "optimizer_s", "fixed": "fixed_s"}
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@cache
def _job(model: str, gpus: int, recipe: str, batch: int = 64) -> Job:
    return api.make_job(model, "dgx-h100", gpus=gpus, seq_len=2048, global_batch=batch,
                        recipe=recipe)


def check_adds_up(job: Job, plan_text: str) -> Timeline:
    """Span = step, critical sums = breakdown, per stage the passes = m x its stage time."""
    ev = api.evaluate(job, plan_text)
    tl = timeline(job, ev.plan)
    start = min(s.start_s for s in tl.slices)
    end = max(s.end_s for s in tl.slices)
    assert start == pytest.approx(0.0, abs=1e-12)
    assert end - start == pytest.approx(ev.time.step_s, rel=1e-9)
    sums = tl.kind_sums()
    assert set(sums) == set(KINDS)
    for kind, field in BREAKDOWN.items():
        assert sums[kind] == pytest.approx(getattr(ev.time, field), rel=1e-9, abs=1e-12), kind
    assert sum(sums.values()) == pytest.approx(ev.time.step_s, rel=1e-9)
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
    assert len(passes) == ev.plan.pp * m * ev.plan.vpp * 2
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
@pytest.mark.parametrize(("pp", "m"), [(1, 3), (2, 2), (4, 4), (4, 6), (4, 9), (3, 7)])
def test_schedules_run_every_pass_once_without_deadlock(name: str, pp: int, m: int) -> None:
    vpp = 3 if name == "interleaved-1f1b" else 1
    if name == "interleaved-1f1b" and m < pp:
        return
    for j in range(pp):
        order = SCHEDULES[name](pp, vpp, m, j)
        assert sorted(order) == sorted(Op(i, c, ph) for i in range(m) for c in range(vpp)
                                       for ph in "FB")
        seen: set[Op] = set()
        for op in order:  # a stage's own backward follows its forward of the same chunk
            if op.phase == "B":
                assert Op(op.microbatch, op.chunk, "F") in seen
            seen.add(op)
            dep = depends_on(op, j, pp, vpp)
            assert dep is None or 0 <= dep[0] < pp


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
    assert timeline(job, ev.plan, schedule="interleaved-1f1b").schedule == "1f1b"


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
