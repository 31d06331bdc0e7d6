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
(`cost.evaluate` on the job with the candidate calibration applied), so the fitted knobs mean
exactly what the solver will use. A knob no run is sensitive to (e.g. the inter-node network
when every run fits in one node) is left at its prior and reported as not identified.
Uncertainty: the Gauss-Newton covariance (J^T J)^-1 at the solution, scaled by the reduced
chi-square of the data residuals when above 1 (Press et al., Numerical Recipes §15.5-15.6).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoparallel_cp.calibrate.micro import MicroRow, micro_predict
from autoparallel_cp.calibrate.runs import Run
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.spec.calibration import BOUNDS, Calibration, Interval

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
#: Soft-L1 scale in noise units: residuals beyond 3 sigma weigh linearly, not quadratically.
F_SCALE = 3.0
#: A knob is identified when moving it by one prior width moves some prediction by at least
#: this many noise sigmas (0.5 -> 1 % of a step time).
MIN_SENSITIVITY = 0.5
#: z of a two-sided 80 % normal interval.
Z80 = 1.2816
#: A run whose time residual is further than this many robust sigmas (and 10 %) from the
#: others' median is reported as an outlier.
OUTLIER_SIGMAS = 3.0


@dataclass(frozen=True)
class Knob:
    name: str  # "compute:<GPU name>", "net_intra", ...
    kind: str  # PRIOR_SIGMA / BOUNDS key
    log: bool  # fitted as ln(value)

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

    def value(self, theta: float) -> float:
        return math.exp(theta) if self.log else theta


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


def _summary(runs: Sequence[Run], micro: Sequence[MicroRow], steps: np.ndarray,
             peaks: np.ndarray, mic: np.ndarray) -> dict[str, float]:
    meas = np.array([r.step_s for r in runs])
    out: dict[str, float] = {}
    if len(runs):
        rel = steps / meas - 1.0
        out["step_mape_pct"] = float(np.mean(np.abs(rel)) * 100)
        out["step_signed_pct"] = float(np.mean(rel) * 100)
        out["step_worst_pct"] = float(rel[np.argmax(np.abs(rel))] * 100)
    mem = [(p, r.peak_bytes) for p, r in zip(peaks, runs, strict=True) if r.peak_bytes]
    if mem:
        out["memory_mape_pct"] = float(np.mean([abs(p / m - 1) for p, m in mem]) * 100)
    if len(micro):
        mm = np.array([float(m.fields["time_s"]) for m in micro])
        out["micro_mape_pct"] = float(np.mean(np.abs(mic / mm - 1)) * 100)
    return out


