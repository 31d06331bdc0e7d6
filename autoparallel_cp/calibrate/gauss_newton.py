"""The fit's objective on the local log-linear model of calibrate/linear.py, and the
Gauss-Newton loop that relinearises the cost model until the knobs stop moving.

Objective (calibrate/fit.py module docstring): robust (soft-L1) least squares of the time,
memory and microbenchmark residuals plus one Gaussian prior residual per free knob. Each inner
problem is `scipy.optimize.least_squares` (trust-region reflective, bounded) on the linear
model with its exact Jacobian, kept within two prior widths of the linearisation point; the
outer loop re-evaluates the cost model there (`linear.linearize`) and stops when no knob moved
by more than TOL prior widths. With slopes taken again by finite differences at every step, the
linear model's gradient then equals the cost model's (finite-difference) gradient at the
solution, so the solution is the nonlinear problem's own stationary point (Nocedal & Wright,
Numerical Optimization, 2nd ed., §10.3); with Broyden's secant updates (many configurations)
the values are exact and the slopes approximate: tests/calibrate/test_fit_engine.py checks that
both reach the same knobs within a tenth of their uncertainty.

Each step is a trust-region step (Nocedal & Wright §4.1, Algorithm 4.1): the new point's exact
objective (its predictions are evaluated anyway, for the next slopes) is compared with the
reduction the linear model promised; a step that does not lower the exact objective is
refused and the region shrinks (to a quarter of the step), one that keeps less than a quarter
of the promise shrinks it, a good step that reached the region's edge widens it (up to TRUST).
The cost model is piecewise smooth: an overlapped collective costs max(0, comm - compute)
(cost/comm.py `overlap_exposed`), a kink where the two meet (e.g. the data-parallel
all-reduce of 16 H100s at tp 4 turns exposed below ~0.87 of the network's bandwidth: that
run's d ln step / d ln net_inter jumps from -0.018 to -0.068). When the minimum lies at or
near a kink, the slopes on either side point across it, and plain Gauss-Newton steps alternate
between two points until the outer loop's cap stops them on either; a refused step instead
shrinks the region until the steps lower the exact objective, and the iterates settle at the
kink (tests/calibrate/test_fit_engine.py `test_steps_settle_at_a_kink`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoparallel_cp.calibrate.linear import (
    KnobRef,
    Linear,
    Progress,
    Units,
    calibration_at,
    linearize,
    secant_update,
)
from autoparallel_cp.spec import GIB

#: The outer loop (`iterate`): at most MAX_OUTER linearisations (and as many refused steps,
#: one evaluation each); each step
#: stays within TRUST prior widths of the last point; converged when no knob moves more than
#: TOL prior widths; slopes by forward differences of STEP prior widths.
MAX_OUTER = 8
#: Up to this many distinct configurations every step takes its slopes again by finite
#: differences; above, Broyden's update keeps 10^4 rows within a minute.
RELINEARIZE_MAX_UNITS = 300
TRUST = 2.0
TOL = 1e-2
STEP = 0.05
#: Soft-L1 scale in noise units: residuals beyond 3 sigma weigh linearly, not quadratically.
F_SCALE = 3.0
#: Trust-region ratio test (`iterate`): a step keeping less than RHO_SHRINK of the linear
#: model's promised reduction shrinks the region, one keeping more than RHO_GROW at its edge
#: widens it; a step that raises the exact objective is refused (Nocedal & Wright §4.1).
RHO_SHRINK = 0.25
RHO_GROW = 0.75


@dataclass
class Data:
    """The measured rows the residuals compare with (fit.py builds it)."""

    run_unit: np.ndarray  # unit of each training run
    meas_t: np.ndarray  # measured step seconds per run
    mem_idx: np.ndarray  # runs with a measured peak
    meas_m: np.ndarray  # their peaks, bytes
    peaks: np.ndarray  # predicted peak bytes per training unit at the identity
    n_train_units: int
    meas_u: np.ndarray  # measured seconds per microbenchmark row
    sigma_t: float
    sigma_m: float
    ps: int | None  # index of per_step_s among the knobs
    reserve: int | None  # index of memory_reserve_gib
    #: sigma of a training run's ln step residual: the measurement noise and the model's
    #: per-configuration error (calibrate/prior.py); None: sigma_t
    sigma_r: float | None = None

    @property
    def sigma_run(self) -> float:
        return self.sigma_t if self.sigma_r is None else self.sigma_r

    @property
    def n_runs(self) -> int:
        return len(self.meas_t)

    @property
    def n_rows(self) -> int:
        return len(self.meas_t) + len(self.mem_idx) + len(self.meas_u)

    def row_mask(self, runs: np.ndarray) -> np.ndarray:
        """Data rows (time, memory, micro) that belong to the training runs `runs` (bool per
        run); every microbenchmark row is kept."""
        return np.concatenate([runs, runs[self.mem_idx], np.ones(len(self.meas_u), bool)])


def predict(lin: Linear, d: Data, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """(step seconds per run, peak bytes per measured-peak run, seconds per micro row)."""
    s = lin.unit_seconds(theta)
    ps = lin.knobs[d.ps].value(float(theta[d.ps])) if d.ps is not None else 0.0
    res = lin.knobs[d.reserve].value(float(theta[d.reserve])) if d.reserve is not None else 0.0
    steps = s[d.run_unit] + ps
    peaks = d.peaks[d.run_unit[d.mem_idx]] + res * GIB
    return steps, peaks, s[d.n_train_units:]


def residuals_and_jacobian(lin: Linear, d: Data, theta: np.ndarray
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Data residuals (time, memory, micro) and their Jacobian over all knobs."""
    s = lin.unit_seconds(theta)
    steps, peaks, mic = predict(lin, d, theta)
    k = len(lin.knobs)
    r_t = np.log(steps / d.meas_t) / d.sigma_run
    su = s[d.run_unit]
    j_t = (su / steps)[:, None] * lin.slopes[d.run_unit] / d.sigma_run
    if d.ps is not None:
        j_t[:, d.ps] = 1.0 / (steps * d.sigma_run)
    r_m = (peaks - d.meas_m) / (d.sigma_m * d.meas_m)
    j_m = np.zeros((len(d.mem_idx), k))
    if d.reserve is not None and len(d.mem_idx):
        j_m[:, d.reserve] = GIB / (d.sigma_m * d.meas_m)
    r_u = np.log(mic / d.meas_u) / d.sigma_t
    j_u = lin.slopes[d.n_train_units:] / d.sigma_t
    return np.concatenate([r_t, r_m, r_u]), np.vstack([j_t, j_m, j_u])


