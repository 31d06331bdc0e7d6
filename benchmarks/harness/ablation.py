"""Ablation pairs: published runs of one job that differ in exactly one choice (issue 29 item 2).

Two evaluable runs form an ablation pair when they train the same model (shape, sequence) on
the same GPU with the same recipe (framework behaviour and precisions, as the harness wrote
them) and differ in one of these choices only:

- ``cp``: context parallelism at a fixed sequence, GPU count and global batch (dp follows);
- ``zero``: the ZeRO stage, all else equal;
- ``microbatches``: the micro-batch count (and with it the global batch) at a fixed plan;
- ``gpus, fixed batch``: the GPU count at a fixed global batch (strong scaling: dp and the
  micro-batch count follow, tp/pp/vpp/cp/ep/zero/mbs/recompute fixed);
- ``gpus``: the GPU count with the per-GPU batch as the source set it (tp/pp/vpp/cp/ep/zero/
  recompute fixed; micro-batch size, count and global batch may follow the scale);
- ``schedule``: the pipeline schedule at a fixed plan and batch (a V-shaped schedule brings its
  two chunks per rank: vpp and the chunk layout may follow), e.g. the Zero Bubble paper's 1F1B /
  ZB-1p / ZB-2p runs of one job (arXiv 2401.10241 Table 4);
- ``offload``: optimizer or activation offload at a fixed plan and batch (no published pair in
  the corpus yet).

Pairs whose measured tokens/s/GPU differ by more than the ranking margin are the ones the
ranking scores (crossval.ranking_agreement), so ablation pairs already count there; this
module names them, so that the agreement on exactly these choices is reported on its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Protocol

from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan

#: The ablation axes, in report order.
AXES = ("cp", "zero", "microbatches", "gpus, fixed batch", "gpus", "schedule", "offload")

#: plan fields a schedule change may carry along (V-shaped: two chunks per rank)
_WITH_SCHEDULE = frozenset({"schedule", "vpp", "chunk_layers", "stage_layers"})
_OFFLOAD = ("optimizer_offload", "activation_offload")

_MODEL_PARALLEL = ("tp", "pp", "vpp", "ep", "etp", "sp", "recompute", "schedule",
                   "stage_layers", "chunk_layers")


class _Run(Protocol):
    """A run as crossval.Case has it (read-only members, so frozen records match)."""

    @property
    def key(self) -> tuple[str, int]: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def gpus(self) -> int: ...
    @property
    def job(self) -> Job: ...
    @property
    def plan(self) -> Plan: ...
    @property
    def measured(self) -> float: ...


def _same_job(a: _Run, b: _Run) -> bool:
    ja, jb = a.job, b.job
    return (a.shape == b.shape and ja.seq_len == jb.seq_len and ja.model == jb.model
            and ja.recipe == jb.recipe
            and ja.cluster.node_groups[0].gpu == jb.cluster.node_groups[0].gpu)


def _differ(a: Plan, b: Plan, fields: Sequence[str]) -> set[str]:
    return {f for f in fields if getattr(a, f) != getattr(b, f)}


def axis(a: _Run, b: _Run) -> str | None:
    """The one choice runs `a` and `b` of the same job differ in (an AXES name), or None."""
    if not _same_job(a, b):
        return None
    pa, pb = a.plan, b.plan
    fixed = _MODEL_PARALLEL + ("cp", "zero") + _OFFLOAD
    if a.gpus != b.gpus:
        if _differ(pa, pb, fixed):
            return None
        if a.job.global_batch == b.job.global_batch and pa.mbs == pb.mbs:
            return "gpus, fixed batch"
        return "gpus"
    gb_a, gb_b = a.job.global_batch, b.job.global_batch
    d = _differ(pa, pb, fixed + ("mbs", "num_microbatches", "dp"))
    if d == {"num_microbatches"} and gb_a != gb_b:
        return "microbatches"
    if gb_a != gb_b:
        return None
    if "schedule" in d and d <= _WITH_SCHEDULE \
            and pa.pipeline_schedule != pb.pipeline_schedule:
        return "schedule"
    if d and d <= set(_OFFLOAD):
        return "offload"
    if d == {"zero"}:
        return "zero"
    if d in ({"cp", "dp"}, {"cp", "dp", "num_microbatches"}):
        return "cp"
    return None


def pairs(runs: Sequence[_Run]) -> dict[str, list[tuple[_Run, _Run]]]:
    """Every ablation pair of `runs`, per axis (each pair once, in input order)."""
    out: dict[str, list[tuple[_Run, _Run]]] = {k: [] for k in AXES}
    for a, b in itertools.combinations(runs, 2):
        ax = axis(a, b)
        if ax is not None:
            out[ax].append((a, b))
    return out


def agreement(runs: Sequence[_Run], preds: Mapping[tuple[str, int], float],
              margin: float = 0.10) -> dict[str, tuple[int, int, int]]:
    """Per axis: (pairs whose measured throughputs differ by more than `margin` that the
    predictions order the same way, such pairs, all pairs on the axis)."""
    out: dict[str, tuple[int, int, int]] = {}
    for ax, ps in pairs(runs).items():
        agree = total = 0
        for a, b in ps:
            hi, lo = (a, b) if a.measured >= b.measured else (b, a)
            if hi.measured < lo.measured * (1 + margin):
                continue
            total += 1
            agree += preds[hi.key] > preds[lo.key]
        out[ax] = (agree, total, len(ps))
    return out
