"""Free per-stage layer counts under DualPipe (issue 31, "one space"), on one node group or
several, searched exactly: a best-first branch and bound over the family's splits (at most
`DUALPIPE_FREE_MAX`, replay_axis.py `free_pp_ok`), each split's lower bound the least over
its stage placements of dualpipe_bound.py's (split, placement) bound (`split_bounds`,
vectorised), and the splits scored exactly by the cost model in the order of their bounds.
Above that many splits, where replay_axis.py `by_class` holds, `solve_free_dualpipe` hands
the key to search/dualpipe_classes.py, which bounds and opens pair-sum classes instead (at
pp 16 found best-first: search/dualpipe_frontier.py).

What evaluate charges a DualPipe plan (cost/steptime.py `_dualpipe_rank`, cost/memory.py;
search/dualpipe_bound.py holds the derivation): rank r runs stage r and its mirror p-1-r on
its own GPUs, its per-micro-batch time T_r the mean of the two stage times (both timed on
rank r's node group g_r, `stage_groups`), its DP sync and optimizer step the sums; step =
(m - rho)·T + rho·S + max_r exposed_r + max_r o_r with T = max_r T_r, S = Σ_r T_r; memory
per rank r: both stages' states and activations on g_r + constants, under g_r's capacity.
dualpipe_bound.py proves its (split, placement) bound is <= the exact best step of every plan
with that split and placement (each recompute count), and inf only where none fits.

Exactness (`solve_free_dualpipe`): list the splits (`enumerate_axes.partition_array`: every
per-stage count >= 1, stage 0 >= the dense prefix, the counts multiples of `layer_step`),
bound each (the least over `placement_array`'s rows), order them by (bound, split), and
score them in that order (model_scan.py `best_of_split`: `plan_terms` over the split's
recompute counts and every placement, the enumerator's scoring, bit for bit), keeping the
least (step, `Plan.key()`), until the next bound is above the best exact step so far (or
the caller's cutoff) by more than `REL_TOL` (float rounding: the bound and the exact step
sum the same entries in other orders). Every split left has exact >= bound > best, so the
result is the family's exact best, ties to the least `Plan.key()` (the enumerator's order,
model_scan.py); an exact tie has bound <= best and is scored. search/solve.py asks a key
again at other cutoffs: the bounds and the splits scored before (exact whatever the cutoff,
kept on the tables) are reused and seed the incumbent. Each plan the cost model scores
charges the search's `limits.Budget` `limits.MODEL_PLAN_DTIME` (as cpsat_partition.py
`_score_determined`); if it runs out, the best so far is returned unproven, its gap to the
least bound left as error bound.

Before session 26 a per-key CP-SAT model (one-hot placement selectors linearising the
products with the layer counts) proposed the splits: its LP relaxation was weak, and a mixed
H100 + A100 key of 12 layers at pp 4 took 0.03 s under one random seed and did not prove in
140 s under another; the family is small enough (<= 256 splits x <= 100 placements) that
bounding every split directly is exact, fast and the same under every seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autoparallel_cp.search import limits
from autoparallel_cp.search.dualpipe_bound import key_constants, split_bounds
from autoparallel_cp.search.dualpipe_classes import keep_best, solve_by_class
from autoparallel_cp.search.enumerate_axes import partition_array, placement_array
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.model_scan import best_of_split
from autoparallel_cp.search.replay_axis import by_class
from autoparallel_cp.search.space import Degrees
from autoparallel_cp.search.tables import Tables
from autoparallel_cp.spec.plan import Plan, canonical

#: Relative slack of the stopping test: a split whose bound is within it of the best exact
#: step is still scored (the bound and the step add the same entries in other orders)
REL_TOL = 1e-9

Ordered = tuple[list[tuple[int, ...]], list[float]]


def ordered_splits(t: Tables, key: Any) -> Ordered:
    """The key's free splits and their bounds (the least over the placements), ordered by
    (bound, split); cached on the tables per key. No placement: no split."""
    cache: dict[Any, Ordered] = t.__dict__.setdefault("_dp_bounds", {})
    if key in cache:
        return cache[key]
    d = Degrees(key.tp, key.pp, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
    places, _ = placement_array(t.space, t, d)
    parts, _ = partition_array(t.space, key.pp, key.vpp)
    if len(places) == 0 or len(parts) == 0:
        cache[key] = ([], [])
        return cache[key]
    c, every, rho, synced, fl = key_constants(t, key)
    b = split_bounds(t, c, key, rho, every, synced, np.array(fl, float),
                     np.asarray(parts, float), places).min(axis=1)
    rows = sorted(zip((float(x) for x in b), (tuple(int(v) for v in r) for r in parts),
                      strict=True))
    cache[key] = ([r for _, r in rows], [x for x, _ in rows])
    return cache[key]


def solve_free_dualpipe(t: Tables, key: Any, *, seed: int, workers: int,
                        cutoff_s: float | None, budget: Budget
                        ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """The exact best plan of a DualPipe key's free family (module docstring), as
    cpsat_partition's `_solve_family` returns it: ((step, plan, exact - its split's bound,
    error bound), whether a None answer is proven). None, proven, when no plan fits with an
    exact step time <= `cutoff_s`. `seed` and `workers` are the family interface's (no
    randomised solve here)."""
    del seed, workers
    if by_class(t.space, key.pp):  # too many splits to score one by one: by pair-sum class
        return solve_by_class(t, key, cutoff_s=cutoff_s, budget=budget)
    splits, bounds = ordered_splits(t, key)
    cut = cutoff_s if cutoff_s is not None and math.isfinite(cutoff_s) else None
    best: tuple[float, tuple[Any, ...], Plan, float] | None = None
    # split -> its exact best (None: nothing fits), from earlier calls at other cutoffs
    memo: dict[tuple[int, ...], Any] = t.__dict__.setdefault("_dp_split", {}).setdefault(
        key, {})
    bound_of = dict(zip(splits, bounds, strict=True))
    for sp in sorted(memo):
        best, cut = keep_best(best, cut, memo[sp], bound_of[sp])
    for sp, b in zip(splits, bounds, strict=True):
        if not math.isfinite(b) or (cut is not None and b > cut * (1.0 + REL_TOL)):
            return _answer(best, cutoff_s, 0.0, t.space.num_layers)
        if sp in memo:
            continue
        if budget.exhausted():
            err = None if best is None else max(best[0] - b, 0.0)
            ans = _answer(best, cutoff_s, err, t.space.num_layers)
            return ans[0], False
        n0 = len(t.__dict__.get("_model_terms", {}))
        memo[sp] = best_of_split(t, key, sp)
        budget.charge(limits.MODEL_PLAN_DTIME
                      * (len(t.__dict__.get("_model_terms", {})) - n0))
        best, cut = keep_best(best, cut, memo[sp], b)
    return _answer(best, cutoff_s, 0.0, t.space.num_layers)


def _answer(best: tuple[float, tuple[Any, ...], Plan, float] | None, cutoff_s: float | None,
            err: float | None, num_layers: int
            ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """`solve_free_dualpipe`'s answer: None (proven when `err` is 0: every split was bounded
    out or scored) when none fits or the best is above the cutoff."""
    if best is None or (cutoff_s is not None and best[0] > cutoff_s):
        return None, err == 0.0
    step, _, plan, diff = best
    return (step, canonical(plan, num_layers), diff, err or 0.0), False
