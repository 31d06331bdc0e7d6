"""The near-capacity second search (the fastest plan within --mem-headroom, search/capacity.py)
reuses the first, up-to-capacity search's tables, bounds and key results (`capacity.reuse`):
the same plans and status as a search from scratch, on random jobs whose best plans sit on
both sides of the margin."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_solver_vs_enumerate import _mini

from autoparallel_cp.errors import InfeasibleError
from autoparallel_cp.search import capacity
from autoparallel_cp.search.solve import solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import Job, ModelSpec
from autoparallel_cp.spec.loaders import load_cluster


def _wide(layers: int) -> ModelSpec:
    """Llama 3 70B's width on few layers: memory binds on 8-32 H100s."""
    return ModelSpec(name="wide", num_layers=layers, hidden_size=8192, ffn_hidden_size=28672,
                     num_attention_heads=64, num_kv_heads=8, vocab_size=128256)


def _plans(res: object) -> list[tuple[float, tuple]]:
    return [(ev.time.step_s, ev.plan.key()) for ev in res.plans]  # type: ignore[attr-defined]


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(wide=st.booleans(), moe=st.booleans(), layers=st.sampled_from([6, 9, 18]),
       gpus=st.sampled_from([8, 16, 32]), seq=st.sampled_from([2048, 4096]),
       headroom=st.sampled_from([0.05, 0.152, 0.3]), k=st.sampled_from([1, 3]))
def test_reuse_gives_the_search_from_scratch(wide: bool, moe: bool, layers: int, gpus: int,
                                             seq: int, headroom: float, k: int) -> None:
    model = _wide(layers) if wide else _mini(moe, layers)
    job = Job(model=model, cluster=load_cluster("dgx-h100").take_gpus(gpus), seq_len=seq,
              global_batch=32, mem_headroom=headroom)
    full, _ = capacity.to_capacity(job)
    try:
        first = solve(full, SearchSpace.for_job(full), top_k=10, time_limit=60)
    except InfeasibleError:
        assume(False)
        return
    try:
        fresh = solve(job, SearchSpace.for_job(job), top_k=k, time_limit=60)
    except InfeasibleError:
        try:
            solve(job, SearchSpace.for_job(job), top_k=k, time_limit=60, prior=first.context)
        except InfeasibleError:
            return
        raise AssertionError("the reusing search found a plan the fresh one proves absent") \
            from None
    again = solve(job, SearchSpace.for_job(job), top_k=k, time_limit=60, prior=first.context)
    assert again.status == fresh.status == "optimal"
    assert _plans(again) == _plans(fresh)


def test_reuse_refuses_another_space_or_a_smaller_capacity() -> None:
    job = Job(model=_mini(False, 6), cluster=load_cluster("dgx-h100").take_gpus(16),
              seq_len=2048, global_batch=32, mem_headroom=0.152)
    full, _ = capacity.to_capacity(job)
    ctx = solve(full, SearchSpace.for_job(full), top_k=3, time_limit=60).context
    assert capacity.reuse(ctx, SearchSpace.for_job(job)) is not None
    assert capacity.reuse(ctx, SearchSpace.for_job(job, fix="tp=2")) is None
    other = job.model_copy(update={"seq_len": 4096})
    assert capacity.reuse(ctx, SearchSpace.for_job(other)) is None
    # a prior searched within a larger margin covers fewer plans: nothing is reused
    tight = solve(job, SearchSpace.for_job(job), top_k=3, time_limit=60).context
    assert capacity.reuse(tight, SearchSpace.for_job(full)) is None
