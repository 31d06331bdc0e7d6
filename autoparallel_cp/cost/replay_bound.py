"""A lower bound of the replayed span of a V schedule (cost/pipeline_sim.py `v_makespan`) at
the cost of one path, not the whole step DAG: the search skips the replay of a plan whose
bound is already above the best or the cutoff (search/enumerate.py `_replayed`).

The bound (`span_floor`): the length of one fixed path of the DAG, its steps' durations added
in path order from 0.0, each step's duration summed exactly as the replay sums it
(pipeline_sim `_totals`). It is <= the replay's span in floating point, not only in exact
arithmetic: along the path n_1 .. n_L each n_j is a predecessor of n_{j+1} (`Dag.preds`), so
the replay starts n_{j+1} no earlier than n_j ends, and rounding to nearest is monotone, so
x_j = fl(x_{j-1} + d_j) <= fl(start_j + d_j) = end_j by induction (x_0 = 0 <= start_1); the
path ends on a rank's last step, one of the ends the span is the max of. The path is a
longest one at equal rank times and equal F, I, W (`witness`): any path gives a valid
bound; that one is near-critical for the balanced layouts the search scores most.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from autoparallel_cp.cost.pipeline_sim import _lengths, _totals, chain, v_dag


@functools.lru_cache(maxsize=64)
def witness(schedule: str, p: int, m: int) -> tuple[int, ...]:
    """The step shapes (`Dag.shape`) along a longest path of `v_dag(schedule, p, m)` at equal
    durations, first step first: `pipeline_sim.critical_path`'s chain (back-pointers from
    the last step of the first rank that ends last), each step a predecessor of the next."""
    dag = v_dag(schedule, p, m)
    return tuple(dag.shape[n] for n in reversed(chain(dag, lambda kind, stage: 1.0)))


def span_floor(schedule: str, p: int, m: int, dur: Callable[[str, int], float]) -> float:
    """The length of the `witness` path with durations `dur`, <= `v_makespan(schedule, p,
    m, dur)` bit for bit (module docstring)."""
    tot = _totals(v_dag(schedule, p, m), _lengths(v_dag(schedule, p, m), dur))
    x = 0.0
    for s in witness(schedule, p, m):
        x += tot[s]
    return x
