"""Free per-stage layer counts under DualPipe (issue 31, "one space"), on one node group,
searched exactly: a per-key CP-SAT model whose objective is a proven lower bound of every
free split's exact step time, and the exact loop of search/cpsat_replay.py `solve_free` that
scores the model's candidates with the cost model.

What evaluate charges a DualPipe plan (cost/steptime.py `_dualpipe_rank`, cost/memory.py;
search/dualpipe_bound.py holds the derivation): rank r runs stage r and its mirror p-1-r, its
per-micro-batch time T_r the mean of the two stage times, its DP sync and optimizer step the
sums; step = (m - rho)·T + rho·S + max_r exposed_r + max_r o_r with T = max_r T_r, S the sum
of the stage times, rho = `bubble_ratio("dualpipe", p, split, m)`; memory per rank: both
stages' states and activations (stage j with `inflight_units` in flight) + constants.

The model (`build`), every number read from the tables through `key_coefs` as
dualpipe_bound.py reads them, on the one node group g (stage j's entries are g's): integer
layer counts l_j >= 1 (stage 0 >= the dense prefix k: `SearchSpace.first_stage_min_units`;
`layer_step` is 1 at vpp 1) summing to L, and per stage

    c_j = floor(u/q)·(l_j - k_j) + floor(u'/q)·k_j + floor(emb/q)·[j = 0] + floor(head/q)·[j = p-1]

(k_0 = k, else 0; u the key's layer time plus the replay where every layer is recomputed,
dualpipe_bound.py's `every`; q the unit). Then T2 >= c_r + c_{p-1-r} for every rank,
S = Σ_j c_j, D >= d_r + d_{p-1-r} (the DP-sync entries, 0 when nothing syncs), O >= o_r +
o_{p-1-r}, the objective a·T2 + b·S + c·D + W·O with a = floor((m - rho)·W/2),
b = floor(rho·W), c = floor(tail_frac·W), W = 1024, in units q/W; and per rank
Σ floor(bytes) <= floor(capacity) with both stages' states and in-flight activations.

Lower bound (every free split of the key, every recompute count and placement): each floored
coefficient is <= its exact entry, and dualpipe_bound.py proves the entries bound the exact
terms (t_j >= c_j·q, the rank tail and optimizer sums, the memory a necessary condition:
work buffers >= 0 dropped), so T2·q <= 2·T at the split (T2 can take the largest pair sum),
S·q <= S_exact, D·q <= max_r (d_r + d_{p-1-r}), and with 0 <= rho < 1 <= m each of a/W <=
(m - rho)/2, b/W <= rho, c/W <= tail_frac: objective·q/W <= the exact step; a split whose
rank exceeds the model's memory bound has no fitting plan. rho is the least over the key's
recompute counts (as dualpipe_bound.py).

Exactness (`solve_free_dualpipe`, cpsat_replay.py's loop): take the model's best split,
score it exactly (model_scan.py `best_of_split`: `plan_terms` over its recompute counts and
placements, the enumerator's scoring, bit for bit), forbid it, add objective <= the best
exact time so far (+1 unit: an exact tie stays in), repeat until CP-SAT proves nothing is
left. Every split whose exact time is <= the returned one has then been scored (the model's
objective bounds it), so the result is the family's exact best, ties to the least
`Plan.key()` (the enumerator's order, model_scan.py). CP-SAT draws on the search's
`limits.Budget`; each plan the cost model scores charges `limits.MODEL_PLAN_DTIME` (as
cpsat_partition.py `_score_determined`). If the budget or `ROUNDS_MAX` runs out, the best so
far is returned unproven, its gap to the model's best bound as error bound.
"""

from __future__ import annotations

import math
from typing import Any

from ortools.sat.python import cp_model

from autoparallel_cp.search import limits
from autoparallel_cp.search.act_offload import act_layers
from autoparallel_cp.search.dualpipe_bound import key_constants
from autoparallel_cp.search.enumerate_axes import placement_array
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.model_scan import best_of_split
from autoparallel_cp.search.replay_axis import DUALPIPE_FREE_MAX
from autoparallel_cp.search.space import Degrees
from autoparallel_cp.search.tables import Tables
from autoparallel_cp.spec.plan import Plan, canonical

#: Most rounds (model solves) of one key's exact loop before it returns unproven: more than
#: the family's splits (replay_axis.py `free_pp_ok`), so the loop always proves
ROUNDS_MAX = DUALPIPE_FREE_MAX + 2
#: Fixed-point weight of the objective's coefficients (m - rho, rho, tail_frac)
W = 1024
#: Units per stage-entry bound (q = the largest stage time, sync or step / TIME_UNITS)
TIME_UNITS = 1 << 30


