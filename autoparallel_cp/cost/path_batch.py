"""`pipeline_sim.critical_path` of one step DAG under several sets of durations at once: the
replay level by level (`Dag.levels`) with numpy, one column per set, instead of one pass over
every step per set (search/cpsat_replay.py seeds each V key's cuts with p such paths).

The same floats and the same chains: each step's end is the max of its slots' ends plus its
shape's total (pipeline_sim `_back`: max is exact, and the sum is one IEEE addition of the
same two doubles, in numpy as in Python; the totals are pipeline_sim `_totals`' own), and its
back-pointer is the first slot holding that max (the first index of the max, which is
`_back`'s rule: slot 0 on a tie, then the first strictly later); a level's slots all sit in
earlier levels, so each is final when read. The chain then starts at the first rank whose
last step ends last and follows the back-pointers, as `critical_path` does. A set with a
negative or NaN length takes `critical_path` itself (its replay is the plain loop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost.pipeline_sim import Action, Dag, _lengths, _totals, critical_path

Path = list[tuple[int, Action]]


def critical_paths(dag: Dag, durs: Sequence[Callable[[str, int], float]]) -> list[Path]:
    """`[critical_path(dag, d) for d in durs]` (module docstring)."""
    out = []
    for steps in critical_steps(dag, durs):
        if isinstance(steps, list):
            out.append(steps)
            continue
        chain: Path = []
        for s in steps.tolist():
            chain += [(dag.rank[s], a) for a in reversed(dag.parts[s])]
        out.append(chain)
    return out


def critical_steps(dag: Dag, durs: Sequence[Callable[[str, int], float]]
                   ) -> list[npt.NDArray[np.int64] | Path]:
    """For each set of durations, the steps of `critical_path`'s chain, first first (the
    chain lists each step's actions last first), or the chain itself where a length is
    negative or NaN (module docstring)."""
    lengths = [_lengths(dag, d) for d in durs]
    fast = [k for k, ln in enumerate(lengths) if all(x >= 0.0 for x in ln)]
    out: list[npt.NDArray[np.int64] | Path] = [
        [] if k in fast else critical_path(dag, durs[k]) for k in range(len(durs))]
    if fast:
        tot = np.array([_totals(dag, lengths[k]) for k in fast]).T  # (shapes, sets)
        for k, steps in zip(fast, _walks(dag, tot), strict=True):
            out[k] = steps
    return out


def _walks(dag: Dag, tot: npt.NDArray[np.float64]) -> list[npt.NDArray[np.int64]]:
    """The chains' steps, first first, for each column of the shape totals `tot`."""
    sets = tot.shape[1]
    n = len(dag.rank)
    ends = np.zeros((n + 1, sets))
    back = np.zeros((n + 1, sets), np.int64)  # each step's slot started after, 0: none
    for lv, first, *rest, shape in dag.levels:
        start = ends[first]
        by = np.repeat(first[:, None], sets, axis=1)
        for sl in rest:
            other = ends[sl]
            later = other > start
            np.copyto(start, other, where=later)
            np.copyto(by, sl[:, None], where=later)
        start += tot[shape]
        ends[lv] = start
        back[lv] = by
    last = np.array(dag.last, np.int64) + 1  # a rank with no step: row 0, an end of 0.0
    at = last[np.argmax(ends[last], axis=0)]  # the first rank whose last step ends last
    cols = np.arange(sets)
    steps = []
    while at.any():  # every chain back one step (a finished one stays at row 0)
        steps.append(at)
        at = back[at, cols]
    walk = np.array(steps, np.int64).reshape(len(steps), sets).T
    return [row[row > 0][::-1] - 1 for row in walk]
