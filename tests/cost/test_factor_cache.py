"""The shared factors of `memory.shared`: the layer / edge / MTP factors of `memory._plan_factors`
and the DP ones of `steptime._dp_factors` (what `evaluate`, `stage_memory` and `stage_times`
compose): a cached value is the value the factor function returns for the same
arguments, shared only by the same job object with the same layer axes and options, and the cache
stays bounded. Expected values come from calling the factor functions directly (the uncached
path), never from the cache."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost import memory, steptime
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster, load_model
from autoparallel_cp.spec.plan import Plan, plan_violations


def _dense() -> Job:
    return Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100").take_gpus(16),
               seq_len=4096, global_batch=64)


def _mixed() -> Job:
    return Job(model=load_model("llama3-70b"), cluster=load_cluster("mixed-h100-a100"),
               seq_len=4096, global_batch=1024)


def _moe() -> Job:
    return Job(model=load_model("deepseek-v3"), cluster=load_cluster("dgx-h800").take_gpus(2048),
               seq_len=4096, global_batch=4096)


# hand-picked plans: two of the dense job share tp / cp / ep / sp / mbs, the third does not
DENSE_A = Plan(dp=2, tp=8, pp=1, mbs=1, num_microbatches=32, sp=1)
DENSE_B = Plan(dp=1, tp=8, pp=2, mbs=1, num_microbatches=64, sp=1, zero=1,
               recompute="full")
DENSE_C = Plan(dp=4, tp=4, pp=1, mbs=2, num_microbatches=8, sp=1, recompute="selective")


def _same(a: Any, b: Any) -> None:
    for name in a.__dataclass_fields__:
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.shape == y.shape and np.array_equal(x, y), name


@pytest.mark.parametrize("job_f, plan", [
    (_dense, DENSE_A), (_dense, DENSE_B), (_dense, DENSE_C),
    (_mixed, Plan(dp=16, tp=8, pp=8, mbs=1, num_microbatches=64, sp=1, zero=1)),
    (_moe, Plan(dp=128, tp=1, pp=16, vpp=1, ep=64, mbs=1, num_microbatches=32, zero=1,
                recompute="full")),
])
def test_cached_factors_equal_the_factor_functions(job_f: Any, plan: Plan) -> None:
    job = job_f()
    assert not plan_violations(job, plan)
    opts = F.options_for(job, None)
    memory.clear_factor_cache()
    layer, edges = memory.plan_factors(job, plan, opts)
    mtp = memory.mtp_cache(job, plan, opts)
    for g in range(len(job.cluster.node_groups)):
        for mode in ("none", "selective", "full"):
            for moe in (False, True) if job.model.moe is not None else (False,):
                _same(layer(g, mode, moe),
                      F.layer_factors(job, g, plan.tp, plan.cp, plan.ep, plan.sp, plan.mbs,
                                      mode, moe, opts, etp=plan.etp))
        _same(edges(g), F.edge_factors(job, g, plan.tp, plan.cp, plan.sp, plan.mbs, opts))
        sync, mb_grad, unit_lat = steptime._dp_factors(job, plan)
        axes = (plan.tp, plan.cp, plan.dp, plan.ep, plan.zero, plan.etp)
        assert sync(g) == tuple(float(x) for x in F.dp_sync_factors(job, g, *axes))
        assert mb_grad(g) == tuple(float(x) for x in F.microbatch_grad_factors(job, g, *axes))
        assert unit_lat(g) == tuple(float(x) for x in F.fsdp_call_latency(
            job, g, plan.tp, plan.cp, plan.dp, plan.zero))
        if job.model.mtp_layers:
            _same(mtp(g), F.mtp_factors(job, g, plan.tp, plan.cp, plan.sp, plan.mbs, opts))


def test_evaluate_same_with_and_without_the_cache() -> None:
    """Each plan's evaluation from an empty cache equals the one after the others filled it."""
    job = _dense()
    fresh = []
    for p in (DENSE_A, DENSE_B, DENSE_C):
        memory.clear_factor_cache()
        fresh.append(evaluate(job, p).to_json())
    memory.clear_factor_cache()
    for _ in range(2):
        assert [evaluate(job, p).to_json() for p in (DENSE_A, DENSE_B, DENSE_C)] == fresh


def test_shared_only_by_the_same_job_axes_and_functions(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    job = _dense()
    opts = F.options_for(job, None)
    memory.clear_factor_cache()
    a = memory.plan_factors(job, DENSE_A, opts)[0]
    assert memory.plan_factors(job, DENSE_B, opts)[0] is a  # same tp, cp, ep, sp, mbs
    assert memory.plan_factors(job, DENSE_C, opts)[0] is not a  # tp 4, mbs 2
    assert memory.plan_factors(_dense(), DENSE_A, opts)[0] is not a  # an equal job, not it
    d = steptime._dp_factors(job, DENSE_A)
    assert steptime._dp_factors(job, DENSE_A.model_copy(update={"recompute": "full"})) is d
    assert steptime._dp_factors(job, DENSE_B) is not d  # dp 1, ZeRO-1
    # a replaced factor function is called, not the cached values of the old one
    before = float(evaluate(job, DENSE_A).time.step_s)
    real = F.layer_factors

    def slower(*a: Any, **k: Any) -> F.LayerFactors:
        lf = real(*a, **k)
        return F.LayerFactors(**{**lf.__dict__, "compute_s": lf.compute_s + 1.0,
                                 "time_s": lf.time_s + 1.0})

    monkeypatch.setattr(F, "layer_factors", slower)
    assert float(evaluate(job, DENSE_A).time.step_s) > before + 1.0


def test_cache_is_bounded() -> None:
    memory.clear_factor_cache()
    jobs = [_dense() for _ in range(memory.FACTOR_CACHE_SIZE // 2 + 3)]
    for j in jobs:
        evaluate(j, DENSE_A)  # two sets per job: the layer axes' and the DP axes'
    assert len(memory._SHARED) == memory.FACTOR_CACHE_SIZE
    assert all(e[0] is not jobs[0] for e in memory._SHARED.values())  # the oldest dropped
