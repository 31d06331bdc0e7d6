"""DualPipe, and DualPipeV on MoE models, as searched schedules (search/model_scored.py):
`--fix schedule=dualpipe` searches DualPipe plans only (one chunk per rank, an even pp, an
even m >= 2pp, the named layouts); their plan_cost is evaluate's; every bound stays below
every plan of its key (the master's over the two-stage ranks, the tables' EP hidden-share
lower bound); CP-SAT equals the enumerator on random spaces; DeepSeek-V3's report row is found
with its stated fields; the default search and the union are unchanged."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_replay_search import _compare_exact, _job
from test_solver_vs_enumerate import (
    _assert_master_bounds,
    _key,
    _mini,
    _mixed_small,
    _ranked_or_raise,
)

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.schedules import ep_hidden_share
from autoparallel_cp.errors import UserError
from autoparallel_cp.search import model_scored, schedule_axis
from autoparallel_cp.search.key_bounds import key_bound
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.cluster import ClusterSpec

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_a_dualpipe_pin_narrows_the_space() -> None:
    job = _job(layers=8, batch=32)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe", max_pp=4, max_mbs=2)
    assert sp.schedule == "dualpipe" and sp.vpp == (1,)
    assert set(sp.pp) <= {2, 4} and not sp.partial_recompute
    degs = list(sp.degrees())
    assert degs and all(d.pp % 2 == 0 and d.num_microbatches >= 2 * d.pp
                        and d.num_microbatches % 2 == 0 for d in degs)
    assert sp.free_ok(4, 1)  # one node group: the free per-stage counts (dualpipe_splits.py)
    assert model_scored.model_scored(sp)
    best = enumerate_plans(job, sp, top_k=1).plans[0].plan
    assert best.schedule == "dualpipe" and best.vpp == 1


def test_dualpipe_pins_outside_its_rules_are_input_errors() -> None:
    with pytest.raises(UserError, match="pp"):
        SearchSpace.for_job(_job(), fix="schedule=dualpipe,pp=1", max_pp=4)


@pytest.mark.parametrize("sched, moe", [("dualpipe", False), ("dualpipe", True),
                                        ("dualpipev", True)])
def test_plan_cost_is_evaluate_and_every_bound_is_below(sched: str, moe: bool) -> None:
    """plan_cost == evaluate (step, stage charged bytes, fits) on every enumerated plan; the
    key bounds (0 here), the key listing's LB and the master's LB <= each key's best."""
    job = _job(moe=moe, layers=6 if moe else 8, seq=8192, batch=32)
    sp = SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_mbs=2)
    t = build_tables(sp)
    ranked = _ranked_or_raise(job, sp)
    assert ranked
    kt = build_key_table(t)
    lbs = {kt.key(i): int(kt.lb[i]) * kt.unit_s for i in range(len(kt.lb))}
    for cost, p in ranked:
        assert p.schedule == sched
        e = evaluate(job, p)
        pc = plan_cost(t, p)
        assert e.fits and pc.fits
        assert pc.step_s == pytest.approx(e.time.step_s, rel=1e-12)
        assert cost == pytest.approx(e.time.step_s, rel=1e-12)
        assert list(pc.stage_charged) == pytest.approx(
            [s.charged_bytes for s in stage_memory(job, p)], rel=1e-12)
        k = _key(p)
        assert key_bound(t, k) <= cost and key_bound(t, k, coupled=True) <= cost
        assert lbs[k] <= cost + 1e-9, p.short()
    _assert_master_bounds(job, sp, 2)


