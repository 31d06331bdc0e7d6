"""A V's empty rank 0 (spec/plan.py `empty_first_ok`: under zbv / dualpipev rank 0 holds the
embedding and the head, maybe no layer) in the cost model, hand-derived on a tiny model: the
rank's time and memory are its edges' (and p2p, the fixed DP-sync term), and the replayed
ZBV span with a light rank 0 is the by-hand longest path."""

from __future__ import annotations

import pytest
from toy_cluster import h100_cluster

from autoparallel_cp.cost import schedules as S
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.steptime import stage_times
from autoparallel_cp.spec import Job, ModelSpec
from autoparallel_cp.spec.plan import Plan, plan_violations


def _job(layers: int = 8) -> Job:
    m = ModelSpec(name="tiny", num_layers=layers, hidden_size=1024, ffn_hidden_size=2816,
                  num_attention_heads=8, num_kv_heads=4, vocab_size=128000)
    return Job(model=m, cluster=h100_cluster(), seq_len=2048, global_batch=32)


def _plan(split: tuple[int, int], sched: str = "zbv") -> Plan:
    return Plan(dp=4, tp=1, pp=2, vpp=2, mbs=1, num_microbatches=8, zero=1,
                stage_layers=split, schedule=sched)  # type: ignore[arg-type]


@pytest.mark.parametrize("sched", ["zbv", "dualpipev"])
def test_an_empty_rank_costs_its_edges(sched: str) -> None:
    """(2, 6) against (0, 8): rank 1's 6 layers give one layer's time, states and
    activations; rank 0 of (0, 8) is rank 0 of (2, 6) less two layers: embedding, head,
    loss, p2p and the fixed DP sync only (every per-layer term is linear in the count)."""
    job = _job()
    a, b = _plan((2, 6), sched), _plan((0, 8), sched)
    assert not plan_violations(job, a) and not plan_violations(job, b)
    ta, tb = stage_times(job, a), stage_times(job, b)
    ma, mb = stage_memory(job, a), stage_memory(job, b)
    # every layer is alike (no MoE, no recompute): per-layer terms from rank 1 of (2, 6)
    for f in ("compute_s", "tp_s", "optimizer_s"):
        layer = getattr(ta[1], f) / 6
        assert getattr(tb[0], f) == pytest.approx(getattr(ta[0], f) - 2 * layer, rel=1e-9)
        assert getattr(tb[1], f) == pytest.approx(8 * layer, rel=1e-9)
    for f in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        layer = getattr(ma[1], f) / 6
        assert getattr(mb[0], f) == pytest.approx(getattr(ma[0], f) - 2 * layer, rel=1e-9)
    # activations: the same in-flight count on both ranks (min(p, m) or min(p + 1/2, m)); two
    # layers' worth from rank 1's 8 against its 6 (the working set, one layer's, cancels)
    two = mb[1].activations_bytes - ma[1].activations_bytes
    assert two > 0
    assert mb[0].activations_bytes <= ma[0].activations_bytes - two + 1.0
    assert mb[0].activations_bytes > 0  # the embedding output and the logits stay
    assert tb[0].pp_s == ta[0].pp_s > 0  # the empty chunks still pass every micro-batch on
    assert 0 < tb[0].dp_sync_s < ta[0].dp_sync_s  # the edges' gradients, the fixed term


@pytest.mark.parametrize("m", [2, 3, 4])
def test_replayed_span_with_an_empty_rank_0_by_hand(m: int) -> None:
    """ZBV, p = 2, F = I = W (each action a third of its chunk's half: t_r/6), rank 0 light
    (t0 = 0.3: the edges only) and rank 1 t1 = 3. torch's lists (pipeline_sim.zbv_actions):
    rank 1 runs F1 F2 F1 F2 I2 W2 I1 W1 ...; its first step waits for F(0, 0) on rank 0
    (t0/6 = 0.05), every later input of rank 1 (F(0, i), I(3, i)) is ready before rank 1
    needs it (rank 0's actions take 0.05 each, rank 1's 0.5), and rank 0's last actions,
    I(0, m-1) W(0, m-1) after rank 1's I(1, m-1), end 0.1 after it while rank 1 still runs
    its W(1, m-1) of 0.5. So the longest path is F(0, 0), then all of rank 1's list:
    span = t0/6 + m·t1, the bubble beyond m·T = t0/6."""
    t0, t1 = 0.3, 3.0
    plan = Plan(pp=2, vpp=2, num_microbatches=m, schedule="zbv")
    bubble = S.simulated_bubble(plan, [t0, t1], (1 / 3, 1 / 3, 1 / 3))
    assert bubble == pytest.approx(t0 / 6, rel=1e-12)
