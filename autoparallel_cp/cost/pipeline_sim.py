"""Makespan of a pipeline schedule as PyTorch runs it: the per-rank action lists of
torch.distributed.pipelining (torch v2.13.0 torch/distributed/pipelining/schedules.py) replayed
with each action's duration and its data dependencies (cost/schedules.py uses it for the
V-shaped schedules, whose real order the papers' closed forms do not describe).

Actions, per stage s (model chunk) and micro-batch i: F (forward; needs F(s-1, i)), I (input
gradient; needs F(s, i) and the next stage's input gradient I(s+1, i)), W (weight gradient;
needs I(s, i)), B (full backward = I then W in one action), FB (a forward and a full backward of
two micro-batches run together: DualPipeV's OVERLAP_F_B; it takes the sum of both, its
all-to-all hidden: cost/schedules.py `ep_hidden_share`). A rank runs its list in order, each
action when the rank is free and its inputs are ready; sends take no time here (the stage times
carry the pipeline p2p: steptime.py). The makespan is the last action's end.

Stages of a V (torch `generate_stage_to_rank_mapping(style="v")`): rank r holds stage r
(chunk 0) and stage 2p-1-r (chunk 1).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

# the step DAG (its numbering and fields): cost/step_dag.py
from autoparallel_cp.cost.step_dag import Action, Dag, Step, compile_dag


def zbv_actions(p: int, rank: int, m: int) -> list[Action]:
    """`ScheduleZBVZeroBubble._calculate_single_rank_operations` (schedules.py:3268-3390):
    warm-up 2(p-r)-1 F0, r x (F1 F0), p-r x (F1 I1 W1); steady F0 I0 W0 F1 I1 W1; cool-down
    r x (I0 I1), p-r x (I0 W0), then the W1 and W0 left; micro-batches >= m dropped."""
    n = max(2 * p - 1, m)
    s0, s1 = rank, 2 * p - 1 - rank
    out: list[Action] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - rank) - 1):
        out.append(("F", s0, f0))
        f0 += 1
    for _ in range(rank):
        out += [("F", s1, f1), ("F", s0, f0)]
        f1 += 1
        f0 += 1
    for _ in range(p - rank):
        out += [("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
        f1 += 1
        b1 += 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            out.append(("F", s0, f0))
            f0 += 1
        out += [("I", s0, b0), ("W", s0, b0), ("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
        b0 += 1
        f1 += 1
        b1 += 1
    w0, w1 = b0, b1
    for _ in range(rank):
        out += [("I", s0, b0), ("I", s1, b1)]
        b0 += 1
        b1 += 1
    for _ in range(p - rank):
        out += [("I", s0, b0), ("W", s0, w0)]
        b0 += 1
        w0 += 1
    out += [("W", s1, i) for i in range(w1, b1)] + [("W", s0, i) for i in range(w0, b0)]
    return [a for a in out if a[2] < m]


def dualpipev_actions(p: int, rank: int, m: int) -> list[Step]:
    """`ScheduleDualPipeV._calculate_single_rank_operations` (schedules.py:3459-3617): steps
    1-8 (F0; F0 F1; I1 W F1; the overlapped F0B1 / F1B0 pairs; B1 F1B0; B1 B0 with the second
    half input-only; W B0; W), W actions taken from a queue of pending input-gradient-only
    backwards, oldest first."""
    s0, s1 = rank, 2 * p - 1 - rank
    cnt: dict[tuple[int, str], int] = {}
    queue: list[tuple[int, int]] = []
    out: list[Step] = []

    def nxt(stage: int, kind: str) -> int:
        i = cnt.get((stage, kind), 0)
        cnt[stage, kind] = i + 1
        return i

    def fwd(stage: int) -> Action:
        return ("F", stage, nxt(stage, "F"))

    def bwd(stage: int, input_only: bool) -> Action:
        i = nxt(stage, "I")
        if input_only:
            queue.append((stage, i))
            return ("I", stage, i)
        return ("B", stage, i)

    def weight() -> None:
        if queue:
            st, i = queue.pop(0)
            out.append(("W", st, i))

    for _ in range(2 * (p - rank - 1)):
        out.append(fwd(s0))
    for _ in range(rank + 1):
        out += [fwd(s0), fwd(s1)]
    for _ in range(p - rank - 1):
        out.append(bwd(s1, True))
        weight()
        out.append(fwd(s1))
    for i in range(m - 2 * p + rank + 1):
        if i == 0 and rank == p - 1:  # torch does not overlap this first pair
            out += [fwd(s0), bwd(s1, False)]
        else:
            out.append(("FB", fwd(s0), bwd(s1, False)))
        out.append(("FB", fwd(s1), bwd(s0, False)))
    for _ in range(p - rank - 1):
        out.append(bwd(s1, False))
        out.append(("FB", fwd(s1), bwd(s0, False)))
    zb = False
    steps6 = rank + 1
    for i in range(steps6):
        if i == steps6 // 2 and rank % 2 == 1:
            zb = True
        out.append(bwd(s1, zb))
        if i == steps6 // 2 and rank % 2 == 0:
            zb = True
        out.append(bwd(s0, zb))
    for _ in range(p - rank - 1):
        weight()
        out.append(bwd(s0, zb))
    for _ in range(rank + 1):
        weight()
    return out


def v_orders(schedule: str, p: int, m: int) -> list[list[Step]]:
    """Every rank's step list of a V schedule ("zbv" or "dualpipev") over p ranks and m
    micro-batches (`zbv_actions`, `dualpipev_actions`)."""
    make = zbv_actions if schedule == "zbv" else dualpipev_actions
    return [list(make(p, r, m)) for r in range(p)]


def step_actions(step: Step) -> list[Action]:
    """The actions one step runs: both of an FB pair, else the step itself."""
    return [step[1], step[2]] if step[0] == "FB" else [step]  # type: ignore[list-item]


def dependencies(a: Action, stages: int) -> list[Action]:
    """The actions `a` waits for (module docstring): F the previous stage's F, I / B its own
    F and the next stage's input gradient, W its own I. A dependency ("I", s, i) is done by
    the I or the B of (s, i) (`produces`)."""
    kind, s, i = a
    if kind == "F":
        return [("F", s - 1, i)] if s > 0 else []
    if kind in ("I", "B"):
        return [("F", s, i)] + ([("I", s + 1, i)] if s < stages - 1 else [])
    return [("I", s, i)]


def produces(a: Action) -> list[Action]:
    """What `a` makes ready when it ends: itself, and a full backward its input gradient too."""
    kind, s, i = a
    return [a, ("I", s, i)] if kind == "B" else [a]


def makespan(orders: Sequence[Sequence[Step]], stages: int,
             dur: Callable[[str, int], float]) -> float:
    """End of the last action when every rank runs `orders[rank]` in order (module
    docstring); `dur(kind, stage)` for kind F, I, W (B = I + W)."""
    return _span(compile_dag(orders, stages), dur)


def v_makespan(schedule: str, p: int, m: int, dur: Callable[[str, int], float]) -> float:
    """`makespan` of a V schedule's lists (`v_orders`), on its memoized `v_dag`."""
    return _span(v_dag(schedule, p, m), dur)


