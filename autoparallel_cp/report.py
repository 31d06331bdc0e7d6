"""Readable outputs: rich tables and breakdown reports (the files are in `outputs`).

Everything here works on the PLAN dictionaries of INTERFACE.md (`Evaluation.to_json()`), so the
reports show exactly what `--json` writes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autoparallel_cp.outputs import GIB, MEMORY_FIELDS, TIME_FIELDS, safe_stream  # noqa: F401 (GIB: report.GIB)
from autoparallel_cp.report_advice import _TIME_LABEL, gib, limits, needed_bytes, suggestions
from autoparallel_cp.search.capacity import risk_note, risk_text

_MEM_LABEL: dict[str, str] = {
    "params_bytes": "parameters", "grads_bytes": "gradients", "optimizer_bytes": "optimizer",
    "activations_bytes": "activations", "other_bytes": "other",
}


# --------------------------------------------------------------------------------------------
# formatting helpers
# --------------------------------------------------------------------------------------------


def fmt_time(s: float | None) -> str:
    """Seconds in a readable unit."""
    if s is None:
        return "-"
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def fmt_count(x: float | None) -> str:
    """A large count (tokens/s) with k/M suffix."""
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:,.0f}"


def time_shares(p: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(label, share of step time) of each time component, largest first."""
    t = p.get("time", {})
    step = t.get("step_s") or 0.0
    if step <= 0:
        return []
    parts = [(_TIME_LABEL[f], (t.get(f) or 0.0) / step) for f in TIME_FIELDS]
    return sorted((x for x in parts if x[1] > 0), key=lambda x: -x[1])


def dominant(p: Mapping[str, Any], n: int = 2) -> str:
    """What dominates the step time, e.g. 'compute 78% · bubble 12%'."""
    shares = time_shares(p)[:n]
    return ", ".join(f"{label} {share:.0%}" for label, share in shares) or "-"


def plan_label(plan: Mapping[str, Any]) -> str:
    """Compact plan text: non-trivial degrees and settings."""
    parts = [f"dp{plan.get('dp')}", f"tp{plan.get('tp')}", f"pp{plan.get('pp')}"]
    for k in ("vpp", "cp", "ep"):
        if (plan.get(k) or 1) > 1:
            parts.append(f"{k}{plan[k]}")
    if plan.get("etp") is not None:
        parts.append(f"etp{plan['etp']}")
    if (plan.get("dp_replicate") or 1) > 1:
        parts.append(f"rep{plan['dp_replicate']}")
    if plan.get("sp"):
        parts.append("sp")
    parts.append(f"z{plan.get('zero')}")
    parts.append(f"mbs{plan.get('mbs')}")
    rc = plan.get("recompute", "none")
    if rc != "none":
        rl = plan.get("recompute_layers")
        parts.append(f"rc:{rc}" + (f"({rl})" if rl is not None else ""))
    parts += [str(plan["schedule"])] if plan.get("schedule") is not None else []  # unset: 1f1b
    parts += [f"{k}={plan[k]:g}" for k in ("optimizer_offload", "activation_offload")
              if plan.get(k)]
    return " ".join(parts)


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------


