"""The per-key models' solve portfolio (cpsat_partition.py's partition model, cpsat_replay.py's
V model): a sequence of CP-SAT strategies, each capped in deterministic time and charged to
the search's `limits.Budget`, so the answer does not depend on the machine's load.

Split out of cpsat_partition.py (no behaviour change).
"""

from __future__ import annotations

from typing import Any

from ortools.sat.python import cp_model

from autoparallel_cp.search.limits import Budget

#: Sequential portfolio for the per-key model, each stage capped in deterministic time (so
#: the answer does not depend on the machine's load): no single CP-SAT strategy is fast on every
#: key (fixed search stalls on long pipelines, the default on two-stage MoE keys, the LB-tree
#: search on node-group placement), each closes most keys in milliseconds.
PORTFOLIO: tuple[tuple[dict[str, Any], float], ...] = (
    ({"search_branching": cp_model.FIXED_SEARCH, "cp_model_presolve": False}, 0.05),
    ({"search_branching": cp_model.FIXED_SEARCH}, 0.2),
    ({"search_branching": cp_model.PSEUDO_COST_SEARCH}, 0.5),
    ({"optimize_with_lb_tree_search": True}, 1.0),
    ({}, float("inf")),
)


#: The V model's portfolio (cpsat_replay.py: a max of path cuts with large coefficients):
#: on 80 keys of Llama 3 70B at pp 8 and 16 with their cuts, capped at 1 deterministic s,
#: CP-SAT's portfolio search closed all in 4.6 s (worst 0.6 s), fixed search all in 4.8 s,
#: the default 75 of 80 in 8.1 s (worst 2.6 s), no presolve 79 (the module's measurements)
REPLAY_PORTFOLIO: tuple[tuple[dict[str, Any], float], ...] = (
    ({"search_branching": cp_model.PORTFOLIO_SEARCH}, 1.0),
    ({"search_branching": cp_model.FIXED_SEARCH}, 1.0),
    ({}, float("inf")),
)


def solve_portfolio(model: cp_model.CpModel, budget: Budget, seed: int, workers: int,
                    presolve: bool = True,
                    stages: tuple[tuple[dict[str, Any], float], ...] = PORTFOLIO
                    ) -> tuple[cp_model.CpSolver, Any]:
    """Solve with each `stages` (PORTFOLIO) stage in turn until one proves optimality (or
    infeasibility); each later stage starts from the best solution so far (hint). Every
    stage draws on `budget`; the last one has no cap of its own."""
    best: tuple[cp_model.CpSolver, Any] | None = None
    for params, dtime in stages:
        if budget.exhausted():
            break
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.num_workers = workers
        prm.random_seed = seed
        prm.cp_model_presolve = presolve
        for k, v in params.items():
            setattr(prm, k, v)
        st = budget.solve(solver, model, cap=None if dtime == float("inf") else dtime)
        if st in (cp_model.OPTIMAL, cp_model.INFEASIBLE, cp_model.MODEL_INVALID):
            model.clear_hints()
            return solver, st
        if st == cp_model.FEASIBLE:
            if best is None or solver.objective_value < best[0].objective_value:
                best = (solver, st)
            model.clear_hints()
            for v in range(len(model.proto.variables)):
                var = model.get_int_var_from_proto_index(v)
                model.add_hint(var, int(solver.value(var)))
    model.clear_hints()
    if best is None:
        return cp_model.CpSolver(), cp_model.UNKNOWN
    return best
