"""One step of a plan as a Chrome trace (the Trace Event Format's JSON object form, which
Perfetto's ui.perfetto.dev "Open trace file" and chrome://tracing open, and `torch.profiler`'s
`export_chrome_trace` writes): `{"traceEvents": [...], "displayTimeUnit": "ms"}`.

A process (pid) per pipeline stage, named by the ranks it holds (pipeline parallelism is the
outermost dimension of Megatron-LM's default rank order tp-cp-ep-dp-pp and of torchtitan's
device mesh, so stage j holds ranks [j·N/pp, (j+1)·N/pp)); a thread (tid) per row of
`cost/timeline.py` (compute, TP, CP, EP, PP recv / send, DP gather / reduce, optimizer, host
offload, bubble). Every slice is a complete event (`ph: "X"`, `ts`/`dur` in microseconds; a
pass's `args` name its micro-batch, chunk, pass kind and, where torch's pipelining runtime runs
the schedule, its profiler range `profiler_range`); `ph: "M"`
metadata events name the processes and threads and fix their order; flow events (`ph: "s"` /
`"f"`) draw the pipeline's sends as arrows from stage to stage.
"""

from __future__ import annotations

import json
from typing import Any

from autoparallel_cp.cost.pass_order import Op, place
from autoparallel_cp.cost.timeline import ROWS, Timeline, timeline
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.schedules import SPLIT_BACKWARD

#: Thread names of the rows (`timeline.ROWS`).
ROW_NAMES = {
    "compute": "compute", "tp": "TP comm", "cp": "CP comm", "ep": "EP comm",
    "pp recv": "PP recv", "pp send": "PP send", "dp gather": "DP gather",
    "dp reduce": "DP reduce", "optimizer": "optimizer", "offload": "host offload",
    "bubble": "bubble / idle",
}
#: Required keys of a complete event and their types (Trace Event Format, "Complete Events").
REQUIRED: dict[str, type | tuple[type, ...]] = {
    "name": str, "ph": str, "ts": (int, float), "dur": (int, float), "pid": int, "tid": int}
STEP_TID = 0  # a row holding one slice for the whole step (like torch.profiler's ProfilerStep)


def stage_ranks(job: Job, plan: Plan, stage: int) -> tuple[int, int]:
    """First and last global rank of a pipeline stage (pp outermost, see module docstring)."""
    n = job.num_gpus // plan.pp
    return stage * n, (stage + 1) * n - 1


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def trace_events(job: Job, plan: Plan, tl: Timeline) -> list[dict[str, Any]]:
    """The events of a timeline: metadata first, then the slices in time order."""
    events: list[dict[str, Any]] = []
    for j in range(plan.pp):
        lo, hi = stage_ranks(job, plan, j)
        ranks = f"rank {lo}" if lo == hi else f"ranks {lo}-{hi}"
        slow = ", slowest" if j == tl.slowest_stage else ""
        pid = j + 1
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": STEP_TID, "ts": 0,
                       "args": {"name": f"stage {j} ({ranks}){slow}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": STEP_TID,
                       "ts": 0, "args": {"sort_index": j}})
        for tid, row in enumerate(("step", *ROWS)):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "ts": 0,
                           "args": {"name": ROW_NAMES.get(row, row)}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                           "ts": 0, "args": {"sort_index": tid}})
        events.append({"name": f"step ({tl.schedule}, {tl.num_microbatches} micro-batches)",
                       "cat": "step", "ph": "X", "ts": 0.0, "dur": _us(tl.span_s), "pid": pid,
                       "tid": STEP_TID, "args": {"step_s": tl.step_s,
                                                 "model_gap_s": tl.model_gap_s}})
    tids = {row: k + 1 for k, row in enumerate(ROWS)}
    for s in sorted(tl.slices, key=lambda x: (x.start_s, x.stage, tids[x.row])):
        args: dict[str, Any] = {"critical": s.critical, "exposed": s.exposed,
                                "seconds": s.dur_s}
        name = s.name
        if s.op is not None:
            args |= {"microbatch": s.op.microbatch, "chunk": s.op.chunk, "pass": s.op.phase}
            torch_range = profiler_range(tl, s.stage, s.op)
            if torch_range:
                args["profiler_range"] = torch_range
            chunk = (f" c{s.op.chunk}" if plan.vpp > 1 else
                     f" line {s.op.chunk}" if tl.schedule == "dualpipe" else "")
            name = f"{s.op.phase}{s.op.microbatch}{chunk} {s.name}"
        events.append({"name": name, "cat": s.kind, "ph": "X", "ts": _us(s.start_s),
                       "dur": _us(s.dur_s), "pid": s.stage + 1, "tid": tids[s.row],
                       "args": args})
    return events + flow_events(tl, tids["compute"])


#: torch.distributed.pipelining's computation type of each pass (torch v2.13.0
#: schedules.py `_ComputationType`: F, I input gradient, W weight gradient, B full backward)
_TORCH_TYPE = {"F": "F", "W": "W", "BW": "B"}


