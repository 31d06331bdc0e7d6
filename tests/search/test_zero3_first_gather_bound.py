"""The master's ZeRO-3 first-gather term (search/cpsat_master.py `_bound_tables`) stays a lower
bound on MoE models whose layer kinds differ (a dense prefix): every stage pays at least the
least kind's first gather; the largest kind's was not a bound (the @example: five dense
layers of six on two stages under ZB-H1, where a stage of the cheaper kind is the longer).
Checked under 1F1B and ZB-H1 with free partitions."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_solver_vs_enumerate import _assert_master_bounds, _mini

from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import Job, MoESpec
from autoparallel_cp.spec.loaders import load_cluster


def _job(layers: int, dense: int, seq: int, gpus: int, batch: int) -> Job:
    model = _mini(True, layers).model_copy(update={"moe": MoESpec(
        num_experts=8, top_k=2, expert_ffn_hidden_size=1408, first_k_dense_layers=dense)})
    return Job(model=model, cluster=load_cluster("dgx-a100-40g").take_gpus(gpus),
               seq_len=seq, global_batch=batch)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(layers=st.sampled_from([6, 8]), dense=st.sampled_from([1, 3, 5]),
       seq=st.sampled_from([1024, 8192]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([16, 64]), schedule=st.sampled_from(["1f1b", "zb-h1"]))
# the largest kind's first gather (the old term) exceeded this space's exact best key
@example(layers=6, dense=5, seq=1024, gpus=4, batch=64, schedule="zb-h1")
def test_master_bound_with_zero3_on_mixed_layer_kinds(layers: int, dense: int, seq: int,
                                                      gpus: int, batch: int,
                                                      schedule: str) -> None:
    job = _job(layers, dense, seq, gpus, batch)
    fix = "recompute=none" if schedule == "1f1b" else f"schedule={schedule}"
    space = SearchSpace.for_job(job, fix=fix, max_pp=4, max_vpp=1, max_mbs=2, zero=(3,))
    _assert_master_bounds(job, space, 1)
