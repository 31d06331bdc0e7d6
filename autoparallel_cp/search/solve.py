"""`solve` (CP-SAT, k best with an exactness certificate) and `enumerate_plans` (reference).

Both return a `SolveResult` whose plans are `evaluate.Evaluation` objects ranked by the exact
float cost model (ties by `Plan.key()`). Plans are distinct in their *key*: tp, pp, cp, dp, ep,
vpp, sp, zero, mbs and the recompute mode; for each key the best layer partition, recompute
count and stage placement is reported.

Search (two CP-SAT models, neither listing plans):
1. the master (`cpsat_master.build_master`) over the key axes, whose objective LB(key) is a
   proven lower bound of the exact step time of every plan of the key;
2. per key, the partition model (`cpsat_partition.build_partition`, a linear model over the
   key's constant coefficients): layer counts per stage, recomputed layers, node group per
   stage, with the constraint objective <= the current k-th best exact step time (a key whose
   best is above it cannot enter the top k, so the model is then infeasible and the key is
   dropped without being solved to optimality).
Best-first with a certificate: the master is minimized (capped at MASTER_DTIME; its best
bound seeds the first window when cut short), then the keys with LB in a growing window
(lo, hi] are enumerated by CP-SAT and scored exactly with model 2 in the order of the per-key
bound `cpsat_partition.key_bound` (numpy, proven <= the key's exact best); a key whose bound
is above the current k-th best is skipped without a model (and so are the window's later
keys). The search stops once the k-th best exact step time is <= hi, since every unseen key
has LB > hi and every skipped key a bound above the k-th best, so an exact step time above it.
Status `optimal` means this proof completed. When a parallel master's minimization was cut
short the top-k keys are re-solved without the cutoff at the end, so the reported partitions
do not depend on the order the keys were scored in. All limits are deterministic time
(`limits.Budget`), so the answer does not depend on the machine's load.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from autoparallel_cp.errors import InfeasibleError
from autoparallel_cp.search import cpsat_blocks as cb
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan


@dataclass
class SearchContext:
    """What one solve proved, for the recommendation phase over the same job and pins to reuse
    instead of re-deriving it: the space and its tables, the key master, every key with its
    proven bound LB (objective units) up to `listed_hi` (all windows listed completely), and
    the best plan of each key that was scored (`KeyResult`, exact: the cutoff only drops keys
    whose best is above it)."""

    space: SearchSpace
    tables: Any
    master: Any
    listed: list[tuple[int, Any]]
    listed_hi: int | None  # None: no complete window
    found: dict[Any, KeyResult]


@dataclass
class SolveResult:
    """Outcome of a search (INTERFACE.md JSON: status, solve_time_s, space_size, plans)."""

    status: str  # optimal | feasible | timeout (no plan in the limit, not proven infeasible)
    solve_time_s: float
    space_size: int
    plans: list[Any]  # evaluate.Evaluation, best first
    method: str = "cpsat"
    max_objective_diff_s: float = 0.0  # largest exact - solver objective over returned plans
    error_bound_s: float = 0.0  # proven per-plan bound on that difference
    gap: float = 0.0  # relative gap left when the time limit hit (0 when proven)
    iterations: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    #: the solve's proofs, reused by `recommend` (not part of the JSON)
    context: SearchContext | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "solve_time_s": self.solve_time_s,
            "space_size": self.space_size,
            "plans": [p.to_json() for p in self.plans],
        }


#: Deterministic-time cap on the master minimization (it only seeds the first window, see
#: `solve`); at most half the search's budget.
MASTER_DTIME = 60.0


def _key(plan: Plan) -> tuple[Any, ...]:
    return (plan.tp, plan.pp, plan.cp, plan.dp, plan.ep, plan.vpp, plan.sp, plan.zero,
            plan.mbs, plan.recompute)


def _space(job: Job, space: SearchSpace | None, fix: str | Mapping[str, Any] | None
           ) -> SearchSpace:
    return space if space is not None else SearchSpace.for_job(job, fix=fix)


def _finish(job: Job, ranked: list[tuple[float, Plan]], top_k: int) -> list[Any]:
    from autoparallel_cp.cost.evaluate import evaluate

    return [evaluate(job, p) for _, p in ranked[:top_k]]


def key_space(space: SearchSpace, key: Any) -> SearchSpace:
    """The sub-space of one key: every axis pinned, the partition / recompute / placement free."""
    from autoparallel_cp.spec.plan import RECOMPUTE_MODES

    return space.with_(tp=(key.tp,), cp=(key.cp,), pp=(key.pp,), ep=(key.ep,), vpp=(key.vpp,),
                       mbs=(key.mbs,), zero=(key.zero,), sp=(key.sp,),
                       recompute=(RECOMPUTE_MODES[key.mode],),
                       fixed={**dict(space.fixed), "dp": key.dp})


@dataclass(frozen=True)
class KeyResult:
    """Best plan of one key: exact step time, the plan, its solver-vs-exact difference, and
    the key's factor tables (to re-score variants of the plan without rebuilding them)."""

    step_s: float
    plan: Plan
    diff_s: float
    error_bound_s: float
    tables: Any = None


