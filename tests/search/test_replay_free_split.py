"""Free per-rank layer counts under ZBV / DualPipeV (search/cpsat_replay.py): the path cuts
bound the replayed span and are exact at their own times (`pipeline_sim.makespan`), the model's
objective is <= every free split's exact step time, the family is in the space and the proof
line, and CP-SAT's top k equals the enumerator's on random V spaces, an uneven free split the
best where rank 0 carries a large vocabulary's embedding and head."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from test_replay_search import _compare_exact
from test_solver_vs_enumerate import _mini
from test_zb_search import _job

from autoparallel_cp.cost.pipeline_sim import makespan, v_orders
from autoparallel_cp.errors import UserError
from autoparallel_cp.search import cpsat_partition
from autoparallel_cp.search.cpsat_replay import replay_pipeline
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.solve import enumerate_plans
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import Job

V = ("zbv", "dualpipev")


def _span(sched: str, p: int, m: int, t: list[float], split: tuple[float, ...]) -> float:
    part = dict(zip("FIW", split, strict=True))
    return makespan(v_orders(sched, p, m), 2 * p,
                    lambda k, s: 0.5 * t[s if s < p else 2 * p - 1 - s] * part[k])


def _cuts_model(sched: str, p: int, m: int, times: list[int],
                split: tuple[float, float, float]) -> tuple[cp_model.CpModel, object, object]:
    model = cp_model.CpModel()
    T = model.new_int_var(0, 0, "T")  # m = m': the (m - m')·T term is 0
    pipe, q, _, cuts = replay_pipeline(model, times, T, sched, split, p, m, max(times), 0, 0)
    assert q == 1 << 16
    return model, pipe, cuts


def test_hand_checked_span_of_equal_ranks() -> None:
    """Two equal ranks of time 6, F = I = W: each V chunk action takes 1; torch's ZBV keeps
    the (p-1)-chunk forward ramp: span = m·6 + 1 (tests/search/test_replay_search.py derives
    it), the critical path sums to it, and the model's span with that path is the same."""
    split = (1 / 3, 1 / 3, 1 / 3)
    assert _span("zbv", 2, 16, [6.0, 6.0], split) == pytest.approx(97.0)
    model, pipe, cuts = _cuts_model("zbv", 2, 16, [6, 6], (0.25, 0.5, 0.25))
    path = cuts.path_at([6.0, 6.0])  # type: ignore[attr-defined]
    assert path in cuts.paths  # type: ignore[attr-defined]  # (the equal-ranks seed)
    model.minimize(pipe)  # type: ignore[arg-type]
    s = cp_model.CpSolver()
    assert s.solve(model) == cp_model.OPTIMAL
    want = _span("zbv", 2, 16, [6.0, 6.0], (0.25, 0.5, 0.25))
    assert s.objective_value == want * (1 << 16)


@settings(max_examples=25, deadline=None)
@given(sched=st.sampled_from(V), p=st.integers(2, 4), extra=st.integers(0, 6),
       t1=st.lists(st.integers(1, 40), min_size=4, max_size=4),
       t2=st.lists(st.integers(1, 40), min_size=4, max_size=4))
def test_path_cuts_bound_the_span_and_are_exact_at_their_times(
        sched: str, p: int, extra: int, t1: list[int], t2: list[int]) -> None:
    """Any path found at t1 is <= the span at t2 (a path of the DAG: a lower bound), and the
    model with the path found at t2 has span(t2) exactly (shares with exact fixed points)."""
    m = 2 * p + extra
    split = (0.25, 0.5, 0.25)
    a, b = t1[:p], t2[:p]
    model, pipe, cuts = _cuts_model(sched, p, m, b, split)
    for c in (cuts.path_at([float(x) for x in a]),  # type: ignore[attr-defined]
              cuts.path_at([float(x) for x in b])):  # type: ignore[attr-defined]
        length = sum(n * 0.5 * s * tr for row, tr in zip(c, b, strict=True)
                     for n, s in zip(row, split, strict=True))
        assert length <= _span(sched, p, m, [float(x) for x in b], split) + 1e-9
        cuts.add(c)  # type: ignore[attr-defined]
    model.minimize(pipe)  # type: ignore[arg-type]
    s = cp_model.CpSolver()
    assert s.solve(model) == cp_model.OPTIMAL
    assert s.objective_value == _span(sched, p, m, [float(x) for x in b], split) * (1 << 16)


def _vocab_job(vocab: int, layers: int, gpus: int = 8, seq: int = 4096, batch: int = 32) -> Job:
    job = _job(False, layers, gpus, seq, batch)
    return job.model_copy(update={"model": job.model.model_copy(update={"vocab_size": vocab})})


