"""Every DualPipe mirror pair's exact rank values, for every layer count pair the pair can
hold (search/dualpipe_classes.py): the floats the cost model computes, bit for bit, read
through its own per-stage functions and composed by its own `_dualpipe_rank`, over arrays.

Under DualPipe (DeepSeek-V3 §3.2.1; cost/steptime.py `_dualpipe_rank`, cost/memory.py
`stage_memory`) rank i runs stage i and its mirror p-1-i on its own GPUs; so does rank p-1-i.
Rank i's time, DP sync, optimizer step and memory are functions of its own stage's StageTime
and parts and its mirror's, each a function of (stage, layer kinds, node group) only
(`stage_time_fn`, `stage_parts_fn`, memoized by the cost model on those; a stage's time
reads its position only as first or last, so the inner stages share stage 1's). Where the layers
after the first stage's least count are all of one kind (no MoE, or MoE every layer after
the dense prefix: replay_axis.py `class_ok`), a stage's kinds are a function of its position
and count, so pair i's two ranks depend on (a, b) = (l_i, l_{p-1-i}) and the ranks' groups
only: a table per pair of every (a, b) it can hold and every group, from p·L·G stage
evaluations.

Bit for bit: each array element runs the same IEEE operations in the same order as the
scalar path (numpy float64 +, -, *, / and maximum round as Python floats do): the StageTime
fields are arrays and `_dualpipe_rank` and `StageTime.total_s` are the cost model's own code;
`exposed_dp`, the rank memory and `step_time`'s composition (`compose`) are written out here
in the scalar path's order (tests/search/test_dualpipe_classes.py checks every value against
`plan_terms` on random plans).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.memory import stage_parts_fn, state_consts, usable_bytes
from autoparallel_cp.cost.pass_split import backward_split
from autoparallel_cp.cost.schedules import bubble_ratio
from autoparallel_cp.cost.steptime import (
    StageTime,
    _dualpipe_rank,
    dp_exposure,
    fixed_step_s,
    stage_time_fn,
)
from autoparallel_cp.search.schedule_axis import plan_schedule
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan

F64 = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
_FIELDS = [f.name for f in dataclasses.fields(StageTime) if f.name not in ("stage", "group")]


def probe_plan(t: Any, key: Any, r: int | None) -> Plan:
    """The key's plan without split and placement, recompute count `r` (model_scan.py
    `_best_of_row`'s fields)."""
    space = t.space
    return Plan(dp=key.dp, tp=key.tp, pp=key.pp, vpp=key.vpp, cp=key.cp, ep=key.ep, sp=key.sp,
                zero=key.zero, mbs=key.mbs, num_microbatches=key.m,
                recompute=RECOMPUTE_MODES[key.mode], recompute_layers=r, etp=space.etp,
                schedule=plan_schedule(space.schedule), dp_replicate=space.dp_replicate,
                optimizer_offload=space.optimizer_offload, activation_offload=0)


def kinds(moe: Ints, plan: Plan, start: int, n: int) -> tuple[int, int, int, int]:
    """(dense, MoE, recomputed dense, recomputed MoE) of a stage of `n` layers from layer
    `start`, `moe` the prefix sums of the model's `is_moe_layer`: memory.py
    `stage_layer_kinds` for one stage."""
    r = plan.recomputed_layers(n)
    n_moe, r_moe = int(moe[start + n] - moe[start]), int(moe[start + r] - moe[start])
    return (n - n_moe, n_moe, r - r_moe, r_moe)


@dataclass(frozen=True)
class Side:
    """One rank of a pair on one node group, per (a, b) candidate: its time, exposed DP
    sync, optimizer step and whether its memory fits."""

    tot: F64
    exp: F64
    opt: F64
    fits: npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Pair:
    """Pair i's candidates (a, b) = (l_i, l_{p-1-i}) and, per node group, rank i's (`lo`)
    and rank p-1-i's (`hi`) values."""

    a: Ints
    b: Ints
    lo: dict[int, Side]
    hi: dict[int, Side]


