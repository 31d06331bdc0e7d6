"""Differential tests: the numpy key table (`search/key_table.py`) lists exactly the keys the
CP-SAT master lists (`cpsat_master.enumerate_keys`), with the same integer LB, in the same
order, on dense, MoE, folded-etp, two-node-group, pinned, uniform and memory-tight spaces; its
least LB is the master's proven optimum."""

from __future__ import annotations

import pytest
from ortools.sat.python import cp_model

from autoparallel_cp.errors import InfeasibleError
from autoparallel_cp.search.cpsat_master import build_master, enumerate_keys
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.solve import solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables
from autoparallel_cp.spec import ClusterSpec, Job, ModelSpec, MoESpec
from autoparallel_cp.spec.loaders import load_cluster, load_model


def _mini(moe: bool, layers: int, experts: int = 4) -> ModelSpec:
    return ModelSpec(
        name="mini-moe" if moe else "mini", num_layers=layers, hidden_size=1024,
        ffn_hidden_size=2816, num_attention_heads=8, num_kv_heads=4, vocab_size=32000,
        moe=MoESpec(num_experts=experts, top_k=2, expert_ffn_hidden_size=1408,
                    first_k_dense_layers=1) if moe else None)


def _mixed_small() -> ClusterSpec:
    c = load_cluster("mixed-h100-a100")
    return c.model_copy(update={"node_groups": [g.model_copy(update={"num_nodes": 1})
                                                for g in c.node_groups]})


def _job(model: ModelSpec, cluster: str | ClusterSpec, gpus: int | None, seq: int = 4096,
         batch: int = 16) -> Job:
    c = load_cluster(cluster) if isinstance(cluster, str) else cluster
    return Job(model=model, cluster=c.take_gpus(gpus) if gpus else c, seq_len=seq,
               global_batch=batch)


def _master_min(master: object) -> int | None:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.cp_model_presolve = False
    st = solver.solve(master.model)  # type: ignore[attr-defined]
    if st == cp_model.INFEASIBLE:
        return None
    assert st == cp_model.OPTIMAL
    return int(solver.objective_value)


def _same_listing(space: SearchSpace, upto: int | None = None) -> int:
    """Compare the two listings of every key (or of those with LB up to the `upto`-th least),
    and of a window (lo, hi] inside; returns the number of keys compared."""
    t = build_tables(space)
    master = build_master(t)
    table = build_key_table(t)
    assert table.unit_s == master.unit_s
    assert table.minimum() == _master_min(master)
    if table.minimum() is None:
        assert enumerate_keys(master, None, 10**12) == ([], False)
        return 0
    lb0 = table.minimum()
    assert lb0 is not None
    hi = table.top_u if upto is None else int(table.lb[min(upto, len(table)) - 1])
    want, capped = enumerate_keys(master, None, hi)
    assert not capped
    got, capped = table.window(None, hi)
    assert not capped
    assert got == want
    lo, mid = got[len(got) // 3][0], got[2 * len(got) // 3][0]
    assert table.window(lo, mid) == enumerate_keys(master, lo, mid)
    # the cap: a window of n keys counts as too wide from cap = n on, as the CP-SAT listing
    n = len(table.window(lo, mid)[0])
    if n > 1:
        assert table.window(lo, mid, cap=n)[1] and enumerate_keys(master, lo, mid, cap=n)[1]
        assert not table.window(lo, mid, cap=n + 1)[1]
    return len(got)


@pytest.mark.parametrize("moe", [False, True])
def test_small_spaces_list_the_same_keys(moe: bool) -> None:
    job = _job(_mini(moe, 8), "dgx-h100", 8)
    space = SearchSpace.for_job(job, max_pp=8, max_vpp=2, max_mbs=4)
    assert _same_listing(space) > 100


def test_memory_condition_drops_the_same_keys() -> None:
    """40 GB GPUs, long sequences: the master's memory condition removes keys; the table
    removes the same ones."""
    job = _job(load_model("llama3-8b"), "dgx-a100-40g", 8, seq=8192, batch=16)
    space = SearchSpace.for_job(job, max_pp=8, max_vpp=2, max_mbs=4)
    full = sum(1 for d in space.degrees() for sp in space.sp if space.sp_ok(d.tp, sp)) \
        * len(space.zero) * len(space.recompute)
    assert len(build_key_table(build_tables(space))) < full
    _same_listing(space)


@pytest.mark.parametrize("etp", [1, 2])
def test_folded_etp_spaces_list_the_same_keys(etp: int) -> None:
    job = _job(_mini(True, 4, experts=8), "dgx-h100", 16)
    space = SearchSpace.for_job(job, fix=f"etp={etp}", max_pp=2, max_vpp=2, max_mbs=2)
    assert any(d.ep > d.dp * d.cp for d in space.degrees())
    assert _same_listing(space) > 0


def test_two_node_groups_list_the_same_keys() -> None:
    job = _job(_mini(False, 6), _mixed_small(), None)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3))
    assert _same_listing(space) > 0


@pytest.mark.parametrize("fix", [
    "stage_layers=4:3,vpp=2", "chunk_layers=1:2:3:1,pp=2,vpp=2", "dp=2", "num_microbatches=4",
    "recompute_layers=2", "tp=2,sp=1",
])
def test_pinned_spaces_list_the_same_keys(fix: str) -> None:
    job = _job(_mini(False, 7), "dgx-h100", 8)
    space = SearchSpace.for_job(job, fix=fix, max_pp=4, max_vpp=2, max_mbs=2)
    assert _same_listing(space) > 0


def test_uniform_partition_lists_the_same_keys() -> None:
    job = _job(_mini(True, 8), "dgx-h100", 8)
    space = SearchSpace.for_job(job, partition="uniform", max_pp=8, max_vpp=4, max_mbs=2)
    assert _same_listing(space) > 0


@pytest.mark.parametrize(("model", "gpus", "seq", "batch"), [
    ("llama3-8b", 64, 8192, 256), ("mixtral-8x7b", 64, 4096, 256)])
def test_medium_spaces_list_the_same_keys(model: str, gpus: int, seq: int, batch: int) -> None:
    """Real models on 64 GPUs, the default space: the 400 keys of least LB (and its ties)."""
    job = _job(load_model(model), "dgx-h100", gpus, seq=seq, batch=batch)
    assert _same_listing(SearchSpace.for_job(job), upto=400) >= 400


def test_no_key_fits_is_infeasible() -> None:
    """A model far too large for 8 GPUs: no key passes the memory condition in either."""
    job = _job(load_model("llama3-405b"), "dgx-a100-40g", 8, seq=8192, batch=16)
    space = SearchSpace.for_job(job)
    assert _same_listing(space) == 0
    with pytest.raises(InfeasibleError):
        solve(job, space, top_k=3, time_limit=10)
