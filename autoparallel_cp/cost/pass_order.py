"""Pipeline schedules as per-stage operation orders: what `cost/timeline.py` places.

A schedule is one function `(pp, vpp, m, stage) -> [Op, ...]`: the order in which a stage runs
the forward ("F") and backward ("B") passes of its model chunks for the step's m micro-batches.
A new schedule (zero-bubble's split backward "W", DualPipe, GPipe) plugs in as one more entry of
`SCHEDULES`; the placement reads only the order and the cross-stage dependencies (`depends_on`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autoparallel_cp.spec.splits import microbatch_group


@dataclass(frozen=True, order=True)
class Op:
    """One pass of one micro-batch through one model chunk of a stage."""

    microbatch: int
    chunk: int
    phase: str  # "F" forward, "B" backward


Schedule = Callable[[int, int, int, int], list[Op]]


def one_f_one_b(pp: int, vpp: int, m: int, stage: int) -> list[Op]:
    """Non-interleaved 1F1B (Narayanan et al. 2021 §2.2, PipeDream-Flush; Megatron-LM
    `forward_backward_pipelining_without_interleaving`): min(pp - stage - 1, m) warm-up
    forwards, then one forward and one backward per micro-batch, then the cool-down backwards."""
    if vpp != 1:
        raise ValueError("1F1B runs one model chunk per stage (vpp = 1)")
    warm = min(pp - stage - 1, m)
    order = [Op(i, 0, "F") for i in range(warm)]
    for k in range(m - warm):
        order += [Op(warm + k, 0, "F"), Op(k, 0, "B")]
    order += [Op(i, 0, "B") for i in range(m - warm, m)]
    return order


def interleaved_1f1b(pp: int, vpp: int, m: int, stage: int) -> list[Op]:
    """Megatron's interleaved 1F1B (Megatron-LM d98e8a64 core/pipeline_parallel/schedules.py
    `forward_backward_pipelining_with_interleaving`): forwards in groups of N micro-batches
    (`spec.splits.microbatch_group`, pp when pp | m), chunk by chunk (`get_schedule_table`);
    backwards in the same order with the chunk ids mirrored (vpp - 1 - chunk,
    `get_model_chunk_id`); W = 2(pp - stage - 1) + (vpp - 1)·N warm-up forwards (capped at the
    m·vpp chunks), then one forward and one backward per step, then the cool-down backwards.
    The same walk as `cost/sync.py` `stage_inflight`."""
    group = microbatch_group(pp, m) or pp
    fwd: list[tuple[int, int]] = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        fwd += [(i, c) for c in range(vpp) for i in range(lo, hi)]
    bwd = [(i, vpp - 1 - c) for i, c in fwd]
    total = len(fwd)
    warm = min((pp - stage - 1) * 2 + (vpp - 1) * group, total)
    order = [Op(i, c, "F") for i, c in fwd[:warm]]
    for k in range(total - warm):
        order += [Op(*fwd[warm + k], "F"), Op(*bwd[k], "B")]
    order += [Op(i, c, "B") for i, c in bwd[total - warm:]]
    return order


def gpipe(pp: int, vpp: int, m: int, stage: int) -> list[Op]:
    """GPipe (Huang et al. 2019, §2.2): every micro-batch's forward, then every backward (in
    reverse micro-batch order, as the activations are freed), one model chunk per stage."""
    if vpp != 1:
        raise ValueError("GPipe runs one model chunk per stage (vpp = 1)")
    return [Op(i, 0, "F") for i in range(m)] + [Op(i, 0, "B") for i in reversed(range(m))]


#: Per-stage pass orders by name. The cost model composes 1F1B for vpp = 1 and Megatron's
#: interleaved 1F1B for vpp > 1 (cost/steptime.py); GPipe has the same bubble as 1F1B (only
#: its activation memory differs, Narayanan et al. 2021 §2.2).
SCHEDULES: dict[str, Schedule] = {"1f1b": one_f_one_b, "interleaved-1f1b": interleaved_1f1b,
                                  "gpipe": gpipe}


def schedule_name(vpp: int, requested: str | None = None) -> str:
    """The schedule of a plan: `requested` when it is one of `SCHEDULES` and runs the plan's
    vpp, else the one the cost model composes for that vpp."""
    if requested in SCHEDULES and (requested == "interleaved-1f1b") == (vpp > 1):
        return str(requested)
    return "1f1b" if vpp == 1 else "interleaved-1f1b"


def depends_on(op: Op, stage: int, pp: int, vpp: int) -> tuple[int, Op] | None:
    """(stage, op) that must finish before `op` can start on `stage`, None for the first
    forward: a forward needs the previous stage's forward of the same chunk (stage 0's chunk c
    the last stage's chunk c - 1), a backward the next stage's backward (the last stage's
    chunk c the first stage's chunk c + 1; its last chunk its own forward, the loss)."""
    i, c = op.microbatch, op.chunk
    if op.phase == "F":
        if stage > 0:
            return stage - 1, Op(i, c, "F")
        return (pp - 1, Op(i, c - 1, "F")) if c > 0 else None
    if stage < pp - 1:
        return stage + 1, Op(i, c, "B")
    if c < vpp - 1:
        return 0, Op(i, c + 1, "B")
    return stage, Op(i, c, "F")
