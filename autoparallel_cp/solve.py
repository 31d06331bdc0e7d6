"""`solve` (CP-SAT, k best with an exactness certificate) and `enumerate_plans` (reference).

Both return a `SolveResult` whose plans are `evaluate.Evaluation` objects ranked by the exact
float cost model (ties by `Plan.key()`). Plans are distinct in their *key*: tp, pp, cp, dp, ep,
vpp, sp, zero, mbs and the recompute mode; for each key the best layer partition, recompute
count and stage placement is reported.

Exactness: the CP-SAT objective is a proven lower bound LB(p) <= exact(p) <= LB(p) + error_bound
for every plan p. The loop solves to optimality, re-scores the optimum exactly, forbids its key
(no-good over the key literals) and repeats until the next optimum's LB exceeds the k-th best
exact step time: then no unseen plan can enter the top k.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from autoparallel_cp.errors import InfeasibleError
from autoparallel_cp.plan import Plan
from autoparallel_cp.space import SearchSpace
from autoparallel_cp.specs import Job


@dataclass
class SolveResult:
    """Outcome of a search (INTERFACE.md JSON: status, solve_time_s, space_size, plans)."""

    status: str  # optimal | feasible | infeasible
    solve_time_s: float
    space_size: int
    plans: list[Any]  # evaluate.Evaluation, best first
    method: str = "cpsat"
    max_objective_diff_s: float = 0.0  # largest exact - solver objective over returned plans
    error_bound_s: float = 0.0  # proven per-plan bound on that difference
    gap: float = 0.0  # relative gap left when the time limit hit (0 when proven)
    iterations: int = 0
    stats: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "solve_time_s": self.solve_time_s,
            "space_size": self.space_size,
            "plans": [p.to_json() for p in self.plans],
        }


def _key(plan: Plan) -> tuple[Any, ...]:
    return (plan.tp, plan.pp, plan.cp, plan.dp, plan.ep, plan.vpp, plan.sp, plan.zero,
            plan.mbs, plan.recompute)


def _space(job: Job, space: SearchSpace | None, fix: str | Mapping[str, Any] | None
           ) -> SearchSpace:
    return space if space is not None else SearchSpace.for_job(job, fix=fix)


def _finish(job: Job, ranked: list[tuple[float, Plan]], top_k: int) -> list[Any]:
    from autoparallel_cp.evaluate import evaluate

    return [evaluate(job, p) for _, p in ranked[:top_k]]


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
    """The k best distinct plans by CP-SAT (see the module docstring)."""
    from autoparallel_cp import cpsat
    from autoparallel_cp.tables import build_tables, plan_cost

    del objective  # a fixed cluster: cost per step is proportional to the step time
    cb_ = progress_callback or progress
    t0 = time.perf_counter()
    sp = _space(job, space, fix)
    size = sp.size()
    tabs = build_tables(sp)
    if sp.num_degree_combinations() == 0:
        _raise_infeasible(job, sp)
    form = cpsat.build(tabs)
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.num_workers = workers or os.cpu_count() or 1
    prm.random_seed = int(seed or 0)
    found: dict[tuple[Any, ...], tuple[float, Plan, float]] = {}
    proven = True
    gap = 0.0
    iters = 0
    lb_last = 0.0
    while True:
        left = None if time_limit is None else time_limit - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            proven = False
            break
        if left is not None:
            prm.max_time_in_seconds = max(left, 0.01)
        st = solver.solve(form.model)
        iters += 1
        if st == cp_model.INFEASIBLE:
            break
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            proven = False
            break
        bound = solver.best_objective_bound * form.tu
        ranked = sorted((v[0], v[1].key()) for v in found.values())
        kth = ranked[top_k - 1][0] if len(ranked) >= top_k else float("inf")
        if bound > kth:
            lb_last = bound
            break
        if st != cp_model.OPTIMAL:
            proven = False
            gap = (kth - bound) / kth if kth < float("inf") else 1.0
        plan = form.read_plan(solver, sp)
        lits = form.key_lits(solver)
        pc = plan_cost(tabs, plan)
        obj_s = solver.objective_value * form.tu
        if not pc.fits:
            form.forbid_exact(lits, [int(solver.value(v)) for v in form.layers],
                              int(solver.value(form.r)),
                              None if form.groups is None
                              else [int(solver.value(g)) for g in form.groups])
            continue
        found[_key(plan)] = (pc.step_s, plan, pc.step_s - obj_s)
        form.forbid_key(lits)
        if cb_ is not None:
            cb_({"iteration": iters, "plans": len(found), "bound_s": bound,
                 "best_s": min(v[0] for v in found.values())})
        if st != cp_model.OPTIMAL:
            break
    ranked_plans = sorted(((v[0], v[1]) for v in found.values()), key=lambda x: (x[0], x[1].key()))
    if not ranked_plans:
        if proven:
            _raise_infeasible(job, sp)
        return SolveResult("feasible", time.perf_counter() - t0, size, [], iterations=iters,
                           gap=1.0)
    diffs = [v[2] for v in found.values()]
    evs = _finish(job, ranked_plans, top_k)
    return SolveResult(
        status="optimal" if proven else "feasible",
        solve_time_s=time.perf_counter() - t0,
        space_size=size,
        plans=evs,
        max_objective_diff_s=max(diffs),
        error_bound_s=form.error_bound_s,
        gap=0.0 if proven else gap,
        iterations=iters,
        stats={"vars": form.num_vars, "constraints": form.num_constraints,
               "time_unit_s": form.tu, "last_bound_s": lb_last, "keys_seen": len(found),
               "ranked": [(c, p) for c, p in ranked_plans[:top_k]]},
    )


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
    from autoparallel_cp import enumerate as en

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
    from autoparallel_cp.infeasibility import explain

    raise InfeasibleError(explain(job, space))
