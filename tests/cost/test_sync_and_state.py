"""Data-parallel synchronisation, optimizer traffic and per-layer parameters, by hand.

Expected values are written out from the rules the modules cite (not from their output):
- gradient sync (ZeRO §7, Rajbhandari et al. 2019): no ZeRO all-reduces gradients; ZeRO-1/2
  reduce-scatter gradients and all-gather the updated bf16 weights; ZeRO-3 reduce-scatters
  gradients and all-gathers the bf16 weights in forward and again in backward. Gradients travel
  in fp32 (Megatron bf16 forces fp32 all-reduce, arguments.py); dense gradients reduce over the
  dp·cp group, expert gradients over dp·cp/ep (Megatron expert-data-parallel group);
- collective times: nccl-tests bus factors and the ring alpha-beta model (see test_comm.py);
- parameters of one Llama layer from its shapes; Megatron splits the matrices over tp, keeps
  norms replicated, and splits routed experts over ep (and expert-tp = tp).
"""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.efficiency import hbm_time
from autoparallel_cp.cost.model_state import layer_param_counts, zero3_buffer_bytes
from autoparallel_cp.cost.optimizer_step import optimizer_factor
from autoparallel_cp.cost.sync import dp_sync_factors
from autoparallel_cp.spec import (
    RECIPES,
    ClusterSpec,
    GPUSpec,
    Job,
    LinkSpec,
    ModelSpec,
    MoESpec,
    NodeGroup,
)

NV_US, NET_US = 3.0, 8.0


def _job(nodes: int = 1, moe: bool = False, recipe: str = "megatron-bf16") -> Job:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, hbm_gbps=3350)
    nd = NodeGroup(name="n", gpu=gpu, gpus_per_node=8, num_nodes=nodes,
                   intra_node=LinkSpec(bandwidth_gbps=450, latency_us=NV_US),
                   inter_node=LinkSpec(bandwidth_gbps=50, latency_us=NET_US))
    m = ModelSpec(name="llama8b-like", num_layers=4, hidden_size=4096, ffn_hidden_size=14336,
                  num_attention_heads=32, num_kv_heads=8, vocab_size=128256,
                  moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024,
                              first_k_dense_layers=1) if moe else None)
    return Job(model=m, cluster=ClusterSpec(name="c", node_groups=[nd]),
               recipe=RECIPES[recipe], seq_len=4096, global_batch=64)


NV = 450e9 * comm.NVLINK_EFFICIENCY
NET = 50e9 * comm.NETWORK_EFFICIENCY


def _sync(job: Job, tp: int, cp: int, dp: int, ep: int, zero: int) -> list[float]:
    return [float(np.asarray(x)) for x in dp_sync_factors(job, 0, tp, cp, dp, ep, zero)]


