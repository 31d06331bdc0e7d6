"""Free per-stage layer counts under DualPipe on one node group (search/dualpipe_splits.py):
each split's bound is <= its exact step time, the free family's bound
(dualpipe_bound.py `_free`) is <= every key's exact best, the family is in the space and the
proof line, CP-SAT's top k equals the enumerator's on random DualPipe spaces (dense and MoE,
pp 2..4), and an uneven free split the best where rank 0 holds the embedding (stage 0) and
the LM head (stage p-1) of a large vocabulary."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_replay_free_split import _vocab_job
from test_replay_search import _compare_exact
from test_solver_vs_enumerate import _mini, _mixed_small
from test_zb_search import _job

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.errors import UserError
from autoparallel_cp.search.dualpipe_bound import dualpipe_key_bound
from autoparallel_cp.search.dualpipe_splits import ordered_splits
from autoparallel_cp.search.enumerate_axes import partition_array
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.model_scan import best_of_key, best_of_split
from autoparallel_cp.search.solve import enumerate_plans
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, key_variants
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.splits import named_layouts


@pytest.mark.parametrize("moe", [False, True])
def test_each_split_bound_and_the_free_bound_are_below_every_free_split(moe: bool) -> None:
    """Every free split's bound (`ordered_splits`, the least over its placements) <= the
    split's exact best (`best_of_split`, the enumerator's scoring), and finite whenever the
    split fits; the key's bound <= the key's exact best over every split."""
    job = _vocab_job(64000, 8) if not moe else _job(True, 8, 8, 8192, 32)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=1,cp=1", max_pp=4, max_mbs=1)
    t = build_tables(sp)
    kt = build_key_table(t)
    checked = 0
    for i in range(len(kt.lb)):
        key = kt.key(i)
        for v in key_variants(t, key):
            if not v.space.free_ok(key.pp, key.vpp):
                continue
            parts, _ = partition_array(v.space, key.pp, key.vpp)
            exact = best_of_key(v, key)
            if exact is not None:
                assert dualpipe_key_bound(v, key) <= exact[0] + 1e-9
            splits, bounds = ordered_splits(v, key)
            assert sorted(splits) == sorted(tuple(int(x) for x in r) for r in parts)
            assert bounds == sorted(bounds)
            for split, b in zip(splits, bounds, strict=True):
                got = best_of_split(v, key, split)
                if got is None:
                    continue
                assert b <= got[0] * (1 + 1e-12)  # finite: a fitting split is never cut
                checked += 1
    assert checked >= 20


def test_the_free_dualpipe_family_is_in_the_space_and_the_proof() -> None:
    sp = SearchSpace.for_job(_job(), fix="schedule=dualpipe", max_pp=4)
    assert sp.free_ok(2, 1) and sp.free_ok(4, 1)
    line = space_line(proof_space(sp))
    assert "under dualpipe: rank r runs stage r and its mirror" in line
    assert "evaluated, not searched" not in line
    best = enumerate_plans(_job(), sp, top_k=1).plans[0].plan
    assert outside(sp, best.model_copy(update={"stage_layers": (1, 7) if best.pp == 2
                                               else (1, 1, 1, 5)})) is None
    # several node groups: searched too (test_dualpipe_free_multi.py), said so
    mixed = Job(model=_mini(False, 8), cluster=_mixed_small(), seq_len=4096, global_batch=32)
    hs = SearchSpace.for_job(mixed, fix="schedule=dualpipe,tp=8", max_pp=4)
    assert hs.free_ok(2, 1)
    assert "both stages of a rank timed on the rank's group" in space_line(proof_space(hs))
    # more free splits than the split-by-split loop scores: by pair-sum class
    # (test_dualpipe_classes.py: above its cap, the named layouts, said so)
    deep = SearchSpace.for_job(_job(layers=64), fix="schedule=dualpipe", max_pp=4)
    assert deep.free_ok(2, 1) and deep.free_ok(4, 1)
    assert "at pp 4, by pair-sum class" in space_line(proof_space(deep))



def test_an_uneven_free_split_is_the_best_and_found() -> None:
    """A 128k vocabulary over 8 layers at pp 4: rank 0 runs stage 0 (the embedding) and
    stage 3 (the LM head), so the best DualPipe plan gives that pair fewer layers, a split no
    named layout holds, faster than every named layout (and the uniform split) of its key;
    CP-SAT finds it (its top 3 equals the enumerator's)."""
    job = _vocab_job(128000, 8)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=1,cp=1,pp=4", max_pp=4,
                             max_mbs=1, zero=(1,))
    best = enumerate_plans(job, sp, top_k=1).plans[0]
    ls = best.plan.stage_layers
    assert ls is not None and ls[0] + ls[3] < ls[1] + ls[2]
    others = {*named_layouts(8, 4, 1), (2, 2, 2, 2)}
    assert ls not in others
    for cl in others:
        ev = evaluate(job, best.plan.model_copy(update={"stage_layers": cl}))
        assert ev.time.step_s > best.time.step_s
    _compare_exact(job, sp, 3)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@example(moe=True, layers=8, vocab=32000, gpus=8, batch=32, seq=8192)
@example(moe=False, layers=8, vocab=128000, gpus=8, batch=16, seq=4096)
@given(moe=st.booleans(), layers=st.sampled_from([6, 8, 10]),
       vocab=st.sampled_from([32000, 128000]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16, 32]), seq=st.sampled_from([2048, 8192]))
def test_free_dualpipe_spaces_match_enumeration(moe: bool, layers: int, vocab: int,
                                                gpus: int, batch: int, seq: int) -> None:
    job = _job(True, layers, gpus, seq, batch) if moe else _vocab_job(vocab, layers, gpus,
                                                                     seq, batch)
    try:
        space = SearchSpace.for_job(job, fix="schedule=dualpipe", max_pp=4, max_mbs=2,
                                    zero=(0, 1))
    except UserError:
        return  # no even pp > 1 of this job (a pin outside the rules is exit 2)
    if space.num_degree_combinations() == 0:
        return
    _compare_exact(job, space, 4)