def critical_path(dag: Dag, dur: Callable[[str, int], float]) -> list[tuple[int, Action]]:
    """The (rank, action) pairs of a longest chain of steps of `dag` (`makespan`'s last
    step, back through whichever of its rank's previous step or its inputs ended last, the
    first such on a tie): the sum of their durations is the makespan, and every such chain
    is a path of the step DAG (search/cpsat_replay.py reads it as a lower bound of the span)."""
    out: list[tuple[int, Action]] = []
    for at in chain(dag, dur):
        out += [(dag.rank[at], a) for a in dag.parts[at]]
    return out[::-1]


def chain(dag: Dag, dur: Callable[[str, int], float]) -> list[int]:
    """`critical_path`'s steps, last first: from the last step of the first rank whose last
    step ends last, each step's back-pointer (`_run`'s). With no negative or NaN length the
    ends come from `_ends` (the same floats as `_run`'s) and only the chain's own pointers are
    found again, by `_back`'s rule on its slots (slot 0 on a tie, then the first strictly
    later; a dropped input is never strictly later, `_run`): one pass without a pointer per
    step, then one step per link."""
    ends = _ends(dag, _lengths(dag, dur))
    if ends is None:  # the plain loop's pointers
        last, came = _run(dag, dur)
        at = dag.last[max(range(len(last)), key=last.__getitem__)]
        out = []
        while at >= 0:
            out.append(at)
            at = came[at]
        return out
    last = [ends[x + 1] for x in dag.last]
    at = dag.last[max(range(len(last)), key=last.__getitem__)] + 1  # numbered from 1
    out = []
    head, rest = dag.slots[0], dag.slots[1:]
    while at > 0:
        out.append(at - 1)
        by = head[at - 1]
        start = ends[by]
        for sl in rest:
            x = sl[at - 1]
            if ends[x] > start:
                start, by = ends[x], x
        at = by
    return out


@functools.lru_cache(maxsize=64)
def v_dag(schedule: str, p: int, m: int) -> Dag:
    """The `Dag` of a V schedule's lists (`v_orders`), built once per (schedule, p, m)."""
    return compile_dag(v_orders(schedule, p, m), 2 * p)


def _lengths(dag: Dag, dur: Callable[[str, int], float]) -> list[float]:
    """The duration of each distinct (kind, stage) of the steps (`Dag.uniq`; B = I + W)."""
    return [dur("I", st) + dur("W", st) if k == "B" else dur(k, st) for k, st in dag.uniq]


