"""Tightness, not only validity, of the search's bounds and models (issue 16, mutation testing
pass 4): a bound that drops or flips a term usually stays a valid lower bound, so checks of the
form "bound <= best" let it through; these tests pin the bounds where their docstrings say they
are exact, each against the exact composition of `tables.plan_cost` (tests/search/test_one_cost.py
checks that it equals `evaluate()`), with partitions enumerated here by hand.

- The per-key partition model (search/cpsat_partition.py): for *every* partition of a key
  (stage layer counts, recomputed layers, node group of each stage) pinned into the model, the
  model is feasible exactly when the partition fits (up to its rounding of bytes to 1 B), and its
  objective is a lower bound of the partition's exact step time off by at most its own
  `error_bound_s` (its docstring). Cases: two node groups with the DP tail exposed (DP sync
  longer than 2/3 of the stage time), a memory-bound MoE key with a dense prefix, interleaving
  and ZeRO-3, and a four-stage memory-bound key with partial recompute.
- The key master (search/cpsat_master.py) for one-stage keys: pp = 1 leaves no bubble, no p2p
  and one stage, so T = S = the stage's time and the DP tail is max(DP_TAIL_FRACTION*d, d - 2/3
  t) of that stage: both of its bounds are then exact but for floor rounding (a few us).
- `key_bound` (search/key_bounds.py) for one-stage keys whose memory forces partial recompute:
  its grid over the recompute count is then exact, so it equals the key's best.
- The master's degree rules (search/cpsat_axes.py): the keys it lists are exactly the legal
  keys, counted here with spec/plan.py's `plan_violations` over every combination of axis values.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from ortools.sat.python import cp_model
from test_solver_vs_enumerate import _key, _mini, _mixed_small, _ranked_or_raise

from autoparallel_cp.cost.factors import DP_TAIL_FRACTION
from autoparallel_cp.cost.steptime import BACKWARD_SHARE
from autoparallel_cp.search.cpsat_master import Key, ListingCut, build_master, enumerate_keys
from autoparallel_cp.search.cpsat_partition import build_partition
from autoparallel_cp.search.key_bounds import key_bound, key_coefs
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.schedule_axis import plan_schedule
from autoparallel_cp.search.solve import best_for_key
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import Tables, build_tables, key_variants, plan_cost
from autoparallel_cp.spec import ClusterSpec, Job
from autoparallel_cp.spec.loaders import load_cluster, load_model
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan, plan_violations
from autoparallel_cp.spec.splits import named_layouts


def _with_memory(c: ClusterSpec, gib: float) -> ClusterSpec:
    """The cluster with `gib` GiB GPUs: a small model then meets the memory limit."""
    return c.model_copy(update={"node_groups": [
        g.model_copy(update={"gpu": g.gpu.model_copy(update={"memory_gib": gib})})
        for g in c.node_groups]})


def _splits(L: int, pp: int, vpp: int, first_min: int) -> list[tuple[int, ...]]:
    """Every split of L layers into pp stages, each a multiple of vpp (>= vpp), the first
    holding at least `first_min` (the dense prefix)."""
    return [c for c in itertools.product(range(vpp, L + 1, vpp), repeat=pp)
            if sum(c) == L and c[0] >= first_min]


def _placements(job: Job, pp: int) -> list[tuple[int, ...] | None]:
    """Every assignment of stages to node groups, group g holding G_g * pp / N stages."""
    groups = job.cluster.node_groups
    if len(groups) == 1:
        return [None]
    n = [g.num_gpus * pp // job.num_gpus for g in groups]
    return [pl for pl in itertools.product(range(len(groups)), repeat=pp)
            if all(pl.count(g) == n[g] for g in range(len(groups)))]


def _plan(key: Key, ls: tuple[int, ...], r: int | None, groups: tuple[int, ...] | None,
          schedule: Any = None) -> Plan:
    full = RECOMPUTE_MODES[key.mode] == "full"
    return Plan(dp=key.dp, tp=key.tp, pp=key.pp, vpp=key.vpp, cp=key.cp, ep=key.ep,
                sp=key.sp, zero=key.zero, mbs=key.mbs, num_microbatches=key.m,
                recompute=RECOMPUTE_MODES[key.mode],
                recompute_layers=r if full and r is not None and r < max(ls) else None,
                stage_layers=ls, stage_groups=groups, schedule=schedule)


def _every_partition(t: Tables, key: Key) -> tuple[int, int, float]:
    """Pin each partition of `key` into the partition model and compare with plan_cost.

    Returns (partitions checked, partitions that fit, the largest exact - objective)."""
    job, L = t.space.job, t.space.num_layers
    full = RECOMPUTE_MODES[key.mode] == "full"
    K = t.dense_prefix if t.main_kind else 0
    checked = fitting = 0
    worst = 0.0
    for ls in _splits(L, key.pp, key.vpp, max(K, 1)):
        if any(ls[j] > ls[j + 1] for j in range(1, key.pp - 2)):
            # the model orders the middle stages (interchangeable but for their in-flight
            # count, which does not rise along the pipeline): the sorted split stands in, as
            # fast and no larger a peak
            swapped = (ls[0], *sorted(ls[1:-1]), ls[-1])
            a = plan_cost(t, _plan(key, ls, None if not full else L, None))
            b = plan_cost(t, _plan(key, swapped, None if not full else L, None))
            assert b.step_s == pytest.approx(a.step_s, rel=1e-12)
            # one node group: the largest peak decides whether a split fits
            assert max(b.stage_charged) <= max(a.stage_charged) * (1 + 1e-12)
            continue
        for r in (range(1, max(ls) + 1) if full else [None]):
            for groups in _placements(job, key.pp):
                pm = build_partition(t, key)
                assert pm is not None
                for j, n in enumerate(ls):
                    pm.model.add(pm.layers[j] == n)
                if r is not None:
                    pm.model.add(pm.r == r)
                if groups is not None:
                    assert pm.y is not None
                    for j, g in enumerate(groups):
                        pm.model.add(pm.y[j][g] == 1)
                plan = _plan(key, ls, r, groups, plan_schedule(t.space.schedule))
                exact = plan_cost(t, plan)
                solver = cp_model.CpSolver()
                solver.parameters.num_workers = 1
                st = solver.solve(pm.model)
                checked += 1
                margin = max(p - t.capacity[g] for p, g in
                             zip(exact.stage_charged, groups or (0,) * key.pp, strict=True))
                if abs(margin) < 4096:  # within the model's rounding of the bytes: either way
                    continue
                assert (st == cp_model.OPTIMAL) == exact.fits, (ls, r, groups, margin)
                if not exact.fits:
                    assert st == cp_model.INFEASIBLE
                    continue
                fitting += 1
                got = pm.read_plan(solver, uniform=False)
                assert got.stage_layers == ls and got.stage_groups == groups
                assert got.recompute_layers == plan.recompute_layers
                obj = solver.objective_value * pm.scale_s
                assert obj <= exact.step_s + 1e-12, (ls, r, groups)
                assert exact.step_s - obj <= pm.error_bound_s, (ls, r, groups, exact.step_s - obj)
                # and the bound is small enough to rank by (under 1 % of these ms steps)
                assert pm.error_bound_s < 1e-2 * exact.step_s
                worst = max(worst, exact.step_s - obj)
    return checked, fitting, worst


def _exposed_dp_job() -> Job:
    # 16 GPUs in two node groups (8 H100 + 8 A100), dp = 8 inside each node, a short sequence
    # and 2 micro-batches: a stage's DP sync outlasts 2/3 of its compute (checked below); the
    # ZeRO-3 gradients reduced once per step (recipe zero3_reduce "step"), so zero 3 keeps a
    # step-end sync to expose
    job = Job(model=_mini(False, 6), cluster=_mixed_small(), seq_len=512, global_batch=16)
    return job.model_copy(update={"recipe": job.recipe.with_behaviour(zero3_reduce="step")})


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_partition_model_two_groups_exposed_dp_tail(zero: int) -> None:
    job = _exposed_dp_job()
    space = SearchSpace.for_job(job, fix=f"tp=1,cp=1,pp=2,vpp=1,sp=0,mbs=1,zero={zero}")
    t = build_tables(space)
    for mode in (0, 2):
        key = Key(tp=1, cp=1, pp=2, dp=8, ep=1, vpp=1, sp=0, zero=zero, mbs=1, m=2, mode=mode)
        c = key_coefs(t, key)
        for g in (0, 1):
            # a first stage of 3 layers on group g: DP sync d, compute t
            d = 3 * c.dsync[g] + c.dps_fixed[g] + c.emb_dps[g]
            tt = 3 * c.tau[g] + c.emb_time[g] + c.p2p[g]
            # the exposed branch binds (ZeRO-3 reduce-scatters half of what an all-reduce moves)
            assert (d - BACKWARD_SHARE * tt > DP_TAIL_FRACTION * d) == (zero < 3)
        assert c.dsync[0] != c.dsync[1]  # the groups' networks differ
        checked, fitting, _ = _every_partition(t, key)
        # 5 splits of 6 layers x 2 placements; with full recompute x r in 1..max stage
        assert fitting == checked == (10 if mode == 0 else 42)


def test_partition_model_memory_bound_moe_interleaved_zero3() -> None:
    # 6 GiB GPUs, 16k tokens: without recompute no split of the 8 MoE layers (dense prefix of
    # one) fits; with partial full recompute some do and some do not
    job = Job(model=_mini(True, 8), cluster=_with_memory(
        load_cluster("dgx-a100-40g").take_gpus(8), 6.0), seq_len=16384, global_batch=16)
    space = SearchSpace.for_job(job, fix="tp=1,cp=1,pp=2,vpp=2,sp=0,mbs=1,zero=3,ep=2")
    t = build_tables(space)
    key = Key(tp=1, cp=1, pp=2, dp=4, ep=2, vpp=2, sp=0, zero=3, mbs=1, m=4, mode=0)
    checked, fitting, _ = _every_partition(t, key)
    assert checked == 3 and fitting == 0
    checked, fitting, _ = _every_partition(t, key.__class__(**{**key.__dict__, "mode": 2}))
    assert checked == 16 and 0 < fitting < checked


def test_partition_model_four_stages_memory_bound() -> None:
    # four stages: the in-flight counts differ per stage (pp - j under 1F1B), the middle ones
    # are ordered by the model; 5 GiB GPUs put some splits and recompute counts over the limit
    job = Job(model=_mini(False, 8), cluster=_with_memory(
        load_cluster("dgx-h100").take_gpus(8), 5.0), seq_len=16384, global_batch=16)
    space = SearchSpace.for_job(job, fix="tp=2,cp=1,pp=4,vpp=1,sp=1,mbs=1,zero=1")
    t = build_tables(space)
    key = Key(tp=2, cp=1, pp=4, dp=1, ep=1, vpp=1, sp=1, zero=1, mbs=1, m=16, mode=2)
    checked, fitting, _ = _every_partition(t, key)
    assert 0 < fitting < checked


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2"])
@pytest.mark.parametrize("mode", [0, 1])
def test_partition_model_zero_bubble_four_stages(schedule: str, mode: int) -> None:
    """The partition model of a ZB-H1 / ZB-H2 key (objective x Q, floor(rho Q) (S - T):
    search/schedule_axis.py) against every pinned partition: a lower bound of plan_cost within
    its error bound, feasible exactly when the split fits (5 GiB GPUs: the ZB in-flight counts,
    p and 2p - 1 on every stage, rule some splits out), and tighter than 1F1B's rho = 1."""
    job = Job(model=_mini(False, 8), cluster=_with_memory(
        load_cluster("dgx-h100").take_gpus(8), 5.0), seq_len=8192, global_batch=16)
    space = SearchSpace.for_job(job, fix=f"tp=2,cp=1,pp=4,vpp=1,sp=1,mbs=1,zero=1,"
                                         f"schedule={schedule}")
    t = build_tables(space)
    key = Key(tp=2, cp=1, pp=4, dp=1, ep=1, vpp=1, sp=1, zero=1, mbs=1, m=16, mode=mode)
    checked, fitting, worst = _every_partition(t, key)
    assert 0 < fitting <= checked
    one = build_tables(SearchSpace.for_job(job, fix="tp=2,cp=1,pp=4,vpp=1,sp=1,mbs=1,zero=1"))
    for ls in ((2, 2, 2, 2), (3, 1, 2, 2)):
        zb, base = plan_cost(t, _plan(key, ls, None, None, schedule)), \
            plan_cost(one, _plan(key, ls, None, None))
        assert zb.step_s < base.step_s and zb.stage_time_s == base.stage_time_s


