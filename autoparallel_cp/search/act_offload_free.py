"""Free per-stage layer counts under a pinned activation offload (issue 31, "one space"): the
scored pp > 1 parts (search/act_offload.py `scored`) under 1F1B, interleaved, GPipe and ZB-H1 /
ZB-H2 on one node group or several (`act_offload.free_at`), searched exactly: a per-key CP-SAT model
whose objective is a proven lower bound of every free split's exact step time, and the exact
loop of cpsat_replay.py `solve_free` that scores the model's candidates with the cost model.

The family: per-stage counts l_j, multiples of vpp (equal chunks), each >= k (evaluate needs
every stage to hold >= k layers, spec/schedules.py `offload_violations`), the first also >=
the dense prefix (`act_offload.stage_min`), summing to L. The cost model scores each of their
plans (model_scan.py `best_of_split`: every recompute count of the key's mode, `plan_terms`,
which is steptime.py / memory.py themselves), so the enumerator (search/enumerate.py, via
`best_of_key` over `partition_array`'s rows, those with a stage < k skipped) and the solver
score the same plans the same way.

The model (`build`): integer units u_j with l_j = vpp·u_j, l_j >= the minima, Σ l_j = L; per
stage j and per quantity x of search/act_offload_bound.py's `StageCoefs` (the stage time, the
DP sync, the optimizer step), the floored linear form

    x_j = floor(main/q)·(l_j - k_j) + floor(dense/q)·k_j + floor(emb/q)·[j = 0]
          + floor(head/q)·[j = p - 1] + floor(fixed/q)

(k_0 = K the dense prefix, l_0 >= K; k_j = 0 else; q the unit: the largest entry over 2^30),
T >= c_j, D >= d_j, O >= o_j, S = Σ_j c_j, and the objective A·T + B·S + C·D + W·O with
A = floor((m - rho'/vpp)·W), B = floor(rho'/vpp·W), C = floor(tail·W), W = 1024, in units
q/W. No memory condition (a relaxation: the exact loop checks each candidate's fit).
Several node groups: the placement is a decision (`placement_vars`:
y_jg one-hot, group g holding its count of stages, exactly `placement_array`'s rows, and
z_jg = l_j·y_jg), and x_j = Σ_g floor(main_g/q)·z_jg + ((floor(dense_g/q) -
floor(main_g/q))·k_j + floor(emb_g/q)·[j = 0] + floor(head_g/q)·[j = p - 1] +
floor(fixed_g/q))·y_jg: at a placement it is the form above with stage j's own group's
entries (one placement: constants, the one-group model); q from the largest over the groups.

Lower bound (every plan of every free split of the key, any recompute count): act_offload_
bound.py's docstring proves, for each split, step >= (m - rho'/vpp)·max_j c_j + (rho'/vpp)·
Σ_j c_j + tail·max_j d_j + max_j o_j = `StageCoefs.value` (the copies, p2p, ZeRO-3 and a
partial count's replays are >= 0 and dropped; rho' <= rho the family's least; exposed DP
>= tail·d_j). Each floored coefficient times a count >= 0 is <= the exact term over q, so
every model quantity times q is <= its exact value; T, D, O take at least the max of their
stages (any larger value only raises the objective, A, C, W >= 0) and A/W, B/W, C/W <= their
coefficients, all >= 0 (m >= 1 >= rho'/vpp). So objective·q/W <= `StageCoefs.value(split)` <=
the exact step of every plan of the split; on several groups, at each placement, with the
placement's per-stage entries (act_offload_bound.py `placed`), so the model's least over
the placements is <= every (split, placement)'s exact step.

Exactness (`solve_free_offload`): take the model's least split, score it exactly
(`best_of_split`, memoized per key: each plan charges `limits.MODEL_PLAN_DTIME`), forbid it,
add objective <= the best exact time so far (+1 unit: an exact tie stays in), repeat until
CP-SAT proves nothing is left (`best_of_split` scores a split over every placement, so
forbidding the split drops none unscored). Every split whose exact time is <= the returned one
has then been scored (its objective is below it), so the result is the family's exact best,
ties to the least (step, `Plan.key()`) (the enumerator's order, model_scan.py). If the search's
budget or `ROUNDS_MAX` runs out, the best so far is returned unproven with its gap to the
model's bound as error bound. The key's own bound (key_bounds.py `key_bound`) over this family
is the least over the placements of `StageCoefs.free_value` (each term's least over the splits,
real-valued): <= the least `StageCoefs.value` over the free splits at that placement, so <=
every plan of the family. tests/search/test_act_offload_multi.py checks both on two groups.
"""

