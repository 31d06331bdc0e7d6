"""What a calibration may believe before it sees the user's runs (issue 29, item 5).

Two numbers from the published corpus decide how far a few runs can move a knob:

- MODEL_SIGMA_TIME, the cost model's per-configuration error: what is left of
  ln(measured / predicted step) within one source after every knob was fitted on all of that
  source's runs (each source weighing the same; degrees of freedom: runs less knobs moved).
  A run's time residual is divided by sqrt(SIGMA_TIME^2 + MODEL_SIGMA_TIME^2), not by the
  2 % measurement noise alone: two runs that agree on a 20 % error may share a 20 % error of
  their configuration that the user's other plans do not have.
- CORPUS_PRIOR_SIGMA, the spread of each knob across sources: 1.4826 x the median over sources
  of |knob| (ln of a factor; seconds for the fixed times) fitted on all of each source's runs,
  a robust standard deviation about the identity (Rousseeuw & Croux 1993, JASA 88:1273: the
  few sources whose knobs ran to their bounds absorbing one mechanism's error do not set it).
  A knob whose fitted value is far beyond what the corpus's clusters needed is pulled back.

Both are produced by `python benchmarks/calibrate_sources.py --priors`, and the benchmark
scores each source with the values fitted without it (leave-one-source-out). Together they are
the empirical-Bayes prior of a random-effects model (source effect ~ N(0, tau^2), run effect
~ N(0, sigma_w^2)): the posterior mean moves a knob by the fraction tau^2 / (tau^2 +
sigma_w^2 / n) of what n runs say (Gelman et al., Bayesian Data Analysis, 3rd ed., §5.4-5.5;
Efron & Morris 1975, JASA 70:311).

Identifiability from the runs' design: a knob is fitted only when the runs determine at least
MIN_INFORMATION of it, the knob's share gamma_j = 1 - posterior variance / prior variance of
the Gaussian posterior with precision J^T J + diag(1 / prior^2), J the Jacobian of the
scaled time residuals at the prior (MacKay 1992, Neural Computation 4:415, "well-determined
parameters"). It depends on which runs were measured, not on what they measured: two runs
whose plans move a knob and another knob alike share one direction between them, and neither
is identified.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoparallel_cp.calibrate.linear import KnobRef
from autoparallel_cp.spec.calibration import BOUNDS

#: Per-configuration error of the cost model, ln(measured / predicted step), one standard
#: deviation: `python benchmarks/calibrate_sources.py --priors` (2026-12-04, 14 sources with
#: >= 4 runs, 199-run corpus at commit 22238d1).
MODEL_SIGMA_TIME = 0.0858
#: Spread of each knob across the corpus's sources (ln of a factor; seconds for the fixed
#: times), one standard deviation: same script and date. The memory reserve has no source with
#: measured peaks and plans: it keeps calibrate/fit.py's weak prior.
CORPUS_PRIOR_SIGMA: dict[str, float] = {
    "compute": 0.0871, "net_intra": 0.590, "net_inter": 0.426, "per_microbatch_s": 0.0126,
    "per_step_s": 0.279,
}
#: A knob is fitted when the runs determine at least this share of it (gamma_j above): the
#: data, not the prior, decide more than half its posterior.
MIN_INFORMATION = 0.5


def information(jac: np.ndarray, prior_sigma: Sequence[float] | np.ndarray) -> np.ndarray:
    """gamma_j = 1 - posterior var / prior var per knob (module docstring), from the Jacobian
    `jac` of the scaled data residuals (rows) over the knobs (columns, in fit units)."""
    s2 = np.asarray(prior_sigma, dtype=float) ** 2
    if jac.size == 0:
        return np.zeros(len(s2))
    post = np.linalg.inv(jac.T @ jac + np.diag(1.0 / s2))
    return np.clip(1.0 - np.diag(post) / s2, 0.0, 1.0)


#: Weak prior widths (one standard deviation) of each knob around the identity: compute and
#: network factors +-20 % / +-30 % in log space (the spread of the per-source signed errors in
#: benchmarks/RESULTS.md), 20 ms per micro-batch, 1 s per step, 2 GiB reserve. The fit uses
#: the corpus's spread of each knob across sources where it has one (CORPUS_PRIOR_SIGMA).
WEAK_PRIOR_SIGMA = {"compute": 0.2, "net_intra": 0.3, "net_inter": 0.3,
                    "per_microbatch_s": 0.02, "per_step_s": 1.0, "memory_reserve_gib": 2.0}
#: The prior widths `fit` uses by default.
PRIOR_SIGMA = WEAK_PRIOR_SIGMA | CORPUS_PRIOR_SIGMA


@dataclass(frozen=True)
class Knob(KnobRef):
    """A fitted knob: name ("compute:<GPU name>", "net_intra", ...), kind (a PRIOR_SIGMA /
    BOUNDS key), whether it is fitted as ln(value); its bounds and prior in fit units; `width`
    its prior width (0: PRIOR_SIGMA's)."""

    width: float = 0.0

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
        return self.width if self.width > 0 else PRIOR_SIGMA[self.kind]