def test_master_bound_is_exact_for_one_stage_keys() -> None:
    """pp = 1: LB(key) = the exact step time up to the floor rounding of its few terms (one
    expert-TP size: with several, LB is the least over them, exact for the fastest only)."""
    job = Job(model=_mini(True, 8), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, fix="pp=1", max_mbs=2, etp_values=())
    t = build_tables(space)
    master = build_master(t)
    keys, capped = enumerate_keys(master, None, 10**12)
    assert not capped
    tight = 0
    for lb_u, k in keys:
        exact = plan_cost(t, _plan(k, (space.num_layers,), None, None))
        assert exact.fits
        lb = lb_u * master.unit_s
        assert lb <= exact.step_s + 1e-12, k
        if RECOMPUTE_MODES[k.mode] != "full":  # full recompute: the replays are dropped
            assert exact.step_s - lb <= 5e-6, (k, exact.step_s - lb)
            tight += 1
    assert tight >= 40 and {k.zero for _, k in keys} == {0, 1, 2, 3}


def test_key_bound_is_exact_where_memory_forces_recompute() -> None:
    """One stage with partial full recompute on 6 GiB GPUs: the least recompute count that fits
    decides the step time; key_bound's grid over r is then exact, for every key (pp = 1), and
    with two stages it stays below every partition's exact time (hand enumeration)."""
    job = Job(model=_mini(True, 8), cluster=_with_memory(
        load_cluster("dgx-a100-40g").take_gpus(8), 6.0), seq_len=16384, global_batch=16)
    # optimizer states on the GPU (search/offload_axis.py): the recompute count is what fits
    space = SearchSpace.for_job(job, fix="tp=1,cp=1,sp=0,mbs=1,recompute=full,ep=2,"
                                "optimizer_offload=0", max_pp=2, max_vpp=1)
    t = build_tables(space)
    forced = 0
    for zero in (1, 3):
        one = Key(tp=1, cp=1, pp=1, dp=8, ep=2, vpp=1, sp=0, zero=zero, mbs=1, m=2, mode=2)
        fits = {r: plan_cost(t, _plan(one, (8,), r, None)) for r in range(1, 9)}
        ok = [r for r, pc in fits.items() if pc.fits]
        assert ok and min(ok) > 1  # memory forces more than one recomputed layer
        forced += 1
        best = min(fits[r].step_s for r in ok)
        assert key_bound(t, one) == pytest.approx(best, rel=1e-6)
        res = best_for_key(space, one, tables=t)
        assert res is not None and res.step_s == pytest.approx(best, rel=1e-12)
        two = Key(tp=1, cp=1, pp=2, dp=4, ep=2, vpp=1, sp=0, zero=zero, mbs=1, m=4, mode=2)
        exact = [plan_cost(t, _plan(two, ls, r, None)) for ls in _splits(8, 2, 1, 1)
                 for r in range(1, max(ls) + 1)]
        best2 = min(pc.step_s for pc in exact if pc.fits)
        assert not all(pc.fits for pc in exact)
        assert key_bound(t, two) <= best2
        res2 = best_for_key(space, two, tables=t)
        assert res2 is not None and res2.step_s == pytest.approx(best2, rel=1e-9)
    assert forced == 2


