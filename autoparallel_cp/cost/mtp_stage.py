"""The last stage's DeepSeek-V3 MTP terms as memory.py and steptime.py compose them (moved
out of memory.py whole, session 27: memory.py's line cap), and the layers' base recompute
mode. Sources: cost/mtp.py (the MTP work outside its layer), DeepSeek-V3 §2.2 and §3.2.3.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.schedules import mtp_shares_embedding
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan


@dataclass(frozen=True)
class MtpTerms:
    """The last stage's MTP additions: `mtp_layers` x (one layer of `F.mtp_layer_kind` in the
    plan's mode, `F.mtp_recomputed` deciding full recompute, + `F.mtp_factors`), the embedding
    copy when pp > 1. Activations are one micro-batch's (the last model chunk's, as the head's)."""

    dense_p: float
    exp_p: float
    act: float
    work: float
    compute_s: float
    tp_s: float
    cp_s: float
    ep_s: float
    z3_layer: tuple[float, float]  # (dense params of one MTP layer, its base time) for ZeRO-3


def mtp_terms(job: Job, plan: Plan, layer: Callable[[int, str, bool], F.LayerFactors],
              mtps: Callable[[int], F.MtpFactors], g: int) -> MtpTerms | None:
    """The MTP terms of the last stage on node group `g` (None without MTP)."""
    n = job.model.mtp_layers
    if n == 0:
        return None
    kind = F.mtp_layer_kind(job)
    rc = F.mtp_recomputed(plan.recompute, plan.recompute_layers)
    base = layer(g, _base_mode(plan), kind)
    lf = layer(g, "full", kind) if rc else base
    mf = mtps(g)
    d_, e_ = F.layer_param_counts(job, kind, plan.tp, plan.ep, plan.etp)
    # the word-embedding copy of an MTP stage apart from the embedding (none under DualPipe,
    # whose rank 0 holds both: `mtp_shares_embedding`)
    copy = float(mf.copy_params) if plan.pp > 1 and not mtp_shares_embedding(plan) else 0.0
    rcf = 1.0 if rc else 0.0
    return MtpTerms(
        dense_p=n * (float(d_) + float(mf.params)) + copy,
        exp_p=n * float(e_),
        act=n * (float(lf.ckpt_bytes if rc else lf.act_bytes) + float(mf.act_bytes)),
        work=float(lf.work_bytes),
        compute_s=n * (float(lf.compute_s) + rcf * float(lf.rc_compute_s)
                       + float(mf.compute_s)),
        tp_s=n * (float(lf.tp_s) + rcf * float(lf.rc_tp_s) + float(mf.tp_s)),
        cp_s=n * (float(lf.cp_s) + rcf * float(lf.rc_cp_s)),
        ep_s=n * (float(lf.ep_s) + rcf * float(lf.rc_ep_s)),
        z3_layer=(float(d_), float(base.time_s)),
    )


def _base_mode(plan: Plan) -> str:
    """The recompute mode of a stage's kept layers: selective, else none."""
    return "selective" if plan.recompute == "selective" else "none"