def plans_table(
    plans: Sequence[Mapping[str, Any]],
    *,
    title: str | None = None,
    highlight: int | None = None,
    compare: bool = False,
) -> Table:
    """The k-best table: degrees, mbs, recompute, memory, step time, throughput, MFU, what
    dominates the time; with `compare`, why each plan loses to #1."""
    table = Table(title=title, header_style="bold", title_justify="left", pad_edge=False)
    table.add_column("#", justify="right", no_wrap=True)
    # vpp / cp / ep / dp_replicate (rep) columns only when some plan uses them (the CSV/JSON
    shown = [c for c in ("dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "dp_replicate", "mbs")
             if c not in ("vpp", "cp", "ep", "dp_replicate")  # always have them)
             or any((p.get("plan", {}).get(c) or 1) > 1 for p in plans)]
    if any(p.get("plan", {}).get("etp") is not None for p in plans):
        shown.insert(shown.index("sp"), "etp")  # MoE parallel folding's expert-TP size
    if any(p.get("plan", {}).get("schedule") is not None for p in plans):
        # a searched non-default schedule: after the pipeline's columns
        shown.insert(shown.index("vpp" if "vpp" in shown else "pp") + 1, "schedule")
    for col in (*shown, "m"):
        table.add_column({"dp_replicate": "rep", "schedule": "sched"}.get(col, col),
                         justify="right", no_wrap=True)
    table.add_column("recompute", no_wrap=True)
    table.add_column("mem GiB", justify="right", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("tok/s/GPU", justify="right", no_wrap=True)
    table.add_column("MFU", justify="right", no_wrap=True)
    table.add_column("time goes to", no_wrap=True)
    if compare:
        table.add_column("vs #1", no_wrap=True)
    for i, p in enumerate(plans, start=1):
        plan = {"dp_replicate": 1, **p.get("plan", {})}  # (absent: plain sharding)
        mem = p.get("memory", {})
        t = p.get("time", {})
        thr = p.get("throughput", {})
        rc = str(plan.get("recompute", "none"))
        if rc == "full" and plan.get("recompute_layers") is not None:
            rc += f" ({plan['recompute_layers']}/stage)"
        memtxt = Text(f"{gib(needed_bytes(mem))}/{gib(mem.get('capacity_bytes'))}")
        if p.get("fits") is False:
            memtxt.stylize("red")
        if risk_text(p):  # near capacity (search/capacity.py): its OOM risk, marked
            memtxt.append(" " + risk_text(p), style="yellow")
        mfu = thr.get("mfu")
        style = "bold green" if highlight == i else None
        table.add_row(
            str(i),
            *(("-" if plan.get(f) is None else str(plan[f])) if f == "etp"
              else _schedule_cell(plan) if f == "schedule"
              else str(plan.get(f, "")) for f in (*shown, "num_microbatches")),
            rc,
            memtxt,
            fmt_time(t.get("step_s")),
            fmt_count(thr.get("tokens_per_s_per_gpu"))
            + band(thr.get("tokens_per_s_per_gpu"), thr.get("tokens_per_s_per_gpu_interval")),
            "-" if mfu is None else f"{mfu:.1%}"
            + ("*" if (p.get("evidence") or {}).get("beyond_evidence") else ""),
            dominant(p),
            *((versus(p, plans[0]) if i > 1 else "best",) if compare else ()),
            style=style,
        )
    return table


def _schedule_cell(plan: Mapping[str, Any]) -> str:
    """The pipeline schedule of a table row: the plan's, else its default (1f1b, interleaved
    when vpp > 1; spec/schedules.py), '-' without a pipeline."""
    if plan.get("schedule") is not None:
        return str(plan["schedule"])
    if (plan.get("pp") or 1) == 1:
        return "-"
    return "interleaved" if (plan.get("vpp") or 1) > 1 else "1f1b"


def band(value: float | None, interval: Sequence[float] | None) -> str:
    """` -13%/+7%`: the nominal 80 % interval's ends relative to the value ('' without).

    Both ends are shown, not half the width: the uncalibrated intervals are not centred (the
    model's leave-one-source-out errors lean optimistic, cost/uncertainty.py), so a `±` would
    hide on which side of the prediction a measured run is likelier to fall."""
    if value is None or not interval or value <= 0:
        return ""
    lo, hi = float(interval[0]) / value - 1.0, float(interval[1]) / value - 1.0
    return f" {lo:+.0%}/{hi:+.0%}"


def versus(p: Mapping[str, Any], best: Mapping[str, Any]) -> str:
    """Why `p` loses to `best`: relative step time and the term that grew most."""
    t, b = p.get("time", {}), best.get("time", {})
    step, bstep = t.get("step_s") or 0.0, b.get("step_s") or 0.0
    if not bstep:
        return "-"
    deltas = [(f, (t.get(f) or 0.0) - (b.get(f) or 0.0)) for f in TIME_FIELDS]
    f, d = max(deltas, key=lambda x: x[1])
    rel = step / bstep - 1.0
    if d <= 0 or rel <= 0:
        return f"{rel:+.1%}"
    return f"{rel:+.1%}: {_TIME_LABEL[f]} +{fmt_time(d)}"


def breakdown_tables(p: Mapping[str, Any]) -> tuple[Table, Table]:
    """Memory and time breakdown tables of one PLAN dict."""
    mem = p.get("memory", {})
    cap = mem.get("capacity_bytes") or 0
    peak = mem.get("peak_bytes") or 0
    where = f" (pipeline stage {mem['stage']})" if mem.get("stage") is not None else ""
    mt = Table(title=f"Memory of the most loaded GPU{where}", title_justify="left",
               header_style="bold")
    mt.add_column("part")
    mt.add_column("GiB", justify="right")
    mt.add_column("of peak", justify="right")
    for f in MEMORY_FIELDS:
        v = mem.get(f)
        if v is None:
            continue
        mt.add_row(_MEM_LABEL[f], gib(v), f"{v / peak:.0%}" if peak else "-")
    overhead = mem.get("overhead_bytes")
    if overhead is not None:
        mt.add_row("CUDA context + fragmentation", gib(overhead), "")
    fits = p.get("fits")
    style = "bold" if fits else "bold red"
    mt.add_row(Text("peak allocated", style="bold"), Text(gib(peak), style="bold"),
               Text(f"{peak / cap:.0%} of {gib(cap)}" if cap else "-", style="bold"))
    req = mem.get("required_bytes")
    if req is not None:
        mt.add_row(Text("required (vs capacity)", style=style), Text(gib(req), style=style),
                   Text(f"{req / cap:.0%} of {gib(cap)}" if cap else "-", style=style))
    t = p.get("time", {})
    step = t.get("step_s") or 0.0
    slow = t.get("slowest_stage")
    tt = Table(title="Step time" + (f" (slowest stage {slow})" if slow is not None else ""),
               title_justify="left", header_style="bold")
    tt.add_column("part")
    tt.add_column("time", justify="right")
    tt.add_column("share", justify="right")
    for f in TIME_FIELDS:
        v = t.get(f)
        if v is None:
            continue
        tt.add_row(_TIME_LABEL[f], fmt_time(v), f"{v / step:.0%}" if step else "-")
    offload = t.get("offload_s") or 0.0
    if offload > 0:  # activation copies to / from the host beyond the compute (cost/offload.py)
        tt.add_row("host offload", fmt_time(offload), f"{offload / step:.0%}" if step else "-")
    fixed = t.get("fixed_s") or 0.0
    if fixed > 0:  # a calibration's fixed time per step (spec/calibration.py)
        tt.add_row("fixed per step (calibrated)", fmt_time(fixed),
                   f"{fixed / step:.0%}" if step else "-")
    iv = t.get("step_s_interval")
    tt.add_row(Text("step", style="bold"), Text(fmt_time(step), style="bold"),
               f"80%: {fmt_time(iv[0])}-{fmt_time(iv[1])}" if iv else "")
    return mt, tt


def throughput_line(p: Mapping[str, Any]) -> str:
    """One line: tokens/s, tokens/s/GPU, MFU."""
    thr = p.get("throughput", {})
    mfu = thr.get("mfu")
    iv = thr.get("tokens_per_s_per_gpu_interval")
    ivtxt = (f" (80% interval {fmt_count(iv[0])}-{fmt_count(iv[1])})" if iv else "")
    return (f"throughput {fmt_count(thr.get('tokens_per_s'))} tokens/s, "
            f"{fmt_count(thr.get('tokens_per_s_per_gpu'))} tokens/s/GPU{ivtxt}, "
            f"MFU {'-' if mfu is None else f'{mfu:.1%}'}")


# --------------------------------------------------------------------------------------------
# explain: what limits a plan and what would help
# --------------------------------------------------------------------------------------------


def schedule_line(p: Mapping[str, Any], default: Mapping[str, Any],
                  resplit: bool = False) -> str:
    """Which bubble a plan's zero-bubble schedule removes: its bubble and memory against the
    same plan under its default schedule (`default`, 1F1B or interleaved; cost/schedules.py:
    the deferred weight-gradient passes fill the warm-up and cool-down, Qi et al. 2024);
    `resplit`: `default` has that schedule's own layer split (the plan's cannot run there)."""
    s = p.get("plan", {}).get("schedule")
    t, t0 = p.get("time", {}), default.get("time", {})
    m, m0 = needed_bytes(p.get("memory", {})), needed_bytes(default.get("memory", {}))
    step, step0 = t.get("step_s") or 0.0, t0.get("step_s") or 0.0
    name = default.get("plan", {}).get("schedule") or (
        "interleaved" if (p.get("plan", {}).get("vpp") or 1) > 1 else "1f1b")
    return (f"schedule {s}: bubble {fmt_time(t0.get('bubble_s'))} -> "
            f"{fmt_time(t.get('bubble_s'))} against {name} on the same plan"
            f"{' with its default layer split' if resplit else ''} (step "
            f"{fmt_time(step0)} -> {fmt_time(step)}, {(step0 - step) / step0:.1%} shorter"
            f"; mem {gib(m0)} -> {gib(m)} GiB)" if step0 else f"schedule {s}")


def offload_line(p: Mapping[str, Any], on_gpu: Mapping[str, Any]) -> str:
    """Which GPU memory a plan's host optimizer offload removes and what it costs: its memory
    and step against the same plan with every optimizer state on the GPU (`on_gpu`;
    cost/offload.py: the share's master weights and Adam moments move to the host, its
    gradients go down and the updated weights come back each step, Adam runs on the CPU)."""
    x = p.get("plan", {}).get("optimizer_offload") or 0.0
    mem, mem0 = p.get("memory", {}), on_gpu.get("memory", {})
    t, t0 = p.get("time", {}), on_gpu.get("time", {})
    step, step0 = t.get("step_s") or 0.0, t0.get("step_s") or 0.0
    fits0 = on_gpu.get("fits", True)
    return (f"optimizer_offload {x:g}: GPU memory {gib(needed_bytes(mem0))} -> "
            f"{gib(needed_bytes(mem))} GiB (optimizer states {gib(mem0.get('optimizer_bytes'))}"
            f" -> {gib(mem.get('optimizer_bytes'))} GiB; {gib(mem.get('host_bytes'))} GiB per "
            f"GPU on the host), +{fmt_time(step - step0)} host time per step (step "
            f"{fmt_time(step0)} -> {fmt_time(step)})"
            + ("; without it the plan does not fit" if not fits0 else ""))


def act_offload_line(p: Mapping[str, Any], on_gpu: Mapping[str, Any]) -> str:
    """Which GPU memory a plan's activation offload removes and what it costs: its activations
    and step against the same plan with every activation on the GPU (`on_gpu`; cost/offload.py:
    k layers' saved activations go to the host after their forward and come back for their
    backward, on the copy engines beside the compute; one such layer stays in transit)."""
    k = p.get("plan", {}).get("activation_offload") or 0
    mem, mem0 = p.get("memory", {}), on_gpu.get("memory", {})
    t, t0 = p.get("time", {}), on_gpu.get("time", {})
    step, step0 = t.get("step_s") or 0.0, t0.get("step_s") or 0.0
    return (f"activation_offload {k}: GPU memory {gib(needed_bytes(mem0))} -> "
            f"{gib(needed_bytes(mem))} GiB (activations {gib(mem0.get('activations_bytes'))} -> "
            f"{gib(mem.get('activations_bytes'))} GiB; {gib(mem.get('host_bytes'))} GiB per GPU "
            f"on the host), +{fmt_time(step - step0)} exposed copies per step"
            + ("; without it the plan does not fit" if not on_gpu.get("fits", True) else ""))


def print_plan_report(console: Console, p: Mapping[str, Any], *, title: str,
                      num_layers: int | None = None, explain: bool = False) -> None:
    """Breakdown report of one PLAN dict (evaluate); with `explain`, limits and suggestions."""
    plan = p.get("plan", {})
    console.print(Text(title, style="bold"))
    console.print("plan: " + ", ".join(f"{k}={plan[k]}" for k in plan))
    fits = p.get("fits")
    console.print(Text("fits in memory" + risk_note(p) if fits else "DOES NOT FIT in memory",
                       style=("yellow" if risk_note(p) else "green") if fits else "bold red"))
    mt, tt = breakdown_tables(p)
    console.print(mt)
    console.print(tt)
    console.print(throughput_line(p))
    if explain:
        console.print(Text("What limits it", style="bold"))
        for line in limits(p):
            console.print(f"  - {line}")
        sug = suggestions(p, num_layers)
        if sug:
            console.print(Text("Hints", style="bold"))
            for line in sug:
                console.print(f"  - {line}")


def plans_from(evaluations: Iterable[Any]) -> list[dict[str, Any]]:
    """PLAN dicts from Evaluation objects (`.to_json()`) or dicts."""
    out: list[dict[str, Any]] = []
    for ev in evaluations:
        if isinstance(ev, Mapping):
            out.append(dict(ev))
        else:
            out.append(ev.to_json())
    return out


def stderr_console(quiet: bool = False) -> Console:
    """A rich console on stderr (quiet: prints nothing)."""
    return Console(file=safe_stream(sys.stderr), quiet=quiet, highlight=False)


def stdout_console(file: IO[str] | None = None) -> Console:
    """A rich console on stdout, wide enough for the plan table when not a terminal; plain
    ASCII where stdout cannot encode the table's characters."""
    f = file or sys.stdout
    width = None if f.isatty() else 200
    return Console(file=safe_stream(f), width=width, highlight=False)
