"""Calibrating on two runs of a source and predicting its other runs (issue 29, item 5).

    python benchmarks/calibrate_sources.py [--markdown] [--priors] [--pairs N]

For every source of the published corpus (crossval.cases) with at least 4 runs: the two runs
with the smallest and the largest GPU count (ties: corpus order) are given to
`autoparallel_cp.calibrate.fit` as the user's measurements (step time from the published
tokens/s/GPU); the source's other runs are predicted with and without that calibration.
Printed per source: MAPE of tokens/s/GPU before (the shipped model); after a fit of every
identified knob under the weak prior with measurement noise only (`select_knobs=False`, what
`calibrate` did before issue 29.5); after `calibrate`'s fit with the corpus prior
(calibrate/prior.py: the model's per-configuration error and each knob's spread across
sources, both computed here WITHOUT the scored source: leave-one-source-out), knobs chosen by
the runs' design and by cross-validation within them; every knob fitted on all of the
source's runs (in-sample: what no calibration from two runs can beat); the knobs that moved;
and how many of the other runs fall inside the calibrated 80 % interval. Then the check of
issue 29: the mean per-source error at least halves, and no source gets worse by more than 2
points.

`--pairs N`: also score N pairs of runs per source (every pair when fewer; else N pairs drawn
with a fixed seed), each pair predicting the source's other runs: what a user who measured two
runs of their cluster can expect, rather than the one pair of extremes.

`--priors`: the corpus prior from every source (the numbers in calibrate/prior.py).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence

import numpy as np
from harness import crossval as X

from autoparallel_cp.calibrate.fit import FitResult, fit
from autoparallel_cp.calibrate.prior import WEAK_PRIOR_SIGMA
from autoparallel_cp.calibrate.runs import Run
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.uncertainty import time_log_interval
from autoparallel_cp.spec import Job

#: Knob kinds whose spread across sources sets the prior (the memory reserve: no source).
KINDS = ("compute", "net_intra", "net_inter", "per_microbatch_s", "per_step_s")


def runs_of(cs: Sequence[X.Case]) -> list[Run]:
    return [Run(i + 1, c.job, c.plan, c.job.tokens_per_step / (c.measured * c.job.num_gpus),
                None, c.options) for i, c in enumerate(cs)]


def whole_fit(cs: Sequence[X.Case]) -> FitResult:
    """Every identified knob fitted on all of a source's runs, weak prior, noise only."""
    return fit(runs_of(cs), select_knobs=False, prior_sigma=WEAK_PRIOR_SIGMA, model_sigma=0.0)


def corpus_prior(wholes: dict[str, tuple[int, FitResult]], skip: str | None = None
                 ) -> tuple[dict[str, float], float]:
    """(prior width per knob kind, per-configuration sigma) from the in-sample fits of every
    source but `skip` (calibrate/prior.py): the robust spread of the fitted knobs (ln of
    factors) about the identity over sources, 1.4826 x the median absolute value (a source's
    GPU types averaged first; Rousseeuw & Croux 1993, JASA 88:1273: a few sources whose
    knobs ran to their bounds absorbing a mechanism's error must not set the width); the RMS of
    the residuals ln(measured / fitted step) per source with n - (knobs moved) degrees of
    freedom, sources with at least 2 of them, averaged over sources."""
    per_kind: dict[str, list[float]] = {k: [] for k in KINDS}
    var_w: list[float] = []
    for src, (n, res) in wholes.items():
        if src == skip:
            continue
        vals: dict[str, list[float]] = {}
        for k in res.knobs:
            if k.std is None:
                continue
            kind = "compute" if k.name.startswith("compute:") else k.name
            if kind in per_kind:
                vals.setdefault(kind, []).append(
                    math.log(k.value) if kind in ("compute", "net_intra", "net_inter")
                    else k.value)
        for kind, v in vals.items():
            per_kind[kind].append(abs(float(np.mean(v))))
        moved = sum(k.std is not None for k in res.knobs)
        e = [math.log(float(r["measured_step_s"]) / float(r["after_step_s"]))  # type: ignore[arg-type]
             for r in res.rows]
        if n - moved >= 2:
            var_w.append(float(np.sum(np.square(e))) / (n - moved))
    widths = {k: 1.4826 * float(np.median(v)) for k, v in per_kind.items() if v}
    return widths, math.sqrt(float(np.mean(var_w)))


def tps(job: Job, c: X.Case) -> float:
    return float(evaluate(job, c.plan, c.options).throughput.tokens_per_s_per_gpu)


def score(cs: Sequence[X.Case], train: Sequence[int], widths: dict[str, float], sw: float
          ) -> tuple[float, float, float, int, str]:
    """(MAPE before, every knob, calibrate, runs inside the interval, knobs moved) on the
    source's runs not in `train`."""
    given = runs_of([cs[i] for i in train])
    test = [c for i, c in enumerate(cs) if i not in train]
    every = fit(given, select_knobs=False, prior_sigma=WEAK_PRIOR_SIGMA, model_sigma=0.0)
    res = fit(given, prior_sigma=widths, model_sigma=sw)
    b, a_all, a, inside = [], [], [], 0
    for c in test:
        p0 = tps(c.job, c)
        cal_job = c.job.calibrated(res.calibration)
        p1 = tps(cal_job, c)
        p2 = tps(c.job.calibrated(every.calibration), c)
        b.append(abs(p0 / c.measured - 1) * 100)
        a.append(abs(p1 / c.measured - 1) * 100)
        a_all.append(abs(p2 / c.measured - 1) * 100)
        lo, hi = time_log_interval(cal_job)
        inside += lo <= math.log(c.measured / p1) <= hi
    moved = ", ".join(f"{k.name.replace('compute:', '')}={k.value:.3g}"
                      for k in res.knobs if k.std is not None) or "none (prior)"
    return float(np.mean(b)), float(np.mean(a_all)), float(np.mean(a)), inside, moved