def pair_tables(t: Any, key: Any, r: int | None, groups: list[int], lo0: int
                ) -> list[Pair]:
    """Every pair's table (module docstring) at recompute count `r` on `groups`; `lo0` the
    first stage's least count; every other stage >= 1, the split summing to L."""
    job, p, L = t.space.job, key.pp, t.space.num_layers
    plan = probe_plan(t, key, r)
    st_fn, parts_fn = stage_time_fn(job, plan), stage_parts_fn(job, plan)
    lo = [lo0] + [1] * (p - 1)
    rest = sum(lo)

    def counts(j: int) -> range:
        return range(lo[j], L - rest + lo[j] + 1)

    def start(j: int, n: int) -> int:  # any start of the stage (kinds: position and count)
        return 0 if j == 0 else max(lo0, 1) + j - 1

    moe = np.concatenate([[0], np.cumsum([job.model.is_moe_layer(i) for i in range(L + p)])])
    st: dict[tuple[int, int], dict[str, F64]] = {}
    mem: dict[tuple[int, int], F64] = {}
    for j in range(p):
        for g in groups:
            ks = [kinds(moe, plan, start(j, n), n) for n in counts(j)]
            if 1 < j < p - 1:  # an inner stage's time reads j only as j == 0 or the last
                st[j, g] = st[1, g]
            else:
                rows = [st_fn(j, k, g) for k in ks]
                st[j, g] = {f: np.array([getattr(x, f) for x in rows], float)
                            for f in _FIELDS}
            mem[j, g] = np.array([parts_fn(j, k, (n,), g) for k, n in zip(ks, counts(j),
                                                                          strict=True)], float)
    tail, share = dp_exposure(F.options_for(job, None).dp_overlap)
    consts = state_consts(job, plan)
    out = []
    for i in range(p // 2):
        m_ = p - 1 - i
        aa, bb = np.meshgrid(np.asarray(counts(i)), np.asarray(counts(m_)), indexing="ij")
        keep = (aa + bb) <= L - rest + lo[i] + lo[m_]
        a, b = aa[keep].astype(np.int64), bb[keep].astype(np.int64)
        ia, ib = a - lo[i], b - lo[m_]
        sides: tuple[dict[int, Side], dict[int, Side]] = ({}, {})
        for side, (own, oi, mir, mi) in enumerate(((i, ia, m_, ib), (m_, ib, i, ia))):
            for g in groups:
                x = _stage(st[own, g], oi, own, g)
                y = _stage(st[mir, g], mi, mir, g)
                rank = _dualpipe_rank(x, y)
                tot = np.asarray(rank.total_s, float)
                d = np.asarray(rank.dp_sync_s, float)
                exp = np.maximum(tail * d, d - share * tot)
                fits = _fits(job, consts, mem[own, g][oi], mem[mir, g][mi], g)
                sides[side][g] = Side(tot, exp, np.asarray(rank.optimizer_s, float), fits)
        out.append(Pair(a, b, sides[0], sides[1]))
    return out


def _stage(fields: dict[str, F64], idx: Ints, j: int, g: int) -> StageTime:
    """A StageTime whose fields are arrays over the candidates (the cost model's class,
    elementwise)."""
    arrays: dict[str, Any] = {f: fields[f][idx] for f in _FIELDS}
    return StageTime(stage=j, group=g, **arrays)


def _fits(job: Any, consts: tuple[float, ...], own: F64, mir: F64, g: int
          ) -> npt.NDArray[np.bool_]:
    """memory.py `stage_memory`'s DualPipe rank (no optimizer offload: `class_ok`) and
    evaluate.py's fits rule (required <= capacity; host bytes 0 without offload), over
    arrays of the two stages' parts (dense_p, exp_p, act, work, host, edge_buf)."""
    wd, gd, od, we, ge, oe, buf_pp, z3, other = consts
    dense_p = own[:, 0] + mir[:, 0]
    exp_p = own[:, 1] + mir[:, 1]
    act = own[:, 2] + mir[:, 2]
    work = np.maximum(own[:, 3], mir[:, 3])
    host = own[:, 4] + mir[:, 4]
    edge_buf = own[:, 5] + mir[:, 5]
    buffers = buf_pp * (dense_p + exp_p) + z3 + edge_buf + other
    params_b = wd * dense_p + we * exp_p
    grads_b = gd * dense_p + ge * exp_p
    opt_b = od * dense_p + oe * exp_p
    persistent = F.persistent_bytes(job.recipe, *(cast(float, x) for x in (params_b, grads_b,
                                                                              opt_b)))
    peak = params_b + grads_b + opt_b + (act + work) + buffers
    required = peak + np.asarray(F.overhead_bytes(peak, persistent), float)
    cap = usable_bytes(job, job.cluster.node_groups[g].gpu.memory_bytes)
    return np.asarray((required <= cap) & (host <= 0.0), bool)


def step_consts(t: Any, key: Any, r: int | None) -> tuple[float, float, float]:
    """(m, the bubble ratio, the fixed step time) of the key's plans at recompute `r`, as
    `step_time` takes them."""
    job = t.space.job
    plan = probe_plan(t, key, r)
    ratio = bubble_ratio("dualpipe", plan.pp, backward_split(job, plan, None), key.m)
    return float(key.m), float(ratio), float(fixed_step_s(job))


def compose(consts: tuple[float, float, float], tot: list[F64], exp: list[F64],
            opt: list[F64]) -> F64:
    """`plan_terms`'s step (steptime.py `step_time` less the fixed time, vpp 1) of the ranks'
    arrays in rank order: the same operations in the same order."""
    m, ratio, fixed = consts
    tmax, total, dp, op = tot[0], tot[0], exp[0], opt[0]
    for x, e, o in zip(tot[1:], exp[1:], opt[1:], strict=True):
        tmax = np.maximum(tmax, x)
        total = total + x
        dp = np.maximum(dp, e)
        op = np.maximum(op, o)
    return compose_terms(consts, tmax, total, dp, op)


def compose_terms(consts: tuple[float, float, float], tmax: F64, total: F64, dp: F64,
                  op: F64) -> F64:
    """`compose` from the ranks' max time, summed time (added in rank order), max exposed
    sync and max optimizer step: its last operations, in its order."""
    m, ratio, fixed = consts
    bubble = ratio * (total - tmax) / 1.0
    return np.asarray(m * tmax + bubble + dp + op + fixed - fixed, float)