def best_for_key(space: SearchSpace, key: Any, *, time_limit: float = 10.0,
                 seed: int = 0, workers: int = 1, tables: Any = None,
                 cutoff_s: float | None = None, budget: Budget | None = None
                 ) -> KeyResult | None:
    """Solve one key's partition problem (layer counts per stage, recomputed layers, node group
    per stage) with the per-key linear CP-SAT model (`cpsat_partition`) and re-score it exactly.

    `tables` may be the whole space's tables (they hold every key's entries); None builds the
    key's own. None when no partition of the key fits (or none is <= `cutoff_s`). One worker,
    deterministic-time stages: deterministic.
    """
    from autoparallel_cp.search.cpsat_partition import solve_partition
    from autoparallel_cp.search.tables import build_tables

    del workers  # the per-key model is solved by one deterministic worker
    tk = tables if tables is not None else build_tables(key_space(space, key))
    res = solve_partition(tk, key, time_limit=time_limit, seed=seed, workers=1,
                          cutoff_s=cutoff_s, budget=budget)
    if res is None:
        return None
    step, plan, diff, err = res
    return KeyResult(step, plan, diff, err, tk)


def solve(
    job: Job,
    space: SearchSpace | None = None,
    *,
    top_k: int = 5,
    time_limit: float | None = 10.0,
    workers: int | None = None,
    seed: int | None = 0,
    objective: str = "throughput",
    progress_callback: Callable[[dict[str, Any]], None] | None = None,
    fix: str | Mapping[str, Any] | None = None,
    progress: Callable[..., Any] | None = None,
) -> SolveResult:
    """The k best distinct plans by CP-SAT, proven (see the module docstring).

    `time_limit` (seconds) is a deterministic-time budget (`limits.Budget`): the same input
    gives the same plans and status on an idle or a busy machine. Status `timeout` (no plan,
    not proven infeasible) when it runs out before any plan is found. `workers` > 1 solves the
    master in parallel (faster on large machines; its cut-short bound then depends on the load).
    """
    from autoparallel_cp.search.cpsat_master import ListingCut, build_master, enumerate_keys
    from autoparallel_cp.search.key_bounds import key_bound
    from autoparallel_cp.search.tables import build_tables

    del objective  # a fixed cluster: cost per step is proportional to the step time
    cb_ = progress_callback or progress
    t0 = time.perf_counter()
    sp = _space(job, space, fix)
    size = sp.size()
    if sp.num_degree_combinations() == 0:
        _raise_infeasible(job, sp)
    phase: dict[str, float] = {}
    tp0 = time.perf_counter()
    tabs = build_tables(sp)
    master = build_master(tabs)
    phase["build_s"] = time.perf_counter() - tp0
    unit = master.unit_s

    budget = Budget(time_limit)
    master_workers = workers or 1
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.num_workers = master_workers
    prm.random_seed = int(seed or 0)
    # the master's minimum only seeds the first bound window: any proven lower bound will do, so
    # the minimization is capped (MASTER_DTIME, at most half the budget) and its best bound used
    # when it is cut short
    left0 = budget.left()
    cap = MASTER_DTIME if left0 is None else min(MASTER_DTIME, 0.5 * left0)
    # presolve costs most of the master's time on large spaces (5 s of 6 s for deepseek-v3 on
    # 2,048 GPUs, for ~20k one-hot literals it only merges) and the search closes without it
    prm.cp_model_presolve = False
    tp0 = time.perf_counter()
    st = budget.solve(solver, master.model, cap=cap)
    phase["master_s"] = time.perf_counter() - tp0
    if st == cp_model.INFEASIBLE:
        # confirm with presolve (a second, independent proof) before reporting: CP-SAT 9.15's
        # presolve wrongly reported some feasible masters infeasible during development
        # (enforced linear equalities, since removed), so one path alone is not trusted
        prm.cp_model_presolve = True
        st = budget.solve(solver, master.model, cap=cap)
        if st == cp_model.INFEASIBLE:
            _raise_infeasible(job, sp)
    master_cut = st != cp_model.OPTIMAL
    top_u = cb.bounds(master.model, master.objective)[1]
    bound = solver.best_objective_bound  # +-inf when a cut-short master has no bound yet
    lb0 = int(solver.objective_value) if st == cp_model.OPTIMAL else (
        max(int(math.floor(bound)), 0) if math.isfinite(bound) else 0)
    lb0 = min(lb0, top_u)
    found: dict[Any, KeyResult] = {}
    evaluated = 0
    proven = True
    lo: int | None = None
    hi = lb0 + max(lb0 // 50, 1)
    listed = 0
    all_listed: list[tuple[int, Any]] = []  # every key of the complete windows, with its LB
    listed_hi: int | None = None  # the windows (-inf, listed_hi] are listed completely

    def kth() -> float:
        costs = sorted((r.step_s, r.plan.key()) for r in found.values())
        return costs[top_k - 1][0] if len(costs) >= top_k else float("inf")

    while True:
        if budget.exhausted():
            proven = False
            break
        tp0 = time.perf_counter()
        try:
            keys, capped = enumerate_keys(master, lo, hi, budget=budget)
        except ListingCut:
            proven = False
            break
        phase["enumerate_keys_s"] = phase.get("enumerate_keys_s", 0.0) + time.perf_counter() - tp0
        tp0 = time.perf_counter()
        if capped:  # too wide a window: narrow it and ask again
            hi = (lo if lo is not None else lb0) + max((hi - (lo or lb0)) // 4, 1)
            continue
        all_listed.extend(keys)
        listed_hi = hi
        stop = False
        # score the window's keys in the order of the per-key bound (`key_bound`: numpy, about
        # 0.5 ms, far tighter than LB): the k-th best then drops sooner, and every key whose
        # bound is above the k-th best is skipped without building its model
        tp1 = time.perf_counter()
        order = sorted(((max(key_bound(tabs, key), lb_u * unit), key.order(), lb_u, key)
                        for lb_u, key in keys), key=lambda x: x[:2])
        phase["key_bound_s"] = phase.get("key_bound_s", 0.0) + time.perf_counter() - tp1
        tp0 = time.perf_counter()
        listed += len(order)
        for kb, _, lb_u, key in order:
            cut = kth()
            if kb > cut or kb == math.inf:
                # proven: every plan of this key and of the later ones is slower (or none fits)
                break
            if lb_u * unit >= cut:
                continue
            if budget.exhausted():
                stop = True
                break
            res = best_for_key(sp, key, seed=int(seed or 0), tables=tabs, cutoff_s=cut,
                               budget=budget)
            evaluated += 1
            if res is not None:
                found[key] = res
            if cb_ is not None and found:
                cb_({"iteration": evaluated, "plans": len(found), "bound_s": lb_u * unit,
                     "best_s": min(r.step_s for r in found.values())})
        phase["partition_s"] = phase.get("partition_s", 0.0) + time.perf_counter() - tp0
        if stop:
            proven = False
            break
        k = kth()
        if k <= hi * unit or hi >= top_u:
            break  # every key with LB <= hi is scored: nothing unseen can enter the top k
        lo = hi
        if k < float("inf"):
            # widen geometrically towards the k-th best: keys are scored in bound order and the
            # k-th best usually drops while they are, so a window up to the current k-th best at
            # once would list many keys that the final k-th best rules out
            hi = min(int(math.ceil(k / unit)), hi + max(hi - lb0, lb0 // 100, 1), top_u)
        else:
            hi = min(hi + max(2 * (hi - lb0), lb0 // 20, 1), top_u)
    ranked = sorted(found.values(), key=lambda r: (r.step_s, r.plan.key()))
    # the windows, hence the order keys are scored in and the cutoffs their models get, are
    # fixed by the master's minimum; when a parallel master was cut short they are not (its
    # bound depends on the load), so the reported partitions are then re-solved without a
    # cutoff: same input, same plans
    for i, r in enumerate(ranked[:top_k] if master_cut and master_workers > 1 else []):
        key = next(k for k, v in found.items() if v is r)
        again = best_for_key(sp, key, seed=int(seed or 0), tables=tabs,
                             budget=Budget(max(time_limit or 10.0, 1.0)))
        if again is not None:
            ranked[i] = again
    ranked.sort(key=lambda r: (r.step_s, r.plan.key()))
    if not ranked:
        if proven:
            _raise_infeasible(job, sp)
        return SolveResult("timeout", time.perf_counter() - t0, size, [], gap=1.0,
                           iterations=evaluated, stats=_limit_stats(budget))
    best_lb = lb0 * unit
    kk = ranked[min(top_k, len(ranked)) - 1].step_s
    gap = 0.0 if proven else max(0.0, (kk - (hi * unit)) / kk)
    evs = _finish(job, [(r.step_s, r.plan) for r in ranked], top_k)
    return SolveResult(
        status="optimal" if proven else "feasible",
        solve_time_s=time.perf_counter() - t0,
        space_size=size,
        plans=evs,
        max_objective_diff_s=max(r.diff_s for r in ranked[:top_k]),
        error_bound_s=max(r.error_bound_s for r in ranked[:top_k]),
        gap=gap,
        iterations=evaluated,
        stats={"phases": phase, "master_vars": len(master.model.proto.variables),
               "master_constraints": len(master.model.proto.constraints),
               "keys_scored": evaluated, "keys_skipped": listed - evaluated,
               "root_bound_s": best_lb,
               "ranked": [(r.step_s, r.plan) for r in ranked[:top_k]],
               **_limit_stats(budget)},
        context=SearchContext(space=sp, tables=tabs, master=master, listed=all_listed,
                              listed_hi=listed_hi, found=dict(found)),
    )


def _limit_stats(budget: Budget) -> dict[str, Any]:
    """What the budget says about the run: deterministic seconds used, and whether the
    wall-clock safety net (not the deterministic budget) stopped it."""
    return {"deterministic_time": budget.used, "wall_clock_net_hit": budget.wall_hit}


def enumerate_plans(
    job: Job,
    space: SearchSpace | None = None,
    *,
    top_k: int = 5,
    objective: str = "throughput",
    fix: str | Mapping[str, Any] | None = None,
    limit: int | None = None,
    progress_callback: Callable[[dict[str, Any]], None] | None = None,
) -> SolveResult:
    """The exhaustive reference over the same space (see enumerate.py)."""
    from autoparallel_cp.search import enumerate as en

    del objective, progress_callback
    t0 = time.perf_counter()
    sp = _space(job, space, fix)
    ranked, size = en.enumerate_best(sp, limit=limit)
    if not ranked:
        _raise_infeasible(job, sp)
    evs = _finish(job, ranked, top_k)
    return SolveResult("optimal", time.perf_counter() - t0, size, evs, method="enumerate",
                       stats={"ranked": ranked[:top_k]})


def _raise_infeasible(job: Job, space: SearchSpace) -> None:
    from autoparallel_cp.search.infeasibility import explain

    raise InfeasibleError(explain(job, space))
