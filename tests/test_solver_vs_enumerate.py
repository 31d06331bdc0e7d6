"""Differential tests: CP-SAT top-k == enumerate top-k on small spaces (same keys, same order
up to exact ties), and every returned plan fits under the exact memory model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoparallel_cp.loaders import load_cluster, load_model
from autoparallel_cp.solve import enumerate_plans, solve
from autoparallel_cp.space import SearchSpace
from autoparallel_cp.specs import Job


def _compare(job: Job, space: SearchSpace, k: int) -> None:
    a = solve(job, space, top_k=k, time_limit=120, workers=1)
    b = enumerate_plans(job, space, top_k=k)
    assert a.status == "optimal"
    ca = [c for c, _ in a.stats["ranked"]]
    cb = [c for c, _ in b.stats["ranked"]]
    assert len(ca) == len(cb)
    for x, y in zip(ca, cb, strict=True):
        assert x == pytest.approx(y, rel=1e-9)
    for ev in a.plans:
        assert ev.fits
    assert a.max_objective_diff_s <= a.error_bound_s + 1e-12


def _small_job(gpus: int, batch: int, model: str = "llama3-8b") -> Job:
    return Job(model=load_model(model), cluster=load_cluster("dgx-h100").take_gpus(gpus),
               seq_len=2048, global_batch=batch)


@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(zero=st.sampled_from([0, 1]), mode=st.sampled_from(["none", "full"]))
def test_dense_uniform_small(zero: int, mode: str) -> None:
    job = _small_job(8, 16)
    space = SearchSpace.for_job(job, fix=f"zero={zero},sp=0,recompute={mode},mbs=1",
                                partition="uniform", partial_recompute=False)
    _compare(job, space, 3)
