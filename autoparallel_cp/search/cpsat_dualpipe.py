"""Free per-stage layer counts under DualPipe (issue 31, "one space"), on one node group or
several, searched exactly: a per-key CP-SAT model whose objective is a proven lower bound of
every free (split, placement)'s exact step time, and an exact loop (cpsat_replay.py
`solve_free`'s) that scores the model's candidates with the cost model.

What evaluate charges a DualPipe plan (cost/steptime.py `_dualpipe_rank`, cost/memory.py;
search/dualpipe_bound.py holds the derivation): rank r runs stage r and its mirror p-1-r, its
per-micro-batch time T_r the mean of the two stage times (each stage timed on its own node
group, `stage_groups`), its DP sync and optimizer step the sums; step = (m - rho)·T + rho·S +
max_r exposed_r + max_r o_r with T = max_r T_r, S the sum of the stage times, rho =
`bubble_ratio("dualpipe", p, split, m)`; memory per rank r: both stages' states and
activations (stage j with `inflight_units` in flight) + constants, under the capacity of
rank r's group (stage r's).

The model (`build`), every number read from the tables through `key_coefs` as
dualpipe_bound.py reads them: integer layer counts l_j >= 1 (stage 0 >= the dense prefix k:
`SearchSpace.first_stage_min_units`; `layer_step` is 1 at vpp 1) summing to L; the placement
(`placement_vars`): y_jg = 1 when stage j sits on group g, constants where the key has one placement
(one group, or `stage_groups` pinned), else one-hot selectors with group g holding its count
of stages, exactly `enumerate_axes.placement_array`'s rows (every order of those counts), and
z_jg = y_jg·l_j (linearized: z_jg = l_j where y_jg, else 0). Per stage, each coefficient of
the stage's group g (u_g the key's layer time plus the replay where every layer is
recomputed, dualpipe_bound.py's `every`; q the unit):

    c_j = Σ_g floor(u_g/q)·z_jg + (floor(u'_g/q) - floor(u_g/q))·k_j·y_jg
          + floor(emb_g/q)·y_jg·[j = 0] + floor(head_g/q)·y_jg·[j = p-1]

(k_0 = k, else 0): on the placement's groups, c_j = floor(u/q)·(l_j - k_j) + floor(u'/q)·k_j
+ the edges'. Then T2 >= c_r + c_{p-1-r} for every rank, S = Σ_j c_j, D >= d_r + d_{p-1-r}
(the DP-sync entries plus each stage's group's fixed term, 0 when nothing syncs), O >= o_r +
o_{p-1-r}, the objective a·T2 + b·S + c·D + W·O with a = floor((m - rho)·W/2), b =
floor(rho·W), c = floor(tail_frac·W), W = 1024, in units q/W; and per rank r, for its group
g: Σ floor(bytes) <= floor(capacity_g) with both stages' states and in-flight activations
(each stage's activation bytes its own group's entry).

Lower bound (every free split of the key, every recompute count and every placement): at a
fixed (split, placement) every y and z is fixed and each c_j, d_j, o_j, mem_j is the floored
entry of stage j's group, which is <= its exact entry; dualpipe_bound.py proves the entries
bound the exact terms of that (split, placement) (t_j >= c_j·q on stage j's group, the rank
tail and optimizer sums, the memory a necessary condition: work buffers >= 0 dropped), so
T2·q <= 2·T at the (split, placement) (T2 can take the largest pair sum), S·q <= S_exact,
D·q <= max_r (d_r + d_{p-1-r}), and with 0 <= rho < 1 <= m each of a/W <= (m - rho)/2, b/W <=
rho, c/W <= tail_frac: objective·q/W <= the exact step; a (split, placement) whose rank
exceeds the model's memory bound has no fitting plan. rho is the least over the key's
recompute counts (as dualpipe_bound.py). So the model's least objective over a split's
placements is <= the least exact step over them (tests/search/test_dualpipe_free_multi.py
checks every (split, placement) on two groups; test_dualpipe_free_split.py, one group).

Exactness (`solve_free_dualpipe`): take the model's best split, score it exactly (model_scan.py
`best_of_split`: `plan_terms` over its recompute counts and every placement, the
enumerator's scoring, bit for bit), forbid it whatever its placement, add objective <= the
best exact time so far (+1 unit: an exact tie stays in), repeat until CP-SAT proves nothing
is left. On one node group the objective reads the pair sums l_r + l_{p-1-r} only (each c_r
+ c_{p-1-r} is floor(u/q)·(l_r + l_{p-1-r}) + constants, S, D, O likewise), so every split of
the proposed one's `orbit` (the same pair sums) ties with it in the model, and the loop would
propose each in turn: it scores the whole orbit in the round and forbids the pair-sum vector
(`forbid_pairs`), which removes exactly the orbit's splits, all scored (Llama-3 70B pinned
at pp 2 on 64 H100: 79 splits, one orbit, one round instead of 79). Every (split,
placement) whose exact time is <= the returned one has then been scored (its split's model
objective bounds it, so it was proposed or is in a scored orbit), so the result is the
family's exact best, ties to the least `Plan.key()` (the enumerator's order, model_scan.py).
search/solve.py asks a key again at other cutoffs: the splits and orbits scored before
(exact whatever the cutoff, kept on the tables) seed the incumbent and leave the model
before the first round. CP-SAT draws on the search's `limits.Budget`; each plan the cost
model scores charges `limits.MODEL_PLAN_DTIME` (as cpsat_partition.py `_score_determined`).
If the budget or `ROUNDS_MAX` runs out, the best so far is returned unproven, its gap to
the model's best bound as error bound.
"""

