"""Limits on a search that give the same answer on an idle or a busy machine, and Ctrl-C.

`Budget`: every CP-SAT call of one search draws on a single budget of CP-SAT *deterministic
time* (`max_deterministic_time`, OR-Tools sat_parameters.proto: "deterministic time ...
should be correlated with the wall time but is reproducible"; with one worker and a fixed seed
the search path, hence the answer, does not depend on the machine's load). `--time-limit S` maps
to `DTIME_PER_SECOND * S` deterministic seconds. A wall-clock limit of `WALL_FACTOR * S +
WALL_SLACK_S` stays as an outer safety net only; when it cuts a solve short, `wall_hit` is set
and the caller reports it (the answer may then depend on the load).

Interrupts: CP-SAT catches SIGINT itself by default (`catch_sigint_signal`) and then returns
normally, so a Ctrl-C was swallowed. Every solve here turns that off and registers its solver;
`request_stop` (called by the CLI's `cli/signals.py` `stop_watcher` thread as soon as SIGINT or
SIGTERM arrives, while the main thread is inside CP-SAT's C++ code) stops the registered
solvers (`CpSolver.stop_search`) and makes the next `check` raise KeyboardInterrupt.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ortools.sat.python import cp_model

#: Deterministic seconds per second of --time-limit. Measured on the solver benchmark
#: (benchmarks/solver_bench.py; 2-core machine, one worker): CP-SAT's deterministic clock runs
#: 2.3-3.4x faster than the wall clock on these models (llama3-70b / 512 H100: 5.4 det. s in
#: 2.0 s), so 2 det. s per second finishes within the limit on such a machine.
DTIME_PER_SECOND = 2.0
#: The wall-clock safety net: WALL_FACTOR * time limit + WALL_SLACK_S (a loaded machine runs the
#: deterministic budget slower; the net is only for pathological cases).
WALL_FACTOR = 3.0
WALL_SLACK_S = 30.0
#: Deterministic seconds charged per plan the cost model itself scores (search/model_scan.py:
#: DualPipe, a DualPipeV hiding EP, pp > 1 activation offload), work CP-SAT's clock does not
#: see: DTIME_PER_SECOND x the 0.40 ms of CPU a `model_scored.plan_terms` call took (21,210
#: calls, Llama-3 70B DualPipe on the mixed H100 / A100 preset, 2-core machine; 0.96 ms
#: before the cost model kept each stage's time for the plans that differ only in their
#: split), so such a search stops at its budget, deterministically, not at the wall-clock net.
MODEL_PLAN_DTIME = DTIME_PER_SECOND * 0.40e-3

_DONE = (cp_model.OPTIMAL, cp_model.INFEASIBLE, cp_model.MODEL_INVALID)


class Budget:
    """One search's deterministic-time budget (None: unlimited) and its wall-clock net."""

    def __init__(self, time_limit: float | None) -> None:
        self.time_limit = time_limit
        self.dtime = None if time_limit is None else DTIME_PER_SECOND * time_limit
        self.used = 0.0
        self.deadline = (None if time_limit is None
                         else time.monotonic() + WALL_FACTOR * time_limit + WALL_SLACK_S)
        self.wall_hit = False

    def left(self) -> float | None:
        """Deterministic seconds left (None: unlimited)."""
        return None if self.dtime is None else self.dtime - self.used

    def exhausted(self) -> bool:
        """Whether the budget (or the wall-clock net) is spent; also raises on Ctrl-C."""
        check()
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.wall_hit = True
        left = self.left()
        return self.wall_hit or (left is not None and left <= 0)

    def charge(self, dtime: float) -> None:
        """Charge `dtime` deterministic seconds of work done outside CP-SAT."""
        self.used += dtime

    def solve(self, solver: cp_model.CpSolver, model: cp_model.CpModel,
              callback: cp_model.CpSolverSolutionCallback | None = None, *,
              cap: float | None = None) -> Any:
        """`solver.solve(model)` within the budget (and `cap` det. seconds), charging it."""
        prm = solver.parameters
        limit = [x for x in (self.left(), cap) if x is not None]
        if limit:
            prm.max_deterministic_time = max(min(limit), 1e-3)
        if self.deadline is not None:
            prm.max_time_in_seconds = max(self.deadline - time.monotonic(), 0.01)
        st = run(solver, model, callback)
        self.used += solver.deterministic_time
        if (self.deadline is not None and st not in _DONE
                and time.monotonic() >= self.deadline):
            self.wall_hit = True
        return st


# --------------------------------------------------------------------------------------------
# interrupts
# --------------------------------------------------------------------------------------------

_STOP = threading.Event()
_LOCK = threading.Lock()
_ACTIVE: set[cp_model.CpSolver] = set()


def request_stop() -> None:
    """Stop every running solve; the next `check` raises KeyboardInterrupt."""
    with _LOCK:
        _STOP.set()
        for s in _ACTIVE:
            s.stop_search()


def reset() -> None:
    _STOP.clear()


def check() -> None:
    """Raise KeyboardInterrupt when a stop was requested."""
    if _STOP.is_set():
        raise KeyboardInterrupt


def run(solver: cp_model.CpSolver, model: cp_model.CpModel,
        callback: cp_model.CpSolverSolutionCallback | None = None) -> Any:
    """`solver.solve` that a Ctrl-C (`request_stop`) stops, then raising KeyboardInterrupt."""
    solver.parameters.catch_sigint_signal = False
    with _LOCK:
        check()
        _ACTIVE.add(solver)
    try:
        st = solver.solve(model, callback)
    finally:
        with _LOCK:
            _ACTIVE.discard(solver)
    check()
    return st
