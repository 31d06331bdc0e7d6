"""One optimizer step as the cost model sees it: timed slices per stage, per micro-batch and
chunk, per kind of work (`autoparallel_cp/trace.py` writes them as a Chrome trace).

The step is cost/steptime.py's composition, laid out in time:

    step = pipeline + max_j exposed_dp_j + max_j optimizer_j + per_step_s,
    pipeline = m·T + B,  T = max_j t_j,  B = (Σ_j t_j - T)/vpp

- order: each stage runs its passes in the order of the plan's schedule (`cost/pass_order.py`);
  their positions come from an ideal run of that order in which every stage takes the
  slowest stage's time (each pass starts when its stage is free and the pass it depends on,
  `schedules.depends_on`, has finished). Each pass then owns a *slot* of its ideal duration;
- pace: the slowest stage s sets it (steptime: "the slowest stage sets the pace"): a slot lasts
  its share of T; a faster stage works its own share of t_j at the slot's start and waits the
  rest (a gap in its rows);
- bubble: the ideal run's idle time of a stage (fill, round trip, drain) is drawn as "bubble"
  slices scaled so that they sum to the cost model's B on every stage (the fill and drain
  charge each other stage's t_j/vpp, not T/vpp); every stage's pipeline phase thus ends at
  m·T + B;
- a pass: a micro-batch's chunk c takes σ_c = (layers of chunk c)/(layers of the stage) of the
  stage's per-micro-batch time (model chunks of unequal layer counts, Plan.chunks_per_stage;
  steptime charges them through the stage totals alone, so does this); forward and backward
  split the compute, the exposed TP / CP / EP communication and the ZeRO-3 gathers 1/3 : 2/3
  (steptime.BACKWARD_SHARE: 2 of the 3 GEMM passes are backward), the pipeline sends 1/2 : 1/2
  (cost/sync.py p2p_factor: one activation forward, one gradient back), and the per-micro-batch
  gradient work (ZeRO-2 reduce-scatter, BF16_Optimizer accumulation) follows the backward;
- overlapped communication is drawn beside what hides it, marked `exposed = False` and in no
  sum: the ZeRO-3 weight gathers beside each pass's compute (`zero3_gather_s`), the DP sync
  beside the last backward;
- after the pipeline: each stage's DP synchronisation, its hidden part beside the last backward
  and its exposed part after it (steptime.exposed_dp), then the optimizer, then the calibrated
  fixed time.

`critical` marks the slices the step time is made of: the slowest stage's passes and bubbles,
the largest exposed DP sync, the largest optimizer step and the fixed time. Their sums by kind
are `Evaluation.time`'s breakdown (compute_s ... optimizer_s, bubble_s, fixed_s), and the last
slice ends at step_s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.memory import stage_groups, stage_layer_kinds
from autoparallel_cp.cost.pass_order import SCHEDULES, Op, depends_on, schedule_name
from autoparallel_cp.cost.steptime import (
    BACKWARD_SHARE,
    StageTime,
    _dp_factors,
    exposed_dp,
    step_time,
)
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan

#: Share of a pass's compute, exposed TP/CP/EP and ZeRO-3 gathers that is forward.
FORWARD_SHARE = 1.0 - BACKWARD_SHARE

#: Breakdown keys (INTERFACE.md `time`, without `_s`/`_comm_s`) a slice's kind is one of.
KINDS = ("compute", "bubble", "tp", "cp", "ep", "pp", "dp", "optimizer", "fixed")

#: Rows of a stage, in display order.
ROWS = ("compute", "tp", "cp", "ep", "pp recv", "pp send", "dp gather", "dp reduce", "optimizer",
        "bubble")


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

    def kind_sums(self) -> dict[str, float]:
        """Seconds by kind of the critical slices: the step-time breakdown."""
        out = dict.fromkeys(KINDS, 0.0)
        for s in self.slices:
            if s.critical:
                out[s.kind] += s.dur_s
        return out


def _pass_pieces(st: StageTime, phase: str, share: float
                 ) -> list[tuple[str, str, str, float]]:
    """(row, kind, name, seconds) of one pass of a stage, in the order they are drawn."""
    w = FORWARD_SHARE if phase == "F" else BACKWARD_SHARE
    half = 0.25 * share * st.pp_s  # the pass's send (recv) half of its pipeline transfer
    what = "forward" if phase == "F" else "backward"
    pieces = [
        ("pp recv", "pp", f"pp recv ({'activation' if phase == 'F' else 'gradient'})", half),
        ("dp gather", "dp", "ZeRO-3 weight all-gather (exposed)", w * share * st.zero3_s),
        ("compute", "compute", what, w * share * st.compute_s),
        ("tp", "tp", "TP collectives (exposed)", w * share * st.tp_s),
        ("cp", "cp", "CP ring (exposed)", w * share * st.cp_s),
        ("ep", "ep", "EP all-to-all (exposed)", w * share * st.ep_s),
    ]
    if phase == "B":
        pieces += [
            ("dp reduce", "dp", "gradient reduce-scatter (per micro-batch)",
             share * st.grad_reduce_s),
            ("optimizer", "optimizer", "fp32 gradient accumulation", share * st.grad_accum_s),
        ]
    pieces.append(("pp send", "pp",
                   f"pp send ({'activation' if phase == 'F' else 'gradient'})", half))
    return [p for p in pieces if p[3] > 0.0]


def _pass_time(st: StageTime, phase: str, share: float) -> float:
    return sum(p[3] for p in _pass_pieces(st, phase, share))


def ideal_run(orders: Sequence[Sequence[Op]], pp: int, vpp: int,
              dur: Sequence[dict[tuple[int, str], float]]
              ) -> list[list[tuple[Op, float, float]]]:
    """Start and duration of every pass when each starts as soon as its stage is free and
    its dependency (`schedules.depends_on`) has finished; `dur[j][(chunk, phase)]`. Raises
    ValueError when the orders deadlock (a schedule bug)."""
    end: dict[tuple[int, Op], float] = {}
    free = [0.0] * pp
    ptr = [0] * pp
    out: list[list[tuple[Op, float, float]]] = [[] for _ in range(pp)]
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for j in range(pp):
            while ptr[j] < len(orders[j]):
                op = orders[j][ptr[j]]
                dep = depends_on(op, j, pp, vpp)
                if dep is not None and dep not in end:
                    break
                start = max(free[j], end[dep] if dep is not None else 0.0)
                d = dur[j][(op.chunk, op.phase)]
                end[(j, op)] = free[j] = start + d
                out[j].append((op, start, d))
                ptr[j] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError("pipeline schedule deadlocks: a pass waits for one never run")
    return out


def zero3_gather_s(job: Job, plan: Plan) -> list[float]:
    """Per stage, the ZeRO-3 weight all-gathers of one micro-batch before any overlap: the
    sum over its layers of steptime.stage_times' `ag` (z3_per·dense parameters + the FSDP
    per-call latency), from the same factors (steptime._dp_factors); StageTime.zero3_s is
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
        out.append(total)
    return out


