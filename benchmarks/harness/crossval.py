"""Leave-one-source-out cross-validation of tokens/s/GPU over every published run.

The development rows (`published_runs_train.csv`, four sources the model was built on) and the
held-out rows (`published_runs_heldout.csv`, collected afterwards) form one corpus of sources.
For each source, the constants in `tuned.TUNED` (the only numbers chosen while looking at
end-to-end rows) are re-fitted on the other sources, by grid search of the mean absolute
relative error of the rows that use them, and the held-out source is then predicted with those
values. Mechanisms and hardware constants are fixed (datasheets, microbenchmarks, framework
code), so they need no re-fit.

Also reported per source: signed mean error, the slope of the signed error against log2(GPU
count), and the pairwise ranking agreement within groups of runs of one model shape whose
measured throughputs differ by more than 10%.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.factors import CostOptions
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan
from harness.heldout import heldout_rows
from harness.tuned import TUNED

#: Sources of the development set (validate.published_rows kinds).
DEV_SOURCES = ("sc21", "korthikanti", "mcore", "torchtitan")


@dataclass
class Case:
    """One evaluable run: where it comes from and what the model is asked."""

    key: tuple[str, int]  # (split, row index): stable across knob values
    source: str
    split: str  # "dev" or "heldout"
    name: str
    gpus: int
    shape: tuple[int, ...]  # layers, hidden, ffn, heads, experts: "same model and size"
    job: Job
    plan: Plan
    options: CostOptions
    measured: float
    knobs: tuple[str, ...]


def cases(knobs: Mapping[str, float] | None = None) -> list[Case]:
    """Every run with a plan and a measured tokens/s/GPU, with the tuned constants `knobs`."""
    from harness.train_rows import published_rows

    out: list[Case] = []
    rows: list[tuple[str, object]] = [("dev", r) for r in published_rows(knobs)]
    rows += [("heldout", r) for r in heldout_rows(knobs)]
    for split, r in rows:
        job = getattr(r, "job", None)
        plan = getattr(r, "plan", None)
        measured = getattr(r, "measured_tps", None)
        if job is None or plan is None or not measured:
            continue
        m = job.model
        shape = (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads,
                 m.moe.num_experts if m.moe else 0)
        out.append(Case((split, int(r.idx)), str(r.source), split,
                        str(r.name), job.num_gpus, shape, job, plan,
                        r.options, float(measured),
                        tuple(getattr(r, "knobs", ()))))
    return out


def predict(c: Case) -> float:
    """Predicted tokens/s/GPU of one case."""
    return float(evaluate(c.job, c.plan, c.options).throughput.tokens_per_s_per_gpu)


def grid_predictions(progress: Callable[[str], None] | None = None
                     ) -> tuple[list[Case], dict[tuple[str, int], np.ndarray]]:
    """Every case at the TUNED values, and for each case an array of its predictions over the
    full grid of all tuned constants (axes in TUNED order; constant along the knobs a case does
    not use, so only the grid of its own knobs is evaluated)."""
    names = list(TUNED)
    shape = tuple(len(TUNED[n][1]) for n in names)
    base = cases()
    table: dict[tuple[str, int], np.ndarray] = {}
    sigs = sorted({c.knobs for c in base})
    for sig in sigs:
        members = {c.key for c in base if c.knobs == sig}
        axes = [names.index(k) for k in sig]
        arrays = {k: np.zeros(shape) for k in members}
        for point in itertools.product(*(range(shape[a]) for a in axes)):
            values = {names[a]: TUNED[names[a]][1][i] for a, i in zip(axes, point, strict=True)}
            if progress:
                progress(f"{sig} {values}")
            for c in cases(values):
                if c.key in members:
                    idx: list[slice | int] = [slice(None)] * len(names)
                    for a, i in zip(axes, point, strict=True):
                        idx[a] = i
                    arrays[c.key][tuple(idx)] = predict(c)
        table.update(arrays)
    return base, table


def _fit(train: Sequence[Case], table: Mapping[tuple[str, int], np.ndarray]
         ) -> tuple[int, ...]:
    """Grid index of the tuned constants minimising the training rows' mean |relative error|
    (rows that use no tuned constant add a constant and do not move the argmin)."""
    loss = sum(np.abs(table[c.key] / c.measured - 1.0) for c in train if c.knobs)
    if isinstance(loss, int):  # no training row uses any tuned constant
        return tuple(TUNED[n][1].index(min(TUNED[n][1], key=lambda v, n=n: abs(
            v - TUNED[n][0]))) for n in TUNED)
    return tuple(int(i) for i in np.unravel_index(int(np.argmin(loss)), loss.shape))


@dataclass
class SourceStats:
    """Error of one source's rows."""

    source: str
    split: str
    n: int
    mape: float
    signed: float
    worst: float
    slope_log2_gpus: float | None  # signed error change per doubling of GPUs


