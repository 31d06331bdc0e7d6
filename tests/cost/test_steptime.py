"""Step time: breakdown consistency, pipeline bubble, H200 measured steps."""

from __future__ import annotations

import pytest
from test_memory import _h200_rows

from autoparallel_cp.cost import layer_ops
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.spec import RECIPES, ClusterSpec, GPUSpec, Job, LinkSpec, ModelSpec, NodeGroup
from autoparallel_cp.spec.plan import Plan


def _job(gpus: int = 16, inter: float = 50.0) -> Job:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, hbm_gbps=3350)
    cl = ClusterSpec(name="c", node_groups=[NodeGroup(
        name="n", gpu=gpu, gpus_per_node=8, num_nodes=gpus // 8,
        intra_node=LinkSpec(bandwidth_gbps=450), inter_node=LinkSpec(bandwidth_gbps=inter))])
    m = ModelSpec(name="m", num_layers=16, hidden_size=4096, ffn_hidden_size=14336,
                  num_attention_heads=32, num_kv_heads=8, vocab_size=128256)
    return Job(model=m, cluster=cl, recipe=RECIPES["megatron-bf16"], seq_len=4096,
               global_batch=64)


def test_breakdown_sums_to_step() -> None:
    """The INTERFACE.md parts add up to step_s, and each part is what the 1F1B composition says
    it is: the bubble is Σ t_j - t_max (Narayanan §2.2), the exposed DP sync lies between 0 and
    what is left of step after m·t_max + bubble + optimizer (so no part is a plug figure)."""
    job = _job()
    p = Plan(dp=2, tp=4, pp=2, sp=1, zero=1, mbs=1, num_microbatches=32, recompute="selective")
    ev = evaluate(job, p)
    t = ev.time
    parts = (t.compute_s + t.bubble_s + t.tp_comm_s + t.cp_comm_s + t.ep_comm_s + t.pp_comm_s
             + t.dp_comm_s + t.optimizer_s)
    assert parts == pytest.approx(t.step_s, rel=1e-9)
    ts = ev.stage_time_s
    assert t.bubble_s == pytest.approx(sum(ts) - max(ts), rel=1e-12)
    assert t.compute_s + t.tp_comm_s + t.pp_comm_s == pytest.approx(32 * max(ts), rel=1e-9)
    assert t.tp_comm_s > 0 and t.pp_comm_s > 0 and t.dp_comm_s > 0 and t.optimizer_s > 0


def test_interleaving_shrinks_bubble() -> None:
    """Absolute bubbles, not their ratio (an off-by-one pp for pp-1 keeps the ratio): 1F1B
    bubble = Σ t_j - t_max = (pp-1)·t for equal stages; interleaved (Σ t_j - t_max)/vpp."""
    job = _job()
    a = evaluate(job, Plan(dp=2, tp=4, pp=2, mbs=1, num_microbatches=32))
    b = evaluate(job, Plan(dp=2, tp=4, pp=2, vpp=2, mbs=1, num_microbatches=32))
    ta, tb = a.stage_time_s, b.stage_time_s
    assert a.time.bubble_s == pytest.approx(min(ta), rel=1e-12)  # pp=2: the other stage
    assert b.time.bubble_s == pytest.approx(min(tb) / 2, rel=1e-12)
    # interleaving only adds p2p sends (vpp x), so the stage times barely move
    assert b.time.bubble_s == pytest.approx(a.time.bubble_s / 2, rel=0.05)


def test_h200_step_time() -> None:
    errs = []
    for r, job, plan in _h200_rows():
        errs.append(abs(evaluate(job, plan).time.step_s / r["step_s"] - 1))
    assert sum(errs) / len(errs) < 0.08
    assert max(errs) < 0.17  # worst rows: eager launch-bound small steps (RESULTS.md)


def test_violations_raise() -> None:
    with pytest.raises(ValueError, match="GPUs"):
        evaluate(_job(), Plan(dp=3, tp=4, pp=2, mbs=1, num_microbatches=1))


