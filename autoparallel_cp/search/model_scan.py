"""The per-key scan of the keys the cost model scores (search/model_scored.py: DualPipe, and
DualPipeV where it hides EP all-to-all): every plan of a key's family, scored by steptime.py /
memory.py, the least (step, `Plan.key()`) kept. The solver (cpsat_partition.py
`_score_determined`) and the enumerator (enumerate.py `_best_by_model`) both call it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from autoparallel_cp.search.act_offload import act_layers
from autoparallel_cp.search.enumerate_axes import (
    partition_array,
    placement_array,
    recompute_valid,
    recompute_values,
)
from autoparallel_cp.search.model_scored import Terms, plan_terms
from autoparallel_cp.search.schedule_axis import plan_schedule
from autoparallel_cp.search.space import Degrees
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan


def _terms(t: Any, plan: Plan) -> Terms:
    """`plan_terms`, memoized on the tables (the solver's families and the enumerator ask for
    the same plans)."""
    memo: dict[Plan, Terms] = t.__dict__.setdefault("_model_terms", {})
    if plan not in memo:
        memo[plan] = plan_terms(t.space.job, plan)
    return memo[plan]


def best_of_key(t: Any, key: Any) -> tuple[float, Plan] | None:
    """The exact best (step, plan) of `key` over the partitions of `t.space` (one family:
    its uniform or pinned split), every recompute count `enumerate_axes.recompute_values`
    lists for it and every stage placement; None when none fits."""
    space = t.space
    d = Degrees(key.tp, key.pp, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
    parts, part_objs = partition_array(space, d.pp, d.vpp)
    _, place_objs = placement_array(space, t, d)
    if len(parts) == 0 or not place_objs:
        return None
    mode = RECOMPUTE_MODES[key.mode]
    biggest: npt.NDArray[np.int64] = parts.max(axis=1)
    k_off = act_layers(space)  # a pp > 1 activation offload: stages of >= k layers only
    enough = parts.min(axis=1) >= k_off
    cl = space.fixed.get("chunk_layers")
    best: tuple[float, tuple[Any, ...], Plan] | None = None
    for r in recompute_values(space, mode, int(biggest.max()), d.vpp):
        ok = recompute_valid(space, mode, r, biggest) & enough
        for p in np.nonzero(ok)[0]:
            for q in place_objs:
                plan = Plan(dp=d.dp, tp=d.tp, pp=d.pp, vpp=d.vpp, cp=d.cp, ep=d.ep, sp=key.sp,
                            zero=key.zero, mbs=d.mbs, num_microbatches=d.num_microbatches,
                            recompute=mode, recompute_layers=r,
                            stage_layers=part_objs[int(p)], stage_groups=q,
                            chunk_layers=None if cl is None else tuple(cl), etp=space.etp,
                            schedule=plan_schedule(space.schedule),
                            dp_replicate=space.dp_replicate,
                            optimizer_offload=space.optimizer_offload,
                            activation_offload=k_off)
                step, *_, fits = _terms(t, plan)
                if fits and math.isfinite(step) and (
                        best is None or (step, plan.key()) < best[:2]):
                    best = (step, plan.key(), plan)
    return None if best is None else (best[0], best[2])