from __future__ import annotations

import itertools
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
                 scale_s: float, lows: list[int], one_group: bool,
                 groups: list[dict[int, Any]]) -> None:
        self.model, self.layers, self.objective, self.scale_s = model, layers, objective, scale_s
        self.groups = groups  # y[j][g]: stage j on group g (an int where the placement is fixed)
        self.lows = lows  # each stage's least count (stage 0: the dense prefix)
        self.one_group = one_group  # every stage on one group: the objective reads pair sums

    def forbid(self, split: tuple[int, ...]) -> None:
        """No-good on one split."""
        self._none_of(list(self.layers), split)

    def pair_sums(self, split: tuple[int, ...]) -> tuple[int, ...]:
        """l_r + l_{p-1-r} for each rank r < p/2 (p is even under DualPipe)."""
        p = len(split)
        return tuple(split[r] + split[p - 1 - r] for r in range(p // 2))

    def orbit(self, split: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Every split of the model's counts with the pair sums of `split` (`pair_sums`),
        lexicographically: each rank's pair split any way that leaves both stages >= their
        least count."""
        p, sums = len(split), self.pair_sums(split)
        ranges = [range(self.lows[r], s - self.lows[p - 1 - r] + 1) for r, s in enumerate(sums)]
        out = []
        for head in itertools.product(*ranges):
            out.append((*head, *(s - h for s, h in zip(sums[::-1], head[::-1], strict=True))))
        return out

    def forbid_pairs(self, sums: tuple[int, ...]) -> None:
        """No-good on one pair-sum vector: every split of its `orbit` leaves the model."""
        p = len(self.layers)
        self._none_of([self.layers[r] + self.layers[p - 1 - r] for r in range(p // 2)], sums)

    def _none_of(self, exprs: list[Any], vals: tuple[int, ...]) -> None:
        alts = []
        for x, v in zip(exprs, vals, strict=True):
            b = self.model.new_bool_var("")
            self.model.add(x != v).only_enforce_if(b)
            alts.append(b)
        self.model.add_bool_or(alts)


def build(t: Tables, key: Any) -> DualPipeModel | None:
    """The module docstring's model of `key` on tables `t` (one variant; one node group or
    several, the stage placement then a decision: `placement_vars`); None when the key has no
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
    y, z = placement_vars(m, ls, places, G, L)

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
    return DualPipeModel(m, ls, obj, q / W, [first] + [step] * (p - 1), len(G) == 1, y)


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
    # what earlier calls on this key scored (search/solve.py asks a key again at other
    # cutoffs): split -> (its exact best, the model's objective when it was proposed), and
    # the pair-sum vectors whose whole orbit was scored; exact whatever the cutoff, so they
    # seed the incumbent and leave the model
    memo: dict[tuple[int, ...], Any] = t.__dict__.setdefault("_dp_split", {}).setdefault(
        key, {})
    done: set[tuple[int, ...]] = t.__dict__.setdefault("_dp_orbit", {}).setdefault(key, set())
    for sums in sorted(done):
        dm.forbid_pairs(sums)
    for split in sorted(memo):
        best, cut = _keep(best, cut, *memo[split])
        if dm.pair_sums(split) not in done:
            dm.forbid(split)
    for _ in range(ROUNDS_MAX):
        if cut is not None:  # one unit more: an exact tie is still found (the least wins)
            dm.model.add(dm.objective <= int(math.floor(cut / dm.scale_s)) + 1)
        if budget.exhausted():
            break
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = workers
        solver.parameters.random_seed = seed
        # a small model solved once a round: presolve took most of each solve (mixed
        # H100 + A100, Llama-3 70B: 1,513 rounds, 6.4 s of CP-SAT with it, 1.7 s without)
        solver.parameters.cp_model_presolve = False
        st = budget.solve(solver, dm.model)
        if st == cp_model.INFEASIBLE:
            return _answer(best, cutoff_s, 0.0, t.space.num_layers)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        lb = max(lb, solver.best_objective_bound * dm.scale_s)
        split = tuple(int(solver.value(x)) for x in dm.layers)
        obj_s = solver.objective_value * dm.scale_s
        # one group: the split's whole orbit ties in the model (its objective reads the pair
        # sums only), so it is scored in this round and leaves the model at once
        batch = dm.orbit(split) if dm.one_group else [split]
        for sp in batch:
            if sp not in memo:
                n0 = len(t.__dict__.get("_model_terms", {}))
                memo[sp] = (best_of_split(t, key, sp), obj_s)
                budget.charge(limits.MODEL_PLAN_DTIME
                              * (len(t.__dict__.get("_model_terms", {})) - n0))
            best, cut = _keep(best, cut, *memo[sp])
        if dm.one_group:
            done.add(dm.pair_sums(split))
            dm.forbid_pairs(dm.pair_sums(split))
        else:
            dm.forbid(split)
    ans = _answer(best, cutoff_s, None if best is None else max(best[0] - lb, 0.0),
                  t.space.num_layers)
    return ans[0], False


def _keep(best: tuple[float, tuple[Any, ...], Plan, float] | None, cut: float | None,
          got: tuple[float, Plan] | None, obj_s: float
          ) -> tuple[tuple[float, tuple[Any, ...], Plan, float] | None, float | None]:
    """The least (step, `Plan.key()`) of `best` and a scored split's `got` (None: nothing of
    the split fits), with its exact - model objective (`obj_s`), and the cutoff lowered to
    it."""
    if got is None:
        return best, cut
    cand = (got[0], got[1].key())
    if best is None or cand < best[:2]:
        best = (*cand, got[1], got[0] - obj_s)
    return best, got[0] if cut is None else min(cut, got[0])


def _answer(best: tuple[float, tuple[Any, ...], Plan, float] | None, cutoff_s: float | None,
            err: float | None, num_layers: int
            ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """`solve_free_dualpipe`'s answer: None (proven when `err` is 0: the loop proved it)
    when none fits or the best is above the cutoff."""
    if best is None or (cutoff_s is not None and best[0] > cutoff_s):
        return None, err == 0.0
    step, _, plan, diff = best
    return (step, canonical(plan, num_layers), diff, err or 0.0), False