def extremes(cs: Sequence[X.Case]) -> list[int]:
    lo = min(range(len(cs)), key=lambda i: (cs[i].gpus, i))
    hi = max(range(len(cs)), key=lambda i: (cs[i].gpus, -i))
    if hi == lo:
        hi = (lo + 1) % len(cs)
    return [lo, hi]


def pairs(n: int, k: int) -> list[list[int]]:
    every = [list(p) for p in itertools.combinations(range(n), 2)]
    if len(every) <= k:
        return every
    rng = np.random.default_rng(29)
    return [every[int(i)] for i in sorted(rng.choice(len(every), size=k, replace=False))]


def main() -> int:
    md = "--markdown" in sys.argv
    n_pairs = int(sys.argv[sys.argv.index("--pairs") + 1]) if "--pairs" in sys.argv else 0
    by_src: dict[str, list[X.Case]] = {}
    for c in X.cases():
        by_src.setdefault(c.source, []).append(c)
    srcs = {s: cs for s, cs in sorted(by_src.items()) if len(cs) >= 4}
    wholes = {s: (len(cs), whole_fit(cs)) for s, cs in srcs.items()}
    if "--priors" in sys.argv:
        widths, sw = corpus_prior(wholes)
        print(f"# {len(wholes)} sources; paste into autoparallel_cp/calibrate/prior.py")
        print(f"MODEL_SIGMA_TIME = {sw:.4f}")
        print("CORPUS_PRIOR_SIGMA = {" + ", ".join(f'"{k}": {v:.4g}'
                                                    for k, v in widths.items()) + "}")
        for s, (n, res) in wholes.items():
            print(f"  {s} ({n} runs): " + ", ".join(
                f"{k.name}={k.value:.3g}" for k in res.knobs if k.std is not None))
    rows = []
    for src, cs in srcs.items():
        widths, sw = corpus_prior(wholes, skip=src)
        tr = extremes(cs)
        b, a_all, a, inside, moved = score(cs, tr, widths, sw)
        whole = wholes[src][1].calibration
        o = float(np.mean([abs(tps(c.job.calibrated(whole), c) / c.measured - 1) * 100
                           for i, c in enumerate(cs) if i not in tr]))
        pair_cols: tuple[float, float, float] | None = None
        if n_pairs:
            ps = [score(cs, p, widths, sw) for p in pairs(len(cs), n_pairs)]
            pair_cols = (float(np.mean([p[0] for p in ps])), float(np.mean([p[2] for p in ps])),
                         float(np.max([p[2] - p[0] for p in ps])))
        rows.append((src, len(cs), b, a_all, a, o, inside, moved, pair_cols, sw,
                     widths.get("compute", float("nan"))))
    sep = " | " if md else "  "
    hdr = ["source", "runs", "MAPE before", "every knob (2 runs)", "calibrate (2 runs)",
           "all runs (in-sample)", "inside 80%", "knobs moved"]
    if n_pairs:
        hdr += [f"{n_pairs} pairs: before", "calibrate", "worst pair"]
    print(("| " if md else "") + sep.join(hdr) + (" |" if md else ""))
    if md:
        print("|" + "---|" * len(hdr))
    for src, n, b, a_all, a, o, inside, f, pc, _sw, _tc in rows:
        cells = [src, str(n), f"{b:.1f}%", f"{a_all:.1f}%", f"{a:.1f}%", f"{o:.1f}%",
                 f"{inside}/{n - 2}", f]
        if pc is not None:
            cells += [f"{pc[0]:.1f}%", f"{pc[1]:.1f}%", f"{pc[2]:+.1f}"]
        print(("| " if md else "") + sep.join(cells) + (" |" if md else ""))
    print("leave-one-source-out prior per source (model sigma, compute width): " + ", ".join(
        f"{r[0]} {r[9]:.3f}/{r[10]:.3f}" for r in rows))
    mb = float(np.mean([r[2] for r in rows]))
    for label, col in (("every knob", 3), ("calibrate", 4), ("all runs, in-sample", 5)):
        ma = float(np.mean([r[col] for r in rows]))
        worse = max(r[col] - r[2] for r in rows)
        print(f"{label}: mean per-source MAPE over {len(rows)} sources {mb:.1f}% -> {ma:.1f}% "
              f"(ratio {ma / mb:.2f}; target <= 0.5); most worse by {worse:+.1f} points "
              "(target <= +2)")
    tot = sum(r[1] - 2 for r in rows)
    ins = sum(r[6] for r in rows)
    print(f"calibrated 80% intervals: {ins}/{tot} = {ins / tot:.1%} of the other runs inside")
    if n_pairs:
        pb = float(np.mean([r[8][0] for r in rows]))
        pa = float(np.mean([r[8][1] for r in rows]))
        print(f"pairs: mean per-source MAPE {pb:.1f}% -> {pa:.1f}% (ratio {pa / pb:.2f}); "
              f"sources worse on average: "
              + (", ".join(f"{r[0]} {r[8][1] - r[8][0]:+.1f}" for r in rows
                           if r[8][1] > r[8][0]) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
