"""One cost, everywhere: for random plans (pp > 1, interleaving, partial recompute, ZeRO-3, CP,
EP, MoE parallel folding (etp, ep over tensor ranks), two node groups with explicit stage
placement, the GPipe, ZB-H1 and ZB-H2 schedules; Megatron's splits: pp*vpp not dividing the
layers, stage counts not multiples of vpp, explicit model chunks, micro-batch counts pp does
not divide) the solver's cost tables (`tables.plan_cost`), the enumerator's score, the CP-SAT
solver's reported plan and `cost/evaluate.evaluate()` agree on the step time, the per-stage
times and the per-stage peak memory. Each search is pinned (`--fix`) to the one drawn plan, so
the enumerator and the solver must score exactly that plan."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from autoparallel_cp.cost.constants import CUDA_CONTEXT_BYTES
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.errors import UserError
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import RECIPES, ClusterSpec, Job, ModelSpec, MoESpec
from autoparallel_cp.spec.loaders import load_cluster
from autoparallel_cp.spec.plan import Plan, plan_violations, uneven_chunks

GPUS = 16  # one 8-GPU H100 node + one 8-GPU A100 node
BATCH = 16


def _two_groups() -> ClusterSpec:
    c = load_cluster("mixed-h100-a100")
    return c.model_copy(update={"node_groups": [g.model_copy(update={"num_nodes": 1})
                                                for g in c.node_groups]})


def _model(moe: bool, layers: int, mtp: int = 0, tied: bool = False) -> ModelSpec:
    return ModelSpec(
        name="mini-moe" if moe else "mini", num_layers=layers, hidden_size=1024, mtp_layers=mtp,
        tie_embeddings=tied,
        ffn_hidden_size=2816, num_attention_heads=8, num_kv_heads=4, vocab_size=32000,
        moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=1408,
                    first_k_dense_layers=1) if moe else None)


def _fix(p: Plan, layers: int, moe: bool = False) -> str:
    """The `--fix` text pinning every axis of `p` (with `partial_recompute` off when `p` says
    no recompute_layers: a search space of exactly one plan); for an MoE model the experts'
    tensor-parallel size too (etp is a searched axis there)."""
    parts = [f"{k}={getattr(p, k)}" for k in ("dp", "tp", "pp", "vpp", "cp", "ep", "sp",
                                                "zero", "mbs", "recompute")]
    if p.recompute_layers is not None:
        parts.append(f"recompute_layers={p.recompute_layers}")
    parts.append("stage_layers=" + ":".join(map(str, p.layers_per_stage(layers))))
    if p.stage_groups is not None:
        parts.append("stage_groups=" + ":".join(map(str, p.stage_groups)))
    if p.chunk_layers is not None:
        parts.append("chunk_layers=" + ":".join(map(str, p.chunk_layers)))
    if p.etp is not None or moe:
        parts.append(f"etp={p.expert_tp}")
    # the plan's schedule (search/schedule_axis.py), today's default pinned too: without a
    # pin the space is the union with zb-h1 / zb-h2, whose plans of the same key may be faster
    parts.append(f"schedule={p.pipeline_schedule}")
    return ",".join(parts)


def _composition(draw: Any, total: int, parts: int, least: int) -> tuple[int, ...]:
    """A random split of `total` into `parts` counts of at least `least` each."""
    spare = total - parts * least
    assume(spare >= 0)
    cuts = sorted(draw(st.lists(st.integers(0, spare), min_size=parts - 1,
                                max_size=parts - 1)))
    bounds = [0, *cuts, spare]
    return tuple(least + b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))


@st.composite
def _cases(draw: Any, new_splits: bool = False) -> tuple[Job, Plan]:
    """A random plan; `new_splits`: always interleaved, with Megatron's uneven splits."""
    moe = draw(st.booleans())
    layers = draw(st.sampled_from([4, 8, 7, 6]))
    recipe = draw(st.sampled_from(["megatron-bf16", "torchtitan-fsdp", "deepspeed"]))
    batch = draw(st.sampled_from([BATCH, 6, 10]))  # 6, 10: m that pp does not divide
    # DeepSeek-V3 multi-token prediction: one MTP depth on the last stage
    # Megatron-Core's p2p overlap (the exposed share depends on pp and m, which the tables
    # derive from tp, cp, dp and mbs) and the scatter/gather of the pipeline sends
    behaviour = {"overlap_p2p_comm": draw(st.booleans()),
                 "pp_scatter_gather": draw(st.booleans())}
    job = Job(model=_model(moe, layers, draw(st.sampled_from([0, 1]))), cluster=_two_groups(),
              recipe=RECIPES[recipe].with_behaviour(**behaviour),
              seq_len=draw(st.sampled_from([4096, 8192])), global_batch=batch)
    pp = draw(st.sampled_from([2, 4]))
    vpp = 2 if new_splits else draw(st.sampled_from([2, 1]))
    per_stage = GPUS // pp
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if per_stage % t == 0]))
    cp = draw(st.sampled_from([c for c in (1, 2, 4) if per_stage % (tp * c) == 0]))
    dp = per_stage // (tp * cp)
    # expert-TP size: Megatron's default (None = tp), or folded (ep over tp*cp*dp ranks)
    etp = draw(st.sampled_from([None, 1, 2, tp])) if moe else None
    if etp is None:
        ep = draw(st.sampled_from([e for e in (1, 2, 4) if (dp * cp) % e == 0])) if moe else 1
    else:
        ep = draw(st.sampled_from([e for e in (1, 2, 4) if (tp * cp * dp) % (e * etp) == 0]
                                  or [1]))
    mbs_ok = [m for m in (1, 2) if batch % (dp * m) == 0]
    assume(mbs_ok)
    mbs = draw(st.sampled_from(mbs_ok))
    mode = draw(st.sampled_from(["full", "selective", "none"]))
    r_layers = draw(st.none() | st.integers(0, layers)) if mode == "full" else None
    stage_layers = chunk_layers = None
    split = draw(st.sampled_from(["default", "any", "chunks"] if new_splits
                                 else ["default", "multiples", "any", "chunks"]))
    if split == "multiples":
        # a random composition of the layers into pp stages, each a multiple of vpp
        assume(layers % vpp == 0)
        stage_layers = tuple(vpp * x for x in _composition(draw, layers // vpp, pp, 1))
    elif split == "any":  # counts need not divide by vpp (the plan's chunk rule splits them)
        stage_layers = _composition(draw, layers, pp, 1)
    elif split == "chunks":  # every model chunk given (a --pipeline-model-parallel-layout)
        chunk_layers = _composition(draw, layers, pp * vpp, 0)
    groups = draw(st.permutations([0] * (pp // 2) + [1] * (pp // 2)))
    plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep,
                sp=(1 if etp not in (None, tp) else draw(st.sampled_from([0, 1])))
                if tp > 1 else 0,
                zero=draw(st.sampled_from([3, 1, 0, 2])), mbs=mbs,
                num_microbatches=batch // (dp * mbs), recompute=mode,
                recompute_layers=r_layers, stage_layers=stage_layers,
                stage_groups=tuple(groups), chunk_layers=chunk_layers, etp=etp,
                # GPipe: all m micro-batches in flight on every stage; ZB-H1 / ZB-H2: their
                # own in-flight counts and the split's bubble ratio (search/schedule_axis.py)
                schedule=draw(st.sampled_from([None, "gpipe", "zb-h1", "zb-h2"]))
                if vpp == 1 else None)
    assume(not plan_violations(job, plan))
    if plan.recompute_layers is not None and job.model.mtp_layers \
            and plan.recompute_layers >= max(plan.layers_per_stage(layers)):
        # every layer recomputed: the search writes recompute_layers None (Megatron's uniform
        # method, which also replays the MTP layer; block with as many layers skips it)
        plan = plan.model_copy(update={"recompute_layers": None})
    return job, plan


def _explicit_folded() -> tuple[Job, Plan]:
    """ep = 4 > dp*cp = 2: experts folded over the tensor ranks (etp = 1), ZeRO-1, interleaved."""
    job = Job(model=_model(True, 8), cluster=_two_groups(), seq_len=4096, global_batch=BATCH)
    return job, Plan(dp=2, tp=4, cp=1, pp=2, vpp=2, ep=4, etp=1, sp=1, zero=1, mbs=1,
                     num_microbatches=8, recompute="selective", stage_groups=(0, 1))


def _explicit() -> tuple[Job, Plan]:
    job = Job(model=_model(True, 8), cluster=_two_groups(), seq_len=8192, global_batch=BATCH)
    return job, Plan(dp=2, tp=2, cp=2, pp=2, vpp=2, ep=4, zero=3, mbs=1, num_microbatches=8,
                     recompute="full", recompute_layers=1, stage_layers=(6, 2),
                     stage_groups=(1, 0))


def _explicit_mtp() -> tuple[Job, Plan]:
    """A MoE model with one MTP depth: uniform full recompute replays it, on two groups."""
    job = Job(model=_model(True, 8, 1), cluster=_two_groups(), seq_len=4096,
              global_batch=BATCH)
    return job, Plan(dp=2, tp=2, cp=1, pp=4, vpp=1, ep=2, sp=1, zero=1, mbs=1,
                     num_microbatches=8, recompute="full", stage_groups=(0, 1, 0, 1))


def _explicit_mtp_partial() -> tuple[Job, Plan]:
    """The same with partial (block) recompute: the MTP layer is kept, ZeRO-3."""
    job = Job(model=_model(True, 8, 1), cluster=_two_groups(), seq_len=4096,
              global_batch=BATCH)
    return job, Plan(dp=4, tp=2, cp=1, pp=2, vpp=1, ep=2, sp=1, zero=3, mbs=1,
                     num_microbatches=4, recompute="full", recompute_layers=2,
                     stage_layers=(3, 5), stage_groups=(1, 0))


def _explicit_p2p_overlap() -> tuple[Job, Plan]:
    """Megatron-Core's p2p overlap on pp 4 x vpp 2 with m = 10 (groups of N = 5), no sequence
    parallelism (whole tensors sent from every tensor rank)."""
    job = Job(model=_model(False, 8), cluster=_two_groups(), seq_len=4096, global_batch=20,
              recipe=RECIPES["megatron-bf16"].with_behaviour(overlap_p2p_comm=True))
    return job, Plan(dp=2, tp=2, pp=4, vpp=2, sp=0, zero=1, mbs=1, num_microbatches=10,
                     recompute="none", stage_groups=(0, 1, 0, 1))


def _explicit_slots() -> tuple[Job, Plan]:
    """7 layers on pp 2 x vpp 2, the default split: 9 slots over 4 chunks, 3,2,2,2 less the
    embedding and the loss = 2,2,2,1 (layout order), so stages of 4 and 3 layers, the last in
    chunks (2, 1); m = 3 micro-batches (pp does not divide it: groups of 3)."""
    job = Job(model=_model(False, 7), cluster=_two_groups(), seq_len=4096, global_batch=6)
    return job, Plan(dp=2, tp=4, pp=2, vpp=2, zero=1, mbs=1, num_microbatches=3,
                     recompute="selective", stage_groups=(1, 0))


def _explicit_zb(schedule: str) -> tuple[Job, Plan]:
    """A zero-bubble schedule with a pinned partial recompute (the split's replayed share
    r·pp/L sets the bubble ratio), an uneven split over two groups, MoE with ZeRO-1."""
    job = Job(model=_model(True, 8), cluster=_two_groups(), seq_len=4096, global_batch=BATCH)
    return job, Plan(dp=2, tp=2, cp=1, pp=4, vpp=1, ep=2, sp=1, zero=1, mbs=1,
                     num_microbatches=8, recompute="full", recompute_layers=1,
                     stage_layers=(3, 2, 2, 1), stage_groups=(1, 0, 0, 1), schedule=schedule)


def _explicit_tied(pp: int, tp: int, vpp: int = 1, schedule: str | None = None
                   ) -> tuple[Job, Plan]:
    """A tied embedding: the head stage's DP sync carries the embedding gradient's all-reduce
    with the first stage (cost/tied_embedding_sync.py), over the network when pp·tp > 8."""
    job = Job(model=_model(False, 8, tied=True), cluster=_two_groups(), seq_len=4096,
              global_batch=BATCH)
    return job, Plan(dp=GPUS // (pp * tp), tp=tp, pp=pp, vpp=vpp, sp=int(tp > 1), zero=1, mbs=1,
                     num_microbatches=BATCH // (GPUS // (pp * tp)), recompute="none",
                     schedule=schedule, stage_groups=(0,) * (pp // 2) + (1,) * (pp // 2))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@example(case=_explicit_tied(8, 2))
@example(case=_explicit_tied(4, 2, vpp=2))
@example(case=_explicit_tied(4, 1, schedule="zb-h1"))
@example(case=_explicit_zb("zb-h1"))
@example(case=_explicit_zb("zb-h2"))
@example(case=_explicit())
@example(case=_explicit_folded())
@example(case=_explicit_slots())
@example(case=_explicit_p2p_overlap())
@example(case=_explicit_mtp())
@example(case=_explicit_mtp_partial())
@given(case=_cases())
def test_plan_cost_enumerator_solver_and_evaluate_agree(case: tuple[Job, Plan]) -> None:
    _agree(case)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_cases(new_splits=True))
def test_one_cost_for_megatron_splits(case: tuple[Job, Plan]) -> None:
    """The same agreement on interleaved plans with Megatron's splits only (uneven chunks, the
    default slot split, explicit chunks, m that pp does not divide)."""
    _agree(case)


def _agree(case: tuple[Job, Plan]) -> None:
    job, plan = case
    for name, on in (("vpp>1", plan.vpp > 1), ("partial recompute", plan.recompute_layers
                      is not None), ("zero3", plan.zero == 3), ("cp>1", plan.cp > 1),
                     ("ep>1", plan.ep > 1), ("pp=4 over two groups", plan.pp == 4),
                     ("folded (etp != tp)", plan.folded),
                     ("ep > dp*cp", plan.ep > plan.dp * plan.cp),
                     ("uneven chunks", uneven_chunks(plan, job.model.num_layers)),
                     ("chunk_layers", plan.chunk_layers is not None),
                     ("m % pp != 0", plan.vpp > 1 and plan.num_microbatches % plan.pp > 0),
                     ("mtp", job.model.mtp_layers > 0),
                     ("gpipe", plan.schedule == "gpipe"),
                     ("zero-bubble", plan.schedule in ("zb-h1", "zb-h2"))):
        if on:
            event(name)
    fix = _fix(plan, job.model.num_layers, job.model.moe is not None)
    space = SearchSpace.for_job(job, fix=fix, max_pp=4,
                                max_vpp=2, max_mbs=2, max_ep=4,
                                partial_recompute=plan.recompute_layers is not None,
                                by_framework=False)  # one cost for any plan, run or not
    pc = plan_cost(build_tables(space), plan)
    ev = evaluate(job, plan)
    assert pc.step_s == pytest.approx(ev.time.step_s, rel=1e-9)
    assert list(pc.stage_time_s) == pytest.approx(ev.stage_time_s, rel=1e-9)
    # the tables charge transient bytes x (1 + fragmentation) against the capacity less the
    # CUDA context: the same quantity as evaluate's required bytes less the context
    stages = stage_memory(job, plan)
    assert list(pc.stage_charged) == pytest.approx([s.charged_bytes for s in stages], rel=1e-9)
    assert list(pc.stage_charged) == pytest.approx(
        [s.required_bytes - CUDA_CONTEXT_BYTES for s in stages], rel=1e-9)
    worst = max(range(len(stages)), key=lambda j: stages[j].required_bytes
                / stages[j].capacity_bytes)
    assert stages[worst].peak_bytes == pytest.approx(ev.memory.peak_bytes, rel=1e-9)
    assert pc.fits == ev.fits
    if not ev.fits:
        for search in (lambda: enumerate_plans(job, space, top_k=1),
                       lambda: solve(job, space, top_k=1, time_limit=30, workers=1)):
            with pytest.raises(UserError):
                search()
        return
    en = enumerate_plans(job, space, top_k=1)
    so = solve(job, space, top_k=1, time_limit=30, workers=1)
    for res in (en, so):
        [(cost, got)] = res.stats["ranked"]
        assert got.key()[:10] == plan.key()[:10]
        assert got.expert_tp == plan.expert_tp
        assert got.layers_per_stage(job.model.num_layers) == plan.layers_per_stage(
            job.model.num_layers)
        assert [got.recomputed_layers(n) for n in got.layers_per_stage(job.model.num_layers)] \
            == [plan.recomputed_layers(n) for n in plan.layers_per_stage(job.model.num_layers)]
        assert got.stage_groups == plan.stage_groups
        assert got.schedule == plan.schedule
        assert cost == pytest.approx(ev.time.step_s, rel=1e-9)
        [rep] = res.plans
        assert rep.time.step_s == pytest.approx(ev.time.step_s, rel=1e-12)
        assert rep.memory.peak_bytes == pytest.approx(ev.memory.peak_bytes, rel=1e-12)
    assert so.status == "optimal"
