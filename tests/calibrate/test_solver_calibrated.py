"""The solver's proofs under a calibration: CP-SAT top-k == enumerate top-k and every plan
fits, with every knob away from the identity (and a memory headroom), on small spaces."""

from __future__ import annotations

import pytest

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import Job, ModelSpec
from autoparallel_cp.spec.calibration import Calibration
from autoparallel_cp.spec.loaders import load_cluster

CAL = Calibration(compute={"A100-SXM4-40GB": 0.8}, net_intra=0.6, net_inter=0.4,
                  per_microbatch_s=0.02, per_step_s=0.5, memory_reserve_gib=3.0)


def _job(gpus: int, headroom: float) -> Job:
    # large enough that memory binds on 40 GB GPUs (the headroom changes the answer)
    model = ModelSpec(name="mid", num_layers=8, hidden_size=4096, ffn_hidden_size=11008,
                      num_attention_heads=32, num_kv_heads=8, vocab_size=32000)
    cl = load_cluster("dgx-a100-40g")
    gpu = cl.node_groups[0].gpu.name
    cal = CAL.model_copy(update={"compute": {gpu: 0.8}})
    return Job(model=model, cluster=cl.take_gpus(gpus), seq_len=8192,
               global_batch=16).calibrated(cal, headroom)


@pytest.mark.parametrize(("gpus", "headroom"), [(8, 0.0), (16, 0.3)])
def test_cpsat_equals_enumeration_under_calibration(gpus: int, headroom: float) -> None:
    job = _job(gpus, headroom)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3))
    a = solve(job, space, top_k=4, time_limit=120, workers=2)
    b = enumerate_plans(job, space, top_k=4)
    assert a.status == "optimal"
    ca = [c for c, _ in a.stats["ranked"]]
    cb = [c for c, _ in b.stats["ranked"]]
    assert len(cb) == 4
    assert ca == pytest.approx(cb, abs=a.error_bound_s + 1e-9)
    assert a.max_objective_diff_s <= a.error_bound_s + 1e-12
    for ev in a.plans:
        assert ev.fits
        # the headroom is a capacity reduction: the need stays below (1 - h) x the GPU memory
        total = job.cluster.node_groups[0].gpu.memory_bytes
        assert ev.memory.required_bytes <= total * (1 - headroom) * (1 + 1e-9)
        # the fixed time per step is in the reported step time, not in the search's ranking
        assert ev.time.fixed_s == CAL.per_step_s


def test_headroom_keeps_near_full_plans_out() -> None:
    def top(h: float) -> list[str]:
        job = _job(8, h)
        space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3))
        return [p.short() for _, p in enumerate_plans(job, space, top_k=3).stats["ranked"]]

    loose, tight = top(0.0), top(0.3)
    gone = set(loose) - set(tight)
    assert gone  # a plan that fits only without the headroom is no longer returned


def test_calibration_changes_the_prediction_the_way_it_says() -> None:
    base = Job(model=_job(8, 0.0).model, cluster=load_cluster("dgx-a100-40g").take_gpus(8),
               seq_len=8192, global_batch=16)
    plan = "tp=2,pp=2,mbs=1,recompute=full,zero=1"
    from autoparallel_cp.api import as_plan

    p = as_plan(base, plan)
    e0 = evaluate(base, p)
    gpu = base.cluster.node_groups[0].gpu.name
    slow = evaluate(base.calibrated(Calibration(compute={gpu: 0.5})), p)
    assert slow.time.compute_s == pytest.approx(2 * e0.time.compute_s, rel=0.05)
    assert slow.throughput.mfu == pytest.approx(e0.throughput.mfu * e0.time.step_s
                                                / slow.time.step_s)
    step = evaluate(base.calibrated(Calibration(per_step_s=1.0)), p)
    assert step.time.step_s == pytest.approx(e0.time.step_s + 1.0)
    mem = evaluate(base.calibrated(Calibration(memory_reserve_gib=2.0)), p)
    assert mem.memory.peak_bytes == pytest.approx(e0.memory.peak_bytes + 2 * 2**30)
    mb = evaluate(base.calibrated(Calibration(per_microbatch_s=0.1)), p)
    m, pp = p.num_microbatches, p.pp
    # each stage pays its share (layers/L) per micro-batch: m + (pp - 1) shares of 1/pp
    assert mb.time.step_s - e0.time.step_s == pytest.approx(0.1 / pp * (m + pp - 1), rel=0.05)
    with pytest.raises(ValueError):
        base.calibrated(Calibration()).calibrated(Calibration())


def test_heterogeneous_cluster_with_two_compute_knobs() -> None:
    """Two GPU types, each with its own compute factor: the stage placement sees both."""
    c = load_cluster("mixed-h100-a100")
    c = c.model_copy(update={"node_groups": [g.model_copy(update={"num_nodes": 1})
                                             for g in c.node_groups]})
    names = [g.gpu.name for g in c.node_groups]
    cal = Calibration(compute={names[0]: 0.6, names[1]: 1.3}, per_microbatch_s=0.01)
    model = ModelSpec(name="mini", num_layers=6, hidden_size=1024, ffn_hidden_size=2816,
                      num_attention_heads=8, num_kv_heads=4, vocab_size=32000)
    job = Job(model=model, cluster=c, seq_len=4096, global_batch=16).calibrated(cal)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=1, max_mbs=2, zero=(1,), fix="tp=8")
    a = solve(job, space, top_k=3, time_limit=120, workers=2)
    b = enumerate_plans(job, space, top_k=3)
    assert a.status == "optimal"
    ca = [c for c, _ in a.stats["ranked"]]
    cb = [c for c, _ in b.stats["ranked"]]
    assert ca == pytest.approx(cb, abs=a.error_bound_s + 1e-9)
    assert a.max_objective_diff_s <= a.error_bound_s + 1e-12