from __future__ import annotations

import math
from typing import Any

from ortools.sat.python import cp_model

from autoparallel_cp.search import limits
from autoparallel_cp.search.act_offload import stage_min
from autoparallel_cp.search.act_offload_bound import stage_coefs
from autoparallel_cp.search.enumerate_axes import placement_array
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.model_scan import best_of_split
from autoparallel_cp.search.space import Degrees
from autoparallel_cp.search.tables import Tables
from autoparallel_cp.spec.plan import Plan, canonical

#: Most rounds (model solves) of one key's exact loop before it returns unproven
ROUNDS_MAX = 200
#: Fixed-point weight of the objective's coefficients
W = 1024
#: Units per stage-entry bound (q = the largest stage entry / TIME_UNITS)
TIME_UNITS = 1 << 20


class OffloadModel:
    """One key's model (module docstring): the layer counts, the objective and its unit, and
    the placement (`groups[j][g]`: stage j on group g, 1 / 0 where the key has one)."""

    def __init__(self, model: cp_model.CpModel, layers: list[Any], objective: Any,
                 scale_s: float, groups: list[dict[int, Any]]) -> None:
        self.model, self.layers, self.objective, self.scale_s = model, layers, objective, scale_s
        self.groups = groups

    def forbid(self, split: tuple[int, ...]) -> None:
        """No-good on one split."""
        alts = []
        for x, v in zip(self.layers, split, strict=True):
            b = self.model.new_bool_var("")
            self.model.add(x != v).only_enforce_if(b)
            alts.append(b)
        self.model.add_bool_or(alts)


