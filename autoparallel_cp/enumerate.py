"""Exhaustive reference search: every plan of a SearchSpace, scored by the tabulated cost model.

The factor tables are built once (numpy, vectorized over the axis domains); each complete plan is
then composed from table entries (`tables.plan_cost`, the memory.py / steptime.py composition).
It refuses spaces larger than `DEFAULT_LIMIT` plans (about a minute on one core) with an
InputError saying so: restrict the space (`partition="uniform"`, `partial_recompute=False`, or
`--fix`) or use the CP-SAT solver.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from autoparallel_cp.errors import UserError
from autoparallel_cp.plan import Plan, RecomputeMode
from autoparallel_cp.space import Degrees, SearchSpace
from autoparallel_cp.tables import build_tables, plan_cost

DEFAULT_LIMIT = 3_000_000


class SpaceTooLarge(UserError):
    """The space has more plans than the enumerator is allowed to visit."""


def partitions(space: SearchSpace, pp: int, vpp: int) -> Iterator[tuple[int, ...] | None]:
    """Layer partitions (front to back) of the space for (pp, vpp); None = uniform."""
    if "stage_layers" in space.fixed:
        yield tuple(space.fixed["stage_layers"])
        return
    if space.partition == "uniform":
        yield None
        return
    step = space.layer_step(vpp)
    units = space.num_layers // step
    first_min = space.first_stage_min_units(vpp)
    for cuts in itertools.combinations(range(1, units), pp - 1):
        parts = [b - a for a, b in zip((0, *cuts), (*cuts, units), strict=True)]
        if parts[0] < first_min:
            continue
        yield tuple(p * step for p in parts)


def placements(space: SearchSpace, d: Degrees) -> Iterator[tuple[int, ...] | None]:
    """Node-group orders over the stages (None on a homogeneous cluster)."""
    if not space.heterogeneous:
        yield None
        return
    if "stage_groups" in space.fixed:
        yield tuple(space.fixed["stage_groups"])
        return
    counts = space.stage_group_counts(d.tp, d.cp, d.dp)
    assert counts is not None
    base = [g for g, c in enumerate(counts) for _ in range(c)]
    seen: set[tuple[int, ...]] = set()
    for perm in itertools.permutations(base):
        if perm not in seen:
            seen.add(perm)
            yield perm


def recompute_options(space: SearchSpace, mode: RecomputeMode, biggest: int
                      ) -> Iterator[int | None]:
    """recompute_layers values for a partition whose largest stage has `biggest` layers."""
    if mode != "full":
        yield None
        return
    if "recompute_layers" in space.fixed:
        r = int(space.fixed["recompute_layers"])
        yield r if r < biggest else None
        return
    if space.partial_recompute:
        yield from range(1, biggest)
    yield None


def enumerate_best(space: SearchSpace, limit: int | None = None
                   ) -> tuple[list[tuple[float, Plan]], int]:
    """Best plan per key (the key of solve.py), ranked by exact step time; and the space size."""
    size = space.size()
    lim = DEFAULT_LIMIT if limit is None else limit
    if size > lim:
        raise SpaceTooLarge(
            f"enumerate refuses a space of {size:,} plans (limit {lim:,}); use `solve`, "
            "or narrow the space (--fix, uniform partitions, no partial recompute)"
        )
    tabs = build_tables(space)
    best: dict[tuple[Any, ...], tuple[float, tuple[Any, ...], Plan]] = {}
    for d in space.degrees():
        parts = list(partitions(space, d.pp, d.vpp))
        places = list(placements(space, d))
        for sp_, zero, mode in itertools.product(space.sp, space.zero, space.recompute):
            if sp_ and d.tp == 1:
                continue
            key = (d.tp, d.pp, d.cp, d.dp, d.ep, d.vpp, sp_, zero, d.mbs, mode)
            for part in parts:
                ls = part if part is not None else (space.num_layers // d.pp,) * d.pp
                for r in recompute_options(space, mode, max(ls)):
                    for sg in places:
                        plan = Plan(dp=d.dp, tp=d.tp, pp=d.pp, vpp=d.vpp, cp=d.cp, ep=d.ep,
                                    sp=sp_, zero=zero, mbs=d.mbs,
                                    num_microbatches=d.num_microbatches, recompute=mode,
                                    recompute_layers=r, stage_layers=part, stage_groups=sg)
                        pc = plan_cost(tabs, plan)
                        if not pc.fits:
                            continue
                        cand = (pc.step_s, plan.key(), plan)
                        old = best.get(key)
                        if old is None or cand[:2] < old[:2]:
                            best[key] = cand
    ranked = sorted(best.values(), key=lambda x: (x[0], x[1]))
    return [(c, p) for c, _, p in ranked], size
