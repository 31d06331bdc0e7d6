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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

Action = tuple[str, int, int]  # (kind F/I/W/B, stage, micro-batch)
Step = Action | tuple[str, Action, Action]  # or ("FB", forward action, backward action)


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


def makespan(orders: Sequence[Sequence[Step]], stages: int,
             dur: Callable[[str, int], float]) -> float:
    """End of the last action when every rank runs `orders[rank]` in order (module
    docstring); `dur(kind, stage)` for kind F, I, W (B = I + W)."""
    return run(compile_orders(orders, stages), dur)


@dataclass(frozen=True)
class Dag:
    """The replay of some action lists, compiled once (`compile_orders`): the steps in an
    order in which every step comes after what it waits on, each with its rank, its actions
    (kind, stage) and the steps whose ends it waits on (its rank's previous step first)."""

    stages: int
    ranks: int
    rank: tuple[int, ...]
    parts: tuple[tuple[tuple[str, int], ...], ...]
    waits: tuple[tuple[int, ...], ...]


def compile_orders(orders: Sequence[Sequence[Step]], stages: int) -> Dag:
    """The `Dag` of `orders`: the steps in the order the replay (each rank runs its list in
    order, each step once its rank is free and its inputs are ready) reaches them, each step's
    waits its rank's previous step and the steps that end its inputs' actions (F(s-1, i) for a
    forward; F(s, i) and I(s+1, i) for an input or full backward; I(s, i) for a weight
    gradient; a full backward ends its input gradient too). A ValueError where an action
    waits on one never run (a deadlock)."""
    by: dict[tuple[str, int, int], int] = {}

    def deps(a: Action) -> list[tuple[str, int, int]]:
        kind, s, i = a
        if kind == "F":
            return [("F", s - 1, i)] if s > 0 else []
        if kind in ("I", "B"):
            return [("F", s, i)] + ([("I", s + 1, i)] if s < stages - 1 else [])
        return [("I", s, i)]

    idx = [0] * len(orders)
    last = [-1] * len(orders)
    rank: list[int] = []
    parts: list[tuple[tuple[str, int], ...]] = []
    waits: list[tuple[int, ...]] = []
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r, order in enumerate(orders):
            while idx[r] < len(order):
                step = order[idx[r]]
                acts: list[Action] = [step[1], step[2]] if step[0] == "FB" else [step]  # type: ignore[list-item]
                need = [d for a in acts for d in deps(a)]
                if any(d not in by for d in need):
                    break
                n = len(rank)
                rank.append(r)
                parts.append(tuple((k, s) for k, s, _ in acts))
                waits.append(tuple(([last[r]] if last[r] >= 0 else []) + [by[d] for d in need]))
                for kind, s, i in acts:
                    by[kind, s, i] = n
                    if kind == "B":
                        by["I", s, i] = n
                last[r] = n
                idx[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError("pipeline schedule deadlocks: an action waits on one never run")
    return Dag(stages, len(orders), tuple(rank), tuple(parts), tuple(waits))


def run(dag: Dag, dur: Callable[[str, int], float]) -> float:
    """The makespan of `dag` with the durations `dur(kind, stage)`: each step starts at the
    latest end of what it waits on (0 for a rank's first) and takes the sum of its actions'
    durations (a full backward B = I + W), a longest path through the steps in their order."""
    length: dict[tuple[str, int], float] = {}
    for s in range(dag.stages):
        for k in "FIW":
            length[k, s] = dur(k, s)
        length["B", s] = length["I", s] + length["W", s]
    end = [0.0] * len(dag.rank)
    for n, (acts, waits) in enumerate(zip(dag.parts, dag.waits, strict=True)):
        start = 0.0
        for w in waits:
            if end[w] > start:
                start = end[w]
        total = 0.0
        for a in acts:
            total += length[a]
        end[n] = start + total
    out = [0.0] * dag.ranks
    for n, r in enumerate(dag.rank):
        out[r] = end[n]
    return max(out)
