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
the least-squares iterations, so 10^4 rows fit in under a minute; a step that does not lower the
exact objective is refused (trust region: the cost model has kinks, gauss_newton.py). A knob no
run is sensitive to (e.g. the inter-node network when every run fits in one node) is left at
its prior and reported as not identified. Of the identified knobs, those that predict
held-out runs better are kept, shrunk towards the prior when the runs disagree
(cross-validation within the runs, calibrate/select.py); the others are reported as left at
the prior, with the held-out errors.
Uncertainty: the Gauss-Newton covariance (J^T J)^-1 at the solution, scaled by the reduced
chi-square of the data residuals when above 1 (Press et al., Numerical Recipes §15.5-15.6).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoparallel_cp.calibrate.gauss_newton import (
    Data,
    iterate,
    predict,
    residuals_and_jacobian,
)
from autoparallel_cp.calibrate.knob_report import KnobResult, knob_results
from autoparallel_cp.calibrate.linear import (
    Linear,
    Progress,
    Units,
    linearize,
)
from autoparallel_cp.calibrate.micro import MicroRow, micro_predict
from autoparallel_cp.calibrate.prior import (
    MIN_INFORMATION,
    MODEL_SIGMA_TIME,
    PRIOR_SIGMA,
    Knob,
    information,
)
from autoparallel_cp.calibrate.residuals import interval, outlier_mask, summary
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
#: A knob is identified when moving it by one prior width moves some prediction by at least
#: this many noise sigmas (0.5 -> 1 % of a step time).
MIN_SENSITIVITY = 0.5


@dataclass
class FitResult:
    calibration: Calibration
    knobs: list[KnobResult]
    rows: list[dict[str, float | int | bool | str | None]]
    before: dict[str, float]
    after: dict[str, float]
    outliers: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the model's per-configuration error the runs' time residuals were weighed with
    model_sigma: float = 0.0


def knobs_for(runs: Sequence[Run], micro: Sequence[MicroRow],
              widths: Mapping[str, float] | None = None) -> list[Knob]:
    """The knobs: one compute factor per GPU type in the runs, networks, fixed times, and the
    memory reserve when some run measured its peak; prior widths per kind from `widths`
    (else PRIOR_SIGMA)."""
    w = dict(PRIOR_SIGMA) | dict(widths or {})
    gpus: list[str] = []
    for r in runs:
        for g in r.job.cluster.node_groups:
            if g.gpu.name not in gpus:
                gpus.append(g.gpu.name)
    for m in micro:
        name = (m.fields.get("gpu") or "").strip()
        if m.kind == "gemm" and name and name not in gpus:
            gpus.append(name)
    out = [Knob(f"compute:{g}", "compute", True, w["compute"]) for g in gpus]
    out += [Knob("net_intra", "net_intra", True, w["net_intra"]),
            Knob("net_inter", "net_inter", True, w["net_inter"]),
            Knob("per_microbatch_s", "per_microbatch_s", False, w["per_microbatch_s"]),
            Knob("per_step_s", "per_step_s", False, w["per_step_s"])]
    if any(r.peak_bytes is not None for r in runs):
        out.append(Knob("memory_reserve_gib", "memory_reserve_gib", False,
                        w["memory_reserve_gib"]))
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
        select_knobs: bool = True, relinearize: bool | None = None,
        prior_sigma: Mapping[str, float] | None = None,
        model_sigma: float | None = None) -> FitResult:
    """Fit the knobs to the runs (module docstring). Raises ValueError without data.
    `progress` gets one-line notes, `bar` (stage, done, total) the cost-model evaluations;
    `select_knobs` False keeps every identified knob (no cross-validation); `relinearize`
    forces finite-difference slopes at every step (True) or Broyden's update (False);
    `prior_sigma` replaces prior widths per knob kind, `model_sigma` the model's
    per-configuration error (defaults: calibrate/prior.py; 0 for runs the model itself made)."""
    if not runs and not micro:
        raise ValueError("no runs to calibrate on")
    knobs = knobs_for(runs, micro, prior_sigma)
    units = Units(runs, micro)
    ms = MODEL_SIGMA_TIME if model_sigma is None else float(model_sigma)
    try:
        return _fit(runs, micro, knobs, units, progress, bar, select_knobs, relinearize, ms)
    finally:
        units.close()


