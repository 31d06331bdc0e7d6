"""DualPipe's pair-sum classes in bound order without listing them (issue 31, "one space"):
a best-first branch and bound over the pairs, for pp 16 (replay_axis.py
`DUALPIPE_FRONTIER_PP`) where a key's classes number ~1e8 (61 layers, DeepSeek-V3) to ~1e9
(80 layers) and search/dualpipe_classes.py cannot list and bound every class vector.

The classes and their bounds are dualpipe_classes.py's: class s = (s_0..s_{h-1}), pair sums
summing to L; its bound min over (placement q, recompute r) of `compose` of the per-pair,
per-side least (time, exposed sync, optimizer step) at s_i (`_Key.least`, `_Key.bound`).
`compose` is m·T + rho·(S - T) + E + O = (m - rho)·T + rho·S + E + O with T = max of the
ranks' times, S their sum, E, O the max exposed sync and optimizer step, 0 <= rho < 1 <= m:
nondecreasing in each of T, S, E, O.

A node is a prefix (s_0..s_{k-1}) with R = L - Σ s_i layers left for pairs k..h-1. Its
priority, at each (q, r), is compose's (m - rho)·T + rho·S + E + O of
  T = max(the prefix's ranks' least times, MT[k][R]),  S = the prefix's sum + SS[k][R],
  E, O likewise with ME[k][R], MO[k][R],
where, over every completion (s_k..s_{h-1}) summing to R whose pairs have a fitting entry,
MT[k][R] is the least max of the pairs' least rank times (a min-max DP over the pairs),
SS[k][R] the least sum of the pairs' least rank-time sums (a min-sum DP), ME, MO as MT (inf:
no completion). Each is <= the same term of every completion's class bound (each completion's
max / sum is one of the values the DP minimises over), so the priority, the least over (q, r),
is <= the bound of every class below the node (compose being nondecreasing in each term;
floats: the same entries added in other orders, within rounding, which the stopping test's
REL_TOL covers). A complete prefix (k = h, R = 0) is pushed back with its class's own bound
(`_Key.bound`, bit for bit the listed search's). So popping the heap in (priority, complete
first, prefix) order yields every class in nondecreasing bound order (within rounding), each
once, and the heap's least priority bounds every class not yet yielded: what
dualpipe_classes.py `solve_by_class` needs to open classes in bound order and stop, exactly
as over a listed order (its proof), or, out of budget, to bound what is left.

Work: each node popped costs one vectorised expansion over its children's sums and the
(q, r); charged to the search's `limits.Budget` as `NODE_DTIME` each. DeepSeek-V3 at pp 16
(tp 1, ep 64): 1 class yielded, 0.03 s; llama3-70b at pp 16: up to 792 classes (tied within
rounding, each opened), 1-2 s a key (benchmarks/RESULTS.md, task dp16). Deterministic: the
heap's order is (priority, complete first, prefix), no clock.
Tests: tests/search/test_dualpipe_frontier.py (the listed classes and bounds, bit for bit, in
nondecreasing order; each node's priority below its classes; the enumerator; the listed
search on llama3-70b at pp 4 and 8 and DeepSeek-V3 at pp 8).
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from autoparallel_cp.search.limits import DTIME_PER_SECOND, Budget

F64 = npt.NDArray[np.float64]

#: Deterministic seconds charged per node expanded (about 40 us of CPU each).
NODE_DTIME = DTIME_PER_SECOND * 40e-6

Node = tuple[float, int, tuple[int, ...], int, F64]


class Frontier:
    """The lazy bound order of one key's classes (module docstring): `at(n)` is the n-th
    class and its bound, the ones yielded so far kept for later calls at other cutoffs."""

    def __init__(self, key: Any) -> None:
        self.k = key
        self.h, self.L = key.h, key.t.space.num_layers
        self.combos = [(q, r) for r in key.rls for q in range(len(key.places))]
        # compose's (m - rho, rho) per combo
        self.a = np.array([[key.consts[r][0] - key.consts[r][1]] for _, r in self.combos])
        self.b = np.array([[key.consts[r][1]] for _, r in self.combos])
        C, h, n = len(self.combos), self.h, self.L + 1
        # per combo, pair and sum: least max of the two ranks' time, their sum, exposed, step
        self.pair = np.full((4, C, h, n), math.inf)
        for c, (q, r) in enumerate(self.combos):
            for i in range(h):
                v = key.least(i, q, r)
                self.pair[0, c, i] = np.maximum(v[:, 0], v[:, 3])
                self.pair[1, c, i] = v[:, 0] + v[:, 3]
                self.pair[2, c, i] = np.maximum(v[:, 1], v[:, 4])
                self.pair[3, c, i] = np.maximum(v[:, 2], v[:, 5])
        self.suffix = self._suffix()
        self.items: list[tuple[npt.NDArray[np.int64], float]] = []
        start = np.stack([np.full(C, -math.inf), np.zeros(C), np.full(C, -math.inf),
                          np.full(C, -math.inf)])
        self.heap: list[Node] = []
        self._push(0, (), self.L, start)

    def _suffix(self) -> F64:
        """(4, C, h + 1, L + 1): MT, SS, ME, MO of the module docstring for pairs k.. and R
        layers left (inf: no completion)."""
        C, h, n = len(self.combos), self.h, self.L + 1
        out = np.full((4, C, h + 1, n), math.inf)
        out[[0, 2, 3], :, h, 0] = -math.inf
        out[1, :, h, 0] = 0.0
        R = np.arange(n)
        x = R[:, None] - R[None, :]  # [R, s]: layers left after pair k takes s
        ok = x >= 0
        xs = np.where(ok, x, 0)
        for k in range(h - 1, -1, -1):
            for t in range(4):
                nxt = np.where(ok[None], out[t, :, k + 1][:, xs], math.inf)  # (C, R, s)
                own = self.pair[t, :, k][:, None, :]
                got = own + nxt if t == 1 else np.maximum(own, nxt)
                got = np.where((own < math.inf) & (nxt < math.inf), got, math.inf)
                out[t, :, k] = got.min(axis=2)
        return out

    def _prio(self, k: int, R: npt.NDArray[np.int64], acc: F64) -> F64:
        """(len(R),): the least over the combos of the priority of children at depth k with
        R layers left and fixed terms `acc` (4, C, len(R))."""
        suf = self.suffix[:, :, k][:, :, R]  # (4, C, len(R))
        tmax, total = np.maximum(acc[0], suf[0]), acc[1] + suf[1]
        exp, opt = np.maximum(acc[2], suf[2]), np.maximum(acc[3], suf[3])
        ok = np.all(np.stack([tmax, total, exp, opt]) < math.inf, axis=0)
        with np.errstate(invalid="ignore"):
            val = np.where(ok, self.a * tmax + self.b * total + exp + opt, math.inf)
        return np.asarray(val.min(axis=0), float)

    def _push(self, k: int, s: tuple[int, ...], R: int, acc: F64) -> None:
        """Push the node (s, R) at depth k (its own priority)."""
        p = float(self._prio(k, np.array([R]), acc[:, :, None])[0])
        if math.isfinite(p):
            heapq.heappush(self.heap, (p, 1, s, R, acc))

    def _expand(self, s: tuple[int, ...], R: int, acc: F64) -> None:
        """Push every child of node s: pair k = len(s) taking x layers, x in 0..R."""
        k = len(s)
        xs = np.arange(R + 1) if k < self.h - 1 else np.array([R])
        own = self.pair[:, :, k][:, :, xs]  # (4, C, X)
        ch = np.stack([np.maximum(acc[0][:, None], own[0]), acc[1][:, None] + own[1],
                       np.maximum(acc[2][:, None], own[2]),
                       np.maximum(acc[3][:, None], own[3])])
        live = np.asarray(np.isfinite(own).all(axis=0).any(axis=0), bool)
        if k == self.h - 1:
            if live[0]:
                row = np.array(s + (R,), np.int64)
                b = min(float(self.k.bound(row[None, :], q, r)[0]) for q, r in self.combos)
                if math.isfinite(b):
                    heapq.heappush(self.heap, (b, 0, s + (R,), 0, ch[:, :, 0]))
            return
        pr = self._prio(k + 1, R - xs, ch)
        for j in np.nonzero(live & np.isfinite(pr))[0]:
            heapq.heappush(self.heap, (float(pr[j]), 1, s + (int(xs[j]),), int(R - xs[j]),
                                       ch[:, :, j]))

    def at(self, n: int, budget: Budget, stop: float
           ) -> tuple[npt.NDArray[np.int64], float] | float | None:
        """The n-th class in bound order and its bound; None past the last class; out of
        budget, or once the least priority left is above `stop`, a float: a lower bound of
        every class from the n-th on."""
        while len(self.items) <= n:
            if not self.heap:
                return None
            if self.heap[0][0] > stop or budget.exhausted():
                return self.heap[0][0]
            p, done, s, R, acc = heapq.heappop(self.heap)
            if done == 0:
                self.items.append((np.array(s, np.int64), p))
                continue
            budget.charge(NODE_DTIME)
            self._expand(s, R, acc)
        return self.items[n]