def test_dp_gradients_travel_in_the_recipes_reduce_dtype() -> None:
    """Megatron bf16 all-reduces fp32 gradients (arguments.py); a bf16 reduce halves the wire."""
    from autoparallel_cp.cost.factors import dp_sync_factors

    job = _job(gpus=64)
    bf16_wire = job.model_copy(update={"recipe": RECIPES["megatron-bf16"].model_copy(
        update={"grad_reduce_bytes": 2})})
    for zero in (0, 1):
        fp32 = dp_sync_factors(job, 0, 8, 1, 8, 1, zero)[0]
        bf16 = dp_sync_factors(bf16_wire, 0, 8, 1, 8, 1, zero)[0]
        # all-reduce: all bytes are gradients; ZeRO-1: gradient RS (4 or 2 B) + bf16 weight AG
        assert float(fp32) / float(bf16) == pytest.approx(2.0 if zero == 0 else 1.5, rel=1e-6)


def test_cross_entropy_traffic_scales_with_vocab_over_tp() -> None:
    """The unfused fp32 cross entropy moves CE_BYTES_PER_LOGIT bytes per logit (op by op)."""
    from autoparallel_cp.cost import factors as fx
    from autoparallel_cp.cost.efficiency import hbm_time

    job = _job()
    big = job.model_copy(update={"model": job.model.model_copy(update={"vocab_size": 256512})})
    g = job.cluster.node_groups[0].gpu
    for tp in (1, 4):
        a = fx.edge_factors(job, 0, tp, 1, 0, 1).head_compute_s
        b = fx.edge_factors(big, 0, tp, 1, 0, 1).head_compute_s
        tokens = job.seq_len
        extra_ce = float(hbm_time(g, tokens * (256512 - 128256) / tp
                                  * fx.CE_BYTES_PER_LOGIT["megatron"]))
        assert float(b - a) > extra_ce  # head GEMMs grow too
        assert float(b - a) < 3 * extra_ce


def test_overlap_exposed_limits() -> None:
    """A collective either sticks out of the compute it overlaps or slows it by its SM share."""
    import numpy as np

    from autoparallel_cp.cost.factors import COMM_SM_SHARE, overlap_exposed

    assert float(overlap_exposed(0.0, 5.0)) == 0.0
    assert float(overlap_exposed(1.0, 5.0)) == pytest.approx(COMM_SM_SHARE)
    assert float(overlap_exposed(9.0, 5.0)) == pytest.approx(4.0)
    comm = np.linspace(0.0, 10.0, 101)
    ex = overlap_exposed(comm, 5.0)
    assert np.all(np.diff(ex) >= 0)  # more communication never hides better
    # the compute, slowed to (1 - share) while the collective runs, ends with or after it
    assert np.all(5.0 + ex >= comm - 1e-12)
    assert np.all(ex >= COMM_SM_SHARE * comm - 1e-12)


def _llama8b_fsdp(recipe_update: dict | None = None) -> Job:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, hbm_gbps=3350)
    cl = ClusterSpec(name="c", node_groups=[NodeGroup(
        name="n", gpu=gpu, gpus_per_node=8, num_nodes=1,
        intra_node=LinkSpec(bandwidth_gbps=450), inter_node=LinkSpec(bandwidth_gbps=50))])
    m = ModelSpec(name="llama8b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336,
                  num_attention_heads=32, num_kv_heads=8, vocab_size=128256)
    recipe = RECIPES["pytorch-amp"].model_copy(update={
        "name": "fsdp", "transient_weight_copy_bytes": 0, **(recipe_update or {})})
    return Job(model=m, cluster=cl, recipe=recipe, seq_len=8192, global_batch=16)


def test_op_sac_replays_the_even_matmuls() -> None:
    """torchtitan's op SAC recomputes the 2nd, 4th, 6th matmul of a Llama block (wk, wo, w3)
    and saves the outputs of wq, wv, w1, w2 (parallelize_llama.py, 2024-12)."""
    import numpy as np

    from autoparallel_cp.cost import factors as F
    from autoparallel_cp.cost import layer_factors as LF
    from autoparallel_cp.cost.efficiency import gemm_time
    from autoparallel_cp.cost.straggler import GPU_SPEED_SIGMA

    job = _llama8b_fsdp()
    gpu = job.cluster.node_groups[0].gpu
    t = 2 * 8192.0
    one = np.float64(1.0)
    op = F.CostOptions(selective_policy="op")
    sel = F.layer_factors(job, 0, 1, 1, 1, 0, 2, "selective", options=op)
    none = F.layer_factors(job, 0, 1, 1, 1, 0, 2, "none", options=op)
    ew = LF.hbm_time(gpu, layer_ops.elementwise_bytes_fwd(job, False, one, 0.0 * one, op) * t)
    # the 8-GPU job's GEMMs wait for its slowest GPU (cost/straggler.py): E[max of 8 standard
    # normals] = 1.42360 (tables of normal order statistics)
    c8 = 1.0 + GPU_SPEED_SIGMA * 1.4236003
    replay = c8 * (gemm_time(gpu, t, 4096, 1024) + gemm_time(gpu, t, 4096, 4096)
                   + gemm_time(gpu, t, 4096, 14336))
    assert float(sel.compute_s - none.compute_s) == pytest.approx(float(replay + ew), rel=1e-9)
    br = F.layer_activation_per_token(job, False, one, one, one, 0.0 * one, op)
    saved_mm = 2.0 * (4096 + 1024 + 14336 + 4096)  # wq, wv, w1, w2 outputs in bf16
    expect = float(br.ckpt) + 2.0 * 4096 + 4.0 * 32 + saved_mm
    assert float(sel.act_bytes) == pytest.approx(expect * t, rel=1e-12)


