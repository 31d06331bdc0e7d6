"""DualPipe's free per-stage splits by pair-sum class (issue 31, "one space"): the exact best
of a key's free family at a pp with too many splits to score one by one (replay_axis.py
`by_class`: 79,079 splits of 80 layers at pp 4, 2.3e9 at pp 8). Up to `DUALPIPE_CLASS_MAX`
classes they are listed and bounded at once (`class_array`); above it (pp 16: ~1e8 classes
of 61 layers, ~1e9 of 80) search/dualpipe_frontier.py yields them in the same bound order,
best-first, without listing them (`_Key.at`), and the loop below is the same.

Structure (cost/steptime.py `_dualpipe_rank`, cost/memory.py): rank i runs stage i and its
mirror p-1-i on its own group, so pair i = stages {i, p-1-i} with counts (a_i, b_i) sets
ranks i and p-1-i (time, exposed DP sync, optimizer step, memory), and nothing else does
(search/dualpipe_pairs.py: exact per pair, for every (a, b) and group). A plan's step is
`compose` of the p ranks' values, and its fits is every rank's fits. A split is (a_0..a_{h-1},
b_{h-1}..b_0), h = p/2; its class is its pair sums s_i = a_i + b_i (Σ s_i = L).

Bounds: for a class s, a placement q and a recompute count r, take per pair i and side the
least time, exposed sync and optimizer step over the pair's (a, s_i - a) whose two ranks fit
on (q_i, q_{p-1-i}); `compose` of those is <= the step of every fitting member of the class
at (q, r): the step m·T + rho·(S - T) + max exposed + max o = (m - rho)·T + rho·S + ... grows
with every rank's time (0 <= rho < 1 <= m), exposed sync and step, and each rank's entry is
>= its pair's least. Floats: the bound and a member's step add and compare the same kind of
entries, so they differ by rounding only; the stopping test keeps dualpipe_splits.py's
REL_TOL. The class's bound is its least over (q, r) (inf where no pair fits), a key's classes
are ordered by (bound, s), vectorised over every class (listed), or by (bound, then the
frontier's order) best-first.

Exact best of a class at (q, r) (`_open`): members differ only in each pair's choice; two
choices of a pair with bit-identical (rank values, [max(a, b) > r]) give every member the
same floats and the same validity, so per pair only the least a of each distinct value row
is kept (the enumerator's order, `Plan.key()`, compares stage_layers lexicographically:
(a_0, .., a_{h-1}) decides it within a class, the least a_i per pair independently, and the
uniform split, whose canonical stage_layers is None, first), and every product of kept rows
is composed exactly: bit for bit the cost model's step (dualpipe_pairs.py `compose`; a
recompute count r needs some stage > r, model_scan.py `recompute_valid`). Within float
rounding the members of a class tie (their per-micro-batch times are the means of the same
pair sums), so the kept rows are few: llama3-70b at pp 8 has 3 distinct steps among a class's
361 members (a pair's kept rows depend on its own sum only: cached per (pair, sum, q, r)).
The splits reaching the least step over (q, r) are scored by the cost model
(`best_of_split`, the enumerator's own scan), which picks among (r, split, q) by `Plan.key()`;
a class whose exact least step is above the best so far (bit for bit: `_least` composes the
cost model's floats), or equal with every split reaching it after the best's in
`Plan.key()` (`_cannot_win`), cannot change the answer and is not scored.

Exactness (`solve_by_class`): open the classes in bound order, keeping the least (step,
`Plan.key()`), until the next bound exceeds the best (or the caller's cutoff) by more than
REL_TOL: every class left has every member >= bound > best (best-first: the frontier's
least priority bounds every class not yet yielded). So the result is the family's
exact best as the enumerator finds it (tests/search/test_dualpipe_classes.py: hypothesis,
one and two node groups, against the enumerator, and llama3-70b at pp 4 against every class
scored). Each opened class charges the search's `limits.Budget` one
`limits.MODEL_PLAN_DTIME` per (placement, recompute) opened, and each plan the cost model
scores one more (the frontier `NODE_DTIME` per node expanded); out of budget, the best so
far is returned unproven with its gap to the next bound (the frontier's least priority) as
error bound.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from autoparallel_cp.search import limits
from autoparallel_cp.search.dualpipe_frontier import Frontier
from autoparallel_cp.search.dualpipe_pairs import (
    F64,
    Pair,
    compose,
    compose_terms,
    pair_tables,
    probe_plan,
    step_consts,
)
from autoparallel_cp.search.enumerate_axes import placement_array, recompute_values
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.model_scan import best_of_split
from autoparallel_cp.search.replay_axis import class_listed
from autoparallel_cp.search.space import Degrees
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan, canonical

REL_TOL = 1e-9  # dualpipe_splits.py's


def class_array(L: int, h: int, lo_first: int) -> npt.NDArray[np.int64]:
    """Every class (K, h): pair sums >= (lo_first, 2, .., 2) summing to L, lexicographic."""
    free = L - lo_first - 2 * (h - 1)
    if free < 0:
        return np.zeros((0, h), np.int64)
    if h == 1:
        return np.array([[L]], np.int64)
    n = math.comb(free + h - 1, h - 1)
    cuts = np.fromiter(itertools.chain.from_iterable(
        itertools.combinations(range(free + h - 1), h - 1)), np.int64, n * (h - 1)).reshape(
        n, h - 1)
    edges = np.concatenate([np.full((n, 1), -1), cuts, np.full((n, 1), free + h - 1)], axis=1)
    out = np.diff(edges, axis=1) - 1
    out[:, 0] += lo_first
    out[:, 1:] += 2
    return out


class _Key:
    """One key's tables: every recompute count's pair tables, the per-(pair, groups, r)
    least entries per pair sum, the classes and their bounds in order."""

    def __init__(self, t: Any, key: Any) -> None:
        space = t.space
        self.t, self.key, p = t, key, key.pp
        self.h, L = p // 2, space.num_layers
        d = Degrees(key.tp, p, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
        self.places, self.place_objs = placement_array(space, t, d)
        mode = RECOMPUTE_MODES[key.mode]
        self.rls = recompute_values(space, mode, L)
        self.rf = space.fixed.get("recompute_layers")
        lo0 = space.first_stage_min_units(1)
        groups = sorted({int(g) for g in self.places.reshape(-1)})
        self.tables = {r: pair_tables(t, key, r, groups, lo0) for r in self.rls}
        self.consts = {r: step_consts(t, key, r) for r in self.rls}
        self.mins: dict[tuple[Any, ...], Any] = {}  # `least`'s and `_rows`' cache
        self.frontier: Frontier | None = None
        if not class_listed(space, p):  # too many to list: best-first (dualpipe_frontier.py)
            self.frontier = Frontier(self)
            return
        self.classes = class_array(L, self.h, lo0 + 1)
        b = np.full(len(self.classes), math.inf)
        for r in self.rls:
            for q in range(len(self.places)):
                b = np.minimum(b, self.bound(self.classes, q, r))
        order = np.lexsort(tuple(self.classes[:, i] for i in range(self.h - 1, -1, -1))
                           + (b,))
        self.order, self.bounds = order, b[order]

    def at(self, n: int, budget: Budget, stop: float
           ) -> tuple[npt.NDArray[np.int64], float] | float | None:
        """The n-th class in bound order and its bound (None: no more; a float: out of budget
        or above `stop`, a lower bound of every class from the n-th on)."""
        if self.frontier is not None:
            return self.frontier.at(n, budget, stop)
        if n >= len(self.order):
            return None
        return self.classes[self.order[n]], float(self.bounds[n])

    def feasible(self, pr: Pair, i: int, q: int, r: int | None) -> npt.NDArray[np.bool_]:
        """Pair i's candidates whose two ranks fit on placement q's groups (and, with a
        pinned count rf and r None, whose stages hold <= rf: `recompute_valid`)."""
        row = self.places[q]
        ok = pr.lo[int(row[i])].fits & pr.hi[int(row[self.key.pp - 1 - i])].fits
        if r is None and self.rf is not None:
            ok = ok & (np.maximum(pr.a, pr.b) <= int(self.rf))
        return ok

    def least(self, i: int, q: int, r: int | None) -> F64:
        """(L + 1, 6): per pair sum, the least (time, exposed, step) of rank i and of rank
        p-1-i over pair i's fitting candidates at (q, r) (inf: none)."""
        row = self.places[q]
        k = (i, int(row[i]), int(row[self.key.pp - 1 - i]), r)
        if k not in self.mins:
            pr = self.tables[r][i]
            ok = self.feasible(pr, i, q, r)
            lo, hi = pr.lo[k[1]], pr.hi[k[2]]
            vals = np.stack([lo.tot, lo.exp, lo.opt, hi.tot, hi.exp, hi.opt], axis=1)[ok]
            out = np.full((self.t.space.num_layers + 1, 6), math.inf)
            np.minimum.at(out, (pr.a + pr.b)[ok], vals)
            self.mins[k] = out
        return self.mins[k]

    def bound(self, cls: npt.NDArray[np.int64], q: int, r: int | None) -> F64:
        """The module docstring's bound of every class row of `cls` at (q, r)."""
        p = self.key.pp
        cols: list[F64 | None] = [None] * (3 * p)
        bad = np.zeros(len(cls), bool)
        for i in range(self.h):
            v = self.least(i, q, r)[cls[:, i]]
            bad |= ~np.isfinite(v[:, 0])
            for c in range(3):
                cols[3 * i + c] = v[:, c]
                cols[3 * (p - 1 - i) + c] = v[:, 3 + c]
        safe = [np.where(bad, 0.0, x) for x in cols if x is not None]
        val = compose(self.consts[r], safe[0::3], safe[1::3], safe[2::3])
        return np.where(bad, math.inf, val)

    def open(self, s: npt.NDArray[np.int64], cut: float | None
             ) -> list[tuple[float, tuple[int, ...]]]:
        """Each (q, r) whose bound of class s is within the cut: its exact least step and the
        least split reaching it (module docstring)."""
        out = []
        for r in self.rls:
            for q in range(len(self.places)):
                b = float(self.bound(s[None, :], q, r)[0])
                if not math.isfinite(b) or (cut is not None and b > cut * (1.0 + REL_TOL)):
                    continue
                got = self._open(s, q, r)
                if got is not None:
                    out.append(got)
        return out

    def _open(self, s: npt.NDArray[np.int64], q: int, r: int | None
              ) -> tuple[float, tuple[int, ...]] | None:
        kept: list[tuple[npt.NDArray[np.int64], F64, npt.NDArray[np.bool_]]] = []
        uni: list[tuple[npt.NDArray[np.int64], F64, npt.NDArray[np.bool_]]] = []
        for i in range(self.h):
            rows = self._rows(i, int(s[i]), q, r)
            if rows is None:
                return None
            kept.append(rows[0])
            if rows[1] is not None:
                uni.append(rows[1])
        got = self._least(kept, r)
        if got is None:
            return None
        best, a = got
        if len(uni) == self.h:
            one = self._least(uni, r)
            if one is not None and one[0] == best:
                a = one[1]
        a0 = a[np.lexsort(tuple(a[:, i] for i in range(self.h - 1, -1, -1)))[0]]
        split = [int(x) for x in a0] + [int(s[i] - a0[i]) for i in range(self.h - 1, -1, -1)]
        return best, tuple(split)

    def _rows(self, i: int, si: int, q: int, r: int | None) -> Any:
        """Pair i's kept rows at sum si and (q, r) (the least a of each distinct value row)
        and the uniform split's row (None: not a candidate); None: no candidate fits.
        Cached: they do not depend on the other pairs."""
        ck = ("rows", i, si, q, r)
        if ck not in self.mins:
            p, row, L = self.key.pp, self.places[q], self.t.space.num_layers
            pr = self.tables[r][i]
            idx = np.nonzero(self.feasible(pr, i, q, r) & (pr.a + pr.b == si))[0]
            if len(idx) == 0:
                self.mins[ck] = None
                return None
            lo, hi = pr.lo[int(row[i])], pr.hi[int(row[p - 1 - i])]
            big = (np.maximum(pr.a[idx], pr.b[idx]) > r) if r is not None else \
                np.zeros(len(idx), bool)
            vals = np.stack([lo.tot[idx], lo.exp[idx], lo.opt[idx], hi.tot[idx],
                             hi.exp[idx], hi.opt[idx], big.astype(float)], axis=1)
            _, first = np.unique(vals, axis=0, return_index=True)
            first = np.sort(first)  # candidates come a ascending: the least a of each row
            u = np.nonzero((pr.a[idx] == L // p) & (pr.b[idx] == L // p))[0]
            one = (pr.a[idx][u], vals[u], big[u]) if L % p == 0 and len(u) else None
            self.mins[ck] = ((pr.a[idx][first], vals[first], big[first]), one)
        return self.mins[ck]

    def _least(self, kept: list[tuple[npt.NDArray[np.int64], F64, npt.NDArray[np.bool_]]],
               r: int | None) -> tuple[float, npt.NDArray[np.int64]] | None:
        """The least step over every product of the pairs' kept rows (a recompute count r
        valid where some stage holds > r), and the rows' a reaching it (M, h)."""
        h = self.h
        shape = [len(k[0]) for k in kept]

        def along(i: int, x: F64 | npt.NDArray[np.bool_]) -> Any:
            """x (pair i's kept rows) broadcast along axis i of the product."""
            return x.reshape([-1 if j == i else 1 for j in range(h)])

        # the ranks' time summed in rank order (lo of pairs 0..h-1, then hi of h-1..0): the
        # same float additions as `compose`'s, one axis per pair; the maxima are exact
        total: Any = along(0, kept[0][1][:, 0])
        for i in range(1, h):
            total = total + along(i, kept[i][1][:, 0])
        for i in range(h - 1, -1, -1):
            total = total + along(i, kept[i][1][:, 3])
        tmax, dp, op = (np.full(shape, -math.inf) for _ in range(3))
        valid = np.full(shape, r is None)
        for i, (_, vals, big) in enumerate(kept):
            tmax = np.maximum(tmax, along(i, np.maximum(vals[:, 0], vals[:, 3])))
            dp = np.maximum(dp, along(i, np.maximum(vals[:, 1], vals[:, 4])))
            op = np.maximum(op, along(i, np.maximum(vals[:, 2], vals[:, 5])))
            if r is not None:
                valid = valid | along(i, big)
        step = np.where(valid, compose_terms(self.consts[r], tmax, total, dp, op), math.inf)
        best = float(np.min(step))
        if not math.isfinite(best):
            return None
        at = np.argwhere(step == best)
        return best, np.stack([kept[i][0][at[:, i]] for i in range(h)], axis=1)


def solve_by_class(t: Any, key: Any, *, cutoff_s: float | None, budget: Budget
                   ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """The exact best plan of a DualPipe key's free family by class (module docstring), as
    dualpipe_splits.py `solve_free_dualpipe` returns it: ((step, plan, exact - its class's
    bound, error bound), whether a None answer is proven)."""
    cache: dict[Any, _Key] = t.__dict__.setdefault("_dp_class", {})
    if key not in cache:
        cache[key] = _Key(t, key)
    k = cache[key]
    # class -> (its best over the (placement, recompute) opened, the cutoff it was opened at)
    memo: dict[int, Any] = t.__dict__.setdefault("_dp_class_best", {}).setdefault(key, {})
    cut = cutoff_s if cutoff_s is not None and math.isfinite(cutoff_s) else None
    best: tuple[float, tuple[Any, ...], Plan, float] | None = None
    for n in sorted(memo):  # real plans of the family: incumbents whatever their cutoff
        best, cut = keep_best(best, cut, memo[n][0], memo[n][2])
    err = 0.0
    for n in itertools.count():
        got = k.at(n, budget, math.inf if cut is None else cut * (1.0 + REL_TOL))
        if got is None:
            break
        b = got if isinstance(got, float) else got[1]
        if not math.isfinite(b) or (cut is not None and b > cut * (1.0 + REL_TOL)):
            break
        old = memo.get(n)
        if old is not None and (old[1] is None or (cut is not None and cut <= old[1])):
            continue  # opened at a cutoff at least as wide: kept above
        if isinstance(got, float) or budget.exhausted():
            err = math.inf if best is None else max(best[0] - b, 0.0)
            break
        found = k.open(got[0], cut)
        budget.charge(limits.MODEL_PLAN_DTIME * max(len(found), 1))
        if best is not None and found and _cannot_win(t, key, found, best[:2]):
            memo[n] = (None, cut, b)  # its exact best (bit for bit) after the best: unscored
        else:
            memo[n] = (_score(t, key, found, cut, budget), cut, b)
        best, cut = keep_best(best, cut, memo[n][0], b)
    if best is None or (cutoff_s is not None and best[0] > cutoff_s):
        return None, err == 0.0
    step, _, plan, diff = best
    ans = (step, canonical(plan, t.space.num_layers), diff, 0.0 if err == 0.0 else err)
    return ans, False


def _cannot_win(t: Any, key: Any, found: list[tuple[float, tuple[int, ...]]],
                best: tuple[float, tuple[Any, ...]]) -> bool:
    """Whether a class's plans all come after `best` (step, `Plan.key()`): its exact least
    step above the best's, or equal and, the best's recompute count 0 or None, every split
    reaching it after the best's split in `Plan.key()` (the key's fields before them are the
    key's own; recompute_layers or 0 >= 0; stage_layers canonical, as `best_of_split` names
    them)."""
    least = min(x for x, _ in found)
    if least != best[0]:
        return least > best[0]
    if best[1][10] != 0:
        return False
    probe = probe_plan(t, key, None)
    L = t.space.num_layers
    return all((canonical(probe.model_copy(update={"stage_layers": sp}), L).stage_layers
                or ()) > best[1][11] for x, sp in found if x == least)


def _score(t: Any, key: Any, found: list[tuple[float, tuple[int, ...]]], cut: float | None,
           budget: Budget) -> tuple[float, Plan] | None:
    """The cost model's best of the splits reaching the class's least step over the
    (placement, recompute) opened (`best_of_split`: the enumerator's scan, its `Plan.key()`
    order over recompute, split and placement; a pair left unopened, bound above `cut`,
    may give such a split a step below that least, never one within the cut)."""
    if not found:
        return None
    least = min(x for x, _ in found)
    got: tuple[float, Plan] | None = None
    for sp in sorted({s for x, s in found if x == least}):
        n0 = len(t.__dict__.get("_model_terms", {}))
        one = best_of_split(t, key, sp)
        budget.charge(limits.MODEL_PLAN_DTIME * (len(t.__dict__.get("_model_terms", {})) - n0))
        wide = cut is not None and one is not None and one[0] > cut * (1.0 + REL_TOL)
        if one is None or (one[0] != least and not wide):
            raise RuntimeError(f"dualpipe_classes: split {sp} of key {key} composes to "
                               f"{least!r}, the cost model says {one!r}")
        if got is None or (one[0], one[1].key()) < (got[0], got[1].key()):
            got = one
    return got


def keep_best(best: tuple[float, tuple[Any, ...], Plan, float] | None, cut: float | None,
              got: tuple[float, Plan] | None, bound_s: float
              ) -> tuple[tuple[float, tuple[Any, ...], Plan, float] | None, float | None]:
    """The least (step, `Plan.key()`) of `best` and a scored class's or split's `got` (None:
    nothing of it fits), with its exact - bound (`bound_s`), and the cutoff lowered to it
    (dualpipe_splits.py scores split by split with the same rule)."""
    if got is None:
        return best, cut
    cand = (got[0], got[1].key())
    if best is None or cand < best[:2]:
        best = (*cand, got[1], got[0] - bound_s)
    return best, got[0] if cut is None else min(cut, got[0])
