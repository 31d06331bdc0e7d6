"""Helpers shared by the emitters: layer splits a framework can express, the plan comment, and
the refusal of a plan the target framework cannot run (spec/frameworks.py)."""

from __future__ import annotations

from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.frameworks import refusals
from autoparallel_cp.spec.plan import Plan


def uniform_layers(job: Job, plan: Plan) -> bool:
    layers = plan.layers_per_stage(job.model.num_layers)
    return len(set(layers)) == 1


def first_last_split(job: Job, plan: Plan) -> tuple[int, int] | None:
    """(first, last) stage layer counts when only those two differ from a uniform middle."""
    layers = plan.layers_per_stage(job.model.num_layers)
    if plan.pp < 2 or len(set(layers)) == 1:
        return None
    middle = layers[1:-1]
    if len(set(middle)) <= 1:
        return layers[0], layers[-1]
    return None


def chunk_layers(job: Job, plan: Plan) -> list[int]:
    """Layers of each model chunk in pipeline order (virtual stage v*pp + rank), vpp per rank.

    Each rank's layers split evenly over its vpp chunks (refused otherwise, frameworks.py).
    """
    per_rank = plan.layers_per_stage(job.model.num_layers)
    return [per_rank[r] // plan.vpp for _ in range(plan.vpp) for r in range(plan.pp)]


def plan_comment(plan: Plan) -> str:
    return plan.short() + f",num_microbatches={plan.num_microbatches}"


def refuse_unrunnable(job: Job, plan: Plan, fmt: str) -> None:
    """Raise a UserError (exit 2) naming the first plan field `fmt` cannot run as planned."""
    bad = refusals(job, plan, fmt)
    if bad:
        raise UserError(bad[0].message(plan))