def test_optimizer_kernel_and_clipping_traffic() -> None:
    """foreach AdamW moves 80 B/param at the streaming rate; torch's fused AdamW 28 B/param at
    its measured rate (0.592 of the HBM spec, efficiency.FUSED_ADAMW_HBM_FRACTION); clipping
    adds 12 B/param at the streaming rate (0.87)."""
    from autoparallel_cp.cost import factors as F

    fused = F.optimizer_factor(_llama8b_fsdp({"grad_clip": False}), 0)
    foreach = F.optimizer_factor(_llama8b_fsdp({"grad_clip": False,
                                                "optimizer_kernel": "foreach"}), 0)
    clipped = F.optimizer_factor(_llama8b_fsdp(), 0)
    hbm = 3350e9  # H100 SXM (the dgx-h100 preset)
    assert fused == pytest.approx(28.0 / (hbm * 0.592))
    assert foreach == pytest.approx(80.0 / (hbm * 0.87))
    assert clipped - fused == pytest.approx(12.0 / (hbm * 0.87))


def test_fsdp_copies_cost_pytorch_zero3_only() -> None:
    from autoparallel_cp.cost import factors as F
    from autoparallel_cp.cost import layer_factors as LF

    job = _llama8b_fsdp()
    gpu = job.cluster.node_groups[0].gpu
    # copy-out r2 w2 in forward and in backward, pack bf16 grads into fp32: r2 w4
    # ~5e-12 s per parameter: below pytest.approx's default abs=1e-12, so compare relatively
    assert F.zero3_copy_factor(job, 0) == pytest.approx(float(LF.hbm_time(gpu, 14.0)),
                                                        rel=1e-9, abs=0.0)
    mjob = job.model_copy(update={"recipe": RECIPES["megatron-bf16"]})
    assert F.zero3_copy_factor(mjob, 0) == 0.0
    # DeepSpeed's in-place pre-divide of each reduce bucket: r + w of the reduce dtype, fp32
    # in the preset (8 B), bf16 under the HF recipes' bf16 reduction (4 B)
    djob = job.model_copy(update={"recipe": RECIPES["deepspeed"]})
    assert F.zero3_copy_factor(djob, 0) == pytest.approx(float(LF.hbm_time(gpu, 8.0)),
                                                         rel=1e-9, abs=0.0)
    bjob = djob.model_copy(update={"recipe": RECIPES["deepspeed"].model_copy(
        update={"grad_reduce_bytes": 2})})
    assert F.zero3_copy_factor(bjob, 0) == pytest.approx(float(LF.hbm_time(gpu, 4.0)),
                                                         rel=1e-9, abs=0.0)
    plan = Plan(dp=8, zero=3, mbs=2, num_microbatches=1, recompute="none")
    # with the reduce-scatter once per step, as ZeRO-1's (recipe zero3_reduce "step")
    job = job.model_copy(update={"recipe": job.recipe.with_behaviour(zero3_reduce="step")})
    z1 = evaluate(job, plan.model_copy(update={"zero": 1})).time
    z3 = evaluate(job, plan).time
    # ZeRO-3 pays at least the copies of every layer on top of ZeRO-1's step
    layer_params = 32 * (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336)
    assert z3.step_s - z1.step_s > F.zero3_copy_factor(job, 0) * layer_params


