"""The per-knob report of a calibration fit (calibrate/fit.py): each knob's value, uncertainty
and status, and the notes that say why a knob moved or stayed at its prior."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autoparallel_cp.calibrate.prior import MIN_INFORMATION, Knob
from autoparallel_cp.calibrate.runs import Run
from autoparallel_cp.calibrate.select import Selection


@dataclass
class KnobResult:
    name: str
    value: float
    std: float | None  # one standard deviation, in the knob's units; None when not fitted
    identified: bool
    note: str = ""
    #: share of the knob the runs determine alone (calibrate/prior.py gamma), 0 when no
    #: prediction depends on it measurably; None for a knob never fitted (memory reserve
    #: without measured peaks has no entry at all)
    determined: float | None = None
    prior_sigma: float | None = None  # the prior width it was fitted under (fit units)


def knob_results(knobs: Sequence[Knob], runs: Sequence[Run], free: Sequence[int],
                  kept: Sequence[int], theta: np.ndarray, std_theta: np.ndarray,
                  sel: Selection, thin: Mapping[int, tuple[float, float, str]]
                  ) -> tuple[list[KnobResult], list[str]]:
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
        elif j in thin and j in free:
            results.append(KnobResult(k.name, k.value(k.prior), None, False,
                                      "not identified by the runs' design, left at its prior"))
            alone, least, which = thin[j]
            taken = ", ".join(knobs[i].name for i in sel.chosen) or "no other knob"
            notes.append(f"{k.name}: not identified by the runs' design: they determine "
                         f"{alone:.0%} of it alone, but with it and {taken} only {least:.0%} "
                         f"of {'itself' if which == k.name else which} (< "
                         f"{MIN_INFORMATION:.0%}: their plans move these knobs alike, or "
                         "too little beside the model's per-configuration error); left at "
                         f"its prior {k.value(k.prior):g}")
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