class DualPipeModel:
    """One key's model (module docstring): the layer counts, the objective and its unit."""

    def __init__(self, model: cp_model.CpModel, layers: list[Any], objective: Any,
                 scale_s: float) -> None:
        self.model, self.layers, self.objective, self.scale_s = model, layers, objective, scale_s

    def forbid(self, split: tuple[int, ...]) -> None:
        """No-good on one split."""
        alts = []
        for x, v in zip(self.layers, split, strict=True):
            b = self.model.new_bool_var("")
            self.model.add(x != v).only_enforce_if(b)
            alts.append(b)
        self.model.add_bool_or(alts)


def build(t: Tables, key: Any) -> DualPipeModel | None:
    """The module docstring's model of `key` on tables `t` (one variant; one node group or
    several, the stage placement then a decision: `_groups`); None when the key has no
    placement."""
    space = t.space
    p, L = key.pp, space.num_layers
    d = Degrees(key.tp, p, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
    places, _ = placement_array(space, t, d)
    if len(places) == 0:
        return None
    G = sorted({int(g) for g in places.reshape(-1)})
    c, every, rho, synced, f = key_constants(t, key)
    k = min(int(t.dense_prefix), L)
    u = {g: c.tau[g] + (c.rho[g] if every else 0.0) for g in G}
    ud = {g: c.tau_d[g] + (c.rho_d[g] if every else 0.0) for g in G}
    bt = max(max(L * max(u[g], ud[g], c.dsync[g], c.dsync_d[g], c.opt[g], c.opt_d[g], 0.0)
                 + max(c.emb_time[g], c.emb_dps[g], c.emb_opt[g], 0.0)
                 + max(c.head_time[g], c.head_dps[g], c.head_opt[g], 0.0)
                 + max(c.dps_fixed[g], 0.0) for g in G), 1e-30)
    q = bt / TIME_UNITS  # every stage entry below 2^30 units: the objective below 2^61

    def fl(x: float) -> int:
        return int(math.floor(x / q))

    m = cp_model.CpModel()
    step = space.layer_step(key.vpp)
    first = space.first_stage_min_units(key.vpp) * step
    ls = [m.new_int_var(first if j == 0 else step, L, f"l{j}") for j in range(p)]
    m.add(sum(ls) == L)
    kj = [k if j == 0 else 0 for j in range(p)]
    y, z = _groups(m, ls, places, G, L)

    def per_stage(main: Any, dense: Any, emb: Any, head: Any, conv: Any,
                  fixed: Any = None) -> list[Any]:
        """Stage j's entry on its group: Σ_g (main_g·z_jg + (dense_g - main_g)·k_j·y_jg +
        the edges' and the fixed term's y_jg), each coefficient `conv` of the group's."""
        out = []
        for j in range(p):
            e: Any = 0
            for g in G:
                w = conv(dense[g]) * kj[j] - conv(main[g]) * kj[j] + (
                    conv(emb[g]) if j == 0 else 0) + (conv(head[g]) if j == p - 1 else 0) + (
                    conv(fixed[g]) if fixed is not None else 0)
                e = e + conv(main[g]) * z[j][g] + w * y[j][g]
            out.append(e)
        return out

    def pair_max(vals: list[Any], hi: int, name: str) -> Any:
        v = m.new_int_var(0, hi, name)
        for r in range(p // 2):
            m.add(v >= vals[r] + vals[p - 1 - r])
        return v

    def hi(main: Any, dense: Any, emb: Any, head: Any, fixed: Any = None) -> int:
        """Twice the largest a stage's entry can be on any group (a pair's sum is <= it)."""
        return 2 * max(max(fl(main[g]), fl(dense[g]), 0) * L + max(fl(emb[g]), 0)
                       + max(fl(head[g]), 0) + (max(fl(fixed[g]), 0) if fixed is not None else 0)
                       for g in G)

    cst = per_stage(u, ud, c.emb_time, c.head_time, fl)
    t2 = pair_max(cst, hi(u, ud, c.emb_time, c.head_time), "T2")
    S = sum(cst)
    if synced:
        ds = per_stage(c.dsync, c.dsync_d, c.emb_dps, c.head_dps, fl, c.dps_fixed)
        dhi = hi(c.dsync, c.dsync_d, c.emb_dps, c.head_dps, c.dps_fixed)
    else:
        ds, dhi = [0] * p, 0
    os_ = per_stage(c.opt, c.opt_d, c.emb_opt, c.head_opt, fl)
    D = pair_max(ds, dhi, "D")
    opt = pair_max(os_, hi(c.opt, c.opt_d, c.emb_opt, c.head_opt), "O")
    a, b, cc = (int(math.floor(x)) for x in ((key.m - rho) * W / 2, rho * W, t.tail_frac * W))
    obj = a * t2 + b * S + cc * D + W * opt
    # memory: both stages' states and in-flight activations (each stage's on its own group),
    # the constants, in whole bytes, under the capacity of the rank's group (stage r's)
    kept = act_layers(space) == 0
    act = {g: min(c.act[g], c.ckpt[g]) if not every else c.ckpt[g] for g in G}
    actd = {g: min(c.act_d[g], c.ckpt_d[g]) if not every else c.ckpt_d[g] for g in G}

    def byte(x: float) -> int:
        return int(math.floor(x))

    mem = []
    for j in range(p):
        st: Any = (byte(c.sigma) * (ls[j] - kj[j]) + byte(c.sigma_d) * kj[j]
                   + (byte(c.emb_states) if j == 0 else 0)
                   + (byte(c.head_states) if j == p - 1 else 0))
        if kept:
            for g in G:
                st = st + byte(f[j] * act[g]) * z[j][g] + (
                    (byte(f[j] * actd[g]) - byte(f[j] * act[g])) * kj[j]
                    + (byte(f[j] * c.emb_act[g]) if j == 0 else 0)) * y[j][g]
        mem.append(st)
    if math.isfinite(c.const_mem):
        for r in range(p):
            for g in G:
                on = y[r][g]  # 1 / 0 where the placement is fixed, else the selector
                if not math.isfinite(c.capacity[g]) or (isinstance(on, int) and on == 0):
                    continue
                ct = m.add(mem[r] + mem[p - 1 - r] + byte(c.const_mem) <= byte(c.capacity[g]))
                if not isinstance(on, int):
                    ct.only_enforce_if(on)
    m.minimize(obj)
    return DualPipeModel(m, ls, obj, q / W)


def _groups(m: cp_model.CpModel, ls: list[Any], places: Any, G: list[int], L: int
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


def solve_free_dualpipe(t: Tables, key: Any, *, seed: int, workers: int,
                        cutoff_s: float | None, budget: Budget
                        ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """The exact best plan of a DualPipe key's free family (module docstring), as
    cpsat_partition's `_solve_family` returns it: ((step, plan, exact - model objective,
    error bound), whether a None answer is proven). None, proven, when no plan fits with an
    exact step time <= `cutoff_s`."""
    dm = build(t, key)
    if dm is None:
        return None, True
    cut = cutoff_s if cutoff_s is not None and math.isfinite(cutoff_s) else None
    best: tuple[float, tuple[Any, ...], Plan, float] | None = None
    lb = 0.0
    memo: dict[tuple[int, ...], Any] = t.__dict__.setdefault("_dp_split", {}).setdefault(
        key, {})
    for _ in range(ROUNDS_MAX):
        if cut is not None:  # one unit more: an exact tie is still found (the least wins)
            dm.model.add(dm.objective <= int(math.floor(cut / dm.scale_s)) + 1)
        if budget.exhausted():
            break
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = workers
        solver.parameters.random_seed = seed
        st = budget.solve(solver, dm.model)
        if st == cp_model.INFEASIBLE:
            return _answer(best, cutoff_s, 0.0, t.space.num_layers)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        lb = max(lb, solver.best_objective_bound * dm.scale_s)
        split = tuple(int(solver.value(x)) for x in dm.layers)
        if split not in memo:
            n0 = len(t.__dict__.get("_model_terms", {}))
            memo[split] = best_of_split(t, key, split)
            budget.charge(limits.MODEL_PLAN_DTIME * (len(t.__dict__.get("_model_terms", {})) - n0))
        got = memo[split]
        if got is not None:
            cand = (got[0], got[1].key())
            if best is None or cand < best[:2]:
                best = (*cand, got[1], got[0] - solver.objective_value * dm.scale_s)
            cut = got[0] if cut is None else min(cut, got[0])
        dm.forbid(split)
    ans = _answer(best, cutoff_s, None if best is None else max(best[0] - lb, 0.0),
                  t.space.num_layers)
    return ans[0], False


def _answer(best: tuple[float, tuple[Any, ...], Plan, float] | None, cutoff_s: float | None,
            err: float | None, num_layers: int
            ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """`solve_free_dualpipe`'s answer: None (proven when `err` is 0: the loop proved it)
    when none fits or the best is above the cutoff."""
    if best is None or (cutoff_s is not None and best[0] > cutoff_s):
        return None, err == 0.0
    step, _, plan, diff = best
    return (step, canonical(plan, num_layers), diff, err or 0.0), False
