"""Hybrid sharding in the search: `--fix dp_replicate=R` is one value per space (like a pinned
`etp`). CP-SAT's top k equals the enumerator's on random small instances, the master's bound
stays below every plan's exact cost, and the tables' cost of a plan equals `evaluate`'s."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_solver_vs_enumerate import _assert_master_bounds, _compare_tol, _mini, _ranked_or_raise

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.errors import InputError
from autoparallel_cp.search.solve import solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.loaders import load_cluster


def _job(moe: bool, layers: int, gpus: int, recipe: str) -> Job:
    return Job(model=_mini(moe, layers), cluster=load_cluster("dgx-h100").take_gpus(gpus),
               recipe=RECIPES[recipe], seq_len=2048, global_batch=32)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(moe=st.booleans(), layers=st.sampled_from([4, 6]), rep=st.sampled_from([2, 4]),
       recipe=st.sampled_from(["torchtitan-fsdp", "megatron-bf16"]))
def test_pinned_replicas_match_enumeration(moe: bool, layers: int, rep: int,
                                           recipe: str) -> None:
    """Two 8-GPU nodes: the shard group and its replicas cross nodes or not depending on tp
    and R; every plan CP-SAT returns keeps R, a dp it divides and zero >= 1."""
    job = _job(moe, layers, 16, recipe)
    space = SearchSpace.for_job(job, fix=f"dp_replicate={rep}", max_pp=2, max_vpp=2, max_mbs=2,
                                zero=(0, 1, 3))
    # zero 0 leaves the domain under R > 1; a recipe's framework may narrow it further
    # (torchtitan-fsdp runs ZeRO-3 only here: spec/framework_space.py)
    assert space.zero and 0 not in space.zero and set(space.zero) <= {1, 3}
    res = _compare_tol(job, space, 4)
    for ev in res.plans:
        assert ev.plan.dp_replicate == rep and ev.plan.dp % rep == 0 and ev.plan.zero >= 1


def test_master_bound_holds_with_replicas() -> None:
    job = _job(False, 6, 16, "torchtitan-fsdp")
    space = SearchSpace.for_job(job, fix="dp_replicate=2", max_pp=4, max_vpp=2, max_mbs=2,
                                zero=(1, 2, 3))
    _assert_master_bounds(job, space, 5)


def test_tables_cost_equals_evaluate_with_replicas() -> None:
    """Every 7th plan the enumerator ranks under R = 2 (MoE, experts' DP group split too)."""
    job = _job(True, 4, 16, "megatron-bf16")
    space = SearchSpace.for_job(job, fix="dp_replicate=2", max_pp=2, max_vpp=1, max_mbs=2)
    ranked = _ranked_or_raise(job, space)
    assert ranked
    t = build_tables(space)
    for cost, plan in ranked[::7]:
        ev = evaluate(job, plan)
        assert cost == pytest.approx(ev.time.step_s, rel=1e-9)
        assert plan_cost(t, plan).step_s == pytest.approx(ev.time.step_s, rel=1e-9)


def test_replicas_change_the_answer_and_are_described() -> None:
    """R = 8 on 16 GPUs (shard 2) holds more state per GPU than plain sharding; the proof's
    space names R, and a plan of another R is outside it."""
    job = _job(False, 4, 16, "torchtitan-fsdp")
    space = SearchSpace.for_job(job, fix="dp_replicate=8,tp=1,pp=1,cp=1", max_mbs=2,
                                zero=(3,))
    res = solve(job, space, top_k=1, time_limit=60, workers=1)
    best = res.plans[0].plan
    assert best.dp_replicate == 8 and best.state_shard == 2
    assert proof_space(space)["dp_replicate"] == 8
    why = outside(space, best.model_copy(update={"dp_replicate": 1}))
    assert why is not None and "dp_replicate=1" in why


def test_replicas_refuse_zero0_and_need_a_dividing_dp() -> None:
    job = _job(False, 4, 16, "megatron-bf16")
    with pytest.raises(InputError, match="needs zero >= 1"):
        SearchSpace.for_job(job, fix="dp_replicate=2,zero=0")
    space = SearchSpace.for_job(job, fix="dp_replicate=4", max_pp=4)
    assert all(d.dp % 4 == 0 for d in space.degrees())
    assert 2 not in space.dp_domain


def test_explain_offers_the_replica_neighbours() -> None:
    """A ZeRO plan's single changes include halving / doubling dp_replicate (dp permitting);
    a zero=0 plan gets none (nothing sharded to replicate)."""
    from autoparallel_cp.search.neighbours import neighbours
    from autoparallel_cp.spec.plan import parse_plan

    job = _job(False, 4, 16, "torchtitan-fsdp")
    labels = [lbl for lbl, _ in neighbours(job, parse_plan("zero=3,mbs=1,dp_replicate=2", job))]
    assert "dp_replicate 2 -> 4" in labels and "dp_replicate 2 -> 1" in labels
    plain = [lbl for lbl, _ in neighbours(job, parse_plan("zero=0,mbs=1", job))]
    assert not any(lbl.startswith("dp_replicate") for lbl in plain)


def test_no_dp_dividing_the_replicas_is_named() -> None:
    """16 GPUs: every dp is a power of two, so 3 replicas empty the space, and the answer
    says so instead of naming unrelated rules first."""
    from autoparallel_cp.search.infeasibility import empty_space

    job = _job(False, 4, 16, "megatron-bf16")
    text = empty_space(job, SearchSpace.for_job(job, fix="dp_replicate=3"))
    assert "does not split into dp_replicate=3 replicas" in text.split(";")[0]
