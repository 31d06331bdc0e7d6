"""The plan axes of one degree combination for the exhaustive reference (search/enumerate.py):
the layer partitions, node-group placements and partial-recompute counts it visits, as
generators (the reference order) and as the sorted arrays its vectorized pass reads.

Split out of enumerate.py (no behaviour change): they read only the space, never the tables'
factor values.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from math import comb

import numpy as np
import numpy.typing as npt

from autoparallel_cp.search.empty_rank import prefix_at, prefix_min_units
from autoparallel_cp.search.space import Degrees, SearchSpace
from autoparallel_cp.search.tables import Tables, stage_groups_of
from autoparallel_cp.spec.plan import Plan, RecomputeMode

Ints = npt.NDArray[np.int64]

# --------------------------------------------------------------------------------------------
# The plan axes of one degree combination (reference generators and their array forms)
# --------------------------------------------------------------------------------------------


def partitions(space: SearchSpace, pp: int, vpp: int) -> Iterator[tuple[int, ...] | None]:
    """Layer partitions (front to back) of the space for (pp, vpp); None = uniform."""
    fixed = space.fixed_stage_layers(pp, vpp)
    if fixed is not None:
        yield fixed
        return
    if space.partition == "uniform":
        yield None
        return
    step = space.layer_step(vpp)
    units = space.num_layers // step
    first_min = space.first_stage_min_units(vpp)
    lead = prefix_min_units(space, vpp)  # the dense prefix's stage: rank 0, or 1 after an
    # empty rank 0 (search/empty_rank.py); a first cut at 0, that empty rank 0, listed first
    for cuts in itertools.combinations(range(0 if first_min == 0 else 1, units), pp - 1):
        parts = [b - a for a, b in zip((0, *cuts), (*cuts, units), strict=True)]
        if parts[0] < first_min or parts[prefix_at(parts[0])] < lead:
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
    yield from _orders(list(counts))


def _orders(left: list[int]) -> Iterator[tuple[int, ...]]:
    """The distinct orders of a multiset (`left[g]` copies of group g), lexicographically:
    one step per order, not per permutation of the stages (12 orders of (1, 11), not 12!)."""
    if not any(left):
        yield ()
        return
    for g, c in enumerate(left):
        if c:
            left[g] -= 1
            for rest in _orders(left):
                yield (g, *rest)
            left[g] += 1


def recompute_options(space: SearchSpace, mode: RecomputeMode, biggest: int, vpp: int = 1
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
        step = space.recompute_step(vpp)
        yield from range(step, biggest, step)
    yield None


def partition_array(space: SearchSpace, pp: int, vpp: int
                    ) -> tuple[Ints, list[tuple[int, ...] | None]]:
    """Layers per stage of every partition, (P, pp) sorted lexicographically, and the Plan
    `stage_layers` value of each row (None for the uniform split)."""
    if space.fixed_split or space.partition == "uniform":
        part = next(partitions(space, pp, vpp))
        ls = part if part is not None else Plan(pp=pp).layers_per_stage(space.num_layers)
        return np.array([ls], np.int64).reshape(1, pp), [part]
    step = space.layer_step(vpp)
    units = space.num_layers // step
    first_min = space.first_stage_min_units(vpp)
    if pp == 1:
        out = np.array([[units]], np.int64) if units >= first_min else np.zeros((0, 1), np.int64)
    else:
        c0 = 0 if first_min == 0 else 1  # a first part of 0: search/empty_rank.py
        n = comb(units - c0, pp - 1)
        flat = np.fromiter(
            itertools.chain.from_iterable(itertools.combinations(range(c0, units), pp - 1)),
            dtype=np.int64, count=n * (pp - 1))
        cuts = flat.reshape(n, pp - 1)
        cuts = cuts[cuts[:, 0] >= first_min]
        edges = np.concatenate(
            [np.zeros((len(cuts), 1), np.int64), cuts, np.full((len(cuts), 1), units, np.int64)],
            axis=1)
        out = np.diff(edges, axis=1)
        at = prefix_at(out[:, 0])  # the dense prefix's stage (search/empty_rank.py)
        out = out[out[np.arange(len(out)), at] >= prefix_min_units(space, vpp)]
    # combinations come in lexicographic order of the cuts = lexicographic order of the parts
    out = out * step
    return out, [None] * len(out)  # the winners' stage_layers tuples are read off the rows


def placement_array(space: SearchSpace, t: Tables, d: Degrees
                    ) -> tuple[Ints, list[tuple[int, ...] | None]]:
    """Node group of every stage for every placement, (Q, pp) sorted lexicographically, and
    the Plan `stage_groups` value of each row (None: the default order of `stage_groups_of`)."""
    objs = sorted(placements(space, d), key=lambda x: x or ())
    rows = []
    for sg in objs:
        if sg is None:
            sg = stage_groups_of(t, Plan(dp=d.dp, tp=d.tp, pp=d.pp, cp=d.cp))
        rows.append(sg)
    return np.array(rows, np.int64).reshape(len(rows), d.pp), objs


def recompute_values(space: SearchSpace, mode: RecomputeMode, max_biggest: int,
                     vpp: int = 1) -> list[int | None]:
    """Every recompute_layers value some partition may take, in Plan.key() order (multiples
    of `SearchSpace.recompute_step`)."""
    if mode != "full":
        return [None]
    if "recompute_layers" in space.fixed:
        return [None, int(space.fixed["recompute_layers"])]
    if space.partial_recompute:
        step = space.recompute_step(vpp)
        return [None, *range(step, max_biggest, step)]
    return [None]


def recompute_valid(space: SearchSpace, mode: RecomputeMode, r: int | None, biggest: Ints
                    ) -> npt.NDArray[np.bool_]:
    """Partitions (by their largest stage) for which `enumerate_axes.recompute_options` yields
    `r`."""
    if mode == "full" and "recompute_layers" in space.fixed:
        rf = int(space.fixed["recompute_layers"])
        return biggest > rf if r is not None else biggest <= rf
    if r is None:
        return np.ones(biggest.shape, bool)
    return biggest > r