@pytest.mark.parametrize("sched", V)
def test_the_model_objective_bounds_every_free_split(sched: str) -> None:
    """Every free split of a key pinned in its model: objective <= the exact step time."""
    job = _vocab_job(64000, 12)
    sp = SearchSpace.for_job(job, fix=f"schedule={sched},tp=1,cp=1,pp=4,mbs=1,zero=1",
                             max_pp=4)
    t = build_tables(sp)
    kt = build_key_table(t)
    checked = 0
    for i in range(len(kt.lb)):
        key = kt.key(i)
        for cut in itertools.combinations(range(1, 6), 3):
            units = [b - a for a, b in zip((0, *cut), (*cut, 6), strict=True)]
            pm = cpsat_partition.build_partition(t, key)
            assert pm is not None
            for x, u in zip(pm.layers, units, strict=True):
                pm.model.add(x == 2 * u)
            s = cp_model.CpSolver()
            s.parameters.num_workers = 1
            st_ = s.solve(pm.model)
            plan = pm.read_plan(s, False) if st_ == cp_model.OPTIMAL else None
            if plan is None:
                continue
            pc = plan_cost(t, plan)
            assert s.objective_value * pm.scale_s <= pc.step_s
            # with the split's own longest path among the cuts, within the error bound
            pm.replay.add(pm.replay.path_at(pc.stage_time_s))
            assert s.solve(pm.model) == cp_model.OPTIMAL
            assert s.objective_value * pm.scale_s <= pc.step_s
            assert pc.step_s - s.objective_value * pm.scale_s <= pm.error_bound_s
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("sched", V)
def test_the_free_v_family_is_in_the_space_and_the_proof(sched: str) -> None:
    sp = SearchSpace.for_job(_job(), fix=f"schedule={sched}", max_pp=4)
    assert sp.free_ok(4, 2) and sp.free_ok(2, 2)
    line = space_line(proof_space(sp))
    assert f"under {sched}: per rank" in line and "evaluated, not searched" not in line
    best = enumerate_plans(_job(), sp, top_k=1).plans[0].plan
    if best.pp == 2:
        assert outside(sp, best.model_copy(update={"stage_layers": (2, 6),
                                                   "chunk_layers": None})) is None
        assert "multiples of vpp = 2" in (outside(sp, best.model_copy(
            update={"stage_layers": (3, 5), "chunk_layers": None})) or "")
    # several node groups: searched too (tests/search/test_replay_free_multi.py)
    assert "an odd count" not in line  # 8 layers: two equal chunks per rank can sum to them
    odd = Job(model=_mini(False, 7), cluster=_job().cluster, seq_len=4096, global_batch=32)
    osp = SearchSpace.for_job(odd, fix=f"schedule={sched}", max_pp=2)
    assert "none at 7 layers, an odd count" in space_line(proof_space(osp))


def test_an_uneven_free_split_is_the_best_and_found() -> None:
    """A 128k vocabulary: rank 0 holds the embedding and the LM head (the V's last chunk), so
    the best ZBV plan gives it fewer layers: none, (0, 12) (search/empty_rank.py); among the
    splits that keep layers on rank 0, (2, 10): free splits no named layout holds."""
    job = _vocab_job(128000, 12)
    sp = SearchSpace.for_job(job, fix="schedule=zbv,tp=1,cp=1", max_pp=4, max_mbs=1, zero=(1,))
    ranked = enumerate_plans(job, sp, top_k=3).plans
    best = ranked[0]
    assert best.plan.stage_layers == (0, 12) and best.plan.chunk_layers is None
    assert next(e.plan.stage_layers for e in ranked if e.plan.stage_layers[0]) == (2, 10)
    named = SearchSpace.for_job(job, fix="schedule=zbv,tp=1,cp=1", max_pp=4, max_mbs=1,
                                zero=(1,))
    named.__dict__["_split_families"] = {
        (pp, 2): tuple(f for f in sp.split_families(pp, 2) if f.fixed_split) for pp in sp.pp}
    assert enumerate_plans(job, named, top_k=1).plans[0].time.step_s > best.time.step_s
    _compare_exact(job, sp, 3)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@example(sched="dualpipev", layers=12, vocab=128000, gpus=8, batch=32, seq=4096)
@given(sched=st.sampled_from(V), layers=st.sampled_from([6, 8, 12]),
       vocab=st.sampled_from([32000, 128000]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16, 32]), seq=st.sampled_from([2048, 8192]))
def test_free_v_spaces_match_enumeration(sched: str, layers: int, vocab: int, gpus: int,
                                         batch: int, seq: int) -> None:
    job = _vocab_job(vocab, layers, gpus, seq, batch)
    try:
        space = SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_mbs=2,
                                    zero=(0, 1))
    except UserError:
        return  # no pp > 1 of this job (a pin outside the rules is exit 2)
    if space.num_degree_combinations() == 0:
        return
    _compare_exact(job, space, 4)