def test_the_hidden_share_tables_are_a_lower_bound() -> None:
    """A MoE DualPipe space's layer times are at most the plain ones (the hidden share at 1,
    model_scored.py `hidden_lb`), strictly somewhere at ep > 1, and the share depends on m
    (why no table holds it exactly)."""
    job = _job(moe=True, layers=6, seq=8192, batch=32)
    low = build_tables(SearchSpace.for_job(job, fix="schedule=dualpipe", max_pp=4))
    plain = build_tables(SearchSpace.for_job(job, fix="schedule=1f1b", max_pp=4))
    ie = low.space.ep.index(max(low.space.ep))
    assert max(low.space.ep) > 1
    for k, v in low.time.items():
        assert (v <= plain.time[k] + 1e-15).all()
        assert (low.rec[k] >= 0.0).all()
    moe_key = next(k for k in low.time if k[1])
    assert (low.time[moe_key][:, :, ie, :, :, 0] < plain.time[moe_key][:, :, ie, :, :, 0]).any()
    p = evaluate(job, enumerate_plans(job, low.space, top_k=1).plans[0].plan).plan
    assert ep_hidden_share(p) != ep_hidden_share(p.model_copy(
        update={"num_microbatches": 2 * p.num_microbatches}))


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@example(sched="dualpipe", moe=True, layers=6, gpus=8, batch=32, seq=8192, zero="0,1")
@example(sched="dualpipe", moe=False, layers=8, gpus=8, batch=16, seq=32768, zero="1,3")
@example(sched="dualpipev", moe=True, layers=6, gpus=8, batch=32, seq=8192, zero="1,3")
@given(sched=st.sampled_from(["dualpipe", "dualpipev"]), moe=st.booleans(),
       layers=st.sampled_from([4, 6, 8]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16, 32]), seq=st.sampled_from([2048, 8192, 32768]),
       zero=st.sampled_from(["0,1", "1,3"]))
def test_dualpipe_spaces_match_enumeration(sched: str, moe: bool, layers: int, gpus: int,
                                           batch: int, seq: int, zero: str) -> None:
    if sched == "dualpipev" and not moe:
        moe = True  # the replayed V without hidden EP: test_replay_search.py
    job = _job(moe, layers, gpus, seq, batch)
    zs = tuple(int(z) for z in zero.split(","))
    try:
        space = SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_mbs=2,
                                    zero=zs)
    except UserError:
        return  # no even pp > 1 of this job (a pin outside the rules is exit 2)
    if space.num_degree_combinations() == 0:
        return
    _compare_exact(job, space, 4)


def test_the_union_and_the_default_search_are_unchanged() -> None:
    """DualPipe is pin-only; DualPipeV where it hides EP is in the union now that its keys
    take the tables' V bound (session 22; it stayed out while they had the master's alone);
    the default space has no schedule sub-space."""
    moe = _job(moe=True, layers=6).model_copy(update={
        "recipe": RECIPES["torchtitan-fsdp"], "search_also": ("schedule",)})
    assert schedule_axis.hides_ep("dualpipev", moe)
    sp = SearchSpace.for_job(moe, max_pp=4, max_vpp=2)
    assert "dualpipev" in sp.schedules and "dualpipe" not in sp.schedules
    dense = moe.model_copy(update={"model": _mini(False, 8)})
    assert "dualpipev" in SearchSpace.for_job(dense, max_pp=4, max_vpp=2).schedules
    assert SearchSpace.for_job(_job(), max_pp=4).schedules == (None,)


def test_deepseek_v3_report_row_is_found_with_dualpipe() -> None:
    """DeepSeek-V3's run (arXiv 2412.19437 §3.2: pp 16 DualPipe, ep 64, dp 128, ZeRO-1,
    recipe deepseek-v3-fp8) is found by `solve --fix tp=1,pp=16,ep=64,dp=128,mbs=1,
    schedule=dualpipe` at the CLI's default headroom, and its best plan is evaluate's."""
    from autoparallel_cp.cost.uncertainty import default_mem_headroom

    sys.path.insert(0, str(BENCH))
    from harness.heldout import heldout_rows

    rows = [r for r in heldout_rows() if getattr(r, "source", "") == "deepseek-v3-report"
            and r.job is not None and r.plan is not None]
    assert len(rows) == 1 and rows[0].plan.schedule == "dualpipe"
    job = rows[0].job.calibrated(None, default_mem_headroom())
    fix = "tp=1,pp=16,ep=64,dp=128,mbs=1,schedule=dualpipe"
    res = solve(job, SearchSpace.for_job(job, fix=fix), top_k=1, time_limit=60)
    assert res.status == "optimal" and res.plans
    got = res.plans[0]
    assert (got.plan.schedule, got.plan.pp, got.plan.ep, got.plan.dp) == ("dualpipe", 16, 64,
                                                                           128)
    assert got.fits
    assert got.time.step_s == pytest.approx(evaluate(job, got.plan).time.step_s, rel=1e-12)


