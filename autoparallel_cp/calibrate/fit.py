"""Fitting the calibration knobs (spec/calibration.py) to measured runs.

Method: robust, bounded nonlinear least squares (`scipy.optimize.least_squares`, trust-region
reflective, soft-L1 loss) on

- time residuals ln(predicted / measured step) / SIGMA_TIME of every training run,
- memory residuals (predicted - measured peak) / (SIGMA_MEMORY * measured) of runs with
  `peak_gib`,
- microbenchmark residuals ln(predicted / measured time) / SIGMA_TIME (calibrate/micro.py),
- one prior residual per knob, (knob - prior) / prior width (a weak Gaussian prior: the fit is
  well posed with fewer runs than knobs, and a knob the runs say little about stays near 1).

Compute and network factors are fitted in log space. Predictions are the cost model's own
(`cost.step_time` / `cost.evaluate` on the job with the calibration applied), so the fitted
knobs mean exactly what the solver will use. The minimisation is Gauss-Newton on the cost
model's local log-linear model (calibrate/linear.py, calibrate/gauss_newton.py): each distinct
configuration is evaluated once per linearisation and once per knob it depends on, never inside
the least-squares iterations, so 10^4 rows fit in under a minute. A knob no run is sensitive
to (e.g. the inter-node network when every run fits in one node) is left at its prior and
reported as not identified. Of the identified knobs, those that predict held-out runs better
are kept, shrunk towards the prior when the runs disagree (cross-validation within the runs,
calibrate/select.py); the others are reported as left at the prior, with the held-out errors.
Uncertainty: the Gauss-Newton covariance (J^T J)^-1 at the solution, scaled by the reduced
chi-square of the data residuals when above 1 (Press et al., Numerical Recipes §15.5-15.6).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoparallel_cp.calibrate.gauss_newton import (
    Data,
    iterate,
    predict,
    residuals_and_jacobian,
)
from autoparallel_cp.calibrate.linear import (
    KnobRef,
    Linear,
    Progress,
    Units,
    linearize,
)
from autoparallel_cp.calibrate.micro import MicroRow, micro_predict
from autoparallel_cp.calibrate.residuals import interval, summary
from autoparallel_cp.calibrate.runs import Run
from autoparallel_cp.calibrate.select import Selection, select
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.spec import GIB
from autoparallel_cp.spec.calibration import BOUNDS, Calibration

#: Run-to-run noise of a measured step time (relative): the spread of repeated steps of one
#: configuration after warm-up is ~1-2 % (H200 script: 5 timed steps per row), taken as 2 %.
SIGMA_TIME = 0.02
#: Same for a measured allocated peak (deterministic to within allocator rounding: 1 %).
SIGMA_MEMORY = 0.01
#: Prior widths (one standard deviation) of each knob around the identity: compute and network
#: factors +-20 % / +-30 % in log space (the spread of the per-source signed errors in
#: benchmarks/RESULTS.md), 20 ms per micro-batch, 1 s per step, 2 GiB reserve.
PRIOR_SIGMA = {"compute": 0.2, "net_intra": 0.3, "net_inter": 0.3, "per_microbatch_s": 0.02,
               "per_step_s": 1.0, "memory_reserve_gib": 2.0}
#: A knob is identified when moving it by one prior width moves some prediction by at least
#: this many noise sigmas (0.5 -> 1 % of a step time).
MIN_SENSITIVITY = 0.5
#: A run whose time residual is further than this many robust sigmas (and 10 %) from the
#: others' median is reported as an outlier.
OUTLIER_SIGMAS = 3.0


@dataclass(frozen=True)
class Knob(KnobRef):
    """A fitted knob: name ("compute:<GPU name>", "net_intra", ...), kind (a PRIOR_SIGMA /
    BOUNDS key), whether it is fitted as ln(value); its bounds and prior in fit units."""

    @property
    def lo(self) -> float:
        lo = BOUNDS[self.kind][0]
        return math.log(lo) if self.log else lo

    @property
    def hi(self) -> float:
        hi = BOUNDS[self.kind][1]
        return math.log(hi) if self.log else hi

    @property
    def prior(self) -> float:
        return 0.0  # ln 1 for factors, 0 s / 0 GiB for the additive knobs

    @property
    def sigma(self) -> float:
        return PRIOR_SIGMA[self.kind]


@dataclass
class KnobResult:
    name: str
    value: float
    std: float | None  # one standard deviation, in the knob's units; None when not fitted
    identified: bool
    note: str = ""


@dataclass
class FitResult:
    calibration: Calibration
    knobs: list[KnobResult]
    rows: list[dict[str, float | int | bool | str | None]]
    before: dict[str, float]
    after: dict[str, float]
    outliers: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def knobs_for(runs: Sequence[Run], micro: Sequence[MicroRow]) -> list[Knob]:
    """The knobs: one compute factor per GPU type in the runs, networks, fixed times, and the
    memory reserve when some run measured its peak."""
    gpus: list[str] = []
    for r in runs:
        for g in r.job.cluster.node_groups:
            if g.gpu.name not in gpus:
                gpus.append(g.gpu.name)
    for m in micro:
        name = (m.fields.get("gpu") or "").strip()
        if m.kind == "gemm" and name and name not in gpus:
            gpus.append(name)
    out = [Knob(f"compute:{g}", "compute", True) for g in gpus]
    out += [Knob("net_intra", "net_intra", True), Knob("net_inter", "net_inter", True),
            Knob("per_microbatch_s", "per_microbatch_s", False),
            Knob("per_step_s", "per_step_s", False)]
    if any(r.peak_bytes is not None for r in runs):
        out.append(Knob("memory_reserve_gib", "memory_reserve_gib", False))
    return out


def calibration_of(knobs: Sequence[Knob], theta: Sequence[float],
                   base: Calibration | None = None) -> Calibration:
    """The Calibration of parameter vector `theta` (knobs not listed: from `base` or identity)."""
    upd: dict[str, object] = {}
    compute: dict[str, float] = dict(base.compute) if base is not None else {}
    for k, t in zip(knobs, theta, strict=True):
        v = k.value(float(t))
        lo, hi = BOUNDS[k.kind]
        v = min(max(v, lo), hi)  # float round-off at a bound
        if k.kind == "compute":
            compute[k.name.split(":", 1)[1]] = v
        else:
            upd[k.kind] = v
    data = (base.model_dump() if base is not None else {}) | upd | {"compute": compute}
    return Calibration(**data)


def predictions(runs: Sequence[Run], micro: Sequence[MicroRow], cal: Calibration | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step_s per run, peak bytes per run, seconds per microbenchmark row) under `cal`."""
    steps, peaks = [], []
    for r in runs:
        job = r.job.calibrated(cal) if cal is not None else r.job
        ev = evaluate(job, r.plan, r.options)
        steps.append(ev.time.step_s)
        peaks.append(ev.memory.peak_bytes)
    mic = [micro_predict(m, cal) for m in micro]
    return np.array(steps), np.array(peaks), np.array(mic, dtype=float)


