"""Pipelines as Megatron-Core splits them: unequal model chunks, embedding and loss as layer
slots, pp not dividing the layers, micro-batch counts pp does not divide. Expected values by
hand (Megatron-LM d98e8a64 transformer_block.py / schedules.py, written out in each test)."""

from __future__ import annotations

from typing import Any

import pytest

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.spec import RECIPES, ClusterSpec, GPUSpec, Job, LinkSpec, ModelSpec, NodeGroup
from autoparallel_cp.spec.plan import Plan, plan_violations


def _job(layers: int = 14, gpus: int = 16, batch: int = 4) -> Job:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, hbm_gbps=3350)
    cl = ClusterSpec(name="c", node_groups=[NodeGroup(
        name="n", gpu=gpu, gpus_per_node=8, num_nodes=gpus // 8,
        intra_node=LinkSpec(bandwidth_gbps=450), inter_node=LinkSpec(bandwidth_gbps=50))])
    m = ModelSpec(name="m", num_layers=layers, hidden_size=4096, ffn_hidden_size=14336,
                  num_attention_heads=32, num_kv_heads=8, vocab_size=128256)
    return Job(model=m, cluster=cl, recipe=RECIPES["megatron-bf16"], seq_len=4096,
               global_batch=batch)


def _toy_factors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer: 1 s per micro-batch (fwd + bwd), 1 GB of activations, no working set; no
    embedding / head / p2p / optimizer cost: the pipeline composition alone is left."""

    def layer(*a: Any, **k: Any) -> F.LayerFactors:
        one, zero = 1.0, 0.0
        return F.LayerFactors(act_bytes=1e9, ckpt_bytes=zero, work_bytes=zero, time_s=one,
                              recompute_s=zero, compute_s=one, tp_s=zero, cp_s=zero,
                              ep_s=zero, rc_compute_s=zero, rc_tp_s=zero, rc_cp_s=zero,
                              rc_ep_s=zero)

    def edge(*a: Any, **k: Any) -> F.EdgeFactors:
        z = 0.0
        return F.EdgeFactors(emb_params=z, emb_act_bytes=z, emb_time_s=z, head_params=z,
                             head_act_bytes=z, head_work_bytes=z, head_time_s=z,
                             head_compute_s=z)

    monkeypatch.setattr(F, "layer_factors", layer)
    monkeypatch.setattr(F, "edge_factors", edge)
    monkeypatch.setattr(F, "p2p_factor", lambda *a, **k: 0.0)
    monkeypatch.setattr(F, "optimizer_factor", lambda *a, **k: 0.0)


def test_toy_uneven_chunks_step_time_and_inflight(monkeypatch: pytest.MonkeyPatch) -> None:
    """14 layers on pp=4 x vpp=2 with the embedding and the loss as slots: 16 slots, 2 per chunk,
    so stages hold 3, 4, 4, 3 layers in chunks (1,2), (2,2), (2,2), (2,1). m = 4 (dp = 1).

    Step: stage times 3, 4, 4, 3 s; m·T_max + (Σ t - T_max)/vpp = 4·4 + (14 - 4)/2 = 21 s.
    In flight (warm-up (4 - j - 1)·2 + 1·4 chunk passes, then one forward per backward):
    rank 0 warms up 10 >= 8 passes: all of them, 4·(1 + 2) = 12 layers; rank 1: 8 >= 8, all
    16; rank 2: 6 passes (4 of chunk 0, 2 of chunk 1) + 1 = 7 passes of 2 layers = 14; rank 3:
    4 passes of chunk 0 (8 layers), then each steady step adds chunk 1 (1 layer) and retires
    one: peak 9 layers. At 1 GB a layer: 12, 16, 14, 9 GB of activations."""
    _toy_factors(monkeypatch)
    job = _job()
    plan = Plan(dp=1, tp=4, pp=4, vpp=2, mbs=1, num_microbatches=4)
    assert plan.layers_per_stage(14) == (3, 4, 4, 3)
    assert plan.chunks_per_stage(14) == ((1, 2), (2, 2), (2, 2), (2, 1))
    ev = evaluate(job, plan)
    assert ev.stage_time_s == pytest.approx([3.0, 4.0, 4.0, 3.0])
    assert ev.time.step_s == pytest.approx(21.0)
    assert ev.time.bubble_s == pytest.approx(5.0)
    acts = [s.activations_bytes for s in stage_memory(job, plan)]
    assert acts == pytest.approx([12e9, 16e9, 14e9, 9e9])
    # the same stage counts as even chunks (3 on the edges cannot split over 2 chunks) are
    # what stage_layers=3:4:4:3 means too: one definition
    same = plan.model_copy(update={"stage_layers": (3, 4, 4, 3)})
    assert evaluate(job, same).time.step_s == ev.time.step_s
    assert [s.activations_bytes for s in stage_memory(job, same)] == acts


def test_toy_explicit_chunk_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """chunk_layers 2:2:2:2 | 1:2:2:1 (layout order: chunk v of stage j at v·pp + j) puts
    (2,1), (2,2), (2,2), (2,1) on the stages: stage 0 = 3 layers with the heavy chunk first.
    Rank 0 holds all 8 passes: 4·(2 + 1) = 12 layers (as (1,2)); rank 3 warms up 4 passes of
    chunk 0 (8) and peaks at 9: the same as the slot layout, by symmetry of the sums."""
    _toy_factors(monkeypatch)
    job = _job()
    plan = Plan(dp=1, tp=4, pp=4, vpp=2, mbs=1, num_microbatches=4,
                chunk_layers=(2, 2, 2, 2, 1, 2, 2, 1))
    assert plan_violations(job, plan) == []
    assert plan.chunks_per_stage(14) == ((2, 1), (2, 2), (2, 2), (2, 1))
    acts = [s.activations_bytes for s in stage_memory(job, plan)]
    assert acts == pytest.approx([12e9, 16e9, 14e9, 9e9])
    assert evaluate(job, plan).to_json()["plan"]["chunk_layers"] == [2, 2, 2, 2, 1, 2, 2, 1]


def test_toy_m_not_multiple_of_pp(monkeypatch: pytest.MonkeyPatch) -> None:
    """m = 6 on pp = 4 x vpp = 2 with stages of 4, 4, 4, 2 layers (even chunks): Megatron's group
    size N = 6 (N = 4 and 5 leave 2 and 1 micro-batches, fewer than pp). Step: 6·4 + (14 - 4)/2
    = 29 s. Rank 0 warms up (4-0-1)·2 + 1·6 = 12 = every pass: 6 stages of 4 GB; rank 3 warms
    up 6 passes and holds 7 of 12: 3.5 stages of 2 GB. m = 3 < pp cannot interleave."""
    _toy_factors(monkeypatch)
    job = _job(gpus=16, batch=6)
    plan = Plan(dp=1, tp=4, pp=4, vpp=2, mbs=1, num_microbatches=6, stage_layers=(4, 4, 4, 2))
    assert plan_violations(job, plan) == []
    ev = evaluate(job, plan)
    assert ev.time.step_s == pytest.approx(6 * 4 + (14 - 4) / 2)
    acts = [s.activations_bytes for s in stage_memory(job, plan)]
    assert acts[3] == pytest.approx(3.5 * 2e9)
    assert acts[0] == pytest.approx(6 * 4e9)
    bad = plan.model_copy(update={"num_microbatches": 3})
    assert any("num_microbatches >= pp" in v for v in plan_violations(_job(batch=3), bad))


def test_pp_not_dividing_layers_evaluates_with_megatron_split() -> None:
    """126 layers on pp = 8: 128 slots, 16 per stage: 15/16x6/15 (embedding and loss slots);
    evaluate used to refuse the plan (126 % 8 != 0)."""
    job = _job(layers=126, gpus=64, batch=64)
    plan = Plan(dp=1, tp=8, pp=8, vpp=1, mbs=1, num_microbatches=64)
    assert plan_violations(job, plan) == []
    ev = evaluate(job, plan)
    per = plan.layers_per_stage(126)
    assert per == (15,) + (16,) * 6 + (15,)
    t = ev.stage_time_s
    # every middle stage takes the same time; the edges hold one layer fewer plus the
    # embedding / the LM head
    assert len({round(x, 12) for x in t[1:-1]}) == 1
    interleaved = plan.model_copy(update={"vpp": 8})
    assert plan_violations(job, interleaved) == []
    assert evaluate(job, interleaved).time.bubble_s < ev.time.bubble_s


def test_split_rules() -> None:
    """Chunks too thin for vpp, sums and lengths of the explicit fields."""
    job = _job(layers=14, gpus=16, batch=8)
    ok = Plan(dp=1, tp=4, pp=4, vpp=2, mbs=1, num_microbatches=8, stage_layers=(1, 6, 6, 1))
    assert plan_violations(job, ok) == []  # first/last: one chunk may hold only E / L
    assert ok.chunks_per_stage(14)[0] == (0, 1) and ok.chunks_per_stage(14)[3] == (1, 0)
    thin = ok.model_copy(update={"stage_layers": (5, 1, 4, 4)})
    assert any("at least vpp layers" in v for v in plan_violations(job, thin))
    short = ok.model_copy(update={"stage_layers": None, "chunk_layers": (2,) * 7})
    assert any("7 entries for pp*vpp" in v for v in plan_violations(job, short))
    clash = ok.model_copy(update={"chunk_layers": (1, 2, 2, 2, 2, 2, 2, 1)})
    assert any("stage sums of chunk_layers" in v for v in plan_violations(job, clash))
