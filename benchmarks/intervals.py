"""Prediction-interval tables from leave-one-source-out errors (cost/uncertainty.py).

    python benchmarks/intervals.py [--markdown]

Throughput: for every published run (crossval.cases) the leave-one-source-out prediction
(crossval.loso: the tuned constants re-fitted without the run's source) gives the error
e = ln(measured / predicted) tokens/s/GPU. Per recipe family (megatron; pytorch = FSDP,
torchtitan, AMP), and within a family per regime where the errors differ (MoE models: the
Megatron MoE rows spread twice as wide as the dense ones), the 10th and 90th percentiles of e,
each source weighing the same, are the nominal 80 % interval of a new prediction: measured
in [pred·exp(q10), pred·exp(q90)].
A regime with fewer than MIN_ROWS runs uses its family's pooled table.

Memory: ln(measured / predicted) of every measured memory row: the H200 single-GPU pytorch-amp
runs (torch.cuda.max_memory_allocated vs the predicted allocated peak) and the torchtitan
rows (max reserved vs the predicted peak + fragmentation on its transient bytes). One table
for all recipes (no Megatron memory rows are published with their plans).

Coverage is scored honestly, nested: for each source, percentiles from the other sources'
errors only, applied to the source's rows. Prints the table to paste into uncertainty.py, the
coverage (target 70-90 %) and the median relative width of the tokens/s interval (target
<= 30 %).
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict

import numpy as np
from harness import crossval as X
from harness.train_rows import h200_rows, predicted_reserved_bytes, published_rows

from autoparallel_cp.cost.evaluate import evaluate

#: Fewest runs a regime needs for its own table (else: the family's pooled table).
MIN_ROWS = 10


def family(framework: str) -> str:
    return "megatron" if framework == "megatron" else "pytorch"


def regime(c: X.Case) -> str:
    """The table key of a case: family, with '-moe' for mixture-of-experts models."""
    return family(c.job.recipe.framework) + ("-moe" if c.job.model.moe is not None else "")


def q(errors: list[tuple[str, float]]) -> tuple[float, float]:
    """(10th, 90th) percentile of (source, error) pairs, each source weighing the same (a new
    user's cluster is a new source: a source with 32 runs must not outvote one with 2);
    weighted percentiles by linear interpolation of the mid-point cumulative weights."""
    count: dict[str, int] = defaultdict(int)
    for s, _ in errors:
        count[s] += 1
    order = sorted(errors, key=lambda se: se[1])
    v = np.array([e for _, e in order])
    w = np.array([1.0 / count[s] for s, _ in order])
    cum = (np.cumsum(w) - 0.5 * w) / w.sum()
    return float(np.interp(0.1, cum, v)), float(np.interp(0.9, cum, v))


def memory_errors() -> list[tuple[str, float]]:
    """(source, ln(measured / predicted)) of every measured memory row."""
    out = []
    for r, job, plan in h200_rows():
        ev = evaluate(job, plan)
        out.append(("h200", math.log(r["peak_bytes"] / ev.memory.peak_bytes)))
    for row in published_rows():
        if row.job is None or row.plan is None or not row.measured_mem_gib:
            continue
        ev = evaluate(row.job, row.plan, row.options)
        pred = predicted_reserved_bytes(ev) / 2**30
        out.append((str(row.source), math.log(row.measured_mem_gib / pred)))
    return out


def main() -> int:
    md = "--markdown" in sys.argv
    base, table = X.grid_predictions()
    preds, _ = X.loso(base, table)
    errs: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for c in base:
        e = (c.source, math.log(c.measured / preds[c.key]))
        errs[family(c.job.recipe.framework)].append(e)
        if c.job.model.moe is not None:
            errs[regime(c)].append(e)
    # the dense regime of a family: its rows that are not in a MoE table
    for fam in ("megatron", "pytorch"):
        moe = errs.get(fam + "-moe", [])
        if len(moe) >= MIN_ROWS:
            errs[fam + "-dense"] = [e for e in errs[fam] if e not in moe]
        else:
            errs.pop(fam + "-moe", None)
    print("# tokens/s/GPU: ln(measured / LOSO prediction), per recipe family")
    tab: dict[str, tuple[float, float]] = {}
    for fam, es in sorted(errs.items()):
        tab[fam] = q(es)
        print(f"  {fam}: {len(es)} runs, {len({s for s, _ in es})} sources, "
              f"q10 {tab[fam][0]:+.4f}, q90 {tab[fam][1]:+.4f}")
    mem = memory_errors()
    mq = q(mem)
    print(f"  memory: {len(mem)} rows, q10 {mq[0]:+.4f}, q90 {mq[1]:+.4f}")

    # nested coverage: each source scored with percentiles of the other sources
    inside = total = 0
    widths: list[float] = []
    per_source: dict[str, list[int]] = {}
    scored = [k for k in errs if k.endswith(("-dense", "-moe"))]
    scored += [f for f in ("megatron", "pytorch") if f + "-dense" not in errs]
    for key in scored:
        es = errs[key]
        for src in sorted({s for s, _ in es}):
            rest = [(s, e) for s, e in es if s != src]
            if len(rest) < 5:
                continue
            lo, hi = q(rest)
            mine = [e for s, e in es if s == src]
            k = sum(lo <= e <= hi for e in mine)
            prev = per_source.get(src, [0, 0])
            per_source[src] = [prev[0] + k, prev[1] + len(mine)]
            inside += k
            total += len(mine)
            widths += [math.exp(hi) - math.exp(lo)] * len(mine)
    m_in = m_tot = 0
    for src in sorted({s for s, _ in mem}):
        rest = [(s, e) for s, e in mem if s != src]
        if len(rest) < 5:
            continue
        lo, hi = q(rest)
        mine = [e for s, e in mem if s == src]
        m_in += sum(lo <= e <= hi for e in mine)
        m_tot += len(mine)
    cov = inside / total if total else float("nan")
    width = float(np.median(widths)) if widths else float("nan")
    print(f"\nnested leave-one-source-out coverage of the nominal 80% tokens/s intervals: "
          f"{inside}/{total} = {cov:.1%} (target 70-90%)")
    print(f"median relative width of the tokens/s interval: {width:.1%} (target <= 30%)")
    if m_tot:
        print(f"memory: nested leave-one-source-out coverage {m_in}/{m_tot} = "
              f"{m_in / m_tot:.1%} (two sources with one-sided errors of opposite sign: "
              "each alone cannot predict the other)")
    pooled_in = sum(mq[0] <= e <= mq[1] for _, e in mem)
    print(f"memory: in-sample coverage of the pooled table {pooled_in}/{len(mem)}, "
          f"relative width {math.exp(mq[1]) - math.exp(mq[0]):.1%}")
    print("per source (inside / rows): " + ", ".join(
        f"{s} {k}/{n}" for s, (k, n) in sorted(per_source.items())))
    print("\n# paste into autoparallel_cp/cost/uncertainty.py")
    print("THROUGHPUT_LOG_ERROR = {")
    for fam, (lo, hi) in sorted(tab.items()):
        print(f'    "{fam}": ({lo:.4f}, {hi:.4f}),')
    print("}")
    print(f"MEMORY_LOG_ERROR = ({mq[0]:.4f}, {mq[1]:.4f})")
    if md:
        print("\n| family | runs | q10 | q90 |\n|---|---|---|---|")
        for fam, (lo, hi) in sorted(tab.items()):
            print(f"| {fam} | {len(errs[fam])} | {math.exp(lo) - 1:+.1%} | "
                  f"{math.exp(hi) - 1:+.1%} |")
        print(f"| memory | {len(mem)} | {math.exp(mq[0]) - 1:+.1%} | {math.exp(mq[1]) - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