def fit(runs: Sequence[Run], micro: Sequence[MicroRow] = (),
        progress: Callable[[str], None] | None = None, bar: Progress | None = None,
        select_knobs: bool = True, relinearize: bool | None = None) -> FitResult:
    """Fit the knobs to the runs (module docstring). Raises ValueError without data.
    `progress` gets one-line notes, `bar` (stage, done, total) the cost-model evaluations;
    `select_knobs` False keeps every identified knob (no cross-validation); `relinearize`
    forces finite-difference slopes at every step (True) or Broyden's update (False)."""
    if not runs and not micro:
        raise ValueError("no runs to calibrate on")
    knobs = knobs_for(runs, micro)
    units = Units(runs, micro)
    try:
        return _fit(runs, micro, knobs, units, progress, bar, select_knobs, relinearize)
    finally:
        units.close()


def _fit(runs: Sequence[Run], micro: Sequence[MicroRow], knobs: list[Knob], units: Units,
         progress: Callable[[str], None] | None, bar: Progress | None, select_knobs: bool,
         relinearize: bool | None) -> FitResult:
    kind_at = {k.kind: i for i, k in enumerate(knobs)}
    mem_idx = np.array([i for i, r in enumerate(runs) if r.peak_bytes is not None], dtype=int)
    f_prior, peaks = units.at_identity(bar)
    data = Data(run_unit=units.run_unit, meas_t=np.array([r.step_s for r in runs]),
                mem_idx=mem_idx, meas_m=np.array([runs[i].peak_bytes or 0.0 for i in mem_idx]),
                peaks=peaks,
                n_train_units=len(units.train),
                meas_u=np.array([float(m.fields["time_s"]) for m in micro]),
                sigma_t=SIGMA_TIME, sigma_m=SIGMA_MEMORY, ps=kind_at.get("per_step_s"),
                reserve=kind_at.get("memory_reserve_gib"))
    sigma = np.array([k.sigma for k in knobs])
    lo = np.array([k.lo for k in knobs])
    hi = np.array([k.hi for k in knobs])
    prior = np.array([k.prior for k in knobs])
    if progress:
        progress(f"{len(runs)} runs in {len(units.train)} distinct configurations"
                 + (f", {len(micro)} microbenchmark rows" if micro else ""))

    # identifiability at the prior: how many noise sigmas one prior width of each knob moves
    # some prediction (secant over half a prior width)
    lin0 = linearize(units, knobs, prior, [min(0.5 * k.sigma, k.hi - k.prior) for k in knobs],
                     bar, f0=f_prior)
    sens = _sensitivity(lin0, data, knobs)
    free = [j for j, s in enumerate(sens) if s >= MIN_SENSITIVITY]
    if progress:
        progress(f"fitting {len(free)} of {len(knobs)} knobs")

    theta, jac, lin, msg = iterate(units, knobs, data, free, lin0, prior, lo, hi, sigma, bar,
                                   relinearize=relinearize)
    if progress:
        progress(f"Gauss-Newton: {msg}")

    # which knobs the runs support, by cross-validation within them (calibrate/select.py)
    time_free = [j for j in free if knobs[j].kind != "memory_reserve_gib"]
    sel = (select(lin, data, time_free, theta, lo, hi, sigma, prior) if select_knobs
           else Selection(time_free, 1.0, float("nan"), float("nan"), ran=False))
    kept = sorted(sel.chosen + [j for j in free if j not in time_free])
    if kept != free:  # refit the chosen knobs, the others back at the prior
        start = np.where(np.isin(np.arange(len(knobs)), kept), theta, prior)
        theta, jac, lin, msg = iterate(units, knobs, data, kept, lin, prior, lo, hi, sigma,
                                       bar, start=start, relinearize=relinearize)
    if sel.shrink != 1.0:
        shrunk = np.isin(np.arange(len(knobs)), sel.chosen)
        theta = np.where(shrunk, prior + sel.shrink * (theta - prior), theta)

    # uncertainty: Gauss-Newton covariance at the solution, data part scaled by the reduced
    # chi-square when above 1
    n_data = data.n_rows
    cal = calibration_of([knobs[j] for j in kept], [float(theta[j]) for j in kept])
    steps1 = (lin.f0 if np.array_equal(theta, lin.theta0) else
              units.values(cal, progress=bar, stage="calibrated predictions"))
    lin_f = Linear(list(knobs), theta, steps1, lin.slopes)
    r_data, _ = residuals_and_jacobian(lin_f, data, theta)
    if kept:
        dof = n_data - len(kept)
        chi2 = float(np.sum(r_data ** 2))
        scale = max(1.0, chi2 / dof) if dof > 0 else 1.0
        jtj = jac.T @ jac / scale + np.diag([1.0 / knobs[j].sigma ** 2 for j in kept])
        cov = np.linalg.inv(jtj)
        std_theta = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        # effective number of parameters the data determined (MacKay 1992, gamma = sum of
        # 1 - posterior / prior variance): a knob held by its prior uses no degree of freedom
        used = np.clip(1.0 - np.diag(cov) / np.array([knobs[j].sigma ** 2 for j in kept]),
                       0.0, 1.0)
    else:
        std_theta = used = np.zeros(0)

    results, notes = _knob_results(knobs, runs, free, kept, theta, std_theta, sel)

    # residuals and outliers
    st0, pk0, mc0 = predict(lin0, data, prior)
    st1, pk1, mc1 = predict(lin_f, data, theta)
    e = np.log(data.meas_t / st1) if len(runs) else np.zeros(0)
    outliers: list[int] = []
    if len(e) >= 3:
        med = float(np.median(e))
        mad = float(np.median(np.abs(e - med))) * 1.4826
        s = max(mad, SIGMA_TIME)
        outliers = [runs[i].row for i in range(len(e))
                    if abs(e[i] - med) > OUTLIER_SIGMAS * s and abs(e[i] - med) > 0.1]
    if len(outliers) > 20:
        notes.append(f"{len(outliers)} rows contradict the other runs (residual far beyond "
                     f"their spread), e.g. rows {', '.join(map(str, outliers[:10]))}: check "
                     "their plans and measurements; the robust loss reduced their weight")
    else:
        for row in outliers:
            notes.append(f"row {row} contradicts the other runs (residual far beyond their "
                         "spread): check its plan and measurement; its weight in the fit was "
                         "reduced by the robust loss")
    out_set = set(outliers)
    keep = [i for i in range(len(e)) if runs[i].row not in out_set]
    time_iv = interval([float(e[i]) for i in keep],
                       sum(float(u) for j, u in zip(kept, used, strict=True)
                           if knobs[j].kind != "memory_reserve_gib"), SIGMA_TIME)
    if time_iv is None and len(runs):
        notes.append("too few runs beyond the fitted knobs to estimate the prediction spread "
                     "(or a spread beyond a factor of 10): "
                     "intervals stay those of the uncalibrated model")
    mem_e = [math.log(float(data.meas_m[i]) / float(pk1[i])) for i in range(len(mem_idx))]
    mem_iv = interval(mem_e, sum(float(u) for j, u in zip(kept, used, strict=True)
                                 if knobs[j].kind == "memory_reserve_gib"), SIGMA_MEMORY)
    cal = cal.model_copy(update={"time_interval": time_iv, "memory_interval": mem_iv,
                                 "std": {k.name: k.std for k in results if k.std is not None}})

    peak_of = dict(zip(mem_idx.tolist(), range(len(mem_idx)), strict=True))
    base_peaks = data.peaks[data.run_unit] if len(mem_idx) else np.zeros(len(runs))
    res_gib = cal.memory_reserve_gib
    rows: list[dict[str, float | int | bool | str | None]] = []
    for i, r in enumerate(runs):
        rows.append({
            "row": r.row, "measured_step_s": r.step_s, "before_step_s": float(st0[i]),
            "after_step_s": float(st1[i]),
            "measured_peak_gib": None if r.peak_bytes is None else r.peak_bytes / GIB,
            "before_peak_gib": (float(base_peaks[i]) / GIB if i in peak_of else None),
            "after_peak_gib": (float(base_peaks[i]) / GIB + res_gib if i in peak_of else None),
            "outlier": r.row in out_set,
        })
    before = summary(runs, micro, st0, pk0, mc0, data)
    after = summary(runs, micro, st1, pk1, mc1, data)
    if sel.ran:
        before["heldout_step_pct"] = float(np.expm1(sel.cv_prior) * 100)
        after["heldout_step_pct"] = float(np.expm1(sel.cv_chosen) * 100)
    return FitResult(cal, results, rows, before, after, outliers, notes)


