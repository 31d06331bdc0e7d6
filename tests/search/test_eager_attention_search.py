"""The HF eager attention chain (`eager_attention="scale-mask-clamp"`, cost/layer_factors.py)
and DeepSpeed's ZeRO-3 pre-divide (`zero3_predivide`, cost/sync.py `zero3_copy_factor`)
reach the solver's tables: the tables' cost of every plan equals `evaluate()`, CP-SAT's top
plans equal the enumerator's, and the master's lower bound stays below every enumerated plan's
exact cost, on a non-flash DeepSpeed recipe with HF eager modules (the FlagPerf
Baichuan2-13B family)."""

from __future__ import annotations

import pytest
from test_solver_vs_enumerate import _assert_master_bounds, _compare_tol, _mini, _ranked_or_raise

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.loaders import load_cluster


def _job() -> Job:
    recipe = RECIPES["deepspeed"].model_copy(update={"flash_attention": False})
    recipe = recipe.with_behaviour(fused=False, eager_ops="llama-upcast",
                                   eager_attention="scale-mask-clamp")
    return Job(model=_mini(False, 4), cluster=load_cluster("dgx-h100").take_gpus(8),
               recipe=recipe, seq_len=2048, global_batch=16)


def test_eager_attention_space_matches_enumeration() -> None:
    space = SearchSpace.for_job(_job(), max_pp=2, max_vpp=1, max_mbs=2, zero=(1, 3))
    _compare_tol(_job(), space, 4)


def test_master_bound_holds_with_eager_attention() -> None:
    space = SearchSpace.for_job(_job(), max_pp=2, max_vpp=2, max_mbs=2, zero=(0, 1, 3))
    _assert_master_bounds(_job(), space, 3)


def test_tables_price_plans_as_evaluate_does() -> None:
    """Every enumerated plan, ZeRO-3 ones included (the pre-divide), costs the same in the
    solver's tables as in `evaluate()`."""
    job = _job()
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=1, max_mbs=2, zero=(1, 3))
    tables = build_tables(space)
    ranked = _ranked_or_raise(job, space)
    assert any(p.zero == 3 for _, p in ranked)
    for cost, plan in ranked:
        ev = evaluate(job, plan)
        assert cost == pytest.approx(ev.time.step_s, rel=1e-9)
        assert plan_cost(tables, plan).step_s == pytest.approx(ev.time.step_s, rel=1e-9)
