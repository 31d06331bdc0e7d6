"""What a search, and so its proof, covered (issue 28.2): the JSON `space` of solve /
enumerate, its one-line summary, and whether a given plan lies in the space.

Generic over the axes: every tuple-valued field of `SearchSpace` is an axis domain (an axis
added to the space is described, and checked by `outside`, without a change here); the
remaining fields (the layer-partition kind, partial recompute, a fixed `etp`, ...) are
described as they are. The rules the solver applies beyond the domains (spec/plan.py's
divisibility rules, the partition's granularity) are named in `rules`.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from autoparallel_cp.search.act_offload import act_layers, free_at, scored
from autoparallel_cp.search.act_offload import searched as act_searched
from autoparallel_cp.search.act_offload import words as act_words
from autoparallel_cp.search.empty_rank import dense_prefix, prefix_at
from autoparallel_cp.search.replay_axis import (
    free_family,
    free_pp_ok,
)
from autoparallel_cp.search.schedule_axis import (
    SCANNED,
    UNION,
    searched,
)
from autoparallel_cp.search.split_words import split_rule
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.schedules import default_schedule

#: a search/space.py SearchSpace (not imported: space.py is the lower module)
SearchSpace = Any

#: fields of SearchSpace that are not part of what the proof covered (the framework
#: restriction is described by its frameworks, the sub-spaces' schedules by the schedules
#: they cover: `proof_space`)
_NOT_AXES = ("job", "fixed", "restriction", "schedules", "act_axis")  # act_axis: "offload"


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


def axes(space: SearchSpace) -> dict[str, tuple[Any, ...]]:
    """Every axis domain of the space (the tuple-valued fields), by name."""
    return {f.name: getattr(space, f.name) for f in fields(space)
            if f.name not in _NOT_AXES and isinstance(getattr(space, f.name), tuple)}


def proof_space(space: SearchSpace) -> dict[str, Any]:
    """The JSON `space`: the axes with the values searched, the derived dp values, the other
    settings of the space, the pins, and the rules every searched plan obeys."""
    other = {f.name: _plain(getattr(space, f.name)) for f in fields(space)
             if f.name not in _NOT_AXES and not isinstance(getattr(space, f.name), tuple)}
    if other.get("etp", 0) is None:
        other["etp"] = "tp"  # Megatron's default: the experts' tensor-parallel size is tp
    r = space.restriction
    if r is not None:  # spec/framework_space.py: only the plans these frameworks run
        other["frameworks"] = list(r.formats)
    return {
        "axes": {k: _plain(v) for k, v in axes(space).items()},
        "dp": list(space.dp_domain),
        **other,
        "layer_split": split_rule(space),
        "pins": _plain(dict(space.fixed)),
        "schedule": searched(space.schedules, space.vpp),
        "offload": _offload_text(space),
        "rules": ["dp*tp*pp*cp = GPUs", "global batch % (dp*mbs) = 0",
                  "vpp > 1 needs pp > 1 and num_microbatches >= pp",
                  "ep | dp*cp (etp = tp), else etp*ep | tp*cp*dp",
                  "dp_replicate | dp (and the expert-DP group), zero >= 1 when > 1; "
                  "searched (not pinned): 1, or with zero >= 2 (hybrid FSDP) the replicas of "
                  "a shard group of the fewest whole nodes holding two shard ranks "
                  "(spec/hybrid_sharding.py node_shard_replicas)",
                  "spec/plan.py plan_violations (heads, kv heads, FFN, sequence)",
                  "optimizer_offload > 0 only where the hosts hold the offloaded optimizer "
                  "states of the largest stage a split of the key's pp can have "
                  "(search/offload_axis.py host_ok)"]
        + ([f"the rows of {', '.join(r.formats)} in spec/frameworks.py"] if r is not None
           else []),
    }


def _offload_text(space: SearchSpace) -> str:
    """The host offload the space covers, in words (search/offload_axis.py, act_offload.py)."""
    shares = [x for x in space.off_axis if x > 0]
    acts = [k for k in act_searched(space) if k]
    act = "activations stay on the GPU" if not acts else act_words(space)
    if acts and not shares:
        return "optimizer states on the GPU; " + act
    if not shares:
        why = ("pinned" if "optimizer_offload" in space.fixed else
               "not searched by default: --search-also offload"
               if "offload" not in space.job.search_also else
               "a node group has no host spec" if not all(
                   g.host is not None for g in space.job.cluster.node_groups)
               else "the frameworks run none")
        return f"none (optimizer and activations stay on the GPU: {why})"
    return ("optimizer states on the host, shares " + ", ".join(f"{x:g}" for x in
                                                                 space.off_axis)
            + "; " + act)


def space_line(desc: dict[str, Any]) -> str:
    """One line of `proof_space` for the terminal, under the status line."""
    parts = []
    for name, dom in desc["axes"].items():
        vals = ["tp" if v is None and name == "etp_axis" else
                f"{v:g}" if isinstance(v, float) else str(v) for v in dom]
        shown = {"etp_axis": "etp", "rep_axis": "dp_replicate",
                 "off_axis": "optimizer_offload"}.get(name, name)
        parts.append(f"{shown} {','.join(vals)}")
    # etp and named_splits are shown by the etp axis and the layer-split rule
    extra = [f"{k} {','.join(map(str, v)) if isinstance(v, list) else v}"
             for k, v in desc.items()
             if k not in ("axes", "dp", "layer_split", "pins", "rules", "partition", "etp",
                          "named_splits", "dp_replicate", "optimizer_offload")]
    return ("proof covers: " + "; ".join(parts + extra)
            + f"; layer split {desc['layer_split']}")


def outside(space: SearchSpace, plan: Plan) -> str | None:
    """Why `plan` is not a plan of `space` (None when it is): the first axis whose value the
    search did not try, a different `etp`, or a layer split the partition does not cover."""
    for name, dom in axes(space).items():
        if hasattr(plan, name) and getattr(plan, name) not in dom:
            return f"{name}={getattr(plan, name)} (searched: {list(dom)})"
    if plan.dp not in space.dp_domain:
        return f"dp={plan.dp}"
    runs = searched(space.schedules, space.vpp)
    ps = plan.pipeline_schedule
    if None in space.schedules and ps == default_schedule(plan.vpp):
        sub = None
    elif ps in space.schedules:
        sub = ps
    else:
        hint = (f"; --search-also schedule adds {', '.join(UNION)}" if ps in UNION
                and "schedule" not in space.job.search_also and "schedule" not in space.fixed
                else "")
        return (f"schedule={ps} (searched: {', '.join(runs)}"
                + ("; 1f1b at vpp 1, interleaved at vpp > 1" if None in space.schedules
                   else "") + hint + ")")
    # the rest is checked against the sub-space of the plan's schedule (its pp, vpp and
    # partial recompute: SearchSpace.schedule_variants)
    k = plan.activation_offload
    if k not in act_searched(space):
        hint = ("" if "activation_offload" in space.fixed else
                f"; --fix activation_offload={k} searches it" if (
                    plan.pp > 1 or plan.recompute != "none" or ps != "1f1b")
                else "; --search-also offload adds one-stage counts"
                if "offload" not in space.job.search_also else "")
        return (f"activation_offload={k} (searched: "
                f"{', '.join(map(str, act_searched(space)))}{hint})")
    own = [v for v in space.schedule_variants() if v.schedules == (sub,) and act_layers(v) == k]
    sp0, space = space, next((v for v in own if plan.pp in v.pp
                              and plan.recompute in v.recompute),
                             own[0] if own else None)  # its part (act_offload `_by_stages`)
    if space is None:
        return f"activation_offload={k} with schedule={ps} (searched: {act_words(sp0)})"
    for name in ("pp", "vpp"):
        if getattr(plan, name) not in getattr(space, name):
            return (f"{name}={getattr(plan, name)} with schedule={ps} (searched: "
                    f"{list(getattr(space, name))})")
    if plan.optimizer_offload not in space.off_axis:
        hint = ("; --search-also offload adds the host shares"
                if "offload" not in space.job.search_also
                and "optimizer_offload" not in space.fixed else "")
        return (f"optimizer_offload={plan.optimizer_offload:g} (searched: "
                f"{', '.join(f'{x:g}' for x in space.off_axis)}{hint})")
    have = plan.etp if plan.etp is not None and plan.etp != plan.tp else None
    wants = {None if e is None or e == plan.tp else e for e in space.etp_axis}
    if have not in wants:
        shown = ", ".join("tp" if e is None else str(e) for e in space.etp_axis)
        return f"etp={plan.expert_tp} (searched: {shown})"
    if plan.dp_replicate not in space.rep_axis:
        return (f"dp_replicate={plan.dp_replicate} (searched: "
                f"{', '.join(map(str, space.rep_axis))}; pin it with --fix dp_replicate)")
    one = next((v for v in space.etp_variants()
                if (None if v.etp is None or v.etp == plan.tp else v.etp) == have
                and v.dp_replicate == plan.dp_replicate
                and v.optimizer_offload == plan.optimizer_offload), space)
    if not one.host_ok(plan.tp, plan.ep, plan.zero, plan.dp, plan.cp):
        return (f"optimizer_offload={plan.optimizer_offload:g} at this sharding (searched "
                "only where the hosts hold the offloaded states of the largest stage a split "
                "of this pp can have)")
    if not (one.rep_ok(plan.tp, plan.cp, plan.dp) and one.zero_ok(plan.zero)):
        return (f"dp_replicate={plan.dp_replicate} with tp*cp*dp = "
                f"{plan.tp * plan.cp * plan.dp}, zero={plan.zero} (searched: the shard group "
                "of whole nodes, zero >= 2; pin it with --fix dp_replicate)")
    if not one.ep_ok(plan.tp, plan.cp, plan.dp, plan.ep):
        return f"ep={plan.ep} with dp*cp = {plan.dp * plan.cp} (the space's expert grid rule)"
    if not one.sp_ok(plan.tp, plan.sp):
        return f"sp={plan.sp} with tp={plan.tp} (the space's sequence-parallel rule)"
    if plan.recompute_layers is not None and not space.partial_recompute:
        return "partial recompute (not searched)"
    r = space.restriction
    if r is not None and (why := r.key_refusals(plan) or r.split_refusals(plan)):
        return f"{why[0].field}: {why[0].framework} does not run it"
    step = space.recompute_step(plan.vpp)
    if plan.recompute_layers is not None and plan.recompute_layers % step:
        return f"recompute_layers={plan.recompute_layers} (searched: multiples of {step})"
    L = space.num_layers
    if space.fixed_split:
        return None
    if plan.pp > 1 and plan.layout(L) in space.layouts(plan.pp, plan.vpp):
        return None  # a named uneven layout of the space (search/space.py `layouts`)
    if plan.chunk_layers is not None:
        return "uneven model chunks (chunk_layers; not searched unless pinned)"
    per_stage = plan.layers_per_stage(L)
    if ((space.schedule in SCANNED and not (free_family(space) and free_pp_ok(
            space, plan.pp, plan.vpp))) or (scored(space) and plan.pp > 1 and not free_at(
            space, plan.pp, plan.vpp))) and space.partition != "uniform":
        under = (f"schedule={ps}" if space.schedule in SCANNED else
                 f"activation_offload={act_layers(space)} at pp > 1")
        return f"layer split {list(per_stage)} (searched under {under}: the named layouts only)"
    if space.partition == "uniform":
        if L % (plan.pp * plan.vpp) or len(set(per_stage)) > 1:
            return f"layer split {list(per_stage)} (searched: uniform splits only)"
        return None
    if plan.stage_layers is None and plan.vpp > 1 and L % (plan.pp * plan.vpp):
        # its model chunks are Megatron's uneven default ones, not the equal chunks of a stage
        # that the free partition gives
        return (f"Megatron's uneven default split ({L} layers over pp*vpp = "
                f"{plan.pp * plan.vpp}; searched: multiples of vpp per stage)")
    empty0 = space.first_stage_min_units(plan.vpp) == 0  # a V's rank 0 (empty_rank.py)
    if any(n % plan.vpp or n < plan.vpp and not (j == 0 and empty0 and n == 0)
           for j, n in enumerate(per_stage)):
        return f"layer split {list(per_stage)} (searched: multiples of vpp = {plan.vpp})"
    if min(per_stage) < (k := act_layers(space)):  # evaluate refuses it too
        return f"layer split {list(per_stage)} (activation_offload={k}: every stage >= {k})"
    if per_stage[prefix_at(per_stage[0])] < (k := dense_prefix(space)):
        return (f"layer split {list(per_stage)} (searched: the dense prefix's {k} layers "
                "whole on the first stage holding layers)")
    return None


def partitions_searched(space: SearchSpace) -> list[str]:
    """The partition families the space covers (`SearchSpace.split_families`), in words."""
    if space.fixed_split:
        return ["pinned split (--fix stage_layers / chunk_layers)"]
    out = ["uniform: Megatron's even split, pp*vpp | layers" if space.partition == "uniform"
           else "free: any per-stage counts, multiples of vpp, equal chunks per stage"]
    if space.named_splits:
        out.append("named uneven layouts: the layers plus 0/1 embedding and 0/1 loss slots "
                   "spread evenly over the pp*vpp chunks, the remainder to the first or "
                   "the last chunks (Megatron-Core --account-for-embedding/loss-in-"
                   "pipeline-split, torchtitan's first/last-stage weights)")
    return out


def describe(space: SearchSpace) -> dict[str, list[Any]]:
    """Every axis searched with the values covered (what a proven optimum is optimal over):
    the plan axes' domains, the partition families, the expert-TP sizes ("tp": Megatron's
    default, the attention's tp) and whether partial recompute is searched."""
    return {
        "tp": list(space.tp), "pp": list(space.pp), "cp": list(space.cp),
        "ep": list(space.ep), "vpp": list(space.vpp), "mbs": list(space.mbs),
        "zero": list(space.zero), "sp": list(space.sp), "recompute": list(space.recompute),
        "partition": partitions_searched(space),
        "etp": [e if e is not None else "tp" for e in space.etp_axis],
        "partial_recompute": [space.partial_recompute],
        "dp_replicate": list(space.rep_axis),
        "schedule": searched(space.schedules, space.vpp),
        "optimizer_offload": list(space.off_axis),
        "activation_offload": act_searched(space),
        **({"frameworks": list(space.restriction.formats)}
           if space.restriction is not None else {}),
    }
