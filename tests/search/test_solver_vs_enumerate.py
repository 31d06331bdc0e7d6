"""Differential tests: CP-SAT top-k == enumerate top-k on small spaces (same keys, same order
up to exact ties), and every returned plan fits under the exact memory model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autoparallel_cp.errors import InfeasibleError
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster, load_model


def _small_job(gpus: int, batch: int, model: str = "llama3-8b") -> Job:
    return Job(model=load_model(model), cluster=load_cluster("dgx-h100").take_gpus(gpus),
               seq_len=2048, global_batch=batch)


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("mode", ["none", "full"])
def test_dense_uniform_small(zero: int, mode: str) -> None:
    """All four (zero, recompute) cases (a hypothesis run of one example drew one of four)."""
    job = _small_job(8, 16)
    space = SearchSpace.for_job(job, fix=f"zero={zero},sp=0,recompute={mode},mbs=1",
                                partition="uniform", partial_recompute=False)
    _compare_tol(job, space, 3)


# ---------------------------------------------------------------------------------------------
# Free partitions, partial recompute, MoE and heterogeneous clusters on tiny models
# ---------------------------------------------------------------------------------------------

from typing import Any  # noqa: E402

from autoparallel_cp.search.cpsat_master import Key  # noqa: E402
from autoparallel_cp.spec import ClusterSpec, ModelSpec, MoESpec  # noqa: E402
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan  # noqa: E402


def _mini(moe: bool, layers: int) -> ModelSpec:
    return ModelSpec(
        name="mini-moe" if moe else "mini", num_layers=layers, hidden_size=1024,
        ffn_hidden_size=2816, num_attention_heads=8, num_kv_heads=4, vocab_size=32000,
        moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=1408,
                    first_k_dense_layers=1) if moe else None)


def _mixed_small() -> ClusterSpec:
    c = load_cluster("mixed-h100-a100")
    return c.model_copy(update={"node_groups": [g.model_copy(update={"num_nodes": 1})
                                                for g in c.node_groups]})

def _key(p: Plan) -> Key:
    """The solver key (every axis but the stage partition) of a plan."""
    return Key(tp=p.tp, cp=p.cp, pp=p.pp, dp=p.dp, ep=p.ep, vpp=p.vpp, sp=p.sp, zero=p.zero,
               mbs=p.mbs, m=p.num_microbatches, mode=RECOMPUTE_MODES.index(p.recompute))


def _pinned_lb(master: Any, key: Key) -> int:
    """The master's lower bound of one key (objective units), by a solve with the key pinned."""
    from ortools.sat.python import cp_model

    m = master.model.clone()
    for lit in master.key_lits(key):
        m.add_bool_or([lit])
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.solve(m) == cp_model.OPTIMAL
    return int(solver.objective_value)



_RANKED: list[tuple[SearchSpace, list[tuple[float, Plan]]]] = []  # newest last


def _ranked(space: SearchSpace) -> list[tuple[float, Plan]]:
    """The enumerator's best plan per key of `space`, ranked (`enumerate_best`, what
    `enumerate_plans(...).stats["ranked"]` lists before its cut to the top k and without its
    `evaluate` of each listed plan), kept for the last few spaces (by identity: a space is
    frozen and its sub-spaces are memoized), so a test that compares a space's top k and then
    checks the master's bound on every plan of it enumerates it once."""
    from autoparallel_cp.search.enumerate import enumerate_best

    for sp, ranked in _RANKED:
        if sp is space:
            return ranked
    ranked = enumerate_best(space)[0]
    _RANKED.append((space, ranked))
    del _RANKED[:-4]
    return ranked


def _ranked_or_raise(job: Job, space: SearchSpace) -> list[tuple[float, Plan]]:
    """`_ranked`, or the enumerator's own `InfeasibleError` when no plan of the space fits."""
    ranked = _ranked(space)
    if not ranked:
        enumerate_plans(job, space, top_k=1)  # raises InfeasibleError, explained
        raise AssertionError("enumerate_plans found a plan enumerate_best did not")
    return list(ranked)


