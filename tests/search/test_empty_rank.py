"""A V's empty first rank in the search (search/empty_rank.py, issue 31 "one space"): the free
V family walks rank 0 from 0 layers in the enumerator, the count and CP-SAT alike; every bound
stays below every key's exact best (hypothesis); CP-SAT equals the enumerator; a large
vocabulary on few layers makes the empty rank 0 the best plan, and the Zero Bubble fork's
layout (2·pp - 2 layers) is found."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_cpsat_partition import _check_key_bound_of
from test_replay_free_split import _vocab_job
from test_replay_search import _compare_exact
from test_solver_vs_enumerate import _assert_master_bounds, _key, _mini, _ranked
from test_zb_search import _job

from autoparallel_cp.errors import InfeasibleError, UserError
from autoparallel_cp.search.empty_rank import empty_first
from autoparallel_cp.search.enumerate_axes import partition_array, partitions
from autoparallel_cp.search.key_bounds import key_bound
from autoparallel_cp.search.solve import enumerate_plans
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables
from autoparallel_cp.spec import Job

V = ("zbv", "dualpipev")


@pytest.mark.parametrize("sched", V)
def test_the_free_v_family_starts_rank_0_at_zero(sched: str) -> None:
    """8 layers on pp 4: the per-rank counts (multiples of 2) with rank 0 from 0 and the others
    from 2, lexicographic (the (0, ...) splits first), the same in the generator, the array and
    the count; the other schedules keep >= 1; a dense prefix does not (its rank 0 from 0 too,
    the prefix then on rank 1: test_empty_rank_prefix.py)."""
    sp = SearchSpace.for_job(_job(), fix=f"schedule={sched}", max_pp=4)
    assert empty_first(sp) and sp.first_stage_min_units(2) == 0
    got = list(partitions(sp, 4, 2))
    assert got[:4] == [(0, 2, 2, 4), (0, 2, 4, 2), (0, 4, 2, 2), (2, 2, 2, 2)]
    assert len(got) == sp.num_partitions(4, 2) == 4
    arr, _ = partition_array(sp, 4, 2)
    assert [tuple(r) for r in arr.tolist()] == got
    assert len(list(partitions(sp, 2, 2))) == sp.num_partitions(2, 2) == 4  # (0, 8) .. (6, 2)
    for other in ("zb-h1", "interleaved"):
        o = SearchSpace.for_job(_job(), fix=f"schedule={other}", max_pp=4, max_vpp=2)
        assert not empty_first(o) and o.first_stage_min_units(2) >= 1
    moe = Job(model=_mini(True, 8), cluster=_job().cluster, seq_len=4096, global_batch=16)
    assert empty_first(SearchSpace.for_job(moe, fix=f"schedule={sched}", max_pp=4))


def test_the_proof_line_and_outside_name_the_empty_first_rank() -> None:
    sp = SearchSpace.for_job(_job(), fix="schedule=zbv", max_pp=4)
    assert "rank 0 (the embedding and the head) from 0 layers" in space_line(proof_space(sp))
    best = enumerate_plans(_job(), sp, top_k=1).plans[0].plan
    empty = best.model_copy(update={"pp": 2, "stage_layers": (0, 8), "chunk_layers": None})
    assert outside(sp, empty) is None
    assert "multiples of vpp" in (outside(sp, empty.model_copy(
        update={"stage_layers": (8, 0)})) or "")
    moe = Job(model=_mini(True, 8), cluster=_job().cluster, seq_len=4096, global_batch=16)
    line = space_line(proof_space(SearchSpace.for_job(moe, fix="schedule=zbv", max_pp=4)))
    assert "from 0 layers: an empty first rank, the dense prefix then on rank 1" in line


def test_the_forks_layout_is_found_and_a_large_vocabulary_empties_rank_0() -> None:
    """6 layers on pp 4 (the Zero Bubble fork's 2·pp - 2: rank 0 empty, one layer per chunk
    elsewhere) is a plan of the space and the best of it at a 128k vocabulary; CP-SAT finds
    the same top 3 as the enumerator."""
    job = _vocab_job(128000, 6, gpus=4, batch=16)
    sp = SearchSpace.for_job(job, fix="schedule=zbv,pp=4", max_pp=4, max_mbs=2)
    assert sp.free_ok(4, 2) and sp.num_partitions(4, 2) == 1  # (0, 2, 2, 2) only
    best = enumerate_plans(job, sp, top_k=1).plans[0].plan
    assert best.layers_per_stage(6) == (0, 2, 2, 2)
    _compare_exact(job, sp, 3)


def test_the_key_bounds_hold_where_rank_0_is_empty() -> None:
    """The per-key bound (uncoupled and coupled, with the l = 0 entry at position 0) stays
    below every key's exact best, among them keys whose best leaves rank 0 empty."""
    job = _vocab_job(128000, 12)
    sp = SearchSpace.for_job(job, fix="schedule=zbv,tp=1,cp=1", max_pp=4, max_mbs=1,
                             zero=(1,))
    assert _check_key_bound_of(sp) > 0
    ranked = _ranked(sp)  # the enumeration `_check_key_bound_of` made
    empty = [(c, p) for c, p in ranked if p.layers_per_stage(12)[0] == 0]
    assert empty
    t = build_tables(sp)
    assert all(0.0 < key_bound(t, _key(p)) <= c for c, p in empty)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@example(sched="zbv", layers=6, vocab=128000, gpus=8, batch=16, seq=4096, zero=(0, 1))
