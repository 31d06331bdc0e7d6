"""Single-axis changes of a plan (`explain`): the neighbours that fit, each scored by the exact
cost model, fastest first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoparallel_cp.search.recommend import complexity
from autoparallel_cp.spec.hybrid_sharding import node_shard_replicas
from autoparallel_cp.spec.plan import Plan


@dataclass(frozen=True)
class Change:
    """One single-axis change of a plan and its exact evaluation."""

    change: str
    plan: Plan
    step_s: float
    delta: float  # relative step-time change vs the original (-0.1 = 10 % faster)
    fits: bool
    peak_bytes: float  # memory compared with the capacity (required, else peak allocated)
    capacity_bytes: float


def neighbours(job: Any, plan: Plan) -> list[tuple[str, Plan]]:
    """Legal plans one axis step away from `plan` (dp and micro-batch count re-derived)."""
    from autoparallel_cp.spec.plan import RECOMPUTE_MODES, plan_violations

    base: dict[str, Any] = plan.model_dump()
    moe = getattr(job.model, "moe", None) is not None
    edits: list[tuple[str, dict[str, Any]]] = []
    for axis in ("tp", "pp", "cp", "mbs", "vpp") + (("ep",) if moe else ()):
        v = base[axis]
        for nv in (v * 2, v // 2):
            if nv >= 1 and nv != v:
                edits.append((f"{axis} {v} -> {nv}", {axis: nv}))
    for mode in RECOMPUTE_MODES:
        if mode != plan.recompute:
            edits.append((f"recompute {plan.recompute} -> {mode}",
                          {"recompute": mode, "recompute_layers": None}))
    for z in range(4):
        if z != plan.zero:
            edits.append((f"zero {plan.zero} -> {z}", {"zero": z}))
    if plan.tp > 1:
        edits.append((f"sp {plan.sp} -> {1 - plan.sp}", {"sp": 1 - plan.sp}))
    if moe and plan.etp is None and plan.tp > 1:
        # MoE parallel folding: experts without tensor parallelism, ep over tp ranks (needs SP)
        edits.append((f"etp {plan.tp} -> 1", {"etp": 1, "sp": 1}))
    elif moe and plan.folded:
        edits.append((f"etp {plan.expert_tp} -> {plan.tp}", {"etp": None}))
    edits += axis_edits(job, plan)
    if plan.zero >= 1:  # hybrid sharding: replicas of the shard group (spec/hybrid_sharding.py)
        r = plan.dp_replicate
        gpn = min(g.gpus_per_node for g in job.cluster.node_groups)
        node = node_shard_replicas(plan.tp, plan.cp, plan.dp, gpn)  # the searched one
        for nr in dict.fromkeys((r * 2, r // 2, node, 1)):
            if nr >= 1 and nr != r and plan.dp % nr == 0:
                edits.append((f"dp_replicate {r} -> {nr}", {"dp_replicate": nr}))
    domains = _domains(job)
    out: list[tuple[str, Plan]] = []
    seen = {plan.key()}
    for label, upd in edits:
        if any(k in domains and v not in domains[k] for k, v in upd.items()):
            continue
        f = {**base, **upd}
        if "pp" in upd or upd.get("vpp", f["vpp"]) != base["vpp"]:
            f["stage_layers"] = None
            f["stage_groups"] = None
            if f["pp"] == 1:
                f["vpp"] = 1
        if "tp" in upd and f["tp"] == 1:
            f["sp"] = 0
        denom = f["tp"] * f["pp"] * f["cp"]
        if job.num_gpus % denom:
            continue
        f["dp"] = job.num_gpus // denom
        if job.global_batch % (f["dp"] * f["mbs"]):
            continue
        f["num_microbatches"] = job.global_batch // (f["dp"] * f["mbs"])
        try:
            p = Plan(**f)
        except ValueError:
            continue
        if p.key() in seen or plan_violations(job, p):
            continue
        seen.add(p.key())
        out.append((label, p))
    return out


def axis_edits(job: Any, plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    """The schedule and offload changes of `plan` (spec/schedules.py; the optimizer shares
    are those the search tries, search/offload_axis.py `OFFLOAD_SHARES`; the rest are not
    searched by default):
    every other schedule (a V-shaped one at vpp 2), half or all of the optimizer states on
    the host, and one or half of the smallest stage's layers' activations offloaded."""
    from autoparallel_cp.spec.schedules import SCHEDULES, V_SHAPED

    out: list[tuple[str, dict[str, Any]]] = []
    if plan.pp > 1:
        cur = plan.pipeline_schedule
        for s in SCHEDULES:
            if s == cur:
                continue
            vpp = 2 if s in V_SHAPED else (plan.vpp if s == "interleaved" else 1)
            if s == "interleaved" and vpp == 1:
                continue
            out.append((f"schedule {cur} -> {s}", {"schedule": s, "vpp": vpp}))
    if all(g.host is not None for g in job.cluster.node_groups):
        for x in (0.0, 0.5, 1.0):
            if x != plan.optimizer_offload:
                out.append((f"optimizer_offload {plan.optimizer_offload:g} -> {x:g}",
                            {"optimizer_offload": x}))
        least = min(plan.layers_per_stage(job.model.num_layers))
        for k in sorted({0, 1, least // 2}):
            if k != plan.activation_offload:
                out.append((f"activation_offload {plan.activation_offload} -> {k}",
                            {"activation_offload": k}))
    return out


def _domains(job: Any) -> dict[str, tuple[Any, ...]]:
    """The search space's axis domains (empty when space.py is not available)."""
    try:
        from autoparallel_cp.search.space import SearchSpace
    except ImportError:
        return {}
    sp = SearchSpace.for_job(job)
    return {a: tuple(getattr(sp, a)) for a in ("tp", "pp", "cp", "ep", "vpp", "mbs", "zero")}


def single_changes(job: Any, plan: Plan, current: dict[str, Any] | None = None) -> list[Change]:
    """Single-axis changes that fit and beat the plan's step time (or, when the plan does not
    fit, every change that fits), fastest first; each scored by the exact cost model."""
    from autoparallel_cp.cost.evaluate import evaluate

    if current is None:
        current = evaluate(job, plan).to_json()
    cur_step = float(current["time"]["step_s"])
    cur_fits = bool(current.get("fits"))
    out: list[Change] = []
    for label, p in neighbours(job, plan):
        d = evaluate(job, p).to_json()
        step = float(d["time"]["step_s"])
        fits = bool(d.get("fits"))
        if not fits or (cur_fits and step >= cur_step):
            continue
        mem = d.get("memory", {})
        need = mem.get("required_bytes", mem.get("peak_bytes"))  # what is compared to capacity
        out.append(Change(label, p, step, step / cur_step - 1.0, fits,
                          float(need or 0), float(mem.get("capacity_bytes") or 0)))
    out.sort(key=lambda c: (c.step_s, complexity(c.plan), c.plan.key()))
    return out
