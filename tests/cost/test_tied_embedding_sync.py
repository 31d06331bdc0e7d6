"""The tied word embedding's gradient all-reduce between the first and the last pipeline stage
(cost/tied_embedding_sync.py: Megatron's `_allreduce_word_embedding_grads` after the flush,
the Zero Bubble fork @6574e0ea finalize_model_grads.py l. 16-52, 156-164). Expected values by
hand on the toy H100 node (NVLink 450 GB/s, 3 us; network 50 GB/s, 8 us per GPU)."""

from __future__ import annotations

import pytest

from autoparallel_cp.cost.comm import NETWORK_EFFICIENCY, NVLINK_EFFICIENCY
from autoparallel_cp.cost.common import options_for
from autoparallel_cp.cost.constants import DP_TAIL_FRACTION
from autoparallel_cp.cost.steptime import BACKWARD_SHARE, step_time
from autoparallel_cp.cost.tied_embedding_sync import tied_embedding_sync_s
from autoparallel_cp.spec import RECIPES, Job, ModelSpec
from autoparallel_cp.spec.plan import Plan
from tests.cost.toy_cluster import h100_cluster

V, H = 32000, 4096


def _job(tied: bool = True, nodes: int = 2, recipe: str = "megatron-bf16") -> Job:
    model = ModelSpec(name="m", num_layers=16, hidden_size=H, ffn_hidden_size=4 * H,
                      num_attention_heads=32, vocab_size=V, tie_embeddings=tied)
    return Job(model=model, cluster=h100_cluster(nodes), recipe=RECIPES[recipe], seq_len=2048,
               global_batch=64)


def _ring2(nbytes: float, bw_gbps: float, eff: float, lat_us: float) -> float:
    """Two-rank ring all-reduce: two steps of half the buffer, each latency + half / bw."""
    return 2.0 * (lat_us * 1e-6 + nbytes / 2.0 / (bw_gbps * 1e9 * eff))


def test_bytes_and_link_by_hand() -> None:
    job = _job()
    gb = float(job.recipe.grad_bytes)
    # pp 16 on two 8-GPU nodes (tp = cp = dp = 1): stage 0 on node 0, stage 15 on node 1
    net = _ring2(V * H * gb, 50, NETWORK_EFFICIENCY, 8.0)
    assert float(tied_embedding_sync_s(job, 0, 1, 1, 1, 16)) == pytest.approx(net, rel=1e-12)
    # pp 8, tp 2 on 16 GPUs (dp 1): pp·S = 16 > 8, the pair crosses; V/tp of the gradient each
    net2 = _ring2(V / 2 * H * gb, 50, NETWORK_EFFICIENCY, 8.0)
    assert float(tied_embedding_sync_s(job, 0, 2, 1, 1, 8)) == pytest.approx(net2, rel=1e-12)
    # pp 8 on one node: ranks 0 and 7 share NVLink
    nvl = _ring2(V * H * gb, 450, NVLINK_EFFICIENCY, 3.0)
    assert float(tied_embedding_sync_s(job, 0, 1, 1, 1, 8)) == pytest.approx(nvl, rel=1e-12)
    assert nvl < net  # the link matters: ~9x here


def test_zero_where_no_collective_runs() -> None:
    job = _job()
    assert float(tied_embedding_sync_s(job, 0, 1, 1, 16, 1)) == 0.0  # pp = 1
    assert float(tied_embedding_sync_s(_job(tied=False), 0, 1, 1, 1, 16)) == 0.0
    assert float(tied_embedding_sync_s(_job(recipe="torchtitan-fsdp"), 0, 1, 1, 1, 16)) == 0.0
    for sched in ("zb-h1", "zb-h2", "zbv", "dualpipev", "dualpipe"):
        assert float(tied_embedding_sync_s(job, 0, 1, 1, 1, 16, sched)) == 0.0, sched
    assert float(tied_embedding_sync_s(job, 0, 1, 1, 1, 16, "1f1b")) > 0.0


def test_step_time_adds_it_once_after_the_flush() -> None:
    """dp = 1: no DP sync, so without DP overlap (the Zero Bubble rows: Megatron-LM's default)
    the step's tail grows by exactly the all-reduce (1F1B); with the overlap on, the head
    stage's sync is exposed as steptime.exposed_dp charges any (the module docstring's bound)."""
    tied, untied = _job(), _job(tied=False)
    plan = Plan(tp=1, pp=16, dp=1, mbs=1, num_microbatches=64)
    ar = float(tied_embedding_sync_s(tied, 0, 1, 1, 1, 16))
    off = options_for(tied, None).model_copy(update={"dp_overlap": False})
    a, b = step_time(tied, plan, off), step_time(untied, plan, off)
    assert a.dp_comm_s - b.dp_comm_s == pytest.approx(ar, rel=1e-9)
    assert a.stages[-1].dp_sync_s == pytest.approx(ar, rel=1e-12)
    assert all(s.dp_sync_s == 0.0 for s in a.stages[:-1])
    on = options_for(tied, None).model_copy(update={"dp_overlap": True})
    c = step_time(tied, plan, on)
    last = c.stages[-1]
    want = max(DP_TAIL_FRACTION * ar, ar - BACKWARD_SHARE * last.total_s)
    assert c.dp_comm_s - step_time(untied, plan, on).dp_comm_s == pytest.approx(want, rel=1e-9)
