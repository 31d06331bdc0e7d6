"""Claims against evidence (issue 29.3): a plan's predicted MFU against the best MFU published
for its model class and GPU generation.

The table (`evidence.json` next to this module) is generated from the cited corpus
`benchmarks/data/published_runs_*.csv` by `python benchmarks/evidence_table.py` (a test checks
that the packaged file equals what the script writes; the package never reads `benchmarks/`).
Per class it holds the best run's measured MFU (the model's own definition: model FLOPs per
token, cost/flops.py, times the measured tokens/s/GPU over the data-sheet peak of the run's
compute dtype, as `evaluate` reports a plan's) and that run's plan evaluated by the cost model:
its predicted MFU and the share of its step each time term takes.

Class: dense or MoE, a size bucket of the total parameters (`SIZE_BUCKETS`), the GPU
generation (the chip in the GPU's name: A100, H100, H200, H800, B200, ...) and the compute
dtype (bf16 / fp8: their peaks differ twofold). A plan claiming an MFU more than
`BEYOND = 10 %` (relative) above the best published one is `beyond_evidence`; the mark names
the mechanisms that carry the claim: the time terms whose share of the step the plan saves
against the best published plan's evaluated breakdown, and the compute efficiency (MFU per
unit of compute share: GEMM shapes, recompute, attention kernels) where it is higher. No
number changes: the mark informs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

from autoparallel_cp.spec import GPUSpec, Job, ModelSpec
from autoparallel_cp.spec.params import count_params

#: relative excess over the best published MFU from which a claim is beyond the evidence
BEYOND = 0.10
#: upper bounds (billions of total parameters) of the size buckets; the last is open
SIZE_BUCKETS: tuple[float, ...] = (15.0, 100.0, 300.0)
#: the time terms of a breakdown (cost/evaluate.py TimeBreakdown) compared as mechanisms
TERMS: dict[str, str] = {
    "bubble_s": "pipeline bubble", "tp_comm_s": "TP communication",
    "cp_comm_s": "CP communication", "ep_comm_s": "EP all-to-all",
    "pp_comm_s": "PP send/recv", "dp_comm_s": "DP / ZeRO communication",
    "optimizer_s": "optimizer step", "fixed_s": "fixed time per step",
}
#: a term named as a mechanism saves at least this share of the step
MIN_SAVING = 0.01
#: the packaged table's file name
TABLE_FILE = "evidence.json"


def gpu_generation(gpu: GPUSpec | str) -> str:
    """The chip of a GPU name ("H100-SXM5-80GB" -> "H100")."""
    name = gpu if isinstance(gpu, str) else gpu.name
    return name.split("-")[0].split(" ")[0].upper()


def size_bucket(total_params: float) -> str:
    """The size bucket of a model of `total_params` parameters ("15-100B")."""
    b = total_params / 1e9
    lo = 0.0
    for hi in SIZE_BUCKETS:
        if b < hi:
            return f"{lo:g}-{hi:g}B" if lo else f"<{hi:g}B"
        lo = hi
    return f">={lo:g}B"


def model_class(model: ModelSpec) -> str:
    """"dense 15-100B" / "moe >=300B": dense or MoE and the size bucket of the total."""
    kind = "moe" if model.moe is not None else "dense"
    return f"{kind} {size_bucket(count_params(model).total)}"


def class_key(job: Job) -> str:
    """The table key of a job: model class, GPU generation, compute dtype (the slowest node
    group's chip on a mixed cluster: its peak bounds the job's)."""
    gens = sorted({gpu_generation(g.gpu) for g in job.cluster.node_groups})
    return f"{model_class(job.model)} | {'+'.join(gens)} | {job.recipe.compute_dtype}"


def time_shares(time: Mapping[str, Any]) -> dict[str, float]:
    """Each term's share of the step (the compute share under `compute_s`)."""
    step = float(time.get("step_s") or 0.0)
    if step <= 0:
        return {}
    return {k: float(time.get(k) or 0.0) / step for k in ("compute_s", *TERMS)}


@cache
def table() -> dict[str, Any]:
    """The packaged evidence table (class key -> best published run)."""
    text = resources.files("autoparallel_cp.cost").joinpath(TABLE_FILE).read_text("utf-8")
    return dict(json.loads(text)["classes"])


def mechanisms(shares: Mapping[str, float], best: Mapping[str, float], mfu: float,
               best_mfu: float) -> list[dict[str, Any]]:
    """What carries a plan's MFU past the best published plan's (both as the cost model
    evaluates them): MFU = compute share x compute efficiency, so the gain is the overhead the
    plan saves (each term's share of the step it saves, largest first) and the efficiency of
    its compute (MFU per compute share) where that is higher."""
    out: list[dict[str, Any]] = []
    for k, label in TERMS.items():
        saved = best.get(k, 0.0) - shares.get(k, 0.0)
        if saved >= MIN_SAVING:
            out.append({"term": k, "mechanism": label, "plan_share": shares.get(k, 0.0),
                        "published_share": best.get(k, 0.0)})
    out.sort(key=lambda m: m["plan_share"] - m["published_share"])
    cs, bcs = shares.get("compute_s", 0.0), best.get("compute_s", 0.0)
    if cs > 0 and bcs > 0 and best_mfu > 0:
        ratio = (mfu / cs) / (best_mfu / bcs)
        if ratio > 1.0 + MIN_SAVING:
            out.append({"term": "compute_s", "mechanism": "compute efficiency (GEMM shapes, "
                        "recompute, attention kernels)", "plan_share": cs,
                        "published_share": bcs, "efficiency_ratio": ratio})
    return out


def evidence(job: Job, mfu: float, time: Mapping[str, Any]) -> dict[str, Any]:
    """The PLAN's `evidence`: the best published MFU of its class, and `beyond_evidence` with
    the mechanisms when the plan claims more than BEYOND past it."""
    key = class_key(job)
    row = table().get(key)
    if row is None:
        return {"class": key, "best_published_mfu": None, "beyond_evidence": False,
                "mechanisms": [], "note": "no published run of this class in the corpus"}
    best = float(row["mfu"])
    claim = mfu / best - 1.0 if best > 0 else 0.0
    beyond = claim > BEYOND
    return {
        "class": key, "best_published_mfu": best, "run": row["run"], "source": row["source"],
        "published_plan": row["plan"], "model_mfu_on_published_run": row["predicted_mfu"],
        "claim_vs_published": claim, "beyond_evidence": beyond,
        "mechanisms": mechanisms(time_shares(time), row["shares"], mfu,
                                 float(row["predicted_mfu"])) if beyond else [],
    }


def evidence_text(ev: Mapping[str, Any], mfu: float) -> str:
    """One sentence on a claim beyond the evidence ('' when within it)."""
    if not ev.get("beyond_evidence"):
        return ""
    mech = ", ".join(
        f"{m['mechanism']} {m['plan_share']:.0%} of the step vs {m['published_share']:.0%}"
        if m["term"] != "compute_s" else
        f"{m['mechanism']} x{m['efficiency_ratio']:.2f}" for m in ev["mechanisms"][:3])
    return (f"MFU {mfu:.1%} is {ev['claim_vs_published']:+.0%} past the best published "
            f"{ev['class']} run ({ev['best_published_mfu']:.1%}, {ev['run']}; the model "
            f"predicts {ev['model_mfu_on_published_run']:.1%} for it)"
            + (f"; carried by {mech}" if mech else ""))
