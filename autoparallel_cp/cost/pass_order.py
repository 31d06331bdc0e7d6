"""Pipeline schedules as per-rank pass orders: what `cost/timeline.py` replays and draws.

A schedule is one function `(pp, vpp, m, rank) -> [Step, ...]`: the order in which a rank runs
the passes of its model chunks for the step's m micro-batches; a step is one pass, or two run
together (DualPipe's overlapped forward-backward pair, "F&B"). Passes (`Op.phase`):
"F" forward, "B" backward (the input gradient alone where the schedule splits it), "W" the
weight gradient of a split backward (Qi et al. arXiv 2401.10241 §2), "BW" a full backward in a
split schedule (DualPipe's backward without zero bubble). The V-shaped and DualPipe orders are
cost/pipeline_sim.py's action lists (torch v2.13.0 / deepseek-ai/DualPipe), the ones
cost/schedules.py replays for their bubble: one source for the cost and the picture.

Dependencies (`dependencies`) are the data flow along a *line* of stages: a forward needs the
previous stage's forward of the micro-batch, a backward (B or BW) the next stage's backward
(the line's last stage its own forward, the loss) and its own forward, a W its own B. Stage
`s` of line `d` sits on the rank and chunk `place` names (Megatron's interleaving: chunk c of
rank r is stage c·pp + r; a V: stage r and 2pp-1-r; DualPipe: two lines, rank r stage r of
line 0 and stage pp-1-r of line 1, `Op.chunk` the line).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autoparallel_cp.cost.pipeline_sim import Action, dualpipev_actions, zbv_actions
from autoparallel_cp.cost.pipeline_sim import Step as Step_
from autoparallel_cp.spec.schedules import default_schedule, schedule_violations
from autoparallel_cp.spec.splits import microbatch_group


@dataclass(frozen=True, order=True)
class Op:
    """One pass of one micro-batch through one model chunk of a stage."""

    microbatch: int
    chunk: int
    phase: str  # "F", "B", "W" or "BW" (module docstring)


Step = tuple[Op, ...]  # one pass, or an overlapped (forward, backward) pair
Schedule = Callable[[int, int, int, int], list[Step]]


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


def _zero_bubble_h(pp: int, m: int, stage: int, warm: int, lag: int) -> list[Op]:
    """ZB-H1 / ZB-H2 on `stage` with `warm` warm-up forwards (Qi et al. 2401.10241 §2.1-2.2,
    Figure 3): then F and B (input gradient) alternate as in 1F1B, each B followed by the W of
    the oldest micro-batch whose W is pending once `lag` of them are held back (the later
    stages defer more, so that their B reaches upstream sooner); in the cool-down each B is
    followed by a W, and the W left run last, filling the drain."""
    order = [Op(i, 0, "F") for i in range(warm)]
    w = 0
    for k in range(m - warm):
        order += [Op(warm + k, 0, "F"), Op(k, 0, "B")]
        if k + 1 - w > lag:
            order.append(Op(w, 0, "W"))
            w += 1
    for k in range(m - warm, m):
        order.append(Op(k, 0, "B"))
        if w <= k:
            order.append(Op(w, 0, "W"))
            w += 1
    return order + [Op(i, 0, "W") for i in range(w, m)]


def zb_h1(pp: int, vpp: int, m: int, stage: int) -> list[Op]:
    """ZB-H1: 1F1B's min(pp - stage - 1, m) warm-up forwards (Qi §2.1: the same peak memory
    as 1F1B), W passes deferred into the drain (`_zero_bubble_h`)."""
    if vpp != 1:
        raise ValueError("ZB-H1 runs one model chunk per stage (vpp = 1)")
    return _zero_bubble_h(pp, m, stage, min(pp - stage - 1, m), stage)


def zb_h2(pp: int, vpp: int, m: int, stage: int) -> list[Op]:
    """ZB-H2: min(2(pp - stage) - 2, m) warm-up forwards, 2(pp - stage) - 1 before the first
    B (Qi §2.2, Figure 3: the extra forwards fill the fill bubble) and 2·stage W held back,
    so that every stage holds 2pp - 1 micro-batches' inputs at its peak (Qi Table 1's
    (2p-1)·M_B; a held W's inputs counted whole). Its replay for equal stages is
    cost/schedules.py's (p-1)·max(F+B-2W, B-F, F): the paper's F+B-2W, the last rank's ramp
    F, and the first rank's wait for its first B, (p-1)(B-F) beyond its 2p-1 forwards
    (tests/cost/test_schedules.py checks the two agree)."""
    if vpp != 1:
        raise ValueError("ZB-H2 runs one model chunk per stage (vpp = 1)")
    return _zero_bubble_h(pp, m, stage, min(2 * (pp - stage) - 2, m), 2 * stage)


_KIND = {"F": "F", "I": "B", "W": "W", "B": "BW"}


def _from_actions(actions: list[Step_], chunk_of: Callable[[int], int]) -> list[Step]:
    """cost/pipeline_sim.py actions as steps: I -> B, a full B -> BW, FB -> a pair."""
    def op(a: Action) -> Op:
        return Op(a[2], chunk_of(a[1]), _KIND[a[0]])
    out: list[Step] = []
    for a in actions:
        if a[0] == "FB":
            out.append((op(a[1]), op(a[2])))  # type: ignore[arg-type]
        else:
            out.append((op(a),))  # type: ignore[arg-type]
    return out


def zbv(pp: int, vpp: int, m: int, stage: int) -> list[Step]:
    """PyTorch's ScheduleZBVZeroBubble order (pipeline_sim.zbv_actions); chunk 0 is stage
    `stage` of the V, chunk 1 stage 2pp - 1 - stage."""
    if vpp != 2:
        raise ValueError("ZBV runs two model chunks per rank (vpp = 2)")
    return _from_actions(list(zbv_actions(pp, stage, m)), lambda s: 0 if s == stage else 1)


def dualpipev(pp: int, vpp: int, m: int, stage: int) -> list[Step]:
    """PyTorch's ScheduleDualPipeV order (pipeline_sim.dualpipev_actions), chunks as `zbv`."""
    if vpp != 2:
        raise ValueError("DualPipeV runs two model chunks per rank (vpp = 2)")
    return _from_actions(dualpipev_actions(pp, stage, m), lambda s: 0 if s == stage else 1)