def _assert_master_bounds(job: Job, space: SearchSpace, stride: int) -> None:
    """The master's LB of every `stride`-th enumerated plan's key never exceeds its exact cost
    (per schedule sub-space of a union: each has its own master, search/schedule_axis.py)."""
    from autoparallel_cp.search.cpsat_master import build_master
    from autoparallel_cp.search.tables import build_tables

    for sub in space.schedule_variants():
        try:
            ranked = _ranked_or_raise(job, sub)
        except InfeasibleError:
            if sub is space:
                raise
            continue  # a ZB sub-space where nothing fits
        master = build_master(build_tables(sub))
        for cost, plan in ranked[::stride]:
            assert _pinned_lb(master, _key(plan)) * master.unit_s <= cost + 1e-9


def _compare_tol(job: Job, space: SearchSpace, k: int) -> Any:
    """CP-SAT's top k equals the enumerator's (within the proven bound); the solve result."""
    a = solve(job, space, top_k=k, time_limit=120, workers=2)
    b = _ranked_or_raise(job, space)[:k]
    assert a.status == "optimal"
    ca = [c for c, _ in a.stats["ranked"]]
    cb = [c for c, _ in b]
    assert len(ca) == len(cb)
    # each key's partition is optimal up to the partition model's proven error bound
    tol = a.error_bound_s + 1e-9
    for x, y in zip(ca, cb, strict=True):
        assert x == pytest.approx(y, abs=tol)
    keys_a = [p.key()[:10] for _, p in a.stats["ranked"]]
    keys_b = [p.key()[:10] for _, p in b]
    # same plans, same order, except where exact costs tie within the tolerance
    for i, (ka, kb) in enumerate(zip(keys_a, keys_b, strict=True)):
        if ka != kb:
            assert ca[i] == pytest.approx(cb[i], abs=tol)
    for ev in a.plans:
        assert ev.fits
    assert a.max_objective_diff_s <= a.error_bound_s + 1e-12
    return a


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(moe=st.booleans(), layers=st.sampled_from([4, 6, 8]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16]), seq=st.sampled_from([2048, 8192]),
       zero=st.sampled_from(["0,1", "1,3"]))
def test_free_partitions_match_enumeration(moe: bool, layers: int, gpus: int, batch: int,
                                           seq: int, zero: str) -> None:
    job = Job(model=_mini(moe, layers), cluster=load_cluster("dgx-a100-40g").take_gpus(gpus),
              seq_len=seq, global_batch=batch)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2,
                                zero=tuple(int(z) for z in zero.split(",")))
    if space.num_degree_combinations() == 0:
        return
    _compare_tol(job, space, 4)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@example(schedule="zb-h2", moe=False, layers=8, gpus=8, batch=32, seq=32768)  # memory-tight
@example(schedule="zb-h1", moe=True, layers=6, gpus=8, batch=16, seq=8192)
@example(schedule="zb-h2", moe=False, layers=8, gpus=4, batch=4, seq=8192)  # m < 2p - 1
@example(schedule="zb-h1", moe=True, layers=8, gpus=8, batch=2, seq=2048)  # m < p
@given(schedule=st.sampled_from(["zb-h1", "zb-h2", "gpipe"]), moe=st.booleans(),
       layers=st.sampled_from([4, 6, 8]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([2, 4, 8, 16, 32]), seq=st.sampled_from([2048, 8192, 32768]))
def test_schedule_axis_matches_enumeration(schedule: str, moe: bool, layers: int, gpus: int,
                                           batch: int, seq: int) -> None:
    """CP-SAT's top k equals the enumerator's on random spaces of a pinned schedule, the
    zero-bubble ones included (per-key bubble ratio of the key's split and m, few
    micro-batches too: batch 2 or 4 puts m below p; their in-flight counts:
    search/schedule_axis.py), and the master's LB stays below every key's best."""
    job = Job(model=_mini(moe, layers), cluster=load_cluster("dgx-a100-40g").take_gpus(gpus),
              seq_len=seq, global_batch=batch)
    space = SearchSpace.for_job(job, fix=f"schedule={schedule}", max_pp=4, max_mbs=2,
                                zero=(0, 1))
    if space.num_degree_combinations() == 0:
        return
    a = _compare_tol(job, space, 4)
    assert all(ev.plan.schedule == schedule for ev in a.plans)
    _assert_master_bounds(job, space, 9)


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2"])
def test_heterogeneous_zero_bubble_matches_enumeration(schedule: str) -> None:
    """Two node groups with a zero-bubble schedule: stage placement and the bubble ratio."""
    job = Job(model=_mini(False, 6), cluster=_mixed_small(), seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=1, max_mbs=2, zero=(1,),
                                fix=f"tp=8,schedule={schedule}")
    _compare_tol(job, space, 3)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(layers=st.sampled_from([4, 6]), batch=st.sampled_from([16, 32]))
def test_heterogeneous_matches_enumeration(layers: int, batch: int) -> None:
    job = Job(model=_mini(False, layers), cluster=_mixed_small(), seq_len=4096,
              global_batch=batch)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=1, max_mbs=2, zero=(1,),
                                fix="tp=8")
    _compare_tol(job, space, 3)


