"""`schedule_axis.key_split` fills a space's whole grid of splits at once (`_fill_splits`,
cost/pass_split.py `backward_splits`): every key it answers from the grid equals the scalar
`backward_split` of the key's probe plan, and a pinned recompute count still takes the
scalar path."""

from __future__ import annotations

import itertools

from autoparallel_cp import api
from autoparallel_cp.cost.pass_split import backward_split
from autoparallel_cp.search.schedule_axis import key_split
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec.plan import Plan


def test_the_filled_grid_answers_every_key_as_the_scalar_path() -> None:
    job = api.make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=256)
    sp = SearchSpace.for_job(job, fix="schedule=zb-h1", max_pp=4, max_mbs=2)
    n = 0
    for tp, cp, ep, q, mbs, mode in itertools.product(sp.tp, sp.cp, sp.ep, sp.sp, sp.mbs,
                                                      sp.recompute):
        got = key_split(sp, 2, tp, cp, ep, sp.etp, q, mbs, mode, None)
        probe = Plan(pp=2, tp=tp, cp=cp, ep=ep, etp=sp.etp, sp=int(q), mbs=mbs,
                     recompute=mode)
        assert got == backward_split(job, probe), (tp, cp, ep, q, mbs, mode)
        n += 1
    assert n >= 50
    assert any(k[0] == "filled" for k in sp.__dict__["_splits"])  # read off the grid
    # a pinned count: its share min(1, r·pp/L) is the scalar path's
    probe = Plan(pp=4, tp=2, cp=1, ep=8, etp=sp.etp, sp=1, mbs=1, recompute="full",
                 recompute_layers=2)
    assert key_split(sp, 4, 2, 1, 8, sp.etp, 1, 1, "full", 2) == backward_split(job, probe)