@example(sched="dualpipev", layers=4, vocab=256000, gpus=4, batch=16, seq=8192, zero=(1, 3))
@given(sched=st.sampled_from(V), layers=st.sampled_from([4, 6, 8]),
       vocab=st.sampled_from([32000, 128000, 256000]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16]), seq=st.sampled_from([2048, 8192]),
       zero=st.sampled_from([(0, 1), (1, 3)]))
def test_bounds_and_cpsat_with_empty_first_ranks(sched: str, layers: int, vocab: int,
                                                 gpus: int, batch: int, seq: int,
                                                 zero: tuple[int, ...]) -> None:
    """Every key's per-key bound (uncoupled and coupled) and the master's <= the enumerator's
    exact best of the key, and CP-SAT's top k == the enumerator's, on V spaces whose free
    splits include rank 0 empty."""
    check_v_space(_vocab_job(vocab, layers, gpus, seq, batch), sched, zero)


def check_v_space(job: Job, sched: str, zero: tuple[int, ...]) -> None:
    """On the V space of `job` under `sched` (pp <= 4, mbs <= 2, these ZeRO stages), whose
    free splits include rank 0 empty: every key's per-key bound (uncoupled and coupled) and
    the master's <= the enumerator's exact best of the key, and CP-SAT's top k == the
    enumerator's (nothing to check where the space is empty)."""
    try:
        space = SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_mbs=2,
                                    zero=zero)
    except UserError:
        return
    if space.num_degree_combinations() == 0:
        return
    assert empty_first(space)
    try:
        enumerate_plans(job, space, top_k=1)
    except InfeasibleError:
        _compare_exact(job, space, 4)  # the solver says so too
        return
    _check_key_bound_of(space)
    _assert_master_bounds(job, space, 3)
    _compare_exact(job, space, 4)


def test_a_one_split_free_family_is_scanned_not_cut() -> None:
    """6 layers on pp 4 leave the free V family one split, (0, 2, 2, 2): its keys are scored
    by the enumerator's scan (cpsat_partition.py `_determined`, as a pinned split), with the
    split read off the row, and the search's best equals the enumerator's; at 8 layers (four
    splits) the replay's cut loop stays."""
    from autoparallel_cp.search.cpsat_partition import _determined
    from autoparallel_cp.search.enumerate import best_of_pinned_split
    from autoparallel_cp.search.key_table import build_key_table
    from autoparallel_cp.search.solve import solve

    for layers, one in ((6, True), (8, False)):
        job = _vocab_job(128000, layers, gpus=4, batch=16)
        sp = SearchSpace.for_job(job, fix="schedule=zbv,pp=4", max_pp=4, max_mbs=2)
        t = build_tables(sp)
        key = build_key_table(t).key(0)
        assert _determined(t, key) is one
        if one:
            got = best_of_pinned_split(t, key)
            assert got is not None and got[1].stage_layers == (0, 2, 2, 2)
            best = solve(job, sp, top_k=1, time_limit=60).plans[0]
            ref = enumerate_plans(job, sp, top_k=1).plans[0]
            assert best.plan == ref.plan and best.time.step_s == ref.time.step_s