def test_master_bound_is_below_every_key_best() -> None:
    """LB(key) from the master never exceeds the exact best step time of that key."""

    for moe in (False, True):
        job = Job(model=_mini(moe, 6), cluster=load_cluster("dgx-h100").take_gpus(8),
                  seq_len=4096, global_batch=16)
        space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2)
        _assert_master_bounds(job, space, 7)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(layers=st.sampled_from([4, 6]), gpus=st.sampled_from([4, 8]),
       seq=st.sampled_from([2048, 8192]))
def test_torchtitan_recipe_matches_enumeration(layers: int, gpus: int, seq: int) -> None:
    """The recipe's framework behaviour (op-level SAC as `selective`, FSDP2 copies, foreach
    AdamW, eager Llama ops off under compile, repeat_kv) reaches the solver's tables."""
    from autoparallel_cp.spec import RECIPES

    job = Job(model=_mini(False, layers), cluster=load_cluster("dgx-h100").take_gpus(gpus),
              recipe=RECIPES["torchtitan-fsdp"], seq_len=seq, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=2, max_mbs=2, zero=(1, 3))
    _compare_tol(job, space, 4)


def test_master_bound_holds_for_the_torchtitan_recipe() -> None:
    from autoparallel_cp.spec import RECIPES

    job = Job(model=_mini(False, 6), cluster=load_cluster("dgx-h100").take_gpus(8),
              recipe=RECIPES["torchtitan-fsdp"], seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(0, 1, 3))
    _assert_master_bounds(job, space, 5)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(moe=st.booleans(), layers=st.sampled_from([4, 6]), gpus=st.sampled_from([4, 8]))
def test_deepspeed_recipe_matches_enumeration(moe: bool, layers: int, gpus: int) -> None:
    """DeepSpeed's per-micro-batch gradient work (ZeRO-2 reduce-scatter every micro-batch,
    BF16_Optimizer's accumulation pass at zero <= 1) reaches the solver's stage tables: with
    global batch 32 every plan runs m > 1 micro-batches."""
    from autoparallel_cp.spec import RECIPES

    job = Job(model=_mini(moe, layers), cluster=load_cluster("dgx-h100").take_gpus(gpus),
              recipe=RECIPES["deepspeed"], seq_len=2048, global_batch=32)
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=2, max_mbs=2, zero=(1, 2))
    _compare_tol(job, space, 4)


def test_master_bound_holds_for_the_deepspeed_recipe() -> None:
    from autoparallel_cp.search.cpsat_master import build_master
    from autoparallel_cp.search.tables import build_tables
    from autoparallel_cp.spec import RECIPES

    job = Job(model=_mini(False, 6), cluster=load_cluster("dgx-h100").take_gpus(8),
              recipe=RECIPES["deepspeed"], seq_len=4096, global_batch=32)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(0, 1, 2, 3))
    ranked = _ranked_or_raise(job, space)
    assert any(p.zero == 2 and p.num_microbatches > 1 for _, p in ranked)
    master = build_master(build_tables(space))
    for cost, plan in ranked[::5]:
        assert _pinned_lb(master, _key(plan)) * master.unit_s <= cost + 1e-9


# ---------------------------------------------------------------------------------------------
# MoE parallel folding: one expert-TP size per space (--fix etp), ep laid over tp*cp*dp ranks
# ---------------------------------------------------------------------------------------------


def _mini_folding(layers: int) -> ModelSpec:
    """8 routed experts (ep up to 8 > dp*cp in most layouts), a dense first layer."""
    return _mini(True, layers).model_copy(update={"moe": MoESpec(
        num_experts=8, top_k=2, expert_ffn_hidden_size=1408, first_k_dense_layers=1)})