def fit(runs: Sequence[Run], micro: Sequence[MicroRow] = (),
        progress: Callable[[str], None] | None = None) -> FitResult:
    """Fit the knobs to the runs (module docstring). Raises ValueError without data."""
    if not runs and not micro:
        raise ValueError("no runs to calibrate on")
    knobs = knobs_for(runs, micro)
    meas_t = np.array([r.step_s for r in runs])
    mem_idx = [i for i, r in enumerate(runs) if r.peak_bytes is not None]
    meas_m = np.array([runs[i].peak_bytes or 0.0 for i in mem_idx])
    meas_u = np.array([float(m.fields["time_s"]) for m in micro])

    def data_residuals(ks: Sequence[Knob], theta: Sequence[float]) -> np.ndarray:
        cal = calibration_of(ks, theta)
        st, pk, mc = predictions(runs, micro, cal)
        parts = [np.log(st / meas_t) / SIGMA_TIME]
        if mem_idx:
            parts.append((pk[mem_idx] - meas_m) / (SIGMA_MEMORY * meas_m))
        if len(micro):
            parts.append(np.log(mc / meas_u) / SIGMA_TIME)
        return np.concatenate(parts)

    # identifiability: sensitivity of the data to one prior width of each knob
    zero = [k.prior for k in knobs]
    r0 = data_residuals(knobs, zero)
    sens: list[float] = []
    for i, k in enumerate(knobs):
        th = list(zero)
        th[i] = min(k.prior + 0.5 * k.sigma, k.hi)
        d = np.abs(data_residuals(knobs, th) - r0) / max(th[i] - k.prior, 1e-12) * k.sigma
        sens.append(float(np.max(d)) if d.size else 0.0)
    free = [k for k, s in zip(knobs, sens, strict=True) if s >= MIN_SENSITIVITY]
    if progress:
        progress(f"fitting {len(free)} of {len(knobs)} knobs to {len(runs)} runs"
                 + (f" and {len(micro)} microbenchmark rows" if micro else ""))

    def residuals(theta: np.ndarray) -> np.ndarray:
        prior = [(t - k.prior) / k.sigma for k, t in zip(free, theta, strict=True)]
        return np.concatenate([data_residuals(free, [float(x) for x in theta]),
                               np.array(prior)])

    n_data = len(r0)
    if free:
        # imported here: scipy.optimize takes ~0.3 s to import, and every solve's report reads
        # this module's constants (calibrate/advice.py) without fitting anything
        from scipy.optimize import least_squares

        # start inside the box: a start on a bound (the fixed times' prior 0) stalls the
        # trust-region reflective steps of that variable (Coleman-Li scaling)
        x0 = np.array([min(max(k.prior, k.lo + 0.1 * k.sigma), k.hi - 0.1 * k.sigma)
                       for k in free])
        res = least_squares(residuals, x0, bounds=([k.lo for k in free], [k.hi for k in free]),
                            loss="soft_l1", f_scale=F_SCALE, x_scale=[k.sigma for k in free],
                            diff_step=1e-4, max_nfev=60 * (len(free) + 1))
        theta = res.x
        if progress:
            progress(f"least_squares: {res.message} ({res.nfev} evaluations)")
        r_data = data_residuals(free, [float(x) for x in theta])
        dof = n_data - len(free)
        chi2 = float(np.sum(r_data ** 2))
        scale = max(1.0, chi2 / dof) if dof > 0 else 1.0
        # data rows (robust-loss weighted) scaled by the reduced chi-square, plus the prior
        jd = res.jac[:n_data]
        jtj = jd.T @ jd / scale + np.diag([1.0 / k.sigma ** 2 for k in free])
        cov = np.linalg.inv(jtj)
        std_theta = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        # effective number of parameters the data determined (MacKay 1992, gamma = sum of
        # 1 - posterior / prior variance): a knob held by its prior uses no degree of freedom
        used = np.clip(1.0 - np.diag(cov) / np.array([k.sigma ** 2 for k in free]), 0.0, 1.0)
    else:
        used = np.zeros(0)
        theta = np.zeros(0)
        r_data = r0
        std_theta = np.zeros(0)
        dof = n_data
    cal = calibration_of(free, theta)

    results: list[KnobResult] = []
    notes: list[str] = []
    for k in knobs:
        if k in free:
            i = free.index(k)
            v = k.value(float(theta[i]))
            sd = float(std_theta[i]) * (v if k.log else 1.0)
            weak = std_theta[i] > 0.5 * k.sigma
            note = ("weakly identified: its uncertainty is close to the prior width"
                    if weak else "")
            at_bound = (math.isclose(float(theta[i]), k.lo, abs_tol=1e-6)
                        or math.isclose(float(theta[i]), k.hi, abs_tol=1e-6))
            if at_bound and k.hi != k.lo:
                note = (note + "; " if note else "") + "at its bound"
            results.append(KnobResult(k.name, v, sd, not weak, note))
            if note:
                notes.append(f"{k.name}: {note}")
        else:
            why = _why_not(k, runs)
            results.append(KnobResult(k.name, k.value(k.prior), None, False,
                                      "not identified, left at its prior"))
            notes.append(f"{k.name}: not identified ({why}); left at its prior "
                         f"{k.value(k.prior):g}")

    # residuals and outliers
    st0, pk0, mc0 = predictions(runs, micro, None)
    st1, pk1, mc1 = predictions(runs, micro, cal)
    e = np.log(meas_t / st1) if len(runs) else np.zeros(0)
    outliers: list[int] = []
    if len(e) >= 3:
        med = float(np.median(e))
        mad = float(np.median(np.abs(e - med))) * 1.4826
        s = max(mad, SIGMA_TIME)
        outliers = [runs[i].row for i in range(len(e))
                    if abs(e[i] - med) > OUTLIER_SIGMAS * s and abs(e[i] - med) > 0.1]
    for row in outliers:
        notes.append(f"row {row} contradicts the other runs (residual far beyond their spread): "
                     "check its plan and measurement; its weight in the fit was reduced by the "
                     "robust loss")
    keep = [i for i in range(len(e)) if runs[i].row not in outliers]
    time_iv = _interval([float(e[i]) for i in keep],
                        sum(float(u) for k, u in zip(free, used, strict=True)
                            if k.kind != "memory_reserve_gib"))
    if time_iv is None and len(runs):
        notes.append("too few runs beyond the fitted knobs to estimate the prediction spread: "
                     "intervals stay those of the uncalibrated model")
    mem_e = [math.log((runs[i].peak_bytes or 1.0) / pk1[i]) for i in mem_idx]
    mem_iv = _interval(mem_e, sum(float(u) for k, u in zip(free, used, strict=True)
                                  if k.kind == "memory_reserve_gib"), SIGMA_MEMORY)
    cal = cal.model_copy(update={"time_interval": time_iv, "memory_interval": mem_iv,
                                 "std": {k.name: k.std for k in results if k.std is not None}})

    rows: list[dict[str, float | int | bool | str | None]] = []
    for i, r in enumerate(runs):
        rows.append({
            "row": r.row, "measured_step_s": r.step_s, "before_step_s": float(st0[i]),
            "after_step_s": float(st1[i]),
            "measured_peak_gib": None if r.peak_bytes is None else r.peak_bytes / 2**30,
            "before_peak_gib": float(pk0[i]) / 2**30, "after_peak_gib": float(pk1[i]) / 2**30,
            "outlier": r.row in outliers,
        })
    return FitResult(cal, results, rows, _summary(runs, micro, st0, pk0, mc0),
                     _summary(runs, micro, st1, pk1, mc1), outliers, notes)


def _interval(errors: Sequence[float], n_fitted: float,
              noise: float = SIGMA_TIME) -> Interval | None:
    """Nominal 80 % interval of ln(measured / predicted) from the fit residuals: +-z80 sigma,
    sigma^2 = sum(e^2) / (n - p) + noise^2 (the residual spread, plus the measurement noise
    of the next run); None with fewer than 3 degrees of freedom (p: the effective number of
    fitted parameters)."""
    dof = len(errors) - n_fitted
    if dof < 3:
        return None
    sigma = math.sqrt(sum(x * x for x in errors) / dof + noise ** 2)
    return Interval(lo=-Z80 * sigma, hi=Z80 * sigma)


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