def build(t: Tables, key: Any) -> OffloadModel | None:
    """The module docstring's model of `key` on tables `t` (one variant; one node group, or
    several with the stage placement a decision); None when no split holds every stage's
    minimum or the key has no placement."""
    space = t.space
    p, vpp, L = key.pp, key.vpp, space.num_layers
    lo, lo0 = stage_min(space, vpp)
    if p < 2 or L % vpp or lo0 + (p - 1) * lo > L:
        return None
    d = Degrees(key.tp, p, key.cp, key.dp, key.ep, vpp, key.mbs, key.m)
    places, _ = placement_array(space, t, d)
    if len(places) == 0:
        return None
    G = sorted({int(g) for g in places.reshape(-1)})
    scs = {g: stage_coefs(t, key, g) for g in G}  # each group's own entries
    sc = scs[G[0]]  # a, b, tail and the dense prefix: the same on every group
    K = sc.dense
    bt = max(max(max(abs(e[0]), abs(e[1])) * L + sum(abs(x) for x in e[2:])
                 for e in (c.time, c.dsync, c.opt)) for c in scs.values())
    q = max(bt, 1e-30) / TIME_UNITS  # every stage entry within 2^30 units: objective < 2^62

    def fl(x: float) -> int:
        return int(math.floor(x / q))

    m = cp_model.CpModel()
    ls = []
    for j in range(p):
        u = m.new_int_var((lo0 if j == 0 else lo) // vpp, L // vpp, f"u{j}")
        ls.append(vpp * u)
    m.add(sum(ls) == L)
    y, z = placement_vars(m, ls, places, G, L)

    def stages(which: int) -> list[Any]:
        """Stage j's entry on its group: Σ_g main_g·z_jg + (dense_g - main_g)·k_j·y_jg +
        the edges' and the fixed term's y_jg (one placement: constants)."""
        out = []
        for j in range(p):
            x: Any = 0
            for g in G:
                e = (scs[g].time, scs[g].dsync, scs[g].opt)[which]
                w = ((fl(e[1]) - fl(e[0])) * K + fl(e[2]) if j == 0 else 0) + (
                    fl(e[3]) if j == p - 1 else 0) + fl(e[4])
                x = x + fl(e[0]) * z[j][g] + w * y[j][g]
            out.append(x)
        return out

    def top(vals: list[Any], name: str) -> Any:
        v = m.new_int_var(-4 * TIME_UNITS, 4 * TIME_UNITS, name)
        for x in vals:
            m.add(v >= x)
        return v

    cst = stages(0)
    T, D, Op = top(cst, "T"), top(stages(1), "D"), top(stages(2), "O")
    a, b, c = (int(math.floor(x * W)) for x in (sc.a, sc.b, sc.tail))
    obj = a * T + b * sum(cst) + c * D + W * Op
    m.minimize(obj)
    return OffloadModel(m, ls, obj, q / W, y)


def solve_free_offload(t: Tables, key: Any, *, seed: int, workers: int,
                       cutoff_s: float | None, budget: Budget
                       ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """The exact best plan of a pinned offload's free family (module docstring), as
    cpsat_partition's `_solve_family` returns it: ((step, plan, exact - model objective,
    error bound), whether a None answer is proven). None, proven, when no plan fits with an
    exact step time <= `cutoff_s`."""
    om = build(t, key)
    if om is None:
        return None, True
    cut = cutoff_s if cutoff_s is not None and math.isfinite(cutoff_s) else None
    best: tuple[float, tuple[Any, ...], Plan, float] | None = None
    lb = 0.0
    memo: dict[tuple[int, ...], Any] = t.__dict__.setdefault("_aoff_split", {}).setdefault(
        key, {})
    for _ in range(ROUNDS_MAX):
        if cut is not None:  # one unit more: an exact tie is still found (the least wins)
            om.model.add(om.objective <= int(math.floor(cut / om.scale_s)) + 1)
        if budget.exhausted():
            break
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = workers
        solver.parameters.random_seed = seed
        st = budget.solve(solver, om.model)
        if st == cp_model.INFEASIBLE:
            return _answer(best, cutoff_s, 0.0, t.space.num_layers)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        lb = max(lb, solver.best_objective_bound * om.scale_s)
        split = tuple(int(solver.value(x)) for x in om.layers)
        if split not in memo:
            n0 = len(t.__dict__.get("_model_terms", {}))
            memo[split] = best_of_split(t, key, split)
            budget.charge(limits.MODEL_PLAN_DTIME * (len(t.__dict__.get("_model_terms", {})) - n0))
        got = memo[split]
        if got is not None:
            cand = (got[0], got[1].key())
            if best is None or cand < best[:2]:
                best = (*cand, got[1], 0.0)
            cut = got[0] if cut is None else min(cut, got[0])
        om.forbid(split)
    ans = _answer(best, cutoff_s, None if best is None else max(best[0] - lb, 0.0),
                  t.space.num_layers)
    return ans[0], False


def _answer(best: tuple[float, tuple[Any, ...], Plan, float] | None, cutoff_s: float | None,
            err: float | None, num_layers: int
            ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """`solve_free_offload`'s answer: None (proven when `err` is 0: the loop proved it)
    when none fits or the best is above the cutoff."""
    if best is None or (cutoff_s is not None and best[0] > cutoff_s):
        return None, err == 0.0
    step, _, plan, _ = best
    # the plan is scored exactly: no model error once proven (`err` 0), else the gap to the
    # model's least bound (as a pinned split's scan, cpsat_partition.py `_score_determined`)
    return (step, canonical(plan, num_layers), err or 0.0, err or 0.0), False


def placement_vars(m: cp_model.CpModel, ls: list[Any], places: Any, G: list[int], L: int
            ) -> tuple[list[dict[int, Any]], list[dict[int, Any]]]:
    """The stage placement: y[j][g] (1 when stage j sits on group g) and z[j][g] = y·l_j.
    One placement (one node group, or `stage_groups` pinned): constants (z the count
    itself). Several (`placement_array`'s rows: every order of the groups' stage counts):
    one-hot selectors, each group holding its count of stages, and z_jg = l_j where
    y_jg, else 0 (cpsat_partition.py's selectors)."""
    p = len(ls)
    if len(places) == 1:
        row = [int(g) for g in places[0]]
        return ([{g: int(row[j] == g) for g in G} for j in range(p)],
                [{g: (ls[j] if row[j] == g else 0) for g in G} for j in range(p)])
    counts = {g: int((places[0] == g).sum()) for g in G}
    y = [{g: m.new_bool_var(f"y{j}_{g}") for g in G} for j in range(p)]
    z: list[dict[int, Any]] = []
    for j in range(p):
        m.add_exactly_one(y[j].values())
        zj = {}
        for g in G:
            v = m.new_int_var(0, L, f"z{j}_{g}")
            m.add(v == ls[j]).only_enforce_if(y[j][g])
            m.add(v == 0).only_enforce_if(~y[j][g])
            zj[g] = v
        m.add(sum(zj.values()) == ls[j])
        z.append(zj)
    for g in G:
        m.add(sum(y[j][g] for j in range(p)) == counts[g])
    return y, z