def _chunk_shares(job: Job, plan: Plan) -> list[tuple[float, ...]]:
    out = []
    for chunks in plan.chunks_per_stage(job.model.num_layers):
        n = sum(chunks)
        out.append(tuple(c / n for c in chunks) if n else (1.0 / plan.vpp,) * plan.vpp)
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
    # a plan's own `schedule` field, where the spec has one, names its order
    name = schedule_name(vpp, schedule if schedule is not None
                         else getattr(plan, "schedule", None))
    order_of = SCHEDULES[name]
    orders = [order_of(pp, vpp, m, j) for j in range(pp)]
    shares = _chunk_shares(job, plan)
    s = st.slowest_stage
    pace = stages[s].total_s
    bubble = st.bubble_s
    # the ideal run: every stage takes the slowest stage's split (unit = T per micro-batch)
    f_share = _pass_time(stages[s], "F", 1.0) / pace if pace > 0 else FORWARD_SHARE
    unit = [{(c, ph): sh * (f_share if ph == "F" else 1.0 - f_share)
             for c, sh in enumerate(shares[j]) for ph in ("F", "B")} for j in range(pp)]
    ideal = ideal_run(orders, pp, vpp, unit)
    span = max((a + d for runs in ideal for _, a, d in runs), default=0.0)
    pipeline = m * pace + bubble

    gathers = zero3_gather_s(job, plan) if plan.zero >= 3 else [0.0] * pp
    slices: list[Slice] = []
    for j, runs in enumerate(ideal):
        crit = j == s
        idle = span - sum(d for _, _, d in runs)
        scale = bubble / idle if idle > 0 else 0.0  # unit idle -> seconds of bubble
        cursor = 0.0  # end of the last slot (seconds)
        busy_until = 0.0  # end of the stage's own work
        prev = 0.0  # end of the last pass in the ideal run (units)

        if idle <= 0 and bubble > 0:  # no idle in the ideal run: the bubble comes first
            slices.append(Slice(j, "bubble", "bubble", "pipeline bubble", 0.0, bubble,
                                critical=crit))
            cursor = busy_until = bubble
        for op, a, d in runs:
            cursor += _bubble(slices, j, cursor, (a - prev) * scale, crit)
            start = max(cursor, busy_until)
            t = start
            share = shares[j][op.chunk]
            for row, kind, label, sec in _pass_pieces(stages[j], op.phase, share):
                slices.append(Slice(j, row, kind, label, t, sec, op=op, critical=crit))
                if row == "compute" and gathers[j] > 0:  # the gathers hidden behind it
                    w = FORWARD_SHARE if op.phase == "F" else BACKWARD_SHARE
                    slices.append(Slice(j, "dp gather", "dp",
                                        "ZeRO-3 weight all-gather (overlapped)", t,
                                        min(w * share * gathers[j], sec), op=op,
                                        exposed=False))
                t += sec
            busy_until = t
            cursor += d * pace
            prev = a + d
        _bubble(slices, j, cursor, (span - prev) * scale, crit)

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
                    pipeline_s=pipeline, slowest_stage=s, slices=tuple(slices))
