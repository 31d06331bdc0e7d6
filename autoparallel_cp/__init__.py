"""autoparallel_cp: optimal parallel training plans with OR-Tools CP-SAT.

Public API (imported lazily, so `import autoparallel_cp` stays light; every bad argument or
input raises a `UserError`: `InputError` for specs and options, `PlanError` for plans)::

    from autoparallel_cp import load_model, load_cluster, make_job
    from autoparallel_cp.search import solve
    from autoparallel_cp.cost import evaluate
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "solve", "evaluate", "enumerate_plans", "load_model", "load_cluster", "make_job",
    "Job", "Plan", "parse_plan", "RECIPES", "UserError", "InputError", "PlanError",
    "InfeasibleError", "__version__",
]

_LAZY: dict[str, str] = {
    "solve": "autoparallel_cp.api",
    "evaluate": "autoparallel_cp.api",
    "enumerate_plans": "autoparallel_cp.api",
    "load_model": "autoparallel_cp.api",
    "load_cluster": "autoparallel_cp.api",
    "make_job": "autoparallel_cp.api",
    "Job": "autoparallel_cp.spec",
    "RECIPES": "autoparallel_cp.spec",
    "Plan": "autoparallel_cp.spec.plan",
    "parse_plan": "autoparallel_cp.spec.plan",
    "PlanError": "autoparallel_cp.spec.plan",
    "UserError": "autoparallel_cp.errors",
    "InputError": "autoparallel_cp.errors",
    "InfeasibleError": "autoparallel_cp.errors",
}

if TYPE_CHECKING:
    from autoparallel_cp.api import (
        enumerate_plans,
        evaluate,
        load_cluster,
        load_model,
        make_job,
        solve,
    )
    from autoparallel_cp.errors import InfeasibleError, InputError, UserError
    from autoparallel_cp.spec import RECIPES, Job
    from autoparallel_cp.spec.plan import Plan, PlanError, parse_plan


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'autoparallel_cp' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