@pytest.mark.parametrize("etp", [1, 2])
def test_folded_space_matches_enumeration(etp: int) -> None:
    """Two 8-GPU nodes: folded ep groups cross nodes at stride etp; the solver's degree rule
    etp*ep | tp*cp*dp and the SP rule (folded tp > 1 needs sp) match the enumerator's."""
    job = Job(model=_mini_folding(4), cluster=load_cluster("dgx-h100").take_gpus(16),
              seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, fix=f"etp={etp}", max_pp=2, max_vpp=2, max_mbs=2,
                                zero=(1,))
    assert any(d.ep > d.dp * d.cp for d in space.degrees())  # folding reaches new layouts
    _compare_tol(job, space, 4)
    best = solve(job, space, top_k=4, time_limit=120, workers=1)
    for ev in best.plans:
        assert ev.plan.etp == etp
        assert ev.plan.sp == 1 or ev.plan.tp in (1, etp)


def test_master_bound_holds_with_folding() -> None:
    job = Job(model=_mini_folding(6), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, fix="etp=1", max_pp=4, max_vpp=2, max_mbs=2)
    ranked = _ranked_or_raise(job, space)
    assert any(p.ep > p.dp * p.cp for _, p in ranked)
    _assert_master_bounds(job, space, 5)  # per schedule sub-space


# Megatron's splits: micro-batch counts pp does not divide, pinned uneven splits
# ---------------------------------------------------------------------------------------------


def _m_not_multiple_space() -> SearchSpace:
    """8 GPUs, batch 12, 8 layers: pp=4 with dp=2 runs m = 6 micro-batches (groups of 6), pp=2
    with dp=4 m = 3 (groups of 3): interleaved keys whose m pp does not divide."""
    job = Job(model=_mini(False, 8), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=12)
    return SearchSpace.for_job(job, max_pp=8, max_vpp=2, max_mbs=2, zero=(1,))


def test_m_not_multiple_of_pp_is_searched_and_matches_enumeration() -> None:
    """Megatron-LM d98e8a64 runs interleaving for any m >= pp (micro-batch groups): such keys
    are in the space, the master lists them (pp <= m replaces pp | m) and CP-SAT's top k is
    the enumerator's."""
    space = _m_not_multiple_space()
    keys = [d for d in space.degrees() if d.vpp > 1 and d.num_microbatches % d.pp]
    assert keys, "no interleaved degree with m % pp != 0"
    _compare_tol(space.job, space, 6)


def test_master_bound_below_best_when_pp_does_not_divide_m() -> None:
    from autoparallel_cp.search.cpsat_master import build_master
    from autoparallel_cp.search.tables import build_tables

    space = _m_not_multiple_space()
    ranked = enumerate_plans(space.job, space, top_k=10**6).stats["ranked"]
    master = build_master(build_tables(space))
    odd = [(c, p) for c, p in ranked if p.vpp > 1 and p.num_microbatches % p.pp]
    assert odd
    for cost, plan in odd:
        assert _pinned_lb(master, _key(plan)) * master.unit_s <= cost + 1e-9


@pytest.mark.parametrize("fix", [
    "stage_layers=4:3,vpp=2",  # last stage 3 layers over 2 chunks: (2, 1)
    "stage_layers=3:4,vpp=2",  # first stage: (1, 2) (embedding slot)
    "chunk_layers=1:2:3:1,pp=2,vpp=2",  # chunks given outright (layout order)
])
def test_pinned_uneven_split_matches_enumeration(fix: str) -> None:
    """`--fix` with a split the free space does not hold: CP-SAT and the enumerator score that
    one split, with the stages' own in-flight counts, as evaluate does."""
    job = Job(model=_mini(False, 7), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, fix=fix, max_pp=4, max_vpp=2, max_mbs=2, zero=(1,))
    assert space.num_degree_combinations() > 0
    _compare_tol(job, space, 4)
    from autoparallel_cp.cost.evaluate import evaluate

    for cost, plan in enumerate_plans(job, space, top_k=4).stats["ranked"]:
        assert evaluate(job, plan).time.step_s == pytest.approx(cost, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# Sliding-window layers: every layer of a kind costs the windowed/full mean (cost/layer_factors)
# ---------------------------------------------------------------------------------------------


def _mini_windowed(moe: bool, layers: int) -> ModelSpec:
    """GPT-OSS's pattern (every other layer windowed) on `_mini`, a window that binds at 8k."""
    return _mini(moe, layers).model_copy(update={
        "sliding_window_left": 255, "sliding_window_layers": (True, False)})


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(moe=st.booleans(), layers=st.sampled_from([5, 6]), gpus=st.sampled_from([4, 8]))
def test_windowed_model_matches_enumeration(moe: bool, layers: int, gpus: int) -> None:
    job = Job(model=_mini_windowed(moe, layers),
              cluster=load_cluster("dgx-h100").take_gpus(gpus), seq_len=8192, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1,))
    _compare_tol(job, space, 4)