def _mixed(gpn: int, n0: int, n1: int, a100_first: bool) -> ClusterSpec:
    """The mixed H100 / A100 preset cut to `n0` / `n1` nodes of `gpn` GPUs (either order)."""
    c = _mixed_small()
    gs = [g.model_copy(update={"num_nodes": n, "gpus_per_node": gpn})
          for g, n in zip(c.node_groups, (n0, n1), strict=True)]
    return c.model_copy(update={"node_groups": gs[::-1] if a100_first else gs})


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@example(gpn=2, n0=1, n1=2, a100_first=True, moe=False, seq=8192, zero="1,3")
@example(gpn=4, n0=1, n1=1, a100_first=False, moe=True, seq=4096, zero="0,1")
@given(gpn=st.sampled_from([2, 4]), n0=st.sampled_from([1, 2]), n1=st.sampled_from([1, 2]),
       a100_first=st.booleans(), moe=st.booleans(), seq=st.sampled_from([2048, 8192, 32768]),
       zero=st.sampled_from(["0,1", "1,3"]))
def test_dualpipe_on_several_node_groups_matches_enumeration(
        gpn: int, n0: int, n1: int, a100_first: bool, moe: bool, seq: int, zero: str) -> None:
    """DualPipe on a mixed H100 / A100 cluster is searched (no longer exit 2): the master's
    LB (`pair_harmonic`) <= every key's exact best over every stage placement, and CP-SAT's
    top k equals the enumerator's. Two ZeRO stages and mbs 1 per example (the placements are
    what this test varies; mbs 2 and every stage on one group: test_dualpipe_spaces_match_
    enumeration): the 16-GPU space of all four stages and mbs <= 2 took over a minute to
    enumerate, a quarter of it here."""
    job = Job(model=_mini(moe, 6 if moe else 8), cluster=_mixed(gpn, n0, n1, a100_first),
              seq_len=seq, global_batch=32)
    try:
        space = SearchSpace.for_job(job, fix="schedule=dualpipe", max_pp=8, max_mbs=1,
                                    zero=tuple(int(z) for z in zero.split(",")))
    except UserError:
        return  # no even pp whose stages the node groups hold whole
    assert space.heterogeneous
    if space.num_degree_combinations() == 0:
        return
    _assert_master_bounds(job, space, 1)
    _compare_exact(job, space, 4)


def _least_rank_time(us: tuple[float, ...], layers: int) -> float:
    """min over stage placements and free layer counts (>= 0 each) of DualPipe's slowest rank,
    max_j (l_j·u_j + l_{p-1-j}·u_{p-1-j})/2 (stage j of per-layer time u_j), by brute force."""
    p = len(us)
    best = math.inf
    for perm in set(itertools.permutations(us)):
        for cuts in itertools.combinations_with_replacement(range(layers + 1), p - 1):
            ls = [b - a for a, b in zip((0, *cuts), (*cuts, layers), strict=True)]
            best = min(best, max((ls[j] * perm[j] + ls[p - 1 - j] * perm[p - 1 - j]) / 2
                                 for j in range(p)))
    return best


@settings(max_examples=30, deadline=None)
@example(counts=(1, 1), u=[1.0, 2.0, 1.0], layers=6)
@given(counts=st.sampled_from([(1, 1), (2, 2), (1, 3), (3, 1), (2, 1, 1), (1, 1, 2)]),
       u=st.lists(st.floats(0.1, 10.0), min_size=3, max_size=3),
       layers=st.integers(1, 7))
