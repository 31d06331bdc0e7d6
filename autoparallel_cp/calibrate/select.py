"""Calibration that does not hurt (issue 29, item 5): which knobs the runs support, chosen by
cross-validation within the runs, and how far towards the prior to shrink them.

K-fold cross-validation (leave-one-out up to MAX_FOLDS runs; run i in fold i mod K) of the
step-time error on held-out runs, mean |ln(predicted / measured)|: every candidate is fitted on
the other folds (calibrate/gauss_newton.py `solve`, on the fit's linear model) and scored on
the held-out runs. Knob sets grow greedily from none (the shipped model) while a knob lowers
the held-out error by at least MIN_GAIN and the runs' design identifies it beside the knobs
already taken (calibrate/prior.py: two runs whose plans move two knobs alike identify one);
then the fitted moves are scaled towards the prior by the factor w in SHRINK with the lowest
held-out error (w = 1 unless shrinking is better by MIN_GAIN). Forward selection by
cross-validation: Hastie, Tibshirani & Friedman, The Elements of Statistical Learning, 2nd
ed., §3.3 and §7.10; shrinking fitted effects towards a prior mean by a cross-validated
factor: §3.4 (ridge) and Efron & Morris (1975, JASA 70:311).

The held-out error is scored on the runs that agree with the others (`scored`: the fit leaves
out those its outlier rule flags at the all-knob solution, calibrate/residuals.py
`outlier_mask`); a contradicting run still takes part in every training fold, down-weighted by
the robust loss. Scored on every run, one contradicting run decides the selection whenever
some knob moves it more than the rest: its held-out |error| (e.g. 0.9 for a step measured 2.5x
the model's) outweighs the ~0.01 by which the right knob beats a wrong one on the others, and
the greedy step takes the knob that best explains that run (e.g. the network, for the only run
whose pipeline link crosses a node: tests/calibrate/test_fit.py
`test_a_contradicting_run_is_reported`). A non-robust criterion in cross-validation selects the
wrong model under contamination however robust the fit (Ronchetti, Field & Blanchard 1997,
JASA 92:1017, "Robust linear model selection by cross-validation").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoparallel_cp.calibrate.gauss_newton import Data, predict, solve
from autoparallel_cp.calibrate.linear import Linear

#: Most folds: leave-one-out up to 10 runs, then 10-fold.
MAX_FOLDS = 10
#: Cross-validation runs up to this many runs; beyond, every identified knob is kept (with
#: hundreds of runs the data, not the prior, determine the knobs, and 10 folds x the greedy
#: steps would dominate the fit's time).
CV_MAX_RUNS = 200
#: A knob (or a shrinkage) is taken when it lowers the held-out error by at least this much,
#: relative (1 %): below that the simpler calibration is kept.
MIN_GAIN = 0.01
#: Shrinkage factors tried, towards the prior (1: the fitted move; 0: the prior).
SHRINK = (1.0, 0.75, 0.5, 0.25)


@dataclass
class Selection:
    chosen: list[int]  # knob indices kept, in the order they were taken
    shrink: float  # w: the fitted move is scaled by it
    cv_prior: float  # held-out error of the shipped model (mean |ln ratio|)
    cv_chosen: float  # held-out error of the chosen calibration
    #: per knob left out: (held-out error with it added to the knobs chosen before it was last
    #: tried, the error without it then)
    gains: dict[int, tuple[float, float]] = field(default_factory=dict)
    ran: bool = True  # False: too few or too many runs to cross-validate


def _folds(n: int) -> list[np.ndarray]:
    k = min(n, MAX_FOLDS)
    idx = np.arange(n)
    return [idx % k == i for i in range(k)]


def cv_error(lin: Linear, d: Data, subset: Sequence[int], w: float, start: np.ndarray,
             lo: np.ndarray, hi: np.ndarray, sigma: np.ndarray, prior: np.ndarray,
             scored: np.ndarray | None = None) -> float:
    """Mean held-out |ln(predicted / measured step)| of the knobs `subset` fitted on the other
    folds, their moves scaled by `w` (the other knobs at the prior), over the runs `scored`
    (bool per run; all by default)."""
    keep = np.ones(d.n_runs, bool) if scored is None else scored
    errs: list[float] = []
    base = prior.copy()
    for held in _folds(d.n_runs):
        th = base
        if subset:
            th = solve(lin, d, subset, np.where(np.isin(np.arange(len(start)), subset), start,
                                                base), lo, hi, sigma, prior,
                       mask=d.row_mask(~held)).theta
        th = prior + w * (th - prior)
        steps, _, _ = predict(lin, d, th)
        errs += list(np.abs(np.log(steps[held & keep] / d.meas_t[held & keep])))
    return float(np.mean(errs))


def select(lin: Linear, d: Data, candidates: Sequence[int], start: np.ndarray, lo: np.ndarray,
           hi: np.ndarray, sigma: np.ndarray, prior: np.ndarray,
           identified: Callable[[Sequence[int]], bool] | None = None,
           scored: np.ndarray | None = None) -> Selection:
    """Greedy forward selection and shrinkage by cross-validation (module docstring); a knob
    joins only while `identified` holds for the knobs taken with it (the runs' design,
    calibrate/prior.py); held-out errors of the runs `scored` (bool per run; all if None)."""
    if (d.n_runs < 2 or d.n_runs > CV_MAX_RUNS or not candidates
            or (scored is not None and not scored.any())):
        return Selection(list(candidates), 1.0, float("nan"), float("nan"), ran=False)

    def cv(sub: Sequence[int], w: float = 1.0) -> float:
        return cv_error(lin, d, sub, w, start, lo, hi, sigma, prior, scored)

    e_prior = cv([])
    chosen: list[int] = []
    e_cur = e_prior
    gains: dict[int, tuple[float, float]] = {}
    left = list(candidates)
    while left:
        if identified is not None:
            left = [j for j in left if identified([*chosen, j])]
            if not left:
                break
        trial = {j: cv([*chosen, j]) for j in left}
        for j, e in trial.items():
            gains[j] = (e, e_cur)
        best = min(left, key=lambda j: (trial[j], j))
        if trial[best] > e_cur * (1.0 - MIN_GAIN):
            break
        chosen.append(best)
        e_cur = trial[best]
        left.remove(best)
    w = 1.0
    if chosen:
        for f in SHRINK[1:]:
            e = cv(chosen, f)
            if e < e_cur * (1.0 - MIN_GAIN):
                w, e_cur = f, e
    return Selection(chosen, w, e_prior, e_cur, gains)