def profiler_range(tl: Timeline, stage: int, op: Op) -> str | None:
    """The `record_function` range torch.distributed.pipelining opens for this pass,
    `PP:{stage index}{type}{micro-batch}` (torch v2.13.0 schedules.py
    `_get_profiler_function_name`, opened by the multi-stage runtime that runs
    ScheduleInterleaved1F1B, ScheduleZBVZeroBubble and ScheduleDualPipeV); None for the
    others (torch's single-stage schedules open no such range; ZB-H1/H2 run in the paper's
    Megatron fork, DualPipe in DeepSeek's repository)."""
    if tl.schedule not in ("interleaved", "zbv", "dualpipev"):
        return None
    kind = _TORCH_TYPE.get(op.phase) or ("I" if tl.schedule in SPLIT_BACKWARD else "B")
    _, index = place(tl.schedule, tl.pp, tl.vpp, stage, op.chunk)
    return f"PP:{index}{kind}{op.microbatch}"


def flow_events(tl: Timeline, tid: int) -> list[dict[str, Any]]:
    """Arrows from each pass to the pass on another stage that waits for it (the activation
    sent forward, the gradient sent back: `Timeline.links`): legacy flow events, a start
    (`ph: "s"`) inside the sender's compute slice and an end (`ph: "f"`, `bp: "e"`) inside the
    receiver's, each bound to its enclosing slice."""
    mid = {(s.stage, s.op): _us(s.start_s + s.dur_s / 2) for s in tl.slices
           if s.op is not None and s.row == "compute" and s.exposed}
    out: list[dict[str, Any]] = []
    for r_from, op_from, stage, op in sorted(tl.links):
        dep = (r_from, op_from)
        if dep not in mid or (stage, op) not in mid:
            continue
        ts = mid[stage, op]
        what = "activation" if op.phase == "F" else "gradient"
        ident = len(out) // 2 + 1
        out.append({"name": what, "cat": "pp", "ph": "s", "id": ident, "ts": mid[dep],
                    "pid": dep[0] + 1, "tid": tid})
        out.append({"name": what, "cat": "pp", "ph": "f", "bp": "e", "id": ident, "ts": ts,
                    "pid": stage + 1, "tid": tid})
    return out


def chrome_trace(job: Job, plan: Plan, evaluation: dict[str, Any] | None = None,
                 tl: Timeline | None = None) -> dict[str, Any]:
    """The trace object of one step of `plan` (`evaluation`: its PLAN JSON, kept in
    `otherData` beside the breakdown the critical slices add up to)."""
    tl = tl if tl is not None else timeline(job, plan)
    other: dict[str, Any] = {
        "tool": "ap-solve", "plan": plan.short(), "schedule": tl.schedule,
        "step_s": tl.step_s, "slowest_stage": tl.slowest_stage,
        "model_gap_s": tl.model_gap_s,
        "critical_path_s_by_kind": tl.kind_sums(),
        "note": "predicted by the cost model, not measured; args.critical marks the slices "
                "the step time is made of",
    }
    if evaluation is not None:
        other["time"] = evaluation.get("time")
    return {"traceEvents": trace_events(job, plan, tl), "displayTimeUnit": "ms",
            "otherData": other}


def trace_json(job: Job, plan: Plan, evaluation: dict[str, Any] | None = None) -> str:
    """`chrome_trace` as compact JSON text (traces hold many thousand events)."""
    return json.dumps(chrome_trace(job, plan, evaluation), separators=(",", ":"),
                      allow_nan=False) + "\n"


def check_events(trace: dict[str, Any]) -> list[str]:
    """Problems of a trace object against the Trace Event Format: every event has a string
    `ph`, `pid`/`tid` integers; complete events (`X`) the keys and types of `REQUIRED` with
    `ts`, `dur` >= 0; metadata events (`M`) a `name` and `args`. Empty when it is well formed."""
    bad: list[str] = []
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["traceEvents is not a list"]
    for k, e in enumerate(events):
        ph = e.get("ph")
        if ph == "X":
            for key, typ in REQUIRED.items():
                if not isinstance(e.get(key), typ) or isinstance(e.get(key), bool):
                    bad.append(f"event {k}: {key!r} missing or not {typ}")
            if isinstance(e.get("ts"), (int, float)) and e["ts"] < 0:
                bad.append(f"event {k}: negative ts")
            if isinstance(e.get("dur"), (int, float)) and e["dur"] < 0:
                bad.append(f"event {k}: negative dur")
        elif ph in ("s", "f"):
            for key in ("id", "ts", "pid", "tid"):
                if not isinstance(e.get(key), (int, float)) or isinstance(e.get(key), bool):
                    bad.append(f"event {k}: flow without {key!r}")
        elif ph == "M":
            if not isinstance(e.get("name"), str) or not isinstance(e.get("args"), dict):
                bad.append(f"event {k}: metadata without name or args")
            if not isinstance(e.get("pid"), int):
                bad.append(f"event {k}: 'pid' missing")
        else:
            bad.append(f"event {k}: unexpected ph {ph!r}")
    return bad
