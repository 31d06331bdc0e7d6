"""--moe-load-imbalance in the search: CP-SAT equals the enumerator on a small MoE space at
rho = 1.5, and the master's key bounds stay below every key's exact best."""

from __future__ import annotations

import pytest
from test_solver_vs_enumerate import _ranked_or_raise

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.search.cpsat_master import build_master
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables
from autoparallel_cp.spec import Job, ModelSpec, MoESpec
from autoparallel_cp.spec.loaders import load_cluster
from tests.search.test_solver_vs_enumerate import _compare_tol, _key, _pinned_lb


def _mini_moe(layers: int) -> ModelSpec:
    """8 routed experts top-2 (ep up to 8), a dense first layer."""
    return ModelSpec(
        name="mini-moe", num_layers=layers, hidden_size=1024, ffn_hidden_size=2816,
        num_attention_heads=8, num_kv_heads=4, vocab_size=32000,
        moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1408,
                    first_k_dense_layers=1))


def _job(rho: float, layers: int = 4) -> Job:
    return Job(model=_mini_moe(layers), cluster=load_cluster("dgx-h100").take_gpus(8),
               seq_len=4096, global_batch=16, moe_load_imbalance=rho)


def test_cpsat_equals_enumeration_at_rho_1_5() -> None:
    job = _job(1.5)
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=2, max_mbs=2, zero=(1,))
    assert any(d.ep > 1 for d in space.degrees())  # the imbalance reaches some plans
    a = _compare_tol(job, space, 4)
    assert len(a.stats["ranked"]) == 4
    # the solver ranks the imbalanced costs: its best plan's step time is the rho = 1.5
    # evaluation, above the balanced one wherever that plan has ep > 1
    best = a.plans[0]
    assert best.time.step_s == pytest.approx(evaluate(job, best.plan).time.step_s, rel=1e-12)
    balanced = evaluate(_job(1.0), best.plan).time.step_s
    if best.plan.ep > 1:
        assert best.time.step_s > balanced
    else:
        assert best.time.step_s == pytest.approx(balanced, rel=1e-12)


def test_master_bound_holds_at_rho_2() -> None:
    """LB(key) of the master at rho = 2 never exceeds that key's exact best step time."""
    job = _job(2.0, layers=6)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2)
    ranked = _ranked_or_raise(job, space)
    assert any(p.ep > 1 for _, p in ranked)
    for sub in space.schedule_variants():  # each schedule sub-space has its own master
        ranked = _ranked_or_raise(job, sub)
        master = build_master(build_tables(sub))
        for cost, plan in ranked[::9]:
            assert _pinned_lb(master, _key(plan)) * master.unit_s <= cost + 1e-9