def test_dp_sync_within_a_node_by_zero_stage() -> None:
    """dp=8 on one node (stride tp=1): ring over 8 NVLink ranks; 4-byte gradients, 2-byte
    weights. Values per parameter; `fixed` is the latency of one synchronisation."""
    job = _job()
    per, _, z3, fixed = _sync(job, 1, 1, 8, 1, 0)
    assert per == pytest.approx(4 * 2 * 7 / 8 / NV, rel=1e-9)  # all-reduce
    assert fixed == pytest.approx(2 * 7 * NV_US * 1e-6, rel=1e-9)
    assert z3 == 0.0
    per, _, z3, fixed = _sync(job, 1, 1, 8, 1, 1)
    assert per == pytest.approx((4 + 2) * 7 / 8 / NV, rel=1e-9)  # RS grads + AG weights
    assert fixed == pytest.approx(2 * 7 * NV_US * 1e-6, rel=1e-9)
    # ZeRO-2 (Megatron-FSDP optim_grads): the gradients' reduce-scatter moves to every
    # micro-batch (`microbatch_grad_factors`); the step keeps the weights' all-gather
    assert _sync(job, 1, 1, 8, 1, 2)[0] == pytest.approx(2 * 7 / 8 / NV, rel=1e-9)
    # ZeRO-3 (Megatron-FSDP optim_grads_params): RS and AG on all micro-batches
    # (mcore_fsdp_adapter.py:167-169): the gradients' RS joins the two gathers per micro-batch
    per, _, z3, fixed = _sync(job, 1, 1, 8, 1, 3)
    assert per == 0.0
    assert fixed == pytest.approx(7 * NV_US * 1e-6, rel=1e-9)  # one RS latency per step
    assert z3 == pytest.approx((2 * 2 + 4) * 7 / 8 / NV, rel=1e-9)  # AG fwd + bwd, RS
    # reduced once per step (FSDP no_sync): RS at the step, gathers per micro-batch
    step = job.model_copy(update={"recipe": job.recipe.with_behaviour(zero3_reduce="step")})
    per, _, z3, fixed = _sync(step, 1, 1, 8, 1, 3)
    assert per == pytest.approx(4 * 7 / 8 / NV, rel=1e-9)  # RS grads only
    assert fixed == pytest.approx(7 * NV_US * 1e-6, rel=1e-9)
    assert z3 == pytest.approx(2 * 2 * 7 / 8 / NV, rel=1e-9)  # AG in forward and backward