def test_gqa_repeat_kv_costs_a_copy_and_full_head_kv() -> None:
    """repeat_kv reads K, V at kv heads and writes them at all heads; SDPA then saves them."""
    import numpy as np

    from autoparallel_cp.cost import factors as F

    job = _llama8b_fsdp()
    one = np.float64(1.0)
    plain = F.CostOptions(fused=True)
    rep = F.CostOptions(fused=True, gqa_repeat_kv=True)
    ew0 = layer_ops.elementwise_bytes_fwd(job, False, one, 0.0 * one, plain)
    ew1 = layer_ops.elementwise_bytes_fwd(job, False, one, 0.0 * one, rep)
    assert float(ew1 - ew0) == pytest.approx(2.0 * 2 * (8 + 32) * 128)
    a0 = F.layer_activation_per_token(job, False, one, one, one, 0.0 * one, plain)
    a1 = F.layer_activation_per_token(job, False, one, one, one, 0.0 * one, rep)
    assert float(a1.kept - a0.kept) == pytest.approx(2.0 * 2 * (32 - 8) * 128)


def test_eager_llama_ops_counted_op_by_op() -> None:
    """Eager fp32-upcast RMSNorm 36 B, fp32 RoPE 20 B, silu*mul 10 B per element, adds 6 B;
    the attention-output copy is added once (not multiplied)."""
    import numpy as np

    from autoparallel_cp.cost import factors as F

    job = _llama8b_fsdp()
    one = np.float64(1.0)
    opts = F.CostOptions(fused=False, eager_ops="llama-upcast")
    got = float(layer_ops.elementwise_bytes_fwd(job, False, one, 0.0 * one, opts))
    h, f, qk = 4096, 14336, (32 + 8) * 128
    expect = 2 * 36 * h + 2 * 6 * h + 10 * f + 20 * qk + 2 * 2 * 32 * 128
    assert got == pytest.approx(expect)
    generic = float(layer_ops.elementwise_bytes_fwd(job, False, one, 0.0 * one,
                                             F.CostOptions(fused=False)))
    assert got > generic  # the upcasts cost more than the 2x generic eager factor here


def test_tp_overlap_forward_only() -> None:
    """tp_comm_overlap_bwd=0 hides TP collectives in forward (and its replay) only."""
    from autoparallel_cp.cost import factors as F

    job = _job()
    exposed = F.layer_factors(job, 0, 4, 1, 1, 1, 1, "full", options=F.CostOptions())
    both = F.layer_factors(job, 0, 4, 1, 1, 1, 1, "full",
                           options=F.CostOptions(tp_comm_overlap=0.8))
    fwd = F.layer_factors(job, 0, 4, 1, 1, 1, 1, "full",
                          options=F.CostOptions(tp_comm_overlap=0.8, tp_comm_overlap_bwd=0.0))
    one = float(exposed.tp_s) / 2  # forward collectives of one layer
    assert float(both.tp_s) == pytest.approx(2 * 0.2 * one)
    assert float(fwd.tp_s) == pytest.approx(0.2 * one + one)
    assert float(fwd.rc_tp_s) == pytest.approx(0.2 * one)


def test_torch_allgather_ring_hides_behind_one_step_only() -> None:
    """cp_ring='torch-allgather': the cp-1 K, V transfers overlap one ring step of attention;
    the per-step p2p ring overlaps each transfer with its own step."""
    from autoparallel_cp.cost import factors as F

    job = _llama8b_fsdp().model_copy(update={"seq_len": 131072})
    # cp over nodes (tp=8 fills a node): transfers on the 50 GB/s network
    cl = job.cluster.model_copy(update={"node_groups": [job.cluster.node_groups[0].model_copy(
        update={"num_nodes": 4})]})
    job = job.model_copy(update={"cluster": cl})
    p2p = F.layer_factors(job, 0, 8, 4, 1, 1, 1, "none",
                          options=F.CostOptions(fused=True, gqa_repeat_kv=True))
    ag = F.layer_factors(job, 0, 8, 4, 1, 1, 1, "none",
                         options=F.CostOptions(fused=True, gqa_repeat_kv=True,
                                               cp_ring="torch-allgather"))
    assert float(ag.cp_s) > float(p2p.cp_s) > 0
    # the torch ring adds its fp32 merge traffic (tests/cost/test_cp_ring.py), nothing else
    assert float(ag.compute_s) > float(p2p.compute_s)
    assert float(ag.compute_s) - float(p2p.compute_s) < 0.05 * float(p2p.compute_s)