def test_master_bound_holds_for_a_windowed_model() -> None:
    job = Job(model=_mini_windowed(True, 6), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=8192, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2)
    _assert_master_bounds(job, space, 7)


# ---------------------------------------------------------------------------------------------
# Named uneven layouts (issue 28: pp*vpp need not divide the layers; SearchSpace.split_families)
# ---------------------------------------------------------------------------------------------


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(moe=st.booleans(), layers=st.sampled_from([5, 7, 9, 10]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16]), seq=st.sampled_from([2048, 8192]),
       zero=st.sampled_from(["0,1", "1,3"]), hetero=st.booleans())
def test_named_layouts_match_enumeration(moe: bool, layers: int, gpus: int, batch: int,
                                         seq: int, zero: str, hetero: bool) -> None:
    """Random jobs whose layers no vpp > 1 (or no pp*vpp) divides: CP-SAT's top k over the
    free partitions and the named layouts equals the enumerator's, on one or two node groups;
    and the master's LB stays below every key's exact best."""
    cluster = _mixed_small() if hetero else load_cluster("dgx-a100-40g").take_gpus(gpus)
    job = Job(model=_mini(moe, layers), cluster=cluster, seq_len=seq, global_batch=batch)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=3, max_mbs=2,
                                zero=tuple(int(z) for z in zero.split(",")),
                                partial_recompute=not hetero)
    if space.num_degree_combinations() == 0:
        return
    _compare_tol(job, space, 4)
    _assert_master_bounds(job, space, 7)


def test_a_named_layout_wins_where_no_free_split_exists() -> None:
    """7 layers on pp 2 x vpp 2 (no multiple of vpp): only the named layouts place them, both
    searches find the same best, which is a named layout (`chunk_layers`) scored as evaluate
    scores it, and every layout of (2, 2) is a family of the key."""
    from autoparallel_cp.cost.evaluate import evaluate
    from autoparallel_cp.spec.splits import named_layouts

    job = Job(model=_mini(False, 7), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, fix="pp=2,vpp=2", max_mbs=2, zero=(1,))
    assert not space.free_ok(2, 2)
    assert space.layouts(2, 2) == named_layouts(7, 2, 2)
    assert len(space.split_families(2, 2)) == len(named_layouts(7, 2, 2)) >= 2
    a = _compare_tol(job, space, 3)
    for ev in a.plans:
        assert ev.plan.chunk_layers in space.layouts(2, 2)
        assert evaluate(job, ev.plan).time.step_s == pytest.approx(ev.time.step_s, rel=1e-9)
    _assert_master_bounds(job, space, 1)


def test_size_counts_the_named_layouts() -> None:
    """`size` adds one partition per named layout (times its recompute choices)."""
    job = Job(model=_mini(False, 7), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=16)
    fix = "pp=2,vpp=2,tp=1,cp=1,mbs=1,zero=1,sp=0,recompute=none"
    space = SearchSpace.for_job(job, fix=fix + ",optimizer_offload=0")
    assert space.size() == len(space.layouts(2, 2))
    # each host offload share searched (search/offload_axis.py) holds the same plans again
    offl = SearchSpace.for_job(job.model_copy(update={"search_also": ("offload",)}), fix=fix)
    assert offl.size() == len(offl.off_axis) * space.size() and len(offl.off_axis) > 1
    assert SearchSpace.for_job(job, fix=fix, named_splits=False).num_degree_combinations() == 0