def objective(lin: Linear, d: Data, free: Sequence[int], theta: np.ndarray,
              prior: np.ndarray, sigma: np.ndarray, f_scale: float = F_SCALE) -> float:
    """`solve`'s cost at `theta` on the linear model `lin` (exact at lin.theta0): scipy's
    soft-L1 cost, 0.5 sum f^2 rho((r / f)^2), rho(z) = 2 (sqrt(1 + z) - 1), of the data and
    the free knobs' prior residuals."""
    fs = np.array(list(free), dtype=int)
    r, _ = residuals_and_jacobian(lin, d, theta)
    z = np.concatenate([r, (theta[fs] - prior[fs]) / sigma[fs]]) / f_scale
    return float(f_scale ** 2 * np.sum(np.sqrt(1.0 + z * z) - 1.0))


@dataclass
class Solved:
    theta: np.ndarray  # all knobs (the not-free ones where they were given)
    jac: np.ndarray  # loss-weighted Jacobian of the kept data rows, free knobs only
    message: str


def solve(lin: Linear, d: Data, free: Sequence[int], start: np.ndarray, lo: np.ndarray,
          hi: np.ndarray, sigma: np.ndarray, prior: np.ndarray, mask: np.ndarray | None = None,
          f_scale: float = 3.0, shrink: float = 1.0) -> Solved:
    """Minimise the objective on the linear model over the knobs `free` within [lo, hi]
    (the others stay at `start`); rows outside `mask` are left out (cross-validation).
    `shrink` < 1 narrows every prior width by that factor (a stronger pull to the prior)."""
    from scipy.optimize import least_squares  # ~0.3 s to import: only when fitting

    free = list(free)
    theta = start.astype(float).copy()
    if not free:
        return Solved(theta, np.zeros((0, 0)), "no free knob")
    keep = np.ones(d.n_rows, bool) if mask is None else mask
    fs = np.array(free)
    sig = sigma[fs] * shrink

    def full(x: np.ndarray) -> np.ndarray:
        t = theta.copy()
        t[fs] = x
        return t

    def fun(x: np.ndarray) -> np.ndarray:
        r, _ = residuals_and_jacobian(lin, d, full(x))
        return np.concatenate([r[keep], (x - prior[fs]) / sig])

    def jac(x: np.ndarray) -> np.ndarray:
        _, j = residuals_and_jacobian(lin, d, full(x))
        return np.vstack([j[keep][:, fs], np.diag(1.0 / sig)])

    # start inside the box: a start on a bound stalls the trust-region reflective steps of
    # that variable (Coleman-Li scaling)
    lo_f, hi_f = lo[fs], hi[fs]
    x0 = np.minimum(np.maximum(theta[fs], lo_f + 0.01 * sigma[fs]), hi_f - 0.01 * sigma[fs])
    x0 = np.minimum(np.maximum(x0, lo_f), hi_f)
    res: Any = least_squares(fun, x0, jac=jac, bounds=(lo_f, hi_f), loss="soft_l1",
                             f_scale=f_scale, x_scale=sigma[fs], method="trf")
    return Solved(full(res.x), res.jac[: int(keep.sum())], str(res.message))


