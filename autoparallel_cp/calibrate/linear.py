"""The cost model's predictions of the fitted rows and their local log-linear model (the
Gauss-Newton linearisation the fit iterates on, calibrate/fit.py).

Rows that describe the same configuration (job, plan, cost options: repeated measurements)
are evaluated once ("units"). Per unit, only the knobs it depends on are perturbed for the
finite-difference slopes: the compute knob of each GPU type in its cluster, NVLink, the
network when it spans more than one node, the fixed time per micro-batch. Two knobs enter
exactly and need no evaluation (spec/calibration.py, cost/steptime.py `fixed_step_s`,
cost/model_state.py `other_bytes`): `per_step_s` adds to every step, `memory_reserve_gib` to
every peak. A training unit's step is `step_time` of the job with the other knobs applied
(the same function `evaluate` and the search use), its peak `evaluate`'s at the identity.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import numpy as np

from autoparallel_cp.calibrate.micro import MicroRow, micro_predict
from autoparallel_cp.calibrate.runs import Run
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.steptime import step_time
from autoparallel_cp.spec.calibration import BOUNDS, Calibration

#: progress(stage, units done, units in this stage)
Progress = Callable[[str, int, int], None]
#: Knobs that enter exactly (no evaluation): added seconds per step, added GiB per peak.
EXACT = ("per_step_s", "memory_reserve_gib")
#: Passes over at least this many units run in worker processes, one per usable CPU (spawned
#: once per fit; below, their start-up would cost more than they save).
PARALLEL_MIN_UNITS = 400
CHUNKS_PER_WORKER = 4

_WORKER: dict[str, Any] = {}


def _worker_init(train: list[Run], micro: list[MicroRow]) -> None:
    # Ctrl-C reaches the whole process group: the main process stops the pool (Units.close),
    # the workers do not each print a KeyboardInterrupt traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER["train"], _WORKER["micro"] = train, micro


def _predict_units(train: Sequence[Run], micro: Sequence[MicroRow], cal: Calibration | None,
                   idx: Sequence[int]) -> list[tuple[float, float]]:
    """(seconds, peak bytes) of units `idx` (training units, then micro rows: peak 0) under
    `cal` (module doc); `cal` None: the identity, by `evaluate` (time and memory at once)."""
    n = len(train)
    out = []
    for u in idx:
        if u < n:
            r = train[u]
            if cal is None:
                ev = evaluate(r.job, r.plan, r.options)
                out.append((float(ev.time.step_s), float(ev.memory.peak_bytes)))
            else:
                st = step_time(r.job.calibrated(cal), r.plan, r.options)
                out.append((float(st.step_s), 0.0))
        else:
            out.append((float(micro_predict(micro[u - n], cal)), 0.0))
    return out


def _worker_predict(cal: Calibration | None, idx: list[int]) -> list[tuple[float, float]]:
    return _predict_units(_WORKER["train"], _WORKER["micro"], cal, idx)


@dataclass(frozen=True)
class KnobRef:
    """What calibrate/fit.py's Knob is to this module: its name, kind, log flag."""

    name: str
    kind: str
    log: bool

    def value(self, theta: float) -> float:
        return math.exp(theta) if self.log else theta


def calibration_at(knobs: Sequence[KnobRef], theta: Sequence[float] | np.ndarray
                   ) -> Calibration:
    """The Calibration of parameter vector `theta` (knobs not listed: identity)."""
    upd: dict[str, object] = {}
    compute: dict[str, float] = {}
    for k, t in zip(knobs, theta, strict=True):
        lo, hi = BOUNDS[k.kind]
        v = min(max(k.value(float(t)), lo), hi)  # float round-off at a bound
        if k.kind == "compute":
            compute[k.name.split(":", 1)[1]] = v
        else:
            upd[k.kind] = v
    return Calibration(**(upd | {"compute": compute}))