def _sensitivity(lin: Linear, d: Data, knobs: Sequence[Knob]) -> list[float]:
    """Most noise sigmas by which one prior width of each knob moves some data residual, from
    the secant slopes at the prior (the EXACT knobs from their closed forms)."""
    n = d.n_train_units
    out = []
    for j, k in enumerate(knobs):
        if k.kind == "per_step_s":
            s = lin.f0[d.run_unit]
            v = (np.log1p(0.5 * k.sigma / s) / d.sigma_t / 0.5) if len(s) else np.zeros(0)
        elif k.kind == "memory_reserve_gib":
            v = k.sigma * GIB / (d.sigma_m * d.meas_m)
        else:
            v = np.abs(np.concatenate([lin.slopes[d.run_unit, j], lin.slopes[n:, j]])) \
                * k.sigma / d.sigma_t
        out.append(float(np.max(v)) if len(v) else 0.0)
    return out


def _knob_results(knobs: Sequence[Knob], runs: Sequence[Run], free: Sequence[int],
                  kept: Sequence[int], theta: np.ndarray, std_theta: np.ndarray,
                  sel: Selection) -> tuple[list[KnobResult], list[str]]:
    """Per knob: its value, uncertainty and status; the notes that explain the status."""
    results: list[KnobResult] = []
    notes: list[str] = []
    pct = 100.0
    for j, k in enumerate(knobs):
        if j in kept:
            i = list(kept).index(j)
            v = k.value(float(theta[j]))
            sd = float(std_theta[i]) * (v if k.log else 1.0)
            weak = std_theta[i] > 0.5 * k.sigma
            note = ("weakly identified: its uncertainty is close to the prior width"
                    if weak else "")
            at_bound = (math.isclose(float(theta[j]), k.lo, abs_tol=1e-6)
                        or math.isclose(float(theta[j]), k.hi, abs_tol=1e-6))
            if at_bound and k.hi != k.lo:
                note = (note + "; " if note else "") + "at its bound"
            if sel.ran and sel.shrink != 1.0 and j in sel.chosen:
                note = (note + "; " if note else "") + (
                    f"shrunk to {sel.shrink:g} of its fitted move towards the prior (the runs "
                    "disagree: held-out runs are predicted better so)")
            results.append(KnobResult(k.name, v, sd, not weak, note))
            if note:
                notes.append(f"{k.name}: {note}")
        elif j in free:
            g = sel.gains.get(j)
            others = ", ".join(knobs[i].name for i in sel.chosen) or "no other knob"
            why = (f"held-out runs are predicted no better with it added to {others} "
                   f"({np.expm1(g[0]) * pct:.1f}% vs {np.expm1(g[1]) * pct:.1f}%, "
                   "cross-validated)" if g is not None else "not chosen by cross-validation")
            results.append(KnobResult(k.name, k.value(k.prior), None, False,
                                      "left at its prior (cross-validation)"))
            notes.append(f"{k.name}: left at its prior {k.value(k.prior):g}: {why}")
        else:
            results.append(KnobResult(k.name, k.value(k.prior), None, False,
                                      "not identified, left at its prior"))
            notes.append(f"{k.name}: not identified ({_why_not(k, runs)}); left at its prior "
                         f"{k.value(k.prior):g}")
    return results, notes


def _why_not(k: Knob, runs: Sequence[Run]) -> str:
    if not runs:
        return ("no microbenchmark row's predicted time depends on it measurably (too small, "
                "latency-bound, or none of its kind)")
    if k.kind == "net_inter" and all(
            sum(g.num_nodes for g in r.job.cluster.node_groups) == 1 for r in runs):
        return "every run fits in one node, so none crosses the inter-node network"
    if k.kind == "net_intra" and all(
            r.job.cluster.node_groups[0].gpus_per_node == 1 for r in runs):
        return "every run uses one GPU per node"
    return "no run's predicted time or memory depends on it measurably"