def test_dp_sync_counts_cp_ranks_and_crosses_nodes() -> None:
    """Dense gradients reduce over dp·cp ranks: dp=2, cp=4 is a ring of 8. With tp=8 on 8-GPU
    nodes, dp=2 is one rank per node: a ring of 2 over the network."""
    per = _sync(_job(), 1, 4, 2, 1, 0)[0]
    assert per == pytest.approx(4 * 2 * 7 / 8 / NV, rel=1e-9)
    per, _, _, fixed = _sync(_job(nodes=2), 8, 1, 2, 1, 0)
    assert per == pytest.approx(4 * 2 * 1 / 2 / NET, rel=1e-9)
    assert fixed == pytest.approx(2 * 1 * NET_US * 1e-6, rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_expert_gradients_reduce_over_dp_cp_over_ep(zero: int) -> None:
    """ep=2 of dp=8: expert gradients reduce over 4 ranks (stride tp·ep = 2, all on one node);
    ep=8 leaves one rank: nothing to reduce."""
    job = _job(moe=True)
    ring4 = {0: 4 * 2 * 3 / 4, 1: (4 + 2) * 3 / 4, 3: 4 * 3 / 4}[zero] / NV
    assert _sync(job, 1, 1, 8, 2, zero)[1] == pytest.approx(ring4, rel=1e-9)
    assert _sync(job, 1, 1, 8, 8, zero)[1] == 0.0


def test_optimizer_traffic_per_parameter() -> None:
    """Fused Adam with an fp32 master: fp32 master r/w 8, m r/w 8, v r/w 8, fp32 grad read 4 and
    the bf16 working weight written 2 = 30 B (Megatron distributed optimizer); + 12 B of
    gradient clipping (norm read 4, scale r/w 8). Without a separate master the bf16 write
    disappears (28 B). foreach AdamW: 80 B (torch `_multi_tensor_adam`, op by op) + 6 B to
    refresh the bf16 working copy from the fp32 master (read 4, write 2)."""
    base = _job(recipe="megatron-bf16")
    gpu = base.cluster.node_groups[0].gpu

    def with_(**kw: object) -> Job:
        return base.model_copy(update={"recipe": base.recipe.model_copy(update=kw)})

    def b(x: float) -> float:
        return float(hbm_time(gpu, x))

    assert optimizer_factor(with_(grad_clip=False), 0) == pytest.approx(b(30), rel=1e-12,
                                                                         abs=0.0)
    assert optimizer_factor(with_(grad_clip=True), 0) == pytest.approx(b(42), rel=1e-12,
                                                                        abs=0.0)
    assert optimizer_factor(with_(grad_clip=False, master_weight_bytes=0), 0) == \
        pytest.approx(b(28), rel=1e-12, abs=0.0)
    assert optimizer_factor(with_(grad_clip=False, optimizer_kernel="foreach"), 0) == \
        pytest.approx(b(86), rel=1e-12, abs=0.0)
    assert optimizer_factor(with_(grad_clip=False, optimizer_kernel="foreach",
                                  master_weight_bytes=0), 0) == \
        pytest.approx(b(80), rel=1e-12, abs=0.0)


# Llama-3-8B-like layer: h 4096, 32 query heads and 8 KV heads of 128, SwiGLU ffn 14336
H, KV, F = 4096, 8 * 128, 14336
ATTN = H * H + 2 * H * KV + H * H  # wq, wk, wv, wo
MLP = 3 * H * F  # w1, w2, w3
NORMS = 2 * H


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_dense_layer_params_split_over_tp(tp: int) -> None:
    dense, expert = layer_param_counts(_job(), False, tp, 1)
    assert float(dense) == (ATTN + MLP) / tp + NORMS
    assert float(expert) == 0.0
    assert ATTN + MLP + NORMS == 218_112_000


@pytest.mark.parametrize("tp,ep", [(1, 1), (1, 4), (2, 2), (4, 8)])
def test_moe_layer_params_split_over_tp_and_ep(tp: int, ep: int) -> None:
    """8 routed experts of SwiGLU ffn 1024 (3·h·1024 each) split over tp·ep; the first layer is
    dense (first_k_dense_layers=1) and keeps the dense MLP; a MoE layer's dense part is the
    attention, the norms and the router (h x 8), a matrix counted over tp like the others
    (Megatron `theoretical_memory_usage.py` divides the layer's matrices by tp; the TopKRouter
    itself is replicated, a 16k-parameter difference here)."""
    job = _job(moe=True)
    dense, expert = layer_param_counts(job, True, tp, ep)
    assert float(expert) == 8 * 3 * H * 1024 / (tp * ep)
    assert float(dense) == pytest.approx((ATTN + H * 8) / tp + NORMS, rel=1e-12)
    d0, e0 = layer_param_counts(job, False, tp, ep)
    assert float(d0) == (ATTN + MLP) / tp + NORMS and float(e0) == 0.0


def test_zero3_gathered_buffers() -> None:
    """ZeRO-3 holds the unsharded bf16 weights of the resident layers (the one computing and the
    prefetched next: 2) and one layer's unsharded gradient (4 B in fp32 for megatron-bf16)."""
    job = _job()
    per = (ATTN + MLP) / 2 + NORMS  # tp = 2
    assert float(zero3_buffer_bytes(job, 2, 1, 3)) == pytest.approx(2 * 2 * per + 4 * per,
                                                                   rel=1e-12)
    assert float(zero3_buffer_bytes(job, 2, 1, 1)) == 0.0


# ---------------------------------------------------------------------------------------------
# DeepSpeed: per-micro-batch gradient work (ZeRO-2 reduce-scatter, BF16_Optimizer accumulation)
# ---------------------------------------------------------------------------------------------


def _mb(job: Job, tp: int, cp: int, dp: int, ep: int, zero: int) -> tuple[float, float]:
    from autoparallel_cp.cost.sync import microbatch_grad_factors

    d, e = microbatch_grad_factors(job, 0, tp, cp, dp, ep, zero)
    return float(np.asarray(d)), float(np.asarray(e))


def test_deepspeed_zero2_reduces_every_microbatch_in_bf16() -> None:
    """dp=8 on one NVLink node, ZeRO-2 under the deepspeed preset: every micro-batch
    reduce-scatters its gradients in bf16 (2 B, DeepSpeed's default communication_data_type
    for bf16): 2·7/8 bytes per parameter over NVLink; the step keeps only the all-gather of
    the bf16 weights (2·7/8 / NV) and one synchronisation's latency (RS + AG: 2·7 hops)."""
    job = _job(recipe="deepspeed")
    d, e = _mb(job, 1, 1, 8, 1, 2)
    assert d == pytest.approx(2 * 7 / 8 / NV, rel=1e-9)
    per, _, z3, fixed = _sync(job, 1, 1, 8, 1, 2)
    assert per == pytest.approx(2 * 7 / 8 / NV, rel=1e-9)
    assert fixed == pytest.approx(2 * 7 * NV_US * 1e-6, rel=1e-9)
    assert z3 == 0.0
    # ZeRO-1 and ZeRO-3 keep their once-per-step reduction (fp32 RS + bf16 AG; fp32 RS)
    assert _sync(job, 1, 1, 8, 1, 1)[0] == pytest.approx((4 + 2) * 7 / 8 / NV, rel=1e-9)
    assert _mb(job, 1, 1, 8, 1, 3) == (0.0, 0.0)
    # no data parallelism: nothing to reduce
    assert _mb(job, 8, 1, 1, 1, 2) == (0.0, 0.0)


def test_deepspeed_zero2_expert_gradients_reduce_over_expert_dp() -> None:
    """ep=2 of dp=8: expert gradients reduce-scatter over 4 NVLink ranks every micro-batch
    (2·3/4 bytes per parameter); ep=8 leaves one rank."""
    job = _job(moe=True, recipe="deepspeed")
    assert _mb(job, 1, 1, 8, 2, 2)[1] == pytest.approx(2 * 3 / 4 / NV, rel=1e-9)
    assert _mb(job, 1, 1, 8, 8, 2)[1] == 0.0


@pytest.mark.parametrize("zero", [0, 1])
def test_bf16_optimizer_accumulation_pass(zero: int) -> None:
    """BF16_Optimizer's `update_hp_grads` after every backward: cast bf16 -> fp32 (read 2, write
    4) and add into the fp32 gradient (read 4 + 4, write 4) = 18 B per parameter at the H100's
    3350 GB/s x HBM_EFFICIENCY, on dense and expert parameters alike."""
    from autoparallel_cp.cost.efficiency import HBM_EFFICIENCY

    job = _job(moe=True, recipe="deepspeed")
    want = 18.0 / (3350e9 * HBM_EFFICIENCY)
    d, e = _mb(job, 1, 1, 8, 2, zero)
    assert d == pytest.approx(want, rel=1e-12)
    assert e == pytest.approx(want, rel=1e-12)


def test_autograd_accumulation_into_bf16_grad() -> None:
    """DeepSpeed ZeRO-1 with bf16 grad_accum_dtype: autograd adds each micro-batch's bf16
    gradient into `.grad` in place (read 2 + 2, write 2) = 6 B per parameter at the H100's
    3350 GB/s x HBM_EFFICIENCY; no BF16_Optimizer pass; ZeRO-2 reduces and drops the
    gradients every micro-batch instead, so there it is only the bf16 reduce-scatter."""
    from autoparallel_cp.cost.efficiency import HBM_EFFICIENCY

    ds = _job(moe=True, recipe="deepspeed")
    job = ds.model_copy(update={"recipe": ds.recipe.with_behaviour(
        bf16_accum_pass=False, autograd_grad_accum=True)})
    want = 6.0 / (3350e9 * HBM_EFFICIENCY)
    for zero in (0, 1):
        d, e = _mb(job, 1, 1, 8, 2, zero)
        assert d == pytest.approx(want, rel=1e-12)
        assert e == pytest.approx(want, rel=1e-12)
    assert _mb(job, 1, 1, 8, 1, 2)[0] == pytest.approx(2 * 7 / 8 / NV, rel=1e-9)


@pytest.mark.parametrize("recipe", ["megatron-bf16", "pytorch-fsdp", "torchtitan-fsdp"])
def test_other_recipes_have_no_microbatch_gradient_work(recipe: str) -> None:
    """Megatron and PyTorch accumulate into their fp32 main gradients inside the backward
    (no separate pass); at zero 0/1/3 they have no per-micro-batch gradient work, at zero 2
    only the reduce-scatter of every micro-batch (4·7/8 dense over dp 8, 4·3/4 expert over
    the 4 expert-DP ranks of ep 2), and the step keeps the weights' all-gather (2·7/8)."""
    job = _job(moe=True, recipe=recipe)
    for zero in (0, 1, 3):
        assert _mb(job, 1, 1, 8, 2, zero) == (0.0, 0.0)
    gb = float(job.recipe.grad_reduce_bytes)
    d, e = _mb(job, 1, 1, 8, 2, 2)
    assert d == pytest.approx(gb * 7 / 8 / NV, rel=1e-9)
    assert e == pytest.approx(gb * 3 / 4 / NV, rel=1e-9)
    assert _sync(job, 1, 1, 8, 1, 2)[0] == pytest.approx(2 * 7 / 8 / NV, rel=1e-9)


def test_deepspeed_microbatch_work_enters_every_microbatch_of_the_step() -> None:
    """dp=8 on one node, pp=1, m=4 micro-batches. ZeRO-2: the per-micro-batch reduce-scatter
    (bf16, 2·7/8 B per parameter) equals the step-end all-gather (bf16, same volume) less the
    latency of one synchronisation (2·7 NVLink hops), and the step pays it m times on top of
    the tail. ZeRO-1: the accumulation pass is 18 B per parameter at HBM speed, the same
    parameters: ratio 18/(HBM·eff) over 2·7/8/NV. Breakdown components still sum to the step."""
    from autoparallel_cp.cost.efficiency import HBM_EFFICIENCY
    from autoparallel_cp.cost.steptime import step_time
    from autoparallel_cp.spec.plan import Plan

    job = _job(recipe="deepspeed").model_copy(update={"global_batch": 32})
    z2 = step_time(job, Plan(dp=8, zero=2, mbs=1, num_microbatches=4, recompute="none"))
    s2 = z2.stages[0]
    assert s2.grad_reduce_s == pytest.approx(s2.dp_sync_s - 2 * 7 * NV_US * 1e-6, rel=1e-9)
    assert s2.grad_accum_s == 0.0
    assert z2.dp_comm_s == pytest.approx(s2.dp_sync_s + 4 * s2.grad_reduce_s, rel=1e-12)
    z1 = step_time(job, Plan(dp=8, zero=1, mbs=1, num_microbatches=4, recompute="none"))
    s1 = z1.stages[0]
    assert s1.grad_reduce_s == 0.0
    ratio = (18.0 / (3350e9 * HBM_EFFICIENCY)) / (2 * 7 / 8 / NV)
    assert s1.grad_accum_s == pytest.approx(ratio * s2.grad_reduce_s, rel=1e-9)
    for st in (z1, z2):
        parts = (st.compute_s + st.bubble_s + st.tp_comm_s + st.cp_comm_s + st.ep_comm_s
                 + st.pp_comm_s + st.dp_comm_s + st.optimizer_s + st.fixed_s)
        assert parts == pytest.approx(st.step_s, rel=1e-12)


def test_megatron_zero2_is_megatron_fsdp_and_reduces_every_microbatch_in_fp32() -> None:
    """Megatron's zero=2 is Megatron-FSDP `optim_grads` (emit/megatron.py), whose units
    reduce-scatter their gradients in every backward (megatron_fsdp.py:760-774 @d98e8a64).
    dp=8 on one NVLink node, fp32 main grads (`grad_reduce_bytes` 4): 4·7/8 B per parameter
    per micro-batch over NVLink. Across two nodes with tp=8 (dp=2, one rank per node): a ring
    of 2 over the network, 4·1/2 B. ZeRO-1 (the distributed optimizer: one reduce-scatter at
    the last micro-batch) and ZeRO-3 charge nothing here."""
    job = _job()
    assert _mb(job, 1, 1, 8, 1, 2)[0] == pytest.approx(4 * 7 / 8 / NV, rel=1e-9)
    assert _mb(_job(nodes=2), 8, 1, 2, 1, 2)[0] == pytest.approx(4 * 1 / 2 / NET, rel=1e-9)
    assert _mb(job, 1, 1, 8, 1, 1) == (0.0, 0.0)
    assert _mb(job, 1, 1, 8, 1, 3) == (0.0, 0.0)


def test_pytorch_fsdp_shard_grad_op_reduces_every_microbatch() -> None:
    """PyTorch FSDP SHARD_GRAD_OP (zero=2) reduce-scatters each unit in every backward (no
    no_sync in the trainers, spec/recipe.py `zero3_reduce`): torchtitan-fsdp and pytorch-fsdp
    pay 4·7/8 B per parameter (fp32 reduce_dtype) per micro-batch at dp=8 on NVLink."""
    for name in ("torchtitan-fsdp", "pytorch-fsdp"):
        assert _mb(_job(recipe=name), 1, 1, 8, 1, 2)[0] == pytest.approx(4 * 7 / 8 / NV,
                                                                           rel=1e-9)


def test_zero2_reduced_once_per_step_keeps_whole_gradients() -> None:
    """A recipe that states `zero2_reduce: step` reduces once (no per-micro-batch term, the
    step's RS + AG as ZeRO-1) and so keeps whole gradients: 4 B per parameter at dp=8, not
    4/8; per micro-batch reduction shards them (0.5 B)."""
    from autoparallel_cp.cost.model_state import state_bytes_per_param

    rec = RECIPES["megatron-bf16"]
    step = rec.model_copy(update={"behaviour": rec.behaviour.model_copy(
        update={"zero2_reduce": "step"})})
    job = _job().model_copy(update={"recipe": step})
    assert _mb(job, 1, 1, 8, 1, 2) == (0.0, 0.0)
    assert _sync(job, 1, 1, 8, 1, 2)[0] == pytest.approx((4 + 2) * 7 / 8 / NV, rel=1e-9)
    assert float(state_bytes_per_param(step, 2, 8)[1]) == 4.0
    assert float(state_bytes_per_param(rec, 2, 8)[1]) == 0.5
    # the same for ZeRO-3: whole gradients when reduced once per step, 1/8 otherwise
    step3 = rec.with_behaviour(zero3_reduce="step")
    assert float(state_bytes_per_param(step3, 3, 8)[1]) == 4.0
    assert float(state_bytes_per_param(rec, 3, 8)[1]) == 0.5


def test_headline_zero2_plan_pays_its_reduce_scatters() -> None:
    """llama3-70b on 512 H100 (the README's headline job), tp 2, pp 4, vpp 4, cp 4, dp 16,
    32 micro-batches: zero=2 keeps 1/64 of the gradients, so it must reduce-scatter every
    micro-batch: its DP time is at least 32 x one reduce-scatter of the stage's fp32
    gradients more than zero=1's once-per-step one, so zero=2 is no longer as fast as zero=1
    (which needs more memory than the GPU has)."""
    from autoparallel_cp.api import evaluate, make_job

    job = make_job("llama3-70b", "dgx-h100", gpus=512, seq_len=8192, global_batch=512)
    plan = "tp=2,pp=4,vpp=4,cp=4,sp=1,zero={},mbs=1,recompute=none"
    z1, z2 = (evaluate(job, plan.format(z)) for z in (1, 2))
    st = max(z2.time.model_dump()["step_s"], 0.0)
    assert not z1.fits and z2.fits
    assert st > 1.5 * z1.time.step_s
    assert z2.time.dp_comm_s > 10 * z1.time.dp_comm_s
