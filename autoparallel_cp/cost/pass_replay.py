"""Where each pass of a pipeline schedule runs in time: an event-driven replay of the
per-rank orders (`cost/pass_order.py`) with each pass's duration and its dependencies, and the
stretch that lays it over the cost model's pipeline term (`cost/timeline.py` draws it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autoparallel_cp.cost.pass_order import Op, Ready, Step, dependencies, produces

Placed = tuple[Step, float, float]  # (step, start, end) in seconds


def replay(schedule: str, pp: int, vpp: int, orders: Sequence[Sequence[Step]],
           dur: Callable[[int, Op], float]) -> list[list[Placed]]:
    """Every rank runs its `orders[rank]` in order, each step as soon as its rank is free and
    every pass it depends on (`pass_order.dependencies`) has ended; an overlapped pair takes
    the sum of its passes (cost/pipeline_sim.py's rule). `dur(rank, op)` in seconds. Raises
    ValueError when the orders deadlock (a schedule bug).

    The W passes keep their place in the order (ZB-H1/H2 defer them by a fixed count): a
    greedy that pulls a W forward whenever a rank would wait (Qi §3's heuristic, tried) runs
    longer for F, B, W unequal (a W then delays the B the upstream ranks wait for)."""
    done: dict[Ready, float] = {}
    free = [0.0] * pp
    ptr = [0] * pp
    out: list[list[Placed]] = [[] for _ in range(pp)]
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r in range(pp):
            while ptr[r] < len(orders[r]):
                step = orders[r][ptr[r]]
                own = {produces(op, r) for op in step}
                need = [d for op in step for d in dependencies(schedule, pp, vpp, r, op)
                        if d not in own]
                if any(d not in done for d in need):
                    break
                start = max([free[r]] + [done[d] for d in need])
                end = start + sum(dur(r, op) for op in step)
                for op in step:
                    done[produces(op, r)] = end
                out[r].append((step, start, end))
                free[r] = end
                ptr[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError("pipeline schedule deadlocks: a pass waits for one never run")
    return out


def stretch(runs: Sequence[Sequence[Placed]], target: float) -> float:
    """The factor k >= 1 by which every start is multiplied (durations kept) so that the last
    step ends exactly at `target`: k = min over steps of (target - duration)/start. Scaling
    the starts by k >= 1 keeps every dependency (k·a_b >= k·(a_a + d_a) >= k·a_a + d_a) and
    every rank's order without overlap. When `target` is shorter than the replay no placement
    with these durations holds every dependency: k = 1, the replay as it runs (`Timeline.
    model_gap_s`)."""
    span = max((e for run in runs for _, _, e in run), default=0.0)
    if target <= span:
        return 1.0
    ks = [(target - (e - a)) / a for run in runs for _, a, e in run if a > 0.0]
    return max(min(ks, default=1.0), 1.0)