def test_explicit_options_act_exactly_like_the_recipe_behaviour() -> None:
    """evaluate(job, plan, options=B) must equal evaluating a job whose recipe behaviour is B,
    on every term (layers, embedding and head edges, memory): an override that some term ignores
    would price one plan two ways."""
    base = _llama8b_fsdp()
    other = base.recipe.behaviour.model_copy(update={
        "fused": False, "eager_ops": "llama-upcast", "dropout": True})
    job_b = base.model_copy(update={"recipe": base.recipe.model_copy(
        update={"behaviour": other})})
    cl = base.cluster.model_copy(update={"node_groups": [base.cluster.node_groups[0]]})
    plan = Plan(dp=2, tp=2, pp=2, sp=1, mbs=1, num_microbatches=8, recompute="full",
                recompute_layers=4)
    a = evaluate(base.model_copy(update={"cluster": cl}), plan, other)
    b = evaluate(job_b.model_copy(update={"cluster": cl}), plan)
    plain = evaluate(base.model_copy(update={"cluster": cl}), plan)
    assert a.time.step_s == pytest.approx(b.time.step_s, rel=1e-12)
    assert a.stage_time_s == pytest.approx(b.stage_time_s, rel=1e-12)
    assert a.stage_peak_bytes == pytest.approx(b.stage_peak_bytes, rel=1e-12)
    # and the override matters on both edge stages (eager ops, dropout masks)
    assert all(x > y for x, y in zip(a.stage_time_s, plain.stage_time_s, strict=True))
    assert all(x > y for x, y in zip(a.stage_peak_bytes, plain.stage_peak_bytes, strict=True))


def test_dtensor_sequence_parallel_copies() -> None:
    """PyTorch DTensor SP gathers and scatters the [b, s, h] activations along dim 1: each of
    the 2 all-gathers and 2 reduce-scatters of a layer's forward copies the full b·s·h tensor
    (read + write, 2·2·h bytes per token in bf16): 16·h bytes per token and pass. None without
    SP, with tp 1, with async TP (fused all-gather-matmul), or in Megatron (dim-0 sequence);
    the layer's forward and backward each pay it once."""
    import numpy as np

    from autoparallel_cp.cost import factors as F
    from autoparallel_cp.cost import layer_factors as LF
    from autoparallel_cp.cost.efficiency import hbm_time

    job = _llama8b_fsdp()
    h = 4096
    tp, on, off = np.float64(4.0), np.float64(1.0), np.float64(0.0)
    plain = F.CostOptions(fused=True)
    assert float(layer_ops.dtensor_sp_copy_bytes(job, tp, on, plain)) == pytest.approx(16.0 * h)
    assert float(layer_ops.dtensor_sp_copy_bytes(job, tp, off, plain)) == 0.0
    assert float(layer_ops.dtensor_sp_copy_bytes(job, np.float64(1.0), on, plain)) == 0.0
    asynctp = F.CostOptions(fused=True, tp_comm_overlap=0.8)
    assert float(layer_ops.dtensor_sp_copy_bytes(job, tp, on, asynctp)) == 0.0
    meg = job.model_copy(update={"recipe": RECIPES["megatron-bf16"]})
    assert float(layer_ops.dtensor_sp_copy_bytes(meg, tp, on, F.CostOptions())) == 0.0
    # in the layer: forward + backward = 2 x the copies' HBM time of one pass
    with_sp = F.layer_factors(job, 0, 4, 1, 1, 1, 1, "none", options=plain)
    # the same layer with the copies taken out (async TP hides none of the comm here: 0 share)
    tokens = 1 * job.seq_len
    one_pass = float(hbm_time(job.cluster.node_groups[0].gpu, 16.0 * h * tokens))
    no_copy = LF.dtensor_sp_copy_bytes
    try:
        LF.dtensor_sp_copy_bytes = lambda *a, **k: np.float64(0.0)  # type: ignore[assignment]
        without = F.layer_factors(job, 0, 4, 1, 1, 1, 1, "none", options=plain)
    finally:
        LF.dtensor_sp_copy_bytes = no_copy  # type: ignore[assignment]
    assert float(with_sp.time_s - without.time_s) == pytest.approx(2 * one_pass, rel=1e-9)
