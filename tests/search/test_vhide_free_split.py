"""Free per-rank layer counts under a DualPipeV that hides EP all-to-all (a MoE model whose
recipe does not overlap every micro-batch's: `schedule_axis.hides_ep`), searched exactly on
one node group (search/cpsat_replay.py `solve_free`, each split scored by the cost model):
the model's objective is <= every free split's exact best (`model_scan.best_of_split`) with
m above and at the replayed micro-batches, the family is in the space and the proof line,
and CP-SAT's top k equals the enumerator's on random small MoE spaces, pp 2..4."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from test_replay_search import _compare_exact
from test_zb_search import _job

from autoparallel_cp.cost.schedules import sim_microbatches
from autoparallel_cp.errors import UserError
from autoparallel_cp.search import cpsat_partition
from autoparallel_cp.search.enumerate_axes import partition_array
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.model_scan import best_of_split
from autoparallel_cp.search.model_scored import model_scored
from autoparallel_cp.search.replay_axis import scored_free
from autoparallel_cp.search.solve import enumerate_plans
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, key_variants


@pytest.mark.parametrize("pp, batch", [(2, 128), (2, 16), (4, 64)])
def test_the_model_objective_is_below_every_free_split(pp: int, batch: int) -> None:
    """Every free split pinned in its key's model: objective <= the split's exact best by the
    cost model (its tables hold each layer at a hidden share of 1, and the exposed DP sync is
    taken against T: cpsat_replay.py's docstring), m above 8p (the sync's T term) and not."""
    job = _job(True, 8, 8, 4096, batch)
    sp = SearchSpace.for_job(job, fix=f"schedule=dualpipev,tp=1,cp=1,pp={pp},mbs=1",
                             max_pp=4)
    assert model_scored(sp) and scored_free(sp)
    t = build_tables(sp)
    kt = build_key_table(t)
    checked, above = 0, 0
    for i in range(len(kt.lb)):
        key = kt.key(i)
        above += key.m - sim_microbatches(pp, key.m) >= t.bwd_share
        for v in key_variants(t, key):
            parts, _ = partition_array(v.space, key.pp, key.vpp)
            for row in parts:
                split = tuple(int(x) for x in row)
                got = best_of_split(v, key, split)
                if got is None:
                    continue
                pm = cpsat_partition.build_partition(v, key)
                assert pm is not None
                for x, n in zip(pm.layers, split, strict=True):
                    pm.model.add(x == n)
                s = cp_model.CpSolver()
                s.parameters.num_workers = 1
                assert s.solve(pm.model) == cp_model.OPTIMAL  # a fitting split stays in
                assert s.objective_value * pm.scale_s <= got[0] * (1 + 1e-12)
                checked += 1
    assert checked >= 10
    assert (above > 0) == (batch > 16 * pp)


def test_the_free_family_is_in_the_space_and_the_proof() -> None:
    job = _job(True, 8, 8, 4096, 32)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipev", max_pp=4)
    assert model_scored(sp) and sp.free_ok(2, 2) and sp.free_ok(4, 2)
    line = space_line(proof_space(sp))
    assert "under dualpipev: per rank" in line and "scored exactly by the cost model" in line
    assert "evaluated, not searched" not in line
    best = enumerate_plans(job, sp, top_k=1).plans[0].plan
    if best.pp == 2:
        assert outside(sp, best.model_copy(update={"stage_layers": (2, 6),
                                                   "chunk_layers": None})) is None


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@example(layers=8, gpus=8, batch=64, seq=4096, zero="0,1")
@given(layers=st.sampled_from([4, 6, 8]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16, 64]), seq=st.sampled_from([2048, 8192]),
       zero=st.sampled_from(["0,1", "1,3"]))
def test_free_vhide_spaces_match_enumeration(layers: int, gpus: int, batch: int, seq: int,
                                             zero: str) -> None:
    job = _job(True, layers, gpus, seq, batch)
    try:
        space = SearchSpace.for_job(job, fix="schedule=dualpipev", max_pp=4, max_mbs=2,
                                    zero=tuple(int(z) for z in zero.split(",")))
    except UserError:
        return  # no pp > 1 of this job (a pin outside the rules is exit 2)
    if space.num_degree_combinations() == 0:
        return
    assert scored_free(space)
    _compare_exact(job, space, 4)