def test_pair_harmonic_bounds_every_placement_and_split(counts: tuple[int, ...],
                                                        u: list[float], layers: int) -> None:
    """L·Hd/p <= DualPipe's slowest rank over every placement and every layer split (free
    counts included), where the other schedules' harmonic L·Hu/p bounds the slowest stage
    only: at (1, 2) x (1, 2) all layers on the fast stage's pair gives L/2 < L·(4/3)/2."""
    p = sum(counts)
    fr = [c / p for c in counts]
    us = tuple(u[g] for g, c in enumerate(counts) for _ in range(c))
    hd = float(model_scored.pair_harmonic(fr, [np.array(u[g]) for g in range(len(counts))]))
    least = _least_rank_time(us, layers)
    assert layers * hd / p <= least * (1 + 1e-12)
    hu = 1.0 / sum(f / u[g] for g, f in enumerate(fr))
    assert hd <= hu * (1 + 1e-12)
    if counts == (1, 1) and u[:2] == [1.0, 2.0]:
        assert least < layers * hu / p and least == pytest.approx(layers * hd / p)


def test_dualpipe_placements_narrow_the_pipeline_degrees() -> None:
    """DualPipe on several node groups scans every stage placement of a key, so its pp domain
    keeps the degrees with at most PLACEMENTS_MAX of them (the mixed preset's two equal
    groups: C(8, 4) = 70 at pp 8, C(16, 8) = 12,870 at pp 16); a pinned pp above it is exit 2
    unless stage_groups is pinned too, and the proof line says so."""
    from autoparallel_cp.search.space_proof import proof_space, space_line
    from autoparallel_cp.spec.loaders import load_cluster, load_model

    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("mixed-h100-a100"),
              seq_len=4096, global_batch=1024)
    assert [schedule_axis.placement_count(job, p) for p in (2, 4, 8, 16)] == [2, 6, 70, 12870]
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe")
    assert sp.pp == (2, 4, 8)
    assert "stage placements: every order" in space_line(proof_space(sp))
    with pytest.raises(UserError, match="12,870 stage placements"):
        SearchSpace.for_job(job, fix="schedule=dualpipe,pp=16")
    groups = ":".join(["0"] * 8 + ["1"] * 8)
    assert SearchSpace.for_job(job, fix=f"schedule=dualpipe,pp=16,stage_groups={groups}").pp \
        == (16,)
    assert SearchSpace.for_job(job, fix="schedule=1f1b", max_pp=16).pp[-1] == 16  # others keep


@pytest.mark.parametrize("sched", ["zbv", "dualpipev"])
def test_v_placements_narrow_the_pipeline_degrees_too(sched: str) -> None:
    """ZBV and DualPipeV keys scan every stage placement as well (replay_axis.py): pinned, on
    the mixed preset, their pp domain stops at 8 (pp 32 has C(32, 16) = 6e8 placements, which
    the scan once tried to list: minutes, then killed), pp 16 pinned is exit 2, and the union
    of `--search-also schedule` caps its V sub-spaces the same way, saying so; the other
    schedules and one node group keep every pp."""
    from autoparallel_cp.search.space_proof import proof_space, space_line
    from autoparallel_cp.spec.loaders import load_cluster, load_model

    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("mixed-h100-a100"),
              seq_len=4096, global_batch=1024)
    sp = SearchSpace.for_job(job, fix=f"schedule={sched}")
    assert sp.pp == (2, 4, 8)
    assert "stage placements: every order" in space_line(proof_space(sp))
    with pytest.raises(UserError, match=f"schedule={sched}: pp=16 .*12,870 stage placements"):
        SearchSpace.for_job(job, fix=f"schedule={sched},pp=16")
    union = SearchSpace.for_job(job.model_copy(update={"search_also": ("schedule",)}))
    subs = {v.schedule: v.pp for v in union.schedule_variants()}
    assert max(subs["zbv"]) == max(subs["dualpipev"]) == 8
    assert max(subs["zb-h1"]) > 8 and max(union.pp) > 8
    assert "at the pp with at most 100" in space_line(proof_space(union))
    one = Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100"), seq_len=4096,
              global_batch=1024)
    assert max(SearchSpace.for_job(one.model_copy(update={"cluster": one.cluster.take_gpus(
        1024)}), fix=f"schedule={sched}").pp) > 8