# ---------------------------------------------------------------------------------------------
# The experts' tensor-parallel size as a searched axis (issue 28; SearchSpace.etp_axis)
# ---------------------------------------------------------------------------------------------


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(layers=st.sampled_from([4, 5, 6]), gpus=st.sampled_from([4, 8]),
       seq=st.sampled_from([2048, 8192]), zero=st.sampled_from(["1", "0,3"]))
def test_etp_axis_matches_enumeration(layers: int, gpus: int, seq: int, zero: str) -> None:
    """MoE jobs with etp searched (Megatron's default and 1): CP-SAT's top k equals the
    enumerator's over both sizes, folded keys (ep > dp*cp) included, and the master's LB (the
    least over the sizes) stays below every key's exact best."""
    job = Job(model=_mini(True, layers), cluster=load_cluster("dgx-h100").take_gpus(gpus),
              seq_len=seq, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=2, max_mbs=2,
                                zero=tuple(int(z) for z in zero.split(",")))
    assert space.etp_axis == (None, 1)
    if space.num_degree_combinations() == 0:
        return
    _compare_tol(job, space, 5)
    _assert_master_bounds(job, space, 3)


def test_folded_keys_are_searched_without_a_pin() -> None:
    """ep 4 on 4 GPUs with tp 2 (dp*cp = 2 < ep): only etp = 1 runs it. The space lists such
    keys, the enumerator and CP-SAT find the same best among them, with etp = 1, and the
    sizes without the axis (`etp_values=()`) have none."""
    job = Job(model=_mini(True, 4), cluster=load_cluster("dgx-h100").take_gpus(4),
              seq_len=2048, global_batch=8)
    fix = "tp=2,ep=4,pp=1"
    space = SearchSpace.for_job(job, fix=fix, max_mbs=2, zero=(1,))
    assert space.num_degree_combinations() > 0
    a = _compare_tol(job, space, 3)
    assert a.plans and all(ev.plan.etp == 1 and ev.plan.sp == 1 for ev in a.plans)
    assert SearchSpace.for_job(job, fix=fix, max_mbs=2, zero=(1,),
                               etp_values=()).num_degree_combinations() == 0
    assert SearchSpace.for_job(job, fix=fix + ",etp=1", zero=(1,)).describe()["etp"] == [1]
    assert space.describe()["etp"] == ["tp", 1]


@pytest.mark.parametrize("fix", ["pp=2", None])
def test_torchtitan_pipelined_zero_matches_enumeration(fix: str | None) -> None:
    """torchtitan with pp > 1 reduce-scatters ZeRO-2/3 gradients once per step and keeps them
    whole (behaviour `pp_defers_reduce`, cost/sync.py `pp_deferred`): the tables read pp from
    their (tp, cp, dp) axes, so CP-SAT equals the enumerator and the master bound holds, on
    pipelined plans only and on the whole space."""
    from autoparallel_cp.spec import RECIPES

    job = Job(model=_mini(False, 4), cluster=load_cluster("dgx-h100").take_gpus(8),
              recipe=RECIPES["torchtitan-fsdp"], seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, fix=fix, max_pp=4, max_vpp=1, max_mbs=2, zero=(1, 2, 3))
    a = _compare_tol(job, space, 4)
    if fix:
        assert all(ev.plan.pp == 2 for ev in a.plans)
    _assert_master_bounds(job, space, 3)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(layers=st.sampled_from([16, 20]), batch=st.sampled_from([32, 64]),
       vpp=st.sampled_from([1, 2]))
def test_pipelines_across_node_boundaries_match_enumeration(layers: int, batch: int,
                                                            vpp: int) -> None:
    """Two 8-GPU nodes, tp = cp = 1: pp 16 (stride 1), pp 4 (stride dp = 4) and pp 2 (stride
    8) put one or both of the worst stage's pipeline links on the network
    (cost/comm.py `pipeline_links`); the solver's p2p table must price them as the
    enumerator does."""
    job = Job(model=_mini(False, layers), cluster=load_cluster("dgx-a100").take_gpus(16),
              seq_len=2048, global_batch=batch)
    space = SearchSpace.for_job(job, fix="tp=1,cp=1,sp=0,zero=1,recompute=none,mbs=1",
                                max_vpp=vpp)
    if space.num_degree_combinations() == 0:
        return
    a = _compare_tol(job, space, 12)  # every key: pp 1, 2, 4, 8, 16
    assert {ev.plan.pp for ev in a.plans} >= {2, 4, 16}
