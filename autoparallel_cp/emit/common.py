"""Helpers shared by the emitters: layer splits a framework can express, the plan comment."""

from __future__ import annotations

from autoparallel_cp.spec import Job
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


def plan_comment(plan: Plan) -> str:
    return plan.short() + f",num_microbatches={plan.num_microbatches}"
