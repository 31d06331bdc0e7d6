"""Helpers shared by the emitters: layer splits a framework can express, the plan comment, and
the refusal of a plan the target framework cannot run (spec/frameworks.py)."""

from __future__ import annotations

from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.frameworks import refusals
from autoparallel_cp.spec.plan import Plan


def uniform_layers(job: Job, plan: Plan) -> bool:
    """Every model chunk holds the same number of layers (Megatron's default split)."""
    return len(set(plan.layout(job.model.num_layers))) == 1


def first_last_split(job: Job, plan: Plan) -> tuple[int, int] | None:
    """(first, last) stage layer counts when only those two differ from a uniform middle and
    every stage's chunks hold equal counts (Megatron's --decoder-first/last-pipeline-num-layers
    split each of those stages evenly over its vpp chunks)."""
    layers = plan.layers_per_stage(job.model.num_layers)
    if plan.pp < 2 or len(set(layers)) == 1:
        return None
    if any(len(set(c)) > 1 for c in plan.chunks_per_stage(job.model.num_layers)):
        return None
    middle = layers[1:-1]
    if len(set(middle)) <= 1:
        return layers[0], layers[-1]
    return None


def slot_flags(job: Job, plan: Plan) -> tuple[bool, bool] | None:
    """(embedding, loss) as Megatron's --account-for-embedding/loss-in-pipeline-split when
    those flags reproduce the plan's chunks exactly: (layers + e + l) slots divide by pp*vpp
    and every chunk holds its share, less the embedding on the first chunk and the loss on
    the last (Megatron-LM d98e8a64 transformer_block.py `get_num_layers_to_build`)."""
    L, chunks = job.model.num_layers, plan.pp * plan.vpp
    layout = plan.layout(L)
    for e, loss in ((1, 1), (0, 1), (1, 0)):
        if (L + e + loss) % chunks:
            continue
        per = [(L + e + loss) // chunks] * chunks
        per[0] -= e
        per[-1] -= loss
        if tuple(per) == layout and min(per) >= 0:
            return bool(e), bool(loss)
    return None


def chunk_layers(job: Job, plan: Plan) -> list[int]:
    """Layers of each model chunk in pipeline order (virtual stage v*pp + rank), vpp per rank:
    `Plan.layout` (uneven chunks as the plan defines them)."""
    return list(plan.layout(job.model.num_layers))


def plan_comment(plan: Plan) -> str:
    return plan.short() + f",num_microbatches={plan.num_microbatches}"


def refuse_unrunnable(job: Job, plan: Plan, fmt: str) -> None:
    """Raise a UserError (exit 2) naming the first plan field `fmt` cannot run as planned."""
    bad = refusals(job, plan, fmt)
    if bad:
        raise UserError(bad[0].message(plan))