def source_stats(cs: Sequence[Case], preds: Mapping[tuple[str, int], float]
                 ) -> list[SourceStats]:
    """MAPE, signed mean, worst row and error trend with log2(GPUs), per source (percent)."""
    out = []
    for src in sorted({c.source for c in cs}, key=lambda s: (s not in DEV_SOURCES, s)):
        rows = [c for c in cs if c.source == src]
        errs = np.array([(preds[c.key] / c.measured - 1.0) * 100 for c in rows])
        g = np.log2([c.gpus for c in rows])
        slope = float(np.polyfit(g, errs, 1)[0]) if len(set(g)) >= 3 else None
        out.append(SourceStats(src, rows[0].split, len(rows), float(np.mean(np.abs(errs))),
                               float(np.mean(errs)), float(errs[np.argmax(np.abs(errs))]),
                               slope))
    return out


def ranking_agreement(cs: Sequence[Case], preds: Mapping[tuple[str, int], float],
                      margin: float = 0.10) -> tuple[int, int]:
    """(agreeing, total) pairs of runs of the same model shape, from any source, whose measured
    tokens/s/GPU differ by more than `margin`, that the predictions order the same way."""
    agree = total = 0
    groups: dict[tuple[int, ...], list[Case]] = {}
    for c in cs:
        groups.setdefault(c.shape, []).append(c)
    for group in groups.values():
        for a, b in itertools.combinations(group, 2):
            hi, lo = (a, b) if a.measured >= b.measured else (b, a)
            if hi.measured < lo.measured * (1 + margin):
                continue
            total += 1
            agree += preds[hi.key] > preds[lo.key]
    return agree, total


def loso(base: Sequence[Case], table: Mapping[tuple[str, int], np.ndarray]
         ) -> tuple[dict[tuple[str, int], float], dict[str, dict[str, float]]]:
    """Leave-one-source-out predictions of every case, and the fitted constants per fold."""
    names = list(TUNED)
    preds: dict[tuple[str, int], float] = {}
    fitted: dict[str, dict[str, float]] = {}
    for src in sorted({c.source for c in base}):
        train = [c for c in base if c.source != src]
        idx = _fit(train, table)
        fitted[src] = {n: TUNED[n][1][i] for n, i in zip(names, idx, strict=True)}
        for c in base:
            if c.source == src:
                preds[c.key] = float(table[c.key][idx]) if c.knobs else float(
                    table[c.key].flat[0])
    return preds, fitted


def mape(cs: Sequence[Case], preds: Mapping[tuple[str, int], float]) -> tuple[float, float]:
    """(MAPE, signed mean error) in percent."""
    errs = [(preds[c.key] / c.measured - 1.0) * 100 for c in cs]
    return float(np.mean(np.abs(errs))), float(np.mean(errs))


def fmt(x: float | None, signed: bool = True) -> str:
    """A percentage cell."""
    if x is None or math.isnan(x):
        return "-"
    return f"{x:+.1f}" if signed else f"{x:.1f}"