def _legal_keys(space: SearchSpace, t: Tables) -> set[Key]:
    """Every key whose plan passes spec/plan.py's rules, by brute force over the domains."""
    job, L = space.job, space.num_layers
    out = set()
    for tp, cp, pp, dp, ep, vpp, mbs, zero, sp, mode in itertools.product(
            space.tp, space.cp, space.pp, t.dp, space.ep, space.vpp, space.mbs, space.zero,
            space.sp, space.recompute):
        if dp * tp * pp * cp != job.num_gpus or job.global_batch % (dp * mbs):
            continue
        m = job.global_batch // (dp * mbs)
        # two node groups: a stage's dp*tp*cp GPUs lie in one group (cpsat_axes' docstring;
        # spec/plan.py leaves the placement to the solver)
        if any(g.num_gpus % (dp * tp * cp) for g in job.cluster.node_groups):
            continue
        if space.partition == "uniform" and L % (pp * vpp):
            continue
        if space.fixed.get("dp", dp) != dp:
            continue
        units = L // vpp
        # an even split in multiples of vpp, or (free spaces) a framework's slot layout
        splits: list[dict[str, Any]] = []
        split = tuple(vpp * (units // pp + (j < units % pp)) for j in range(pp))
        if pp * vpp <= L and sum(split) == L and min(split) >= vpp:
            splits.append({"stage_layers": split})
        if space.partition == "free" and pp > 1:
            splits += [{"chunk_layers": cl} for cl in named_layouts(L, pp, vpp)]
        # every expert-TP size searched (Megatron's default, and folded sizes of MoE models)
        plans = [Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sp=sp, zero=zero, mbs=mbs,
                      num_microbatches=m, recompute=mode, etp=e, **kw)
                 for kw in splits for e in space.etp_axis]
        if any(not plan_violations(job, plan) for plan in plans):
            out.add(Key(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, vpp=vpp, sp=sp, zero=zero, mbs=mbs,
                        m=m, mode=RECOMPUTE_MODES.index(mode)))
    return out


@pytest.mark.parametrize("case", ["dense", "moe", "hetero", "uniform", "folded", "dp"])
def test_master_lists_exactly_the_legal_keys(case: str) -> None:
    """The master's one-hot axes and degree rules (cpsat_axes) admit every legal key and no
    other (small models on large GPUs, so the master's memory condition removes none)."""
    if case == "dense":
        job = Job(model=_mini(False, 8), cluster=load_cluster("dgx-h100").take_gpus(8),
                  seq_len=2048, global_batch=12)
        kw: dict[str, Any] = {"max_vpp": 2, "max_mbs": 2}
    elif case == "moe":
        job = Job(model=_mini(True, 4), cluster=load_cluster("dgx-h100").take_gpus(8),
                  seq_len=2048, global_batch=8)
        kw = {"max_vpp": 2, "max_mbs": 2, "zero": (1, 3)}
    elif case == "hetero":
        job = Job(model=_mini(False, 6), cluster=_mixed_small(), seq_len=2048,
                  global_batch=16)
        kw = {"max_vpp": 2, "max_mbs": 2, "zero": (0, 3)}
    elif case == "uniform":  # pp * vpp | L (12 layers: pp = 8 and pp = 4 with vpp = 2 not)
        job = Job(model=_mini(False, 12), cluster=load_cluster("dgx-h100").take_gpus(8),
                  seq_len=2048, global_batch=16)
        kw = {"max_vpp": 2, "max_mbs": 1, "zero": (1,), "partition": "uniform"}
    elif case == "folded":  # expert TP 2: etp*ep | tp*cp*dp, and sp with a folded tp > 1
        job = Job(model=_mini(True, 4), cluster=load_cluster("dgx-h100").take_gpus(8),
                  seq_len=2048, global_batch=8)
        kw = {"max_vpp": 2, "max_mbs": 1, "zero": (1,), "fix": "etp=2"}
    else:  # a pinned dp
        job = Job(model=_mini(False, 8), cluster=load_cluster("dgx-h100").take_gpus(8),
                  seq_len=2048, global_batch=16)
        kw = {"max_vpp": 2, "max_mbs": 2, "zero": (1,), "fix": "dp=2"}
    space = SearchSpace.for_job(job, **kw)
    t = build_tables(space)
    keys, capped = enumerate_keys(build_master(t), None, 10**12)
    assert not capped
    listed = [k for _, k in keys]
    assert len(listed) == len(set(listed))
    legal = _legal_keys(space, t)
    assert set(listed) == legal and len(legal) >= 10
    if case in ("moe", "folded"):
        assert any(k.ep > 1 for k in legal)
    # the rules at work: sp only with tp > 1, interleaving only with pp > 1 and pp <= m
    assert any(k.sp for k in legal) and any(k.vpp > 1 or k.pp == 8 for k in legal)
    assert all(k.tp > 1 for k in legal if k.sp) and all(k.pp > 1 for k in legal if k.vpp > 1)


def test_master_memory_condition_excludes_keys_whose_states_do_not_fit() -> None:
    """Llama 2 13B (Touvron et al. 2023: 13.0e9 parameters) on 8 H100s (80 GB), one stage.
    Megatron's bf16 recipe keeps 2 B of bf16 weights, 4 B of fp32 gradients and 12 B of fp32
    master weights + Adam moments a parameter; tp divides them, ZeRO-1/2/3 shard the optimizer
    / + gradients / + weights over the dp x cp = 8 / tp ranks. Per GPU, by hand:
    tp = 1: ZeRO-0 234 GB, ZeRO-1 97.5 GB (both over 80 GB), ZeRO-2 52 GB, ZeRO-3 29 GB;
    tp = 2: ZeRO-0 117 GB (over), ZeRO-1 58.5 GB; tp = 4: ZeRO-0 58.5 GB. The master's memory
    condition (the stage peaks' sum within the capacities' sum) must exclude the keys that are
    over on the states alone, and keep every key brute force finds a fitting plan for."""
    job = Job(model=load_model("llama2-13b"), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=32)
    space = SearchSpace.for_job(job, fix="pp=1,vpp=1,mbs=1,optimizer_offload=0")
    keys, capped = enumerate_keys(build_master(build_tables(space)), None, 10**12)
    assert not capped
    P, cap = 13.0e9, 80e9

    def states(tp: int, zero: int) -> float:
        shards = 8 // tp
        w, g, o = 2.0, 4.0, 12.0
        return P / tp * (w / (shards if zero >= 3 else 1) + g / (shards if zero >= 2 else 1)
                         + o / (shards if zero >= 1 else 1))

    listed = {(k.tp, k.zero) for _, k in keys}
    assert all(states(tp, z) < cap for tp, z in listed)
    over = {(tp, z) for tp in space.tp for z in space.zero if states(tp, z) > cap}
    assert over == {(1, 0), (1, 1), (2, 0)}
    assert {(2, 1), (4, 0), (1, 2)} <= listed
    ranked = _ranked_or_raise(job, space)
    assert ranked and {_key(p) for _, p in ranked} <= {k for _, k in keys}


def test_key_listing_windows_partition_the_keys() -> None:
    """enumerate_keys(lo, hi) lists the keys with lo < LB <= hi (objective units), sorted by
    (LB, key order); consecutive windows split the whole listing; `cap` stops it early; a spent
    budget raises ListingCut rather than return a partial window."""
    job = Job(model=_mini(False, 8), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=2048, global_batch=16)
    master = build_master(build_tables(SearchSpace.for_job(job, max_vpp=2, max_mbs=2)))
    every, capped = enumerate_keys(master, None, 10**12)
    assert not capped and len(every) > 50
    assert every == sorted(every, key=lambda x: (x[0], x[1].order()))
    lbs = sorted({lb for lb, _ in every})
    cut1, cut2 = lbs[len(lbs) // 3], lbs[2 * len(lbs) // 3]
    w1, _ = enumerate_keys(master, None, cut1)
    w2, _ = enumerate_keys(master, cut1, cut2)
    w3, _ = enumerate_keys(master, cut2, 10**12)
    assert w1 + w2 + w3 == every
    assert all(lb <= cut1 for lb, _ in w1) and all(cut1 < lb <= cut2 for lb, _ in w2)
    assert w2 and w2[0][0] > cut1 and w2[-1][0] == cut2
    few, hit = enumerate_keys(master, None, 10**12, cap=3)
    assert hit and len(few) == 3 and set(few) <= set(every)
    with pytest.raises(ListingCut):
        enumerate_keys(master, None, 10**12, budget=Budget(1e-6))


def test_master_bound_is_exact_for_one_stage_keys_with_the_dp_tail_exposed() -> None:
    """As above, on 16 GPUs of two nodes with 128-token sequences: the DP sync crosses the
    network and outlasts 2/3 of the compute, so the master's second bound, with the DP overlap,
    is the one that binds, ZeRO-3 included (its weight gathers enter that bound too)."""
    job = Job(model=_mini(False, 6), cluster=load_cluster("dgx-h100").take_gpus(16),
              seq_len=128, global_batch=16)
    space = SearchSpace.for_job(job, fix="pp=1,tp=1,cp=1,mbs=1,recompute=none")
    t = build_tables(space)
    master = build_master(t)
    keys, _ = enumerate_keys(master, None, 10**12)
    assert {k.zero for _, k in keys} == {0, 1, 2, 3}
    for lb_u, k in keys:
        # the key's best over its hybrid-sharding variants (search/tables.key_variants: the
        # master bounds the least over them)
        exact = min(float(plan_cost(v, _plan(k, (6,), None, None).model_copy(
            update={"dp_replicate": v.space.dp_replicate,
                    "optimizer_offload": v.space.optimizer_offload})).step_s)
            for v in key_variants(t, k))
        assert 0 <= exact - lb_u * master.unit_s <= 5e-6, k
