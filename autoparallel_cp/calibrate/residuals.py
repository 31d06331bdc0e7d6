"""Residual summaries and prediction intervals of a calibration fit (calibrate/fit.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autoparallel_cp.calibrate.gauss_newton import Data
from autoparallel_cp.calibrate.micro import MicroRow
from autoparallel_cp.calibrate.runs import Run
from autoparallel_cp.spec.calibration import MAX_LOG_INTERVAL, Interval

#: z of a two-sided 80 % normal interval.
Z80 = 1.2816
#: A run whose time residual is further than this many robust sigmas (and OUTLIER_MIN_LOG)
#: from the others' median is reported as an outlier.
OUTLIER_SIGMAS = 3.0
OUTLIER_MIN_LOG = 0.1


def outlier_mask(errors: np.ndarray, noise: float) -> np.ndarray:
    """Which of the ln(measured / predicted) step residuals `errors` contradict the others:
    further than OUTLIER_SIGMAS robust sigmas (1.4826 x the median absolute deviation, at
    least the measurement `noise`) and OUTLIER_MIN_LOG from their median (Rousseeuw & Croux
    1993, JASA 88:1273, the MAD as a robust sigma); none is flagged among fewer than 3."""
    e = np.asarray(errors, dtype=float)
    if len(e) < 3:
        return np.zeros(len(e), dtype=bool)
    med = float(np.median(e))
    s = max(float(np.median(np.abs(e - med))) * 1.4826, noise)
    return (np.abs(e - med) > OUTLIER_SIGMAS * s) & (np.abs(e - med) > OUTLIER_MIN_LOG)


def summary(runs: Sequence[Run], micro: Sequence[MicroRow], steps: np.ndarray,
             peaks: np.ndarray, mic: np.ndarray, d: Data) -> dict[str, float]:
    """MAPE / signed / worst step-time error, peak and microbenchmark MAPE (`peaks`: of the
    runs with a measured peak)."""
    out: dict[str, float] = {}
    if len(runs):
        rel = steps / d.meas_t - 1.0
        out["step_mape_pct"] = float(np.mean(np.abs(rel)) * 100)
        out["step_signed_pct"] = float(np.mean(rel) * 100)
        out["step_worst_pct"] = float(rel[np.argmax(np.abs(rel))] * 100)
    if len(d.mem_idx):
        out["memory_mape_pct"] = float(np.mean(np.abs(peaks / d.meas_m - 1)) * 100)
    if len(micro):
        out["micro_mape_pct"] = float(np.mean(np.abs(mic / d.meas_u - 1)) * 100)
    return out


def interval(errors: Sequence[float], n_fitted: float, noise: float) -> Interval | None:
    """Nominal 80 % interval of ln(measured / predicted) from the fit residuals: +-z80 sigma,
    sigma^2 = sum(e^2) / (n - p) + noise^2 (the residual spread, plus the measurement noise
    of the next run); None with fewer than 3 degrees of freedom (p: the effective number of
    fitted parameters) or when wider than a factor of 10."""
    dof = len(errors) - n_fitted
    if dof < 3:
        return None
    sigma = math.sqrt(sum(x * x for x in errors) / dof + noise ** 2)
    if Z80 * sigma > MAX_LOG_INTERVAL:
        return None  # wider than a factor of 10: a calibration file cannot hold it
    return Interval(lo=-Z80 * sigma, hi=Z80 * sigma)
