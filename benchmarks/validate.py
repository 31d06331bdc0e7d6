"""Validate the cost model against published training runs and H200 measurements.

    python benchmarks/validate.py [--markdown] [--cv] [--sensitivity] [--write-snapshot]

`--cv` adds the leave-one-source-out table over all published sources (harness/crossval.py), the
headline number; `--write-snapshot` records every row's signed error for the two-sided
regression guard (tests/cost/test_validation_data.py).

Reads only files under benchmarks/data/ (copied from the calibration set; see its README).
For every usable row prints predicted vs measured tokens/s/GPU (and memory where measured),
the error of each row and the MAPE; rows that cannot be evaluated are listed with the reason.
Defaults used for fields a source leaves empty are the documented defaults of that source,
and every such row is flagged in the `assumed` column.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.train_rows import (
    DATA,
    H200_HELDOUT_FILES,
    h200_rows,
    predicted_reserved_bytes,
    published_rows,
)

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.factors import ALLOCATOR_FRAGMENTATION
from autoparallel_cp.spec import GIB


def main(markdown: bool = False) -> int:
    sep = " | " if markdown else "  "
    print("## Published runs (tokens/s/GPU)\n")
    hdr = ["#", "model", "src", "plan", "pred", "meas", "err%", "mem pred/meas GiB", "fits",
           "assumed"]
    if markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    errs: dict[str, list[float]] = {}
    mem_errs: list[float] = []
    skipped = []
    not_fit = []
    for row in published_rows():
        if row.job is None or row.plan is None:
            skipped.append(row)
            continue
        ev = evaluate(row.job, row.plan, row.options)
        pred = ev.throughput.tokens_per_s_per_gpu
        err = (pred / row.measured_tps - 1) * 100 if row.measured_tps else float("nan")
        if row.measured_tps:
            errs.setdefault(row.source, []).append(abs(err))
        mem_txt = f"{ev.memory.peak_bytes / GIB:.1f}"
        if row.measured_mem_gib:
            reserved = predicted_reserved_bytes(ev) / GIB
            mem_txt = f"{reserved:.1f}/{row.measured_mem_gib:.1f}"
            mem_errs.append(abs(reserved / row.measured_mem_gib - 1) * 100)
        if not ev.fits:
            not_fit.append(row.idx)
        p = row.plan
        plan_txt = (f"tp{p.tp} pp{p.pp} v{p.vpp} cp{p.cp} dp{p.dp} z{p.zero} sp{p.sp} "
                    f"b{p.mbs} m{p.num_microbatches} {p.recompute}")
        cells = [str(row.idx), row.name[:28], row.source, plan_txt, f"{pred:.0f}",
                 f"{row.measured_tps:.0f}" if row.measured_tps else "-", f"{err:+.1f}",
                 mem_txt, "yes" if ev.fits else "NO", row.assumed]
        print(("| " if markdown else "") + sep.join(cells) + (" |" if markdown else ""))
    allerr = [e for v in errs.values() for e in v]
    print()
    for k, v in errs.items():
        print(f"MAPE {k}: {sum(v) / len(v):.1f}% over {len(v)} rows (max {max(v):.1f}%)")
    print(f"MAPE all published rows: {sum(allerr) / len(allerr):.1f}% over {len(allerr)} rows")
    if mem_errs:
        print(f"torchtitan memory (pred peak + {ALLOCATOR_FRAGMENTATION:.3f} x transient vs max "
              "reserved):"
              f" MAPE {sum(mem_errs) / len(mem_errs):.1f}% over {len(mem_errs)} rows")
    print(f"published runs predicted not to fit: {not_fit or 'none'}")
    print("\nSkipped rows:")
    for row in skipped:
        print(f"  #{row.idx} {row.name}: {row.skip}")

    for title, files in (("development: data/h200_pytorch_amp_train.jsonl",
                          ("h200_pytorch_amp_train.jsonl",)),
                         ("held out: data/h200_s15/train_set{1,2,3}.jsonl, session 15",
                          H200_HELDOUT_FILES)):
        h200_table(title, files, markdown, sep)
    return 0


def h200_table(title: str, files: tuple[str, ...], markdown: bool, sep: str) -> None:
    """Predicted vs measured peak memory and step time of single-H200 PyTorch-AMP steps."""
    print(f"\n## H200 pytorch-amp (single GPU), {title}\n")
    hdr2 = ["model", "seq", "mbs", "recompute", "micro-batches", "peak pred GiB",
            "peak meas GiB", "err%", "step pred ms", "step meas ms", "err%"]
    if markdown:
        print("| " + " | ".join(hdr2) + " |")
        print("|" + "---|" * len(hdr2))
    me, te, se = [], [], []
    for r, job, plan in h200_rows(files):
        ev = evaluate(job, plan)
        pm = ev.memory.peak_bytes
        ts = ev.time.step_s
        e1 = (pm / r["peak_bytes"] - 1) * 100
        e2 = (ts / r["step_s"] - 1) * 100
        me.append(abs(e1))
        te.append(abs(e2))
        se.append(e2)
        cells = [str(r["model"]), str(r["seq"]), str(r["mbs"]), str(r["recompute"]),
                 str(plan.num_microbatches), f"{pm / GIB:.2f}", f"{r['peak_bytes'] / GIB:.2f}",
                 f"{e1:+.1f}", f"{ts * 1e3:.1f}", f"{r['step_s'] * 1e3:.1f}", f"{e2:+.1f}"]
        print(("| " if markdown else "") + sep.join(cells) + (" |" if markdown else ""))
    print(f"\nH200 peak memory MAPE {sum(me) / len(me):.1f}% (max {max(me):.1f}%), "
          f"step time MAPE {sum(te) / len(te):.1f}% (signed {sum(se) / len(se):+.1f}%, "
          f"max {max(te):.1f}%) over {len(me)} rows")


def heldout_section(markdown: bool) -> None:
    """Held-out runs (never looked at while the model was built), at the TUNED values."""
    from harness.heldout import heldout_rows

    sep = " | " if markdown else "  "
    print("\n## Held-out published runs (tokens/s/GPU)\n")
    hdr = ["#", "source", "model", "GPUs", "plan", "pred", "meas", "err%", "fits", "assumed"]
    if markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    skipped = []
    for row in heldout_rows():
        if row.job is None or row.plan is None or not row.measured_tps:
            skipped.append(row)
            continue
        ev = evaluate(row.job, row.plan, row.options)
        pred = ev.throughput.tokens_per_s_per_gpu
        err = (pred / row.measured_tps - 1) * 100
        p = row.plan
        plan_txt = (f"tp{p.tp} pp{p.pp} v{p.vpp} cp{p.cp} ep{p.ep} dp{p.dp} z{p.zero} sp{p.sp} "
                    f"b{p.mbs} m{p.num_microbatches} {p.recompute}")
        cells = [str(row.idx), row.source, row.name[:24], str(row.job.num_gpus), plan_txt,
                 f"{pred:.0f}", f"{row.measured_tps:.0f}", f"{err:+.1f}",
                 "yes" if ev.fits else "NO", "; ".join(row.assumed)]
        print(("| " if markdown else "") + sep.join(cells) + (" |" if markdown else ""))
    print("\nSkipped held-out rows:")
    for row in skipped:
        print(f"  #{row.idx} {row.source} {row.name}: {row.skip}")


def error_tables(cv: bool, markdown: bool) -> None:
    """Per-source error (in-sample, and leave-one-source-out with `cv`) and ranking."""
    from harness import crossval as X

    base = X.cases()
    insample = {c.key: X.predict(c) for c in base}
    preds_cv: dict[tuple[str, int], float] = {}
    fitted: dict[str, dict[str, float]] = {}
    if cv:
        _, table = X.grid_predictions()
        preds_cv, fitted = X.loso(base, table)
    print("\n## Error per source (tokens/s/GPU, percent)\n")
    hdr = ["source", "split", "rows", "MAPE", "signed", "worst", "slope/2x GPUs"]
    if cv:
        hdr += ["CV MAPE", "CV signed", "CV worst"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    ins = {s.source: s for s in X.source_stats(base, insample)}
    cvs = {s.source: s for s in X.source_stats(base, preds_cv)} if cv else {}
    for src, st in ins.items():
        cells = [src, st.split, str(st.n), X.fmt(st.mape, False), X.fmt(st.signed),
                 X.fmt(st.worst), X.fmt(st.slope_log2_gpus)]
        if cv:
            c = cvs[src]
            cells += [X.fmt(c.mape, False), X.fmt(c.signed), X.fmt(c.worst)]
        print("| " + " | ".join(cells) + " |")
    print()
    for label, group in (("all", base), ("development", [c for c in base if c.split == "dev"]),
                         ("held-out", [c for c in base if c.split == "heldout"])):
        m, sgn = X.mape(group, insample)
        line = f"{label}: {len(group)} rows, in-sample MAPE {m:.1f}%, signed {sgn:+.1f}%"
        if cv:
            m2, s2 = X.mape(group, preds_cv)
            line += f"; leave-one-source-out MAPE {m2:.1f}%, signed {s2:+.1f}%"
        print(line)
    a, t = X.ranking_agreement(base, insample)
    line = f"ranking agreement (same model shape, measured > 10% apart): {a}/{t}"
    if cv:
        a2, t2 = X.ranking_agreement(base, preds_cv)
        line += f" in-sample, {a2}/{t2} leave-one-source-out"
    print(line)
    ablation_table(base, insample, preds_cv if cv else None)
    if cv:
        print("\nTuned constants re-fitted per held-out source:")
        for src, vals in fitted.items():
            print(f"  {src}: " + ", ".join(f"{k}={v:g}" for k, v in vals.items()))


def ablation_table(base: list, insample: dict[tuple[str, int], float],
                   preds_cv: dict[tuple[str, int], float] | None) -> None:
    """Ranking agreement on the ablation pairs (runs of one job that differ in one choice,
    harness/ablation.py), per axis: the subset of the ranking pairs on exactly these choices."""
    from harness import ablation as A

    print("\n## Ablation pairs (same job, one choice changed; measured > 10% apart scored)\n")
    hdr = ["axis", "pairs", "scored", "agree in-sample"] + (["agree LOSO"] if preds_cv else [])
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    ins = A.agreement(base, insample)
    cvs = A.agreement(base, preds_cv) if preds_cv is not None else {}
    for ax in A.AXES:
        a, t, n = ins[ax]
        cells = [ax, str(n), str(t), f"{a}/{t}"]
        if preds_cv is not None:
            cells.append(f"{cvs[ax][0]}/{cvs[ax][1]}")
        print("| " + " | ".join(cells) + " |")
    tot = [sum(v[i] for v in ins.values()) for i in range(3)]
    line = f"ablation pairs: {tot[2]}, scored {tot[1]}, in-sample {tot[0]}/{tot[1]}"
    if preds_cv is not None:
        line += f", leave-one-source-out {sum(v[0] for v in cvs.values())}/{tot[1]}"
    print(line)


#: Other plausible values of each tuned constant (sources' ranges: the NVL part's 835 and the
#: SXM part's 989 TFLOP/s; no overlap to full overlap).
SENSITIVITY: dict[str, tuple[float, ...]] = {
    "h100_96_peak": (835.0, 912.0, 989.0),
    "megatron_tp_overlap": (0.0, 0.5, 0.8, 1.0),
}


def sensitivity() -> None:
    """How the headline moves when each unstated choice takes its other plausible values."""
    from harness import crossval as X

    print("\n## Sensitivity of the headline to the tuned constants\n")
    print("| constant | value | dev MAPE | dev signed | held-out MAPE | held-out signed |")
    print("|---|---|---|---|---|---|")
    for name, values in SENSITIVITY.items():
        for v in values:
            cs = X.cases({name: v})
            preds = {c.key: X.predict(c) for c in cs}
            dev = [c for c in cs if c.split == "dev"]
            held = [c for c in cs if c.split == "heldout"]
            (m1, s1), (m2, s2) = X.mape(dev, preds), X.mape(held, preds)
            print(f"| {name} | {v:g} | {m1:.1f} | {s1:+.1f} | {m2:.1f} | {s2:+.1f} |")


def write_snapshot(path: Path) -> None:
    """Every evaluable row's signed error (percent) at the TUNED values, for the guard."""
    from harness import crossval as X

    rows = {f"{c.split}:{c.key[1]}": round((X.predict(c) / c.measured - 1) * 100, 2)
            for c in X.cases()}
    path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path} ({len(rows)} rows)")


if __name__ == "__main__":
    if "--write-snapshot" in sys.argv:
        write_snapshot(DATA / "validation_snapshot.json")
        sys.exit(0)
    md = "--markdown" in sys.argv
    rc = main(md)
    heldout_section(md)
    error_tables("--cv" in sys.argv, md)
    if "--sensitivity" in sys.argv:
        sensitivity()
    sys.exit(rc)
