"""Per-key coefficients of the last stage's DeepSeek-V3 MTP terms (tables.Tables `mtp_*`).

One key pins every axis the MTP terms depend on but whether the plan's recompute replays the
MTP layers (`factors.mtp_recomputed`: only with `recompute_layers` None, i.e. every stage fully
recomputed), so the terms are a base value plus what that replay adds; `cpsat_partition` reads
them with a boolean for the replay. The indexing is `tables.plan_cost`'s.

Bounds: `key_bounds` adds these terms to its last stage position (`KeyCoefs.mtp_*`, the least
over the replay flag). `cpsat_master` leaves them out: they are non-negative and only raise the
last stage's time, memory, DP sync and optimizer time, so it stays a lower bound of every
plan's exact step time and never calls a fitting plan infeasible (just looser for MTP models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoparallel_cp.search.tables import Tables


@dataclass(frozen=True)
class MtpCoefs:
    """All `mtp_layers` depths together, per node group (seconds / bytes)."""

    time: list[float]  # layers in base mode (+ ZeRO-3 gathers) + gradient work + extras
    rec: list[float]  # added when the MTP layers are recomputed
    act: list[float]  # kept bytes, not recomputed (one micro-batch)
    ckpt: list[float]  # kept bytes, recomputed
    states: float  # model-state bytes (group independent)
    dps: list[float]
    opt: list[float]


def mtp_coefs(t: Tables, key: Any) -> MtpCoefs | None:
    """The MTP coefficients of `key` (None when the model has no MTP)."""
    if not t.mtp:
        return None
    itp, icp, iep, imb = t.i("tp", key.tp), t.i("cp", key.cp), t.i("ep", key.ep), \
        t.i("mbs", key.mbs)
    iz, idp = t.i("zero", key.zero), t.i("dp", key.dp)
    i6 = (itp, icp, iep, key.sp, imb)
    i6m = i6 + (key.mode,)
    i5 = (itp, iep, iz, idp, icp)
    i4 = (itp, iz, idp, icp)
    ie = (itp, icp, key.sp, imb)
    k, n = t.mtp_kind, float(t.mtp)
    multi = key.pp > 1
    z3 = key.zero >= 3
    G = range(t.groups)

    def time(g: int) -> float:
        x = n * float(t.time[g, k][i6m]) + n * float(t.mbl[g, k][i5]) \
            + float(t.mtp_time[g][ie]) + float(t.mtp_mb[g][i4])
        if z3:
            x += n * float(t.z3l[g, k][i6m + (idp,)])
        return x + (float(t.mtpc_mb[g][i4]) if multi else 0.0)

    return MtpCoefs(
        time=[time(g) for g in G],
        rec=[n * float(t.rec[g, k][i6]) for g in G],
        act=[n * float(t.act[g, k][i6m]) + float(t.mtp_act[g][ie]) for g in G],
        ckpt=[n * float(t.ckpt[g, k][i6]) + float(t.mtp_act[g][ie]) for g in G],
        states=n * float(t.states[k][i5]) + float(t.mtp_states[i4])
        + (float(t.mtpc_states[i4]) if multi else 0.0),
        dps=[n * float(t.dpsync[g, k][i5]) + float(t.mtp_dpsync[g][i4])
             + (float(t.mtpc_dpsync[g][i4]) if multi else 0.0) for g in G],
        opt=[n * float(t.opt[g, k][i5]) + float(t.mtp_opt[g][i4])
             + (float(t.mtpc_opt[g][i4]) if multi else 0.0) for g in G],
    )