def _totals(dag: Dag, length: Sequence[float]) -> list[float]:
    """The duration of each step shape (`Dag.shapes`): its actions' lengths summed from 0 in
    order, as `_run` sums them."""
    out = []
    for ks in dag.shapes:
        total = 0.0
        for k in ks:
            total += length[k]
        out.append(total)
    return out


def _ends(dag: Dag, length: Sequence[float]) -> list[float] | None:
    """0.0, then every step's end, the same floats as `_run` (None where a length is negative
    or NaN: `_run` replays those). Each start is the max of the ends in the step's
    `Dag.slots`, which is `_run`'s start: every end is +0.0 or positive (a start >= +0.0 plus a
    duration >= 0), so the max is >= 0 as `_run`'s is, and an input dropped from the slots
    ends no later than the rank's previous step (`Dag.slots`); max is exact, and each end is the
    same start + the same summed duration."""
    if not all(x >= 0.0 for x in length):
        return None
    tot = map(_totals(dag, length).__getitem__, dag.shape)
    end = [0.0]
    put = end.append
    if len(dag.slots) == 1:
        for a, t in zip(dag.slots[0], tot, strict=True):
            put(end[a] + t)
    elif len(dag.slots) == 2:
        for a, b, t in zip(dag.slots[0], dag.slots[1], tot, strict=True):
            x, y = end[a], end[b]
            put((x if x > y else y) + t)
    elif len(dag.slots) == 3:
        for a, b, c, t in zip(*dag.slots, tot, strict=True):
            x, y, z = end[a], end[b], end[c]
            if y > x:
                x = y
            put((x if x > z else z) + t)
    else:
        for *row, t in zip(*dag.slots, tot, strict=True):
            put(max(end[x] for x in row) + t)
    return end


def _span(dag: Dag, dur: Callable[[str, int], float]) -> float:
    """`_run`'s largest rank end, the same floats (each start the latest end of the step's
    predecessors, 0 at least; each end the start plus its actions' durations summed from 0 in
    order), without the back-pointers: the replay on every search and evaluate call
    (`_ends`; `_run`'s loop where a duration is negative)."""
    length = _lengths(dag, dur)
    ends = _ends(dag, length)
    if ends is not None:
        return max(ends[x + 1] for x in dag.last)
    end = [0.0] * len(dag.rank)
    for n, (ks, preds) in enumerate(zip(dag.kidx, dag.preds, strict=True)):
        start = 0.0
        for x in preds:
            if end[x] > start:
                start = end[x]
        total = 0.0
        for k in ks:
            total += length[k]
        end[n] = start + total
    return max(end[x] if x >= 0 else 0.0 for x in dag.last)


def _run(dag: Dag, dur: Callable[[str, int], float]) -> tuple[list[float], list[int]]:
    """Each rank's last end (0 for a rank with no step), and for every step the step it
    started after (-1: at 0): start = the latest end of its predecessors, end = start + its
    actions' durations (B = I + W). With no negative duration it reads `Dag.slots` (`_ends`'
    proof: the same floats; a dropped input is never strictly later than the rank's previous
    step, so it is never the one started after)."""
    length = _lengths(dag, dur)
    if all(x >= 0.0 for x in length):
        ends, back = _back(dag, _totals(dag, length))
        return [ends[x + 1] for x in dag.last], back
    end = [0.0] * len(dag.rank)
    came = [-1] * len(dag.rank)
    for n, (ks, preds, first) in enumerate(zip(dag.kidx, dag.preds, dag.first, strict=True)):
        start, by = 0.0, -1
        for i, x in enumerate(preds):
            if end[x] > start or (i == 0 and not first):
                start, by = end[x], x
        total = 0.0
        for k in ks:
            total += length[k]
        end[n] = start + total
        came[n] = by
    return [end[x] if x >= 0 else 0.0 for x in dag.last], came


def _back(dag: Dag, totals: list[float]) -> tuple[list[float], list[int]]:
    """`_ends` with each step's back-pointer: the first of its slots whose end is its start
    (slot 0 on a tie, then the first strictly later: `_run`'s rule), -1 for none."""
    tot = map(totals.__getitem__, dag.shape)
    ends: list[float] = [0.0]
    back: list[int] = []
    put, came = ends.append, back.append
    if len(dag.slots) == 2:
        for a, b, t in zip(dag.slots[0], dag.slots[1], tot, strict=True):
            x, y = ends[a], ends[b]
            if y > x:
                put(y + t)
                came(b - 1)
            else:
                put(x + t)
                came(a - 1)
        return ends, back
    for *row, t in zip(*dag.slots, tot, strict=True):
        start, by = ends[row[0]], row[0]
        for x in row[1:]:
            if ends[x] > start:
                start, by = ends[x], x
        put(start + t)
        came(by - 1)
    return ends, back