class Units:
    """The distinct configurations of the runs, and the microbenchmark rows (module doc)."""

    def __init__(self, runs: Sequence[Run], micro: Sequence[MicroRow]) -> None:
        self.runs, self.micro = list(runs), list(micro)
        index: dict[tuple[str, str, str], int] = {}
        self.train: list[Run] = []  # one representative run per unit
        self.of_run: list[int] = []
        for r in runs:
            key = (r.job.model_dump_json(warnings=False), repr(r.plan), repr(r.options))
            if key not in index:
                index[key] = len(self.train)
                self.train.append(r)
            self.of_run.append(index[key])
        self.run_unit = np.array(self.of_run, dtype=int)
        self._executor: Executor | None = None
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
        self._workers = min(cpus, 8) if len(self) >= PARALLEL_MIN_UNITS else 1

    def __len__(self) -> int:
        return len(self.train) + len(self.micro)

    def depends(self, knob: KnobRef) -> list[int]:
        """Indices (training units first, then micro rows) whose prediction moves with a knob
        evaluated by the cost model (not the EXACT ones)."""
        out: list[int] = []
        for i, r in enumerate(self.train):
            groups = r.job.cluster.node_groups
            if knob.kind == "compute":
                hit = any(g.gpu.name == knob.name.split(":", 1)[1] for g in groups)
            elif knob.kind == "net_inter":
                hit = sum(g.num_nodes for g in groups) > 1
            else:
                hit = knob.kind in ("net_intra", "per_microbatch_s")
            if hit:
                out.append(i)
        n = len(self.train)
        for j, m in enumerate(self.micro):
            if m.kind == "gemm":
                hit = knob.kind == "compute" and knob.name.split(":", 1)[1] == \
                    (m.fields.get("gpu") or "").strip()
            else:
                hit = knob.kind in ("net_intra", "net_inter")
            if hit:
                out.append(n + j)
        return out

    def values(self, cal: Calibration, which: Sequence[int] | None = None,
               progress: Progress | None = None, stage: str = "") -> np.ndarray:
        """Predicted seconds of units `which` (all by default) under `cal` without its
        per-step time (EXACT): a step without `per_step_s`, or a microbenchmark call."""
        base = cal.model_copy(update={"per_step_s": 0.0, "memory_reserve_gib": 0.0})
        return self._run(base, which, progress, stage)[:, 0]

    def at_identity(self, progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(seconds of every unit, allocated peak bytes of every training unit) of the
        shipped model, in one pass (`evaluate` gives both)."""
        both = self._run(None, None, progress, "predictions of the shipped model")
        return both[:, 0], both[: len(self.train), 1]

    def _run(self, cal: Calibration | None, which: Sequence[int] | None,
             progress: Progress | None, stage: str) -> np.ndarray:
        idx = list(range(len(self)) if which is None else which)
        pool = self._pool() if len(idx) >= PARALLEL_MIN_UNITS else None
        size = max(len(idx) // (CHUNKS_PER_WORKER * self._workers), 1) if pool else \
            max(len(idx) // 50, 1)
        chunks = [idx[i:i + size] for i in range(0, len(idx), size)]
        out: list[tuple[float, float]] = []
        done = 0
        futures = [pool.submit(_worker_predict, cal, c) for c in chunks] if pool else []
        for i, c in enumerate(chunks):
            # in order: the same numbers however the work was split
            out += futures[i].result() if pool else _predict_units(self.train, self.micro,
                                                                   cal, c)
            done += len(c)
            if progress is not None:
                progress(stage, done, len(idx))
        return np.array(out, dtype=float).reshape(len(idx), 2)

    def _pool(self) -> Executor | None:
        if self._executor is None and self._workers > 1:
            self._executor = ProcessPoolExecutor(
                self._workers, mp_context=get_context("spawn"), initializer=_worker_init,
                initargs=(self.train, self.micro))
        return self._executor

    def close(self) -> None:
        """Stop the worker processes (if any were started)."""
        if self._executor is not None:
            self._executor.shutdown(cancel_futures=True)
            self._executor = None

    def dependence(self, knobs: Sequence[KnobRef]) -> np.ndarray:
        """units x knobs: whether the unit's prediction moves with the knob (`depends`)."""
        dep = np.zeros((len(self), len(knobs)), dtype=bool)
        for j, k in enumerate(knobs):
            if k.kind not in EXACT:
                dep[self.depends(k), j] = True
        return dep

@dataclass
class Linear:
    """log(prediction) of every unit near `theta0`: log f0 + slopes . (theta - theta0), the
    EXACT knobs added on top (`predict`)."""

    knobs: list[KnobRef]
    theta0: np.ndarray
    f0: np.ndarray  # seconds per unit at theta0 (without per_step_s)
    slopes: np.ndarray  # units x knobs, d log f / d theta (0 for the EXACT knobs)

    def unit_seconds(self, theta: np.ndarray) -> np.ndarray:
        return self.f0 * np.exp(self.slopes @ (theta - self.theta0))


def linearize(units: Units, knobs: Sequence[KnobRef], theta0: Sequence[float] | np.ndarray,
              steps: Sequence[float], progress: Progress | None = None,
              f0: np.ndarray | None = None) -> Linear:
    """Secant slopes of every unit's log prediction, one knob at a time by `steps[j]`
    (backwards where the step would leave the knob's range), at `theta0`."""
    t0 = np.array(theta0, dtype=float)
    if f0 is None:
        f0 = units.values(calibration_at(knobs, t0), progress=progress, stage="predictions")
    slopes = np.zeros((len(units), len(knobs)))
    for j, k in enumerate(knobs):
        if k.kind in EXACT:
            continue
        which = units.depends(k)
        if not which:
            continue
        lo, hi = BOUNDS[k.kind]
        lo_t, hi_t = (math.log(lo), math.log(hi)) if k.log else (lo, hi)
        h = steps[j] if t0[j] + steps[j] <= hi_t else -steps[j]
        if t0[j] + h < lo_t:
            continue  # a knob whose range is narrower than the step: no slope taken
        t = t0.copy()
        t[j] += h
        f1 = units.values(calibration_at(knobs, t), which, progress, f"slope of {k.name}")
        slopes[which, j] = np.log(f1 / f0[which]) / h
    return Linear(list(knobs), t0, f0, slopes)


def secant_update(lin: Linear, theta: np.ndarray, f: np.ndarray, dep: np.ndarray,
                  sigma: np.ndarray) -> Linear:
    """The linear model moved to `theta`, where the units' exact values `f` were evaluated:
    each unit's slopes get Broyden's rank-one secant correction along the step, in the metric
    of the prior widths and only over the knobs it depends on (Dennis & Schnabel, Numerical
    Methods for Unconstrained Optimization, SIAM 1996, §8.1, "Broyden's update"). Costs one
    evaluation per unit instead of one per unit and knob."""
    step = (theta - lin.theta0)[None, :] * dep  # units x knobs
    scaled = step / sigma ** 2
    norm = np.sum(step * scaled, axis=1)
    miss = np.log(f / lin.f0) - np.sum(lin.slopes * step, axis=1)
    ok = norm > 0
    slopes = lin.slopes.copy()
    slopes[ok] += (miss[ok] / norm[ok])[:, None] * scaled[ok]
    return Linear(lin.knobs, theta.copy(), f, slopes)