def dualpipe(pp: int, vpp: int, m: int, stage: int) -> list[Step]:
    """DeepSeek's DualPipe (deepseek-ai/DualPipe dualpipe.py `DualPipe.step`, 2412.19437
    §3.2.1): m/2 micro-batches enter at each end. Its eight steps are DualPipeV's with the pp/2
    ranks of a half and m/2 micro-batches (DualPipeV is DualPipe cut in half, the DualPipe
    README): rank r runs `dualpipev_actions(pp/2, h, m/2)` with h = min(r, pp-1-r), the V's
    chunk 0 being its "phase 0" (the line on which it sits h stages from the start: line 0 on
    the first half of the ranks, line 1 on the second) and chunk 1 the other line. `Op.chunk`
    is the line."""
    if vpp != 1 or pp % 2 or m % 2:
        raise ValueError("DualPipe runs one chunk per rank, an even pp and an even m")
    h = min(stage, pp - 1 - stage)
    first = 0 if stage < pp // 2 else 1
    return _from_actions(dualpipev_actions(pp // 2, h, m // 2),
                         lambda s: first if s == h else 1 - first)


def _steps(order_of: Callable[[int, int, int, int], list[Op]]) -> Schedule:
    def run(pp: int, vpp: int, m: int, stage: int) -> list[Step]:
        return [(op,) for op in order_of(pp, vpp, m, stage)]
    run.__doc__ = order_of.__doc__
    return run


#: Per-rank pass orders by plan schedule name (spec/schedules.py).
SCHEDULES: dict[str, Schedule] = {
    "1f1b": _steps(one_f_one_b), "interleaved": _steps(interleaved_1f1b),
    "gpipe": _steps(gpipe), "zb-h1": _steps(zb_h1), "zb-h2": _steps(zb_h2), "zbv": zbv,
    "dualpipe": dualpipe, "dualpipev": dualpipev}


def schedule_name(vpp: int, requested: str | None = None) -> str:
    """The schedule of a plan: `requested` when it is one of `SCHEDULES` and legal for the
    plan's vpp (spec/schedules.py), else the default one for that vpp."""
    if requested == "interleaved-1f1b":  # this module's former name
        requested = "interleaved"
    if requested in SCHEDULES and not [v for v in schedule_violations(requested, 2, vpp, 10**6)
                                       if "vpp" in v]:
        return str(requested)
    return default_schedule(vpp)


def lines(schedule: str, pp: int, vpp: int) -> tuple[int, int]:
    """(lines, stages per line) of a schedule's data flow (module docstring)."""
    if schedule == "dualpipe":
        return 2, pp
    return 1, pp * vpp


def place(schedule: str, pp: int, vpp: int, rank: int, chunk: int) -> tuple[int, int]:
    """(line, stage along it) of `rank`'s chunk `chunk` (module docstring)."""
    if schedule == "dualpipe":
        return chunk, rank if chunk == 0 else pp - 1 - rank
    if schedule in ("zbv", "dualpipev"):
        return 0, rank if chunk == 0 else 2 * pp - 1 - rank
    return 0, chunk * pp + rank


def holder(schedule: str, pp: int, vpp: int, line: int, s: int) -> tuple[int, int]:
    """(rank, chunk) holding stage `s` of `line`: `place`'s inverse."""
    if schedule == "dualpipe":
        return (s, 0) if line == 0 else (pp - 1 - s, 1)
    if schedule in ("zbv", "dualpipev"):
        return (s, 0) if s < pp else (2 * pp - 1 - s, 1)
    return s % pp, s // pp


#: What a pass makes ready for others: "F" its activation, "G" its input gradient, "W" done.
Ready = tuple[int, int, int, str]  # (rank, micro-batch, chunk, "F" | "G" | "W")


def produces(op: Op, rank: int) -> Ready:
    """The readiness key `op` on `rank` sets when it ends."""
    what = {"F": "F", "B": "G", "BW": "G", "W": "W"}[op.phase]
    return rank, op.microbatch, op.chunk, what


def dependencies(schedule: str, pp: int, vpp: int, rank: int, op: Op) -> list[Ready]:
    """The readiness keys (`produces`) `op` on `rank` waits for (module docstring)."""
    i, c = op.microbatch, op.chunk
    line, s = place(schedule, pp, vpp, rank, c)
    n = lines(schedule, pp, vpp)[1]
    if op.phase == "F":
        if s == 0:
            return []
        r, cc = holder(schedule, pp, vpp, line, s - 1)
        return [(r, i, cc, "F")]
    if op.phase == "W":
        return [(rank, i, c, "G")]
    own = (rank, i, c, "F")
    if s == n - 1:
        return [own]
    r, cc = holder(schedule, pp, vpp, line, s + 1)
    return [own, (r, i, cc, "G")]


def depends_on(op: Op, stage: int, pp: int, vpp: int) -> tuple[int, Op] | None:
    """(stage, op) that must finish before `op` can start on `stage` under 1F1B or Megatron's
    interleaving, None for the first forward (`dependencies` for every schedule)."""
    sched = "1f1b" if vpp == 1 else "interleaved"
    deps = dependencies(sched, pp, vpp, stage, op)
    if not deps:
        return None
    r, i, c, what = deps[-1]
    return r, Op(i, c, "F" if what == "F" else "B")