def _fit(runs: Sequence[Run], micro: Sequence[MicroRow], knobs: list[Knob], units: Units,
         progress: Callable[[str], None] | None, bar: Progress | None, select_knobs: bool,
         relinearize: bool | None, model_sigma: float) -> FitResult:
    kind_at = {k.kind: i for i, k in enumerate(knobs)}
    mem_idx = np.array([i for i, r in enumerate(runs) if r.peak_bytes is not None], dtype=int)
    f_prior, peaks = units.at_identity(bar)
    data = Data(run_unit=units.run_unit, meas_t=np.array([r.step_s for r in runs]),
                mem_idx=mem_idx, meas_m=np.array([runs[i].peak_bytes or 0.0 for i in mem_idx]),
                peaks=peaks,
                n_train_units=len(units.train),
                meas_u=np.array([float(m.fields["time_s"]) for m in micro]),
                sigma_t=SIGMA_TIME, sigma_m=SIGMA_MEMORY, ps=kind_at.get("per_step_s"),
                reserve=kind_at.get("memory_reserve_gib"),
                sigma_r=math.hypot(SIGMA_TIME, model_sigma))
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
    # identified by the runs' design (calibrate/prior.py): a set of knobs is, when the runs
    # determine at least MIN_INFORMATION of every knob in it, jointly
    _, j0 = residuals_and_jacobian(lin0, data, prior)

    def gammas(sub: Sequence[int]) -> np.ndarray:
        return information(j0[:, list(sub)], sigma[list(sub)])

    def identified(sub: Sequence[int]) -> bool:
        return bool(np.all(gammas(sub) >= MIN_INFORMATION))
    if progress:
        progress(f"fitting {len(free)} of {len(knobs)} knobs")

    theta, jac, lin, msg = iterate(units, knobs, data, free, lin0, prior, lo, hi, sigma, bar,
                                   relinearize=relinearize)
    if progress:
        progress(f"Gauss-Newton: {msg}")

    # which knobs the runs support, by cross-validation within them (calibrate/select.py)
    time_free = [j for j in free if knobs[j].kind != "memory_reserve_gib"]
    # held-out errors scored on the runs that agree with the others at this all-knob solution
    # (calibrate/select.py: one contradicting run would otherwise choose the knobs)
    st_free, _, _ = predict(lin, data, theta)
    agree = ~outlier_mask(np.log(data.meas_t / st_free), SIGMA_TIME) if len(runs) else None
    sel = (select(lin, data, time_free, theta, lo, hi, sigma, prior, identified, agree)
           if select_knobs else Selection(time_free, 1.0, float("nan"), float("nan"),
                                          ran=False))
    if select_knobs and not sel.ran:  # no cross-validation: best determined alone first
        sel.chosen = []
        for j in sorted(time_free, key=lambda i: (-float(gammas([i])[0]), i)):
            if identified([*sel.chosen, j]):
                sel.chosen.append(j)
    # knobs the design refuses beside the chosen ones: (share determined alone, the least
    # share of a knob of the set with it, that knob)
    design: dict[int, tuple[float, float, str]] = {}
    for j in time_free:
        if j not in sel.chosen and not identified([*sel.chosen, j]):
            g = gammas([*sel.chosen, j])
            design[j] = (float(gammas([j])[0]), float(g.min()),
                         knobs[[*sel.chosen, j][int(np.argmin(g))]].name)
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

    results, notes = knob_results(
        knobs, runs, free, kept, theta, std_theta, sel, design)

    # residuals and outliers
    st0, pk0, mc0 = predict(lin0, data, prior)
    st1, pk1, mc1 = predict(lin_f, data, theta)
    e = np.log(data.meas_t / st1) if len(runs) else np.zeros(0)
    outliers = [runs[int(i)].row for i in np.flatnonzero(outlier_mask(e, SIGMA_TIME))]
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
    for j, kr in enumerate(results):
        kr.determined = float(gammas([j])[0]) if j in free else 0.0
        kr.prior_sigma = knobs[j].sigma
    return FitResult(cal, results, rows, before, after, outliers, notes, model_sigma)


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
