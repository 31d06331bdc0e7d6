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
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan, canonical


def _terms(t: Any, plan: Plan) -> Terms:
    """`plan_terms`, memoized on the tables (the solver's families and the enumerator ask for
    the same plans)."""
    memo: dict[Plan, Terms] = t.__dict__.setdefault("_model_terms", {})
    if plan not in memo:
        memo[plan] = plan_terms(t.space.job, plan)
    return memo[plan]


def best_of_key(t: Any, key: Any) -> tuple[float, Plan] | None:
    """The exact best (step, plan) of `key` over the partitions of `t.space` (one family:
    its uniform or pinned split, or, for a DualPipe free family, every free split:
    `enumerate_axes.partition_array`), every recompute count `enumerate_axes.recompute_values`
    lists for it and every stage placement; None when none fits."""
    d = Degrees(key.tp, key.pp, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
    parts, part_objs = partition_array(t.space, d.pp, d.vpp)
    _, place_objs = placement_array(t.space, t, d)
    best: tuple[float, tuple[Any, ...], Plan] | None = None
    for row, obj in zip(parts, part_objs, strict=True):
        got = _best_of_row(t, key, d, row, obj, place_objs)
        if got is not None and (best is None or got[:2] < best[:2]):
            best = got
    return None if best is None else (best[0], best[2])


def best_of_split(t: Any, key: Any, layers: tuple[int, ...]) -> tuple[float, Plan] | None:
    """The exact best (step, plan) of `key` with the free split `layers` (per-stage counts),
    over its recompute counts and stage placements, as `best_of_key` scores that row (the
    exact loop of search/dualpipe_splits.py); None when none fits."""
    d = Degrees(key.tp, key.pp, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
    _, place_objs = placement_array(t.space, t, d)
    got = _best_of_row(t, key, d, np.asarray(layers, np.int64), None, place_objs)
    return None if got is None else (got[0], got[2])


def _best_of_row(t: Any, key: Any, d: Degrees, row: npt.NDArray[np.int64],
                 obj: tuple[int, ...] | None, place_objs: list[tuple[int, ...] | None]
                 ) -> tuple[float, tuple[Any, ...], Plan] | None:
    """The least (step, `Plan.key()`, plan) over one partition row's recompute counts and
    stage placements. A free row (`obj` None outside a uniform or pinned split) names its
    counts as `stage_layers`, canonical (`spec.plan.canonical`: the default split as None),
    as the solver reports it."""
    space = t.space
    if not place_objs:
        return None
    free = obj is None and not space.fixed_split and space.partition != "uniform"
    split = tuple(int(x) for x in row) if free else obj
    mode = RECOMPUTE_MODES[key.mode]
    biggest = np.asarray([int(row.max())], np.int64)
    k_off = act_layers(space)  # a pp > 1 activation offload: stages of >= k layers only
    if int(row.min()) < k_off:
        return None
    cl = space.fixed.get("chunk_layers")
    best: tuple[float, tuple[Any, ...], Plan] | None = None
    for r in recompute_values(space, mode, int(biggest[0]), d.vpp):
        if not bool(recompute_valid(space, mode, r, biggest)[0]):
            continue
        for q in place_objs:
            plan = Plan(dp=d.dp, tp=d.tp, pp=d.pp, vpp=d.vpp, cp=d.cp, ep=d.ep, sp=key.sp,
                        zero=key.zero, mbs=d.mbs, num_microbatches=d.num_microbatches,
                        recompute=mode, recompute_layers=r,
                        stage_layers=split, stage_groups=q,
                        chunk_layers=None if cl is None else tuple(cl), etp=space.etp,
                        schedule=plan_schedule(space.schedule),
                        dp_replicate=space.dp_replicate,
                        optimizer_offload=space.optimizer_offload,
                        activation_offload=k_off)
            if free:
                plan = canonical(plan, space.num_layers)
            step, *_, fits = _terms(t, plan)
            if fits and math.isfinite(step) and (
                    best is None or (step, plan.key()) < best[:2]):
                best = (step, plan.key(), plan)
    return best