def iterate(units: Units, knobs: Sequence[KnobRef], d: Data, free: Sequence[int],
                  lin: Linear, prior: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                  sigma: np.ndarray, bar: Progress | None, start: np.ndarray | None = None,
                  relinearize: bool | None = None
                  ) -> tuple[np.ndarray, np.ndarray, Linear, str]:
    """The outer Gauss-Newton loop (module docstring): (theta, loss-weighted data
    Jacobian of the free knobs, the last linear model, a status line). Each new point is
    evaluated exactly; its slopes are taken again by finite differences (`relinearize`, the
    default up to RELINEARIZE_MAX_UNITS units) or corrected by Broyden's secant update
    (`linear.secant_update`: one evaluation per unit and step)."""
    theta = (prior if start is None else start).copy()
    if not free:
        return theta, np.zeros((d.n_rows, 0)), lin, "no knob to fit"
    if relinearize is None:
        relinearize = len(units) <= RELINEARIZE_MAX_UNITS
    dep = None if relinearize else units.dependence(knobs)
    fs = np.array(free)
    moved = math.inf
    radius = TRUST  # prior widths
    if not np.array_equal(theta, lin.theta0):  # the exact values at the start
        lin = Linear(lin.knobs, theta.copy(), units.values(calibration_at(knobs, theta)),
                     lin.slopes)
    here = objective(lin, d, free, theta, prior, sigma)
    refused = 0
    for it in range(1, 2 * MAX_OUTER + 1):
        if it - refused > MAX_OUTER:
            break
        box_lo = np.maximum(lo, theta - radius * sigma)
        box_hi = np.minimum(hi, theta + radius * sigma)
        sol = solve(lin, d, free, theta, box_lo, box_hi, sigma, prior, f_scale=F_SCALE)
        moved = float(np.max(np.abs(sol.theta[fs] - theta[fs]) / sigma[fs]))
        if moved < TOL and it > 1:
            # the last evaluated point (within TOL prior widths of the solution): its exact
            # predictions are lin.f0, so the report needs no further evaluation
            return theta, sol.jac, lin, f"converged in {it} steps"
        f = units.values(calibration_at(knobs, sol.theta), progress=bar,
                         stage=f"predictions, step {it}")
        there = objective(Linear(lin.knobs, sol.theta.copy(), f, lin.slopes), d, free,
                          sol.theta, prior, sigma)
        promised = here - objective(lin, d, free, sol.theta, prior, sigma)
        rho = (here - there) / promised if promised > 0 else -1.0
        if rho < RHO_SHRINK:
            radius = 0.25 * moved
        elif rho > RHO_GROW and moved >= 0.99 * radius:
            radius = min(2.0 * radius, TRUST)
        if there >= here:
            refused += 1
            continue  # refused: a smaller step from the same point and slopes
        theta, here = sol.theta, there
        if dep is None:
            lin = linearize(units, list(knobs), theta, [STEP * float(s) for s in sigma], bar,
                            f0=f)
        else:
            lin = secant_update(lin, theta, f, dep, sigma)
    # the best point evaluated (its exact predictions are lin.f0), the Jacobian of a last
    # step from it
    sol = solve(lin, d, free, theta, np.maximum(lo, theta - radius * sigma),
                np.minimum(hi, theta + radius * sigma), sigma, prior, f_scale=F_SCALE)
    return theta, sol.jac, lin, (f"stopped after {MAX_OUTER} steps (last move "
                                 f"{moved:.2g} prior widths)")
