"""CP-SAT plan axes and the degree rules shared by the solver's models.

`add_axes` creates one one-hot `cpsat_blocks.Axis` per plan axis (tp, cp, pp, dp, ep, vpp, mbs,
micro-batch count m, zero, sp, recompute mode) and the linear degree rules over their exponent
encodings (dp*tp*pp*cp = N, dp*mbs*m = B, ep | dp*cp (etp*ep | tp*cp*dp with a fixed
expert-TP size, and then sp = 1 for folded tp > 1), pp <= m when interleaved, sp needs tp > 1,
uniform partitions need pp*vpp | L, node-group divisibility on heterogeneous clusters). The
key-level master (`cpsat_master`) is built on these axes; the per-key partition model
(`cpsat_partition`) takes the key as constants. No model here grows with the number of plans.
"""

from __future__ import annotations

from typing import cast

from ortools.sat.python import cp_model

from autoparallel_cp.search import cpsat_blocks as cb
from autoparallel_cp.search.tables import Tables
from autoparallel_cp.spec.plan import RECOMPUTE_MODES


def add_axes(model: cp_model.CpModel, t: Tables) -> dict[str, cb.Axis]:
    """One-hot plan axes and the degree rules (dp*tp*pp*cp = N, dp*mbs*m = B, ...), linear."""
    s = t.space
    job = s.job
    L = s.num_layers
    N = job.num_gpus
    B = job.global_batch
    hetero = t.groups > 1
    ax: dict[str, cb.Axis] = {}
    for name, dom in (("tp", s.tp), ("cp", s.cp), ("pp", s.pp), ("dp", t.dp), ("ep", s.ep),
                      ("vpp", s.vpp), ("mbs", s.mbs), ("m", t.m), ("zero", s.zero),
                      ("sp", s.sp), ("mode", tuple(RECOMPUTE_MODES.index(x)
                                                   for x in s.recompute))):
        ax[name] = cb.Axis.new(model, name, dom)
    cb.add_product_equals(model, [ax["tp"], ax["cp"], ax["pp"], ax["dp"]], N)
    cb.add_product_equals(model, [ax["dp"], ax["mbs"], ax["m"]], B)
    etps = s.etp_axis if len(s.etp_axis) > 1 else (s.etp,)
    # hybrid sharding: the experts' DP group divides by dp_replicate R too (space.ep_ok)
    rep = s.dp_replicate if job.model.moe is not None else 1
    # the expert grid rule of one of the searched expert-TP sizes (space.ep_ok)
    pick = [model.new_bool_var(f"etp{i}") for i in range(len(etps))] if len(etps) > 1 else []
    if pick:
        model.add_bool_or(pick)
    for i, e in enumerate(etps):
        on = pick[i:i + 1]
        if e is None and rep == 1:
            cb.add_divides(model, [ax["ep"]], [ax["dp"], ax["cp"]], enforce=on)
            continue
        # etp*ep*R | tp*cp*dp with etp a constant (ep*R | dp*cp for etp = tp): prime by prime
        over = ("cp", "dp") if e is None else ("tp", "cp", "dp")
        for p in cb.primes_of([e or 1, rep, *s.ep, *s.tp, *s.cp, *t.dp]):
            have = sum(ax[a].exponent(p) for a in over)
            c = model.add(ax["ep"].exponent(p)
                          <= have - cb.valuation(e or 1, p) - cb.valuation(rep, p))
            if on:
                c.only_enforce_if(on)
    one_vpp = ax["vpp"].lit(1)
    # negated() is a NotBooleanVariable (a Literal, not an IntVar); add_divides only passes
    # `enforce` on to only_enforce_if, which accepts any literal
    interleaved = cast(list[cp_model.IntVar],
                       [one_vpp.negated()] if one_vpp is not None else [])
    if interleaved or one_vpp is None:
        # Megatron's interleaved schedule runs m >= pp micro-batches (groups of pp..m,
        # spec.plan.microbatch_group); pp | m is no longer required
        ge = model.add(ax["pp"].value <= ax["m"].value)
        if interleaved:
            ge.only_enforce_if(interleaved)
        pp1 = ax["pp"].lit(1)
        if pp1 is not None:
            if one_vpp is None:
                model.add(pp1 == 0)
            else:
                model.add_implication(pp1, one_vpp)
    sp1 = ax["sp"].lit(1)
    tp1 = ax["tp"].lit(1)
    if sp1 is not None and tp1 is not None:
        model.add_implication(sp1, tp1.negated())
    for v in s.tp:  # a folded layout with tp > 1 needs sp (space.sp_ok)
        if not s.sp_ok(v, 0):
            tv = ax["tp"].lit(v)
            if tv is not None:
                if sp1 is None:
                    model.add(tv == 0)
                else:
                    model.add_implication(tv, sp1)
    if s.partition == "uniform":
        cb.add_divides(model, [ax["pp"], ax["vpp"]], L)
    if "dp" in s.fixed:
        model.add(ax["dp"].value == s.fixed["dp"])
    if hetero:
        for g in job.cluster.node_groups:
            # dp*tp*cp = N/pp divides the group's GPU count  <=>  N | G*pp
            for p in cb.primes_of([N, g.num_gpus] + list(s.pp)):
                model.add(cb.valuation(N, p) <= cb.valuation(g.num_gpus, p)
                          + ax["pp"].exponent(p))
    return ax
