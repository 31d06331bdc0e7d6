"""One optimizer step as the cost model sees it: timed slices per stage, per micro-batch and
chunk, per kind of work (`autoparallel_cp/trace.py` writes them as a Chrome trace).

The step is cost/steptime.py's composition, laid out in time:

    step = pipeline + max_j exposed_dp_j + max_j optimizer_j + per_step_s,
    pipeline = m·T + B,  T = max_j t_j,  B = the schedule's bubble (cost/schedules.py:
    (Σ_j t_j - T)/vpp times its ratio, or the replay of PyTorch's V orders)

- order: each rank runs its passes in the order of the plan's schedule
  (`cost/pass_order.py`: 1F1B, interleaved, GPipe, ZB-H1/H2, ZBV, DualPipe, DualPipeV; the
  V-shaped and DualPipe orders are cost/pipeline_sim.py's action lists, the ones the bubble
  is costed with);
- placement: an event-driven replay (`replay`) with each rank's own pass times: a step starts
  when its rank is free and every pass it depends on (`pass_order.dependencies`) has ended;
  then every start is multiplied by one factor k >= 1 (`stretch`) so that the last pass
  ends at the cost model's pipeline term m·T + B (T = max_j t_j, B = steptime's bubble).
  Scaling starts by k >= 1 with durations kept preserves every dependency and every rank's
  order, so the picture respects the data flow *and* its span is the predicted step: the
  idle time between passes, drawn as "bubble", is what stretches. On the slowest rank the
  passes take m·T, so its bubble slices sum to B exactly;
- where the cost model's pipeline term is *shorter* than the replay of its own order (a closed
  form that does not describe every split of a pass exactly: ZB-H1/H2's (p-1)·max(F+B-W, F)
  and (p-1)·max(F+B-2W, F) when F, B, W differ, the handcrafted ZB-H2 order replays longer for
  some splits; the V replay's small differences of pass split), no placement with
  these durations can hold every dependency within the predicted step. The timeline then draws
  the replay as it runs and says so: `Timeline.model_gap_s` is the excess (the span is step_s
  + model_gap_s, the excess drawn as bubble on the slowest rank), reported in the trace's
  `otherData` and under the report's timeline. The cost model's numbers are not changed here
  (the solver mirrors them); the gap measures how optimistic its bubble is for the layout;
- a pass: a micro-batch's chunk takes 1/vpp of the stage's per-micro-batch time t_j, as the
  cost model charges it (steptime's (Σ_j t_j - T)/vpp, cost/schedules.py's V replay with
  half a rank's time per chunk). Drawing chunks by their layer counts (Plan.chunks_per_stage)
  would run past the predicted step even on even layouts (measured: +4.3 % for llama3-8b
  pp=4 vpp=3, chunks of 3:3:2 layers; +4.9 % for a ZBV plan with 3 to 5 layers per rank):
  the cost model does not see unequal chunks, and the picture shows its step. DualPipe's
  two lines each take the whole rank's time (steptime's mean of the mirror stages); of that,
  its pass kind's share
  (`pass_shares`: F 1/3, B 2/3 for 1F1B-style schedules, steptime.BACKWARD_SHARE; F, B, W =
  cost/pass_split.py `backward_split` for the split-backward ones); `_pass_pieces` lays out
  what the pass is made of;
- overlapped communication is drawn beside what hides it, marked `exposed = False` and in no
  sum: the ZeRO-3 weight gathers beside each pass's compute (`zero3_gather_s`), the DP sync
  beside the last backward;
- after the pipeline: each stage's DP synchronisation, its hidden part beside the last backward
  and its exposed part after it (steptime.exposed_dp), then the optimizer, then the calibrated
  fixed time.

`critical` marks the slices the step time is made of: the slowest stage's passes and bubbles,
the largest exposed DP sync, the largest optimizer step and the fixed time. Their sums by kind
are `Evaluation.time`'s breakdown (compute_s ... optimizer_s, offload_s, bubble_s + model_gap_s,
fixed_s), and the last slice ends at step_s + model_gap_s.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.memory import stage_groups, stage_layer_kinds
from autoparallel_cp.cost.pass_order import SCHEDULES, Op, dependencies, schedule_name
from autoparallel_cp.cost.pass_replay import replay, stretch
from autoparallel_cp.cost.pass_split import backward_split
from autoparallel_cp.cost.schedules import head_stage
from autoparallel_cp.cost.steptime import (
    BACKWARD_SHARE,
    StageTime,
    _dp_factors,
    exposed_dp,
    step_time,
)
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.schedules import SPLIT_BACKWARD

#: Share of a pass's compute, exposed TP/CP/EP and ZeRO-3 gathers that is forward.
FORWARD_SHARE = 1.0 - BACKWARD_SHARE

#: Breakdown keys (INTERFACE.md `time`, without `_s`/`_comm_s`) a slice's kind is one of.
KINDS = ("compute", "bubble", "tp", "cp", "ep", "pp", "dp", "optimizer", "offload", "fixed")

#: Rows of a stage, in display order.
ROWS = ("compute", "tp", "cp", "ep", "pp recv", "pp send", "dp gather", "dp reduce", "optimizer",
        "offload", "bubble")


@dataclass(frozen=True)
class Slice:
    """One timed piece of work (seconds from the step's start)."""

    stage: int
    row: str  # one of ROWS
    kind: str  # one of KINDS
    name: str
    start_s: float
    dur_s: float
    op: Op | None = None
    critical: bool = False  # on the path the step time is made of (module docstring)
    exposed: bool = True  # False: communication hidden behind compute (not in the step time)

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


Link = tuple[int, Op, int, Op]


@dataclass(frozen=True)
class Timeline:
    """The slices of one step and the numbers they add up to."""

    schedule: str
    pp: int
    vpp: int
    num_microbatches: int
    step_s: float
    pipeline_s: float
    slowest_stage: int
    slices: tuple[Slice, ...]
    #: (sender stage, its pass, receiver stage, its pass) of every cross-stage dependency
    links: tuple[Link, ...] = ()
    #: how much longer the replay of the schedule's own order is than the cost model's pipeline
    #: term (module docstring): the span is step_s + model_gap_s, the excess drawn as bubble
    model_gap_s: float = 0.0

    @property
    def span_s(self) -> float:
        return self.step_s + self.model_gap_s

    def kind_sums(self) -> dict[str, float]:
        """Seconds by kind of the critical slices: the step-time breakdown."""
        out = dict.fromkeys(KINDS, 0.0)
        for s in self.slices:
            if s.critical:
                out[s.kind] += s.dur_s
        return out


def pass_shares(job: Job, plan: Plan, schedule: str) -> dict[str, float]:
    """Share of a stage's per-micro-batch work each kind of pass does: 1F1B-style schedules
    F 1/3, B 2/3 (steptime.BACKWARD_SHARE); split-backward ones (F, B, W) =
    cost/pass_split.py `backward_split`, the shares their bubble is costed with; BW = B + W."""
    if schedule in SPLIT_BACKWARD:
        f, b, w = backward_split(job, plan)
    else:
        f, b, w = FORWARD_SHARE, BACKWARD_SHARE, 0.0
    return {"F": f, "B": b, "W": w, "BW": b + w}


def _pass_pieces(st: StageTime, phase: str, share: float, w: float
                 ) -> list[tuple[str, str, str, float]]:
    """(row, kind, name, seconds) of one pass of a stage, in the order they are drawn: the
    pass's share `w` (`pass_shares`) of the micro-batch's compute, exposed TP / CP / EP and
    ZeRO-3 gathers; half the pipeline transfer on F and half on the backward (B or BW: cost/
    sync.py p2p_factor, one activation forward, one gradient back; W sends nothing); half the
    activation offload copies after F, half before the backward; the per-micro-batch gradient
    work after the pass that ends the weight gradient (B of a 1F1B-style schedule, W, BW)."""
    names = {"F": "forward", "B": "backward", "W": "weight gradient (W)",
             "BW": "backward (B+W)"}
    if phase == "B" and w < BACKWARD_SHARE - 1e-12:
        names["B"] = "input gradient (B)"
    moves = phase != "W"
    half = 0.25 * share * st.pp_s if moves else 0.0
    off = 0.5 * share * st.offload_s if moves else 0.0
    what = "activation" if phase == "F" else "gradient"
    pieces = [("pp recv", "pp", f"pp recv ({what})", half)]
    if phase != "F":
        pieces.append(("offload", "offload", "activation reload from host", off))
    pieces += [
        ("dp gather", "dp", "ZeRO-3 weight all-gather (exposed)", w * share * st.zero3_s),
        ("compute", "compute", names[phase], w * share * st.compute_s),
        ("tp", "tp", "TP collectives (exposed)", w * share * st.tp_s),
        ("cp", "cp", "CP ring (exposed)", w * share * st.cp_s),
        ("ep", "ep", "EP all-to-all (exposed)", w * share * st.ep_s),
    ]
    if phase == "F":
        pieces.append(("offload", "offload", "activation offload to host", off))
    if phase in ("W", "BW") or (phase == "B" and w >= BACKWARD_SHARE - 1e-12):
        pieces += [
            ("dp reduce", "dp", "gradient reduce-scatter (per micro-batch)",
             share * st.grad_reduce_s),
            ("optimizer", "optimizer", "fp32 gradient accumulation", share * st.grad_accum_s),
        ]
    pieces.append(("pp send", "pp", f"pp send ({what})", half))
    return [p for p in pieces if p[3] > 0.0]


def zero3_gather_s(job: Job, plan: Plan) -> list[float]:
    """Per stage, the ZeRO-3 weight all-gathers of one micro-batch before any overlap: the
    sum over its layers of steptime.stage_times' `ag` (z3_per·dense parameters + the FSDP
    per-call latency), from the same factors (steptime._dp_factors), and of the first / last
    stage's embedding / LM head (factors.zero3_edge_s, exposed whole); StageTime.zero3_s is
    their exposed part. MTP depths are left out (drawn only: not in any sum)."""
    sync, _, unit_lat = _dp_factors(job, plan)
    groups = stage_groups(job, plan)
    out = []
    for j, (nd, nm, _, _) in enumerate(stage_layer_kinds(job, plan)):
        z3_per, lat_mb = float(sync(groups[j])[2]), float(unit_lat(groups[j])[0])
        total = 0.0
        for moe, n in ((False, nd), (True, nm)):
            if n:
                dense, _ = F.layer_param_counts(job, moe, plan.tp, plan.ep, plan.etp)
                total += n * (z3_per * float(dense) + lat_mb)
        out.append(total + _edge_gather_s(job, plan, j, groups[j]))
    return out


def _bubble(slices: list[Slice], stage: int, at: float, sec: float, critical: bool) -> float:
    """Append a bubble slice of `sec` seconds (none when empty); its length."""
    if sec <= 0.0:
        return 0.0
    slices.append(Slice(stage, "bubble", "bubble", "pipeline bubble", at, sec,
                        critical=critical))
    return sec


def _dp_name(zero: int) -> str:
    if zero == 0:
        return "DP gradient all-reduce"
    if zero >= 3:
        return "DP gradient reduce-scatter"
    return "DP gradient reduce-scatter + weight all-gather"


def timeline(job: Job, plan: Plan, options: F.CostOptions | None = None,
             schedule: str | None = None) -> Timeline:
    """The step of `plan` as timed slices (module docstring); `schedule`: a `SCHEDULES` name
    (default: the one the cost model assumes for the plan's vpp)."""
    opts = F.options_for(job, options)
    if options is not None and options != job.recipe.behaviour:
        # as cost/evaluate.py: the override becomes the recipe's behaviour, so the factors that
        # read the job's recipe (pipeline sends, DP sync) see it as the rest do
        job = job.model_copy(update={"recipe": job.recipe.model_copy(update={"behaviour": opts})})
    st = step_time(job, plan, opts)
    stages = st.stages
    pp, vpp, m = plan.pp, plan.vpp, plan.num_microbatches
    name = schedule_name(vpp, schedule if schedule is not None else plan.schedule)
    orders = [SCHEDULES[name](pp, vpp, m, j) for j in range(pp)]
    kinds = pass_shares(job, plan, name)
    s = st.slowest_stage
    pipeline = m * stages[s].total_s + st.bubble_s

    def share_of(j: int, op: Op) -> float:  # DualPipe's chunk is its line: the whole rank
        return 1.0 if name == "dualpipe" else 1.0 / vpp

    def dur(j: int, op: Op) -> float:
        return sum(p[3] for p in _pass_pieces(stages[j], op.phase, share_of(j, op),
                                              kinds[op.phase]))

    runs = replay(name, pp, vpp, orders, dur)
    k = stretch(runs, pipeline)
    gap = max(max(e for run in runs for _, _, e in run) - pipeline, 0.0)
    if gap <= 1e-9 * pipeline:  # rounding, not a gap
        gap = 0.0
    pipeline += gap
    gathers = zero3_gather_s(job, plan) if plan.zero >= 3 else [0.0] * pp
    slices: list[Slice] = []
    links: list[Link] = []
    for j, run in enumerate(runs):
        crit = j == s
        cursor = 0.0  # end of the rank's last step
        for step, a, _ in run:
            t = k * a
            _bubble(slices, j, cursor, t - cursor, crit)
            pair = len(step) > 1
            for op in step:
                share = share_of(j, op)
                for row, kind, label, sec in _pass_pieces(stages[j], op.phase, share,
                                                          kinds[op.phase]):
                    if pair and row == "compute":
                        label += " (F&B overlapped pair)"
                    slices.append(Slice(j, row, kind, label, t, sec, op=op, critical=crit))
                    if row == "compute" and gathers[j] > 0:  # the gathers hidden behind it
                        slices.append(Slice(j, "dp gather", "dp",
                                            "ZeRO-3 weight all-gather (overlapped)", t,
                                            min(kinds[op.phase] * share * gathers[j], sec),
                                            op=op, exposed=False))
                    t += sec
                for r, i, c, what in dependencies(name, pp, vpp, j, op):
                    if r != j:
                        links.append((r, Op(i, c, _SENDER[what]), j, op))
            cursor = t
        _bubble(slices, j, cursor, pipeline - cursor, crit)
    grad = {(r, x.microbatch, x.chunk): x for r, run in enumerate(runs)
            for step, _, _ in run for x in step if x.phase in ("B", "BW")}
    links = [(r, grad.get((r, op.microbatch, op.chunk), op) if op.phase == "B" else op, j, to)
             for r, op, j, to in links]  # a gradient's sender is the B or BW that made it

    # after the pipeline: DP sync (hidden part beside the last backward), optimizer, fixed
    exposed = [exposed_dp(x, opts.dp_overlap) for x in stages]
    e_max = max(exposed)
    e_at = exposed.index(e_max)
    o_max = max(x.optimizer_s for x in stages)
    o_at = [x.optimizer_s for x in stages].index(o_max)
    dp_name = _dp_name(plan.zero)
    for j, x in enumerate(stages):
        hidden = x.dp_sync_s - exposed[j]
        if hidden > 0:
            slices.append(Slice(j, "dp reduce", "dp", f"{dp_name} (overlapped)",
                                pipeline - hidden, hidden, exposed=False))
        if exposed[j] > 0:
            slices.append(Slice(j, "dp reduce", "dp", f"{dp_name} (exposed)", pipeline,
                                exposed[j], critical=j == e_at))
        if x.optimizer_s > 0:
            slices.append(Slice(j, "optimizer", "optimizer", "optimizer step",
                                pipeline + e_max, x.optimizer_s, critical=j == o_at))
    if st.fixed_s > 0:
        slices.append(Slice(s, "optimizer", "fixed", "fixed per-step time (calibrated)",
                            pipeline + e_max + o_max, st.fixed_s, critical=True))
    return Timeline(schedule=name, pp=pp, vpp=vpp, num_microbatches=m, step_s=st.step_s,
                    pipeline_s=pipeline, slowest_stage=s, slices=tuple(slices),
                    links=tuple(links), model_gap_s=gap)


_SENDER = {"F": "F", "G": "B", "W": "W"}


def _edge_gather_s(job: Job, plan: Plan, j: int, g: int) -> float:
    """The embedding's (stage 0) and LM head's (last stage) ZeRO-3 term of stage `j`."""
    if plan.zero < 3:
        return 0.0
    ef = F.edge_factors(job, g, plan.tp, plan.cp, plan.sp, plan.mbs)
    args = (plan.tp, plan.cp, plan.dp, plan.zero, plan.dp_replicate)
    t = 0.0
    if j == 0:
        t += float(F.zero3_edge_s(job, g, float(ef.emb_params), *args))
    if j == head_stage(plan):
        t += float(F.zero3_edge_s(job, g, float(ef.head_params), *args))
    return t
