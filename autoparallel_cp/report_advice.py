"""What a plan report advises: the memory a plan needs, the limits it runs into and the
changes worth trying (used by `report.print_plan_report`; re-exported by `report`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoparallel_cp.outputs import GIB

_TIME_LABEL: dict[str, str] = {
    "compute_s": "compute", "bubble_s": "bubble", "tp_comm_s": "TP comm", "cp_comm_s": "CP comm",
    "ep_comm_s": "EP comm", "pp_comm_s": "PP comm", "dp_comm_s": "DP comm",
    "optimizer_s": "optimizer",
}


def gib(n: float | None) -> str:
    """Bytes as GiB with one decimal."""
    return "-" if n is None else f"{n / GIB:.1f}"


def needed_bytes(mem: Mapping[str, Any]) -> Any:
    """Memory compared with the capacity: `required_bytes` (peak + runtime overhead) when the
    cost model gives it, else the allocated `peak_bytes`."""
    req = mem.get("required_bytes")
    return req if req is not None else mem.get("peak_bytes")


def limits(p: Mapping[str, Any]) -> list[str]:
    """What limits the plan (memory-, bubble-, network-bound ...), most important first."""
    out: list[str] = []
    mem = p.get("memory", {})
    cap = mem.get("capacity_bytes") or 0
    peak = needed_bytes(mem) or 0
    t = p.get("time", {})
    step = t.get("step_s") or 0.0
    plan = p.get("plan", {})
    if cap and peak > cap:
        out.append(f"does not fit: needs {gib(peak)} GiB > {gib(cap)} GiB capacity")
    elif cap and peak > 0.9 * cap:
        risk = mem.get("oom_risk")
        out.append(f"memory-bound: {peak / cap:.0%} of GPU memory used"
                   + ("" if risk is None else f", {risk:.0%} risk of running out of memory"))
    if step:
        bubble = (t.get("bubble_s") or 0.0) / step
        comm = sum(t.get(f) or 0.0 for f in ("tp_comm_s", "cp_comm_s", "ep_comm_s",
                                             "pp_comm_s", "dp_comm_s")) / step
        if bubble >= 0.10:
            out.append(f"bubble-bound: {bubble:.0%} of the step is pipeline bubble "
                       f"(pp={plan.get('pp')}, {plan.get('num_microbatches')} micro-batches)")
        if comm >= 0.15:
            worst = max(("tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s"),
                        key=lambda f: t.get(f) or 0.0)
            out.append(f"network-bound: {comm:.0%} of the step is exposed communication, "
                       f"mostly {_TIME_LABEL[worst]}")
        comp = (t.get("compute_s") or 0.0) / step
        if not out and comp >= 0.5:
            out.append(f"compute-bound: {comp:.0%} of the step is computation")
    return out or ["balanced: no single term dominates"]


def suggestions(p: Mapping[str, Any], num_layers: int | None = None) -> list[str]:
    """Changes that would most likely help, derived from the breakdown (heuristic, not solved)."""
    out: list[str] = []
    mem = p.get("memory", {})
    cap = mem.get("capacity_bytes") or 0
    peak = needed_bytes(mem) or 0
    t = p.get("time", {})
    step = t.get("step_s") or 0.0
    plan = p.get("plan", {})
    pp, vpp, m = plan.get("pp", 1), plan.get("vpp", 1), plan.get("num_microbatches", 1)
    if cap and peak > cap:
        acts = mem.get("activations_bytes") or 0
        states = sum(mem.get(f) or 0 for f in ("params_bytes", "grads_bytes",
                                                "optimizer_bytes"))
        if acts >= states:
            if plan.get("recompute") != "full":
                out.append("activations dominate: try recompute=selective or full, a smaller "
                           "mbs, or sp=1 / cp>1")
            else:
                out.append("activations dominate even with full recompute: raise tp or cp")
        else:
            if (plan.get("zero") or 0) < 1 and (plan.get("dp") or 1) > 1:
                out.append("model states dominate: zero=1 (distributed optimizer) shards them "
                           "over dp")
            else:
                out.append("model states dominate: raise tp or pp, or ZeRO-3")
    if step:
        bubble = (t.get("bubble_s") or 0.0) / step
        if bubble >= 0.10 and pp > 1:
            if num_layers is None or num_layers % (pp * vpp * 2) == 0:
                out.append(f"shrink the bubble: interleave (vpp={vpp * 2}) or use more "
                           f"micro-batches (lower mbs / dp; now m={m})")
            else:
                out.append(f"shrink the bubble: more micro-batches (now m={m}) or a smaller pp")
        tpc = (t.get("tp_comm_s") or 0.0) / step
        dpc = (t.get("dp_comm_s") or 0.0) / step
        cpc = (t.get("cp_comm_s") or 0.0) / step
        if tpc >= 0.10:
            out.append("TP communication is large: a lower tp (with pp or dp instead)"
                       + ("" if plan.get("sp") else ", or sp=1 (reduce-scatter/all-gather "
                                                     "instead of all-reduce)"))
        if dpc >= 0.10:
            out.append("DP communication is exposed: larger global batch / more micro-batches "
                       "to overlap it, or a faster inter-node network")
        if cpc >= 0.10:
            out.append("CP communication is exposed: lower cp if memory allows")
    return out


__all__ = ["gib", "limits", "needed_bytes", "suggestions"]
