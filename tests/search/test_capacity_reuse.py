"""The near-capacity second search (the fastest plan within --mem-headroom, search/capacity.py)
reuses the first, up-to-capacity search's space and its listings (`capacity.space_at`), its
tables, bounds, key table and key results (`capacity.reuse`, `KeyTable.at`): the same plans
and status as a search from scratch, on random jobs whose best plans sit on both sides of the
margin."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_solver_vs_enumerate import _mini

from autoparallel_cp.errors import InfeasibleError
from autoparallel_cp.search import capacity
from autoparallel_cp.search.key_table import build_key_table
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
        first = solve(full, top_k=10, time_limit=60)  # its space built here: reusable
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
    # the space too (`space_at`): the same space, listings and answer
    sp = capacity.space_at(first.context, job, capacity.origin_of(None, None))
    own = SearchSpace.for_job(job)
    assert sp is not None and sp == own and sp.job is job
    assert list(sp.degrees()) == list(own.degrees()) and sp.size() == own.size()
    assert [v.job for v in sp.etp_variants()] == [job] * len(own.etp_variants())
    reused = solve(job, top_k=k, time_limit=60, prior=first.context)
    assert reused.status == "optimal" and _plans(reused) == _plans(fresh)
    assert reused.space_size == fresh.space_size
    # the key table at the smaller capacity is the one built from scratch, row for row
    ru = capacity.reuse(first.context, own)
    assert ru is not None and ru.keys is not None
    built = build_key_table(ru.tables, bt=ru.bounds)
    assert (ru.keys.cols == built.cols).all() and (ru.keys.lb == built.lb).all()
    assert ru.keys.top_u == built.top_u and (ru.keys.mem == built.mem).all()


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


def test_space_at_refuses_other_pins_formats_jobs_and_capacities() -> None:
    job = Job(model=_mini(True, 6), cluster=load_cluster("dgx-h100").take_gpus(16),
              seq_len=2048, global_batch=32, mem_headroom=0.152)
    full, _ = capacity.to_capacity(job)
    ctx = solve(full, top_k=3, time_limit=60, fix="zero=1").context
    o = capacity.origin_of("zero=1", None)
    assert capacity.origin_of({"zero": 1}, None) == o
    got = capacity.space_at(ctx, job, o)
    assert got is not None and got == SearchSpace.for_job(job, fix="zero=1")
    assert capacity.space_at(ctx, job, capacity.origin_of("zero=2", None)) is None
    assert capacity.space_at(ctx, job, capacity.origin_of("zero=1", "megatron")) is None
    assert capacity.space_at(ctx, job.model_copy(update={"seq_len": 4096}), o) is None
    # a search within a margin covers fewer plans: not the space of a larger capacity
    tight = solve(job, top_k=3, time_limit=60, fix="zero=1").context
    assert capacity.space_at(tight, full, o) is None
    # a space the caller built is not rebuilt from pins: no root to reuse
    given_ = solve(full, SearchSpace.for_job(full, fix="zero=1"), top_k=3, time_limit=60)
    assert capacity.space_at(given_.context, job, o) is None


def test_space_at_carries_a_framework_restriction() -> None:
    job = Job(model=_mini(True, 6), cluster=load_cluster("dgx-h100").take_gpus(16),
              seq_len=2048, global_batch=32, mem_headroom=0.152)
    full, _ = capacity.to_capacity(job)
    first = solve(full, top_k=3, time_limit=60, emit="torchtitan")
    got = capacity.space_at(first.context, job, capacity.origin_of(None, "torchtitan"))
    own = SearchSpace.for_job(job, emit="torchtitan")
    assert got is not None and got == own and got.restriction == own.restriction
    assert got.restriction is not None and got.restriction.job is job
    fresh = solve(job, top_k=3, time_limit=60, emit="torchtitan")
    again = solve(job, top_k=3, time_limit=60, emit="torchtitan", prior=first.context)
    assert _plans(again) == _plans(fresh) and again.space_size == fresh.space_size
