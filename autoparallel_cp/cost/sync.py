"""Communication and update costs outside the layers: pipeline send/recv, data-parallel gradient
synchronisation (ZeRO stages), the optimizer step, FSDP copies, and in-flight micro-batches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.autocast import autocast_grad_s
from autoparallel_cp.cost.common import (
    ArrayLike,
    FloatArray,
    _f,
    _is_pytorch,
    node,
)
from autoparallel_cp.cost.constants import (
    COMM_SM_SHARE,
    FSDP_COPY_OUT_BYTES_PER_PARAM,
)
from autoparallel_cp.cost.efficiency import hbm_time
from autoparallel_cp.cost.pp_grad_sync import pp_deferred
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.splits import microbatch_group

# ---------------------------------------------------------------------------------------------
# Pipeline, data-parallel, optimizer
# ---------------------------------------------------------------------------------------------


def p2p_factor(job: Job, g: int, tp: ArrayLike, cp: ArrayLike, sp: ArrayLike, mbs: ArrayLike,
               pp: ArrayLike, vpp: ArrayLike, dp: ArrayLike) -> FloatArray:
    """Pipeline send/recv time per micro-batch on one stage (forward activation + backward grad).

    Narayanan §3.2/§4.1: b·s·h per micro-batch per direction (s/cp on each cp rank);
    interleaving multiplies the sends by vpp (§2.2). What each tp rank sends: Megatron-Core
    (since 3c92fa93b5, 2023-03-23, which moved the p2p into megatron/core) sends the tensor
    [s/cp, b, h] from every tp rank, divided by tp only under sequence parallelism
    (schedules.py core_v0.10.0 l. 676-679, d98e8a64 l. 1183-1187); behaviour
    `pp_scatter_gather` sends 1/tp from each rank without it too (Megatron-LM's
    `--scatter-gather-tensors-in-pipeline`, on by default from 72e4230bb5 (2021-02) until that
    move; DeepSpeed's PipelineEngine, `is_pipe_partitioned` / `is_grad_partitioned`,
    deepspeed/runtime/pipe/engine.py @v0.11.1 l. 132-133); the receivers' all-gather over
    NVLink is not charged. Links: `comm.pipeline_links`. Every stage is charged the worst
    stage's pair: Megatron's 1F1B exchanges with each neighbour in one blocking call
    (`send_forward_recv_backward` / `send_backward_recv_forward`, schedules.py d98e8a64
    l. 2416 / 2446), so all stages run at the pace of the slowest F + B + X_up + X_down
    cycle; exact in the steady state of equal stages, it over-charges fill and drain by at
    most (pp - 1)·(X_net - X_nvlink), never lowers a step time, one value >= 0 per solver
    table cell (bounds hold); picked by topology, it is linear in each link's time (no kink).

    Behaviour `overlap_p2p_comm` (Megatron-Core's, interleaved schedule only: vpp > 1) hides the
    steady state's transfers; see `p2p_exposed_share`.
    """
    nd = node(job, g)
    tp_, cp_, sp_, mbs_, pp_, vpp_, dp_ = (_f(x) for x in (tp, cp, sp, mbs, pp, vpp, dp))
    tokens = mbs_ * job.seq_len / cp_
    split = tp_ if job.recipe.behaviour.pp_scatter_gather else np.where(sp_ > 0, tp_, 1.0)
    nbytes = tokens * job.model.hidden_size * job.recipe.activation_bytes / split
    net_links = comm.pipeline_links(tp_ * cp_ * dp_, pp_, nd.gpus_per_node)
    on_nvlink = comm.p2p(nd, np.ones_like(nbytes), nbytes)
    on_net = comm.p2p(nd, np.zeros_like(nbytes), nbytes)
    pair = (2.0 - net_links) * on_nvlink + net_links * on_net
    share = np.ones_like(pair)
    if job.recipe.behaviour.overlap_p2p_comm:
        m = np.maximum(np.floor(job.global_batch / (dp_ * mbs_)), 1.0)
        share = p2p_exposed_share(pp_, vpp_, m)
    return np.where(pp_ > 1, pair * vpp_ * share, 0.0)


def p2p_exposed_share(pp: ArrayLike, vpp: ArrayLike, m: ArrayLike) -> FloatArray:
    """Share of the first stage's pipeline transfers that costs their full time under
    Megatron-Core's `overlap_p2p_comm` (the rest costs COMM_SM_SHARE of theirs); 1 for vpp = 1.

    Interleaved schedule (`forward_backward_pipelining_with_interleaving`, schedules.py): in
    the steady state each forward chunk's send and the next chunk's receive are posted right
    after that forward and waited on only before the next forward, with a backward chunk in
    between, the gradient's likewise around a forward chunk (core_v0.10.0 l. 1169-1300;
    core_v0.8.0 l. 930-1012), so a transfer runs beside a chunk's compute and takes the SMs of
    its NCCL kernel from it (`comm.overlap_exposed` for a transfer shorter than the chunk:
    COMM_SM_SHARE of it). The W warm-up forwards and W cool-down backwards of a stage have no
    compute between a transfer's post and its wait (core_v0.10.0: blocking
    `send_forward_recv_forward` l. 1076 and `send_backward_recv_backward` l. 1437; core_v0.8.0:
    posted l. 881 and waited before the next warm-up forward l. 819-821, blocking cool-down l.
    1114-1115), so they are exposed. The first stage runs the most: W = 2(pp - 1) + (vpp - 1)·N
    of its m·vpp chunks (N = `microbatch_group`, pp when pp | m; core_v0.10.0 l. 692-696),
    capped at m·vpp. Megatron turns the overlap off without interleaving
    (megatron/training/arguments.py core_v0.10.0 l. 356)."""
    pp_, vpp_, m_ = np.broadcast_arrays(*(np.maximum(np.floor(_f(x)), 1.0) for x in (pp, vpp, m)))
    group = _warmup_group(pp_, m_)
    group = np.where(group > 0, group, pp_)  # m < pp: no group (the plan is refused)
    chunks = m_ * vpp_
    f = np.minimum(2.0 * (pp_ - 1.0) + (vpp_ - 1.0) * group, chunks) / chunks
    return np.where(vpp_ > 1, f + (1.0 - f) * COMM_SM_SHARE, 1.0)


def expert_dp_size(tp: ArrayLike, cp: ArrayLike, dp: ArrayLike, ep: ArrayLike,
                   etp: ArrayLike | None = None) -> FloatArray:
    """Ranks of the expert-data-parallel group: tp*cp*dp / (etp*ep) (Megatron-LM d98e8a64
    parallel_state.py:880, world / (etp*ep*pp)); dp*cp/ep in the default layout (etp = tp),
    computed as before so those costs stay bit-identical. At least 1."""
    tp_, cp_, dp_, ep_ = (_f(x) for x in (tp, cp, dp, ep))
    default = np.maximum(dp_ * cp_ / ep_, 1.0)
    if etp is None:
        return default
    etp_ = _f(etp)
    return np.where(etp_ == tp_, default, np.maximum(tp_ * cp_ * dp_ / (etp_ * ep_), 1.0))


def dp_sync_factors(job: Job, g: int, tp: ArrayLike, cp: ArrayLike, dp: ArrayLike,
                    ep: ArrayLike, zero: ArrayLike, etp: ArrayLike | None = None,
                    rep: ArrayLike = 1) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Alpha-beta coefficients of DP gradient synchronisation for the parameters on a GPU.

    Returns (s per dense parameter, s per expert parameter, ZeRO-3 all-gather s per dense
    parameter per micro-batch, fixed latency s of one synchronisation); the time of a stage
    is ``fixed + per_dense·dense + per_expert·expert``. Dense gradients reduce over the dp·cp
    group (Megatron `data_parallel_group_with_cp`), expert gradients over the expert-data-parallel
    group (`expert_dp_size` ranks at stride etp·ep: the expert grid etp x ep x edp of
    parallel_state.py; dp·cp/ep at stride tp·ep when etp = tp); no ZeRO:
    all-reduce (2(n-1)/n, hierarchical across nodes); ZeRO-1/2: reduce-scatter of gradients +
    all-gather of updated weights (same volume, ZeRO §7); ZeRO-3: reduce-scatter, plus an
    all-gather of the weights in forward and in backward per micro-batch (1.5x, ZeRO §7.2.2),
    overlapped per layer. Gradients travel in `recipe.grad_reduce_bytes` (fp32 by default: FSDP
    reduce_dtype, and Megatron bf16 training forces fp32 all-reduce, arguments.py).
    With `fsdp_float8_all_gather` on an fp8 recipe the ZeRO-3 gathers move 1 B per weight.
    With `zero3_reduce == "microbatch"` (PyTorch FSDP without no_sync, spec/recipe.py) the
    dense reduce-scatter moves from the step into the per-micro-batch ZeRO-3 term beside the
    two gathers (each unit reduces its gradients in every micro-batch's backward); expert
    gradients keep their one reduction per step, as the ZeRO-3 term gathers dense units only.
    Where `pp_deferred` (torchtitan at pp > 1) ZeRO-2/3 reduce once per step, as "step" does.
    Solver bounds: these options only move non-negative alpha-beta terms between the step's
    sync and the per-micro-batch ZeRO-3 term, which the search's tables read from this same
    function (search/tables.py `z3l`, `dpsync`), so every bound taken as a minimum over
    those tables stays a lower bound of this cost.

    Hybrid sharding (`rep` replicas, spec/hybrid_sharding.py): the ZeRO collectives span the
    shard group of n/rep ranks, and the reduced share is all-reduced across the replicas
    (`comm.replica_all_reduce`) where the reduce-scatter runs: FSDP2 all-reduces after every
    reduce-scatter (all_reduce_grads defaults to True), Megatron and MiCS once per step. rep = 1
    adds exact zeros; rep is one value per search space, read by the tables from here: the
    bound argument above holds unchanged.
    """
    nd = node(job, g)
    tp_, cp_, dp_, ep_, z = (_f(x) for x in (tp, cp, dp, ep, zero))
    rep_ = np.maximum(_f(rep), 1.0)
    etp_ = tp_ if etp is None else _f(etp)
    gb = float(job.recipe.grad_reduce_bytes)
    wb = 2.0  # weights gathered in bf16
    n_dense = dp_ * cp_
    n_exp = expert_dp_size(tp_, cp_, dp_, ep_, etp)
    ref = 1e9  # reference message (bytes) to separate the bandwidth term from the latency

    # ZeRO-2 reduce-scatters every micro-batch (DeepSpeed, Megatron-FSDP optim_grads, FSDP
    # SHARD_GRAD_OP: `microbatch_grad_factors`): only the all-gather of the updated weights is
    # left for the end of the step (bandwidth terms; the latency of the reduce-scatter stays
    # in `fixed`, once per step)
    beh = job.recipe.behaviour
    eager = np.logical_not(pp_deferred(job, tp_, cp_, dp_))  # reduced in every micro-batch
    mb2 = np.logical_and(beh.zero2_reduce != "step", eager)
    mb3 = np.logical_and(beh.zero3_reduce == "microbatch", eager)

    def reduce(n: FloatArray, st: FloatArray, nbytes: float) -> FloatArray:
        """Gradient reduction of a ZeRO stage: reduce-scatter within the shard group of n/rep
        ranks, then the all-reduce of its share across the replicas (0 when rep = 1)."""
        ns = n / rep_
        return (comm.reduce_scatter(nd, ns, st, nbytes * gb)
                + comm.replica_all_reduce(nd, ns, rep_, st, nbytes * gb))

    def sync(n: FloatArray, st: FloatArray, nbytes: float, per_mb: ArrayLike = False,
             per_mb3: ArrayLike = False) -> FloatArray:
        ar = comm.all_reduce(nd, n, st, nbytes * gb)
        ns = n / rep_
        ag = comm.all_gather(nd, ns, st, nbytes * wb)
        rs3 = reduce(n, st, nbytes)
        rs = rs3 + ag
        # per-micro-batch ZeRO-2 reduce-scatter: the replicas' all-reduce stays per step
        cross = comm.replica_all_reduce(nd, ns, rep_, st, nbytes * gb)
        z12 = np.where(np.logical_and(per_mb, z == 2), ag + cross, rs)
        z3_step = np.where(per_mb3, 0.0, rs3)  # moved into the per-micro-batch term
        return np.where(z == 0, ar, np.where(z >= 3, z3_step, z12))

    fixed = sync(n_dense, tp_, 0.0)
    per_dense = (sync(n_dense, tp_, ref, mb2, mb3) - sync(n_dense, tp_, 0.0, mb2, mb3)) / ref
    per_exp = (sync(n_exp, etp_ * ep_, ref, mb2) - sync(n_exp, etp_ * ep_, 0.0, mb2)) / ref
    # torchao float8 all-gather (behaviour `fsdp_float8_all_gather`): the layers' fp8 linear
    # weights travel in 1 B
    wb3 = 1.0 if beh.fsdp_float8_all_gather and job.recipe.compute_dtype == "fp8" else wb
    n_shard = n_dense / rep_
    ag0 = comm.all_gather(nd, n_shard, tp_, 0.0)
    z3 = 2.0 * (comm.all_gather(nd, n_shard, tp_, ref * wb3) - ag0) / ref
    z3 = z3 + np.where(mb3, (reduce(n_dense, tp_, ref) - reduce(n_dense, tp_, 0.0)) / ref, 0.0)
    return per_dense, per_exp, np.where(z >= 3, z3, 0.0), fixed


def fsdp_call_latency(job: Job, g: int, tp: ArrayLike, cp: ArrayLike, dp: ArrayLike,
                      zero: ArrayLike, rep: ArrayLike = 1) -> tuple[FloatArray, FloatArray]:
    """Per-call latency of FSDP's collectives, per transformer layer: (seconds per
    micro-batch, seconds per step); both 0 for zero < 2, and at zero 2 for Megatron recipes.

    FSDP wraps every transformer block as one unit (llm-foundry's MPT `fsdp_wrap_fn` returns
    True for `MPTBlock`, modeling_mpt.py @v0.3.0; torchtitan calls `fully_shard` on each
    TransformerBlock; HF Accelerate's transformer_layer_cls policy) and issues one collective
    per unit: under FULL_SHARD (zero 3) an all-gather before the unit's forward and another
    before its backward (parameters resharded after forward), every micro-batch; a
    reduce-scatter of its gradients (every micro-batch under `zero3_reduce == "microbatch"`,
    else, or where `pp_deferred`, once per step); under SHARD_GRAD_OP (zero 2) one all-gather
    and one reduce-scatter, whose latency is charged once per step (the volume every micro-batch,
    `microbatch_grad_factors`; the per-call latency of the micro-batches before the last is
    left out: a per-layer term that the solver's per-micro-batch gradient table, linear in
    parameters, does not carry). Each
    call is an NCCL ring over the dp·cp group at stride tp and pays `comm.ring_call_latency`;
    `dp_sync_factors` keeps only the bandwidth of the ZeRO-3 gathers and one latency per step.
    Megatron's zero=3 is Megatron-FSDP `optim_grads_params`, whose units are the transformer
    layers (mcore_fsdp_adapter.py:170-172 @d98e8a64 `fsdp_unit_modules`), each gathered and
    reduce-scattered "on all microbatches" (l. 167-169): the same calls per layer as FULL_SHARD,
    priced the same way (a lower bound for DeepSpeed's ZeRO-3, which gathers per submodule).
    Its zero=2 (`optim_grads`) reduce-scatters per unit in every micro-batch too; that call
    latency is not charged (the solver's per-micro-batch table outside ZeRO-3 is per parameter).

    Solver bounds: both terms are non-negative, independent of the micro-batch count, and
    enter the search through the same per-layer tables as the step time (search/tables.py:
    the per-micro-batch one inside the gather of `z3l`, the per-step one in `dpsync`), so
    every bound taken as a minimum over those tables stays a lower bound of this cost.

    Hybrid sharding (`rep` replicas): the rings span the shard group (dp·cp/rep ranks), and
    each unit's reduction adds an all-reduce across the replicas: 2(rep - 1) ring steps
    (tuning.cc nsteps for AllReduce), twice `ring_call_latency` at stride tp·shard.
    """
    zeros = np.zeros(np.broadcast(_f(tp), _f(cp), _f(dp), _f(zero), _f(rep)).shape)
    nd, beh3 = node(job, g), job.recipe.behaviour.zero3_reduce
    tp_, cp_, dp_, z = (_f(x) for x in (tp, cp, dp, zero))
    rep_ = np.maximum(_f(rep), 1.0)
    shard = dp_ * cp_ / rep_
    one = comm.ring_call_latency(nd, shard, tp_) + zeros
    cross = 2.0 * comm.ring_call_latency(nd, rep_, tp_ * shard) + zeros
    rs_mb = np.where(pp_deferred(job, tp_, cp_, dp_), 0.0, float(beh3 == "microbatch"))
    z2 = 2.0 if _is_pytorch(job.recipe) else 0.0
    per_mb = np.where(z >= 3, (2.0 + rs_mb) * one + rs_mb * cross, 0.0)
    per_step = np.where(z >= 3, (1.0 - rs_mb) * (one + cross),
                        np.where(z == 2, z2 * one + (z2 / 2.0) * cross, 0.0))
    return per_mb, per_step


def microbatch_grad_factors(job: Job, g: int, tp: ArrayLike, cp: ArrayLike, dp: ArrayLike,
                           ep: ArrayLike, zero: ArrayLike, etp: ArrayLike | None = None,
                           rep: ArrayLike = 1) -> tuple[FloatArray, FloatArray]:
    """Seconds per (tp-local) dense and per expert parameter of a stage, per micro-batch, of
    the gradient work a framework does after every micro-batch's backward, not overlapped:

    - ZeRO-2 (zero == 2) unless `zero2_reduce == "step"` or `pp_deferred`: the
      reduce-scatter of the micro-batch's gradients over the dp·cp group (experts: the
      expert-DP group).
      DeepSpeed (`"microbatch"`) reduces in the communication dtype, the model dtype by
      default (`communication_data_type`, engine.py @v0.11.1 l. 798-809: bf16 =
      `weight_bytes`); stage_1_and_2.py @v0.11.1 l. 1327-1328 reduces every micro-batch when
      `partition_gradients`. Megatron-FSDP `optim_grads` and PyTorch FSDP SHARD_GRAD_OP
      (`"unit"`) reduce each unit's gradients in every backward in `grad_reduce_bytes`
      (megatron_fsdp.py:760-774 @d98e8a64 `grad_reduce_every_bprop`; Megatron's default
      fp32 reduction for bf16). Their reduce-scatters run beside the backward of the units
      still to come (megatron_fsdp.py:331-337 forces `overlap_grad_reduce`); this term charges
      them whole, an upper bound by at most one backward per micro-batch: the exposed part
      max(share·r, r - backward) is not linear in the stage's parameters, and the solver reads
      this factor as one (search/tables.py `mbl`), so the composition stays the solver's.
      Bandwidth term only: the latency of a synchronisation stays once per step in
      `dp_sync_factors`' fixed term (FSDP's per-unit call latency: `fsdp_call_latency`).
      Example: llama3-70b, tp 2, pp 4, cp 4, dp 16 on 512 H100: ~8.8e9 fp32 gradients per
      GPU reduce-scatter over 64 ranks across nodes in every one of the 32 micro-batches,
      not once per step, which is what sharding them in memory implies.
    - DeepSpeed BF16_Optimizer (`bf16_accum_pass`, zero <= 1): `update_hp_grads` adds each
      bf16 gradient into its fp32 one, an unfused cast (r weight_bytes, w grad_bytes) and add
      (r 2·grad_bytes, w grad_bytes): 18 B per parameter at bf16/fp32, at HBM bandwidth.
    - autocast over fp32 weights (`transient_weight_copy_bytes` > 0, pytorch-amp): the
      weight-gradient cast back to fp32 and AccumulateGrad's fp32 add (cost/autocast.py).
    - autograd accumulation into `.grad` (`autograd_grad_accum`, zero <= 1): AccumulateGrad's
      in-place add in the parameter dtype (r 2·weight_bytes, w weight_bytes): 6 B per
      parameter in bf16. Charged on every micro-batch; the first one's gradient is taken as
      is (no add), one pass per step that this counts over (1/m of the term).

    With hybrid sharding (`rep` replicas) the reduce-scatter spans the shard group (n/rep
    ranks); the replicas' all-reduce is charged per step in `dp_sync_factors`.
    """
    nd = node(job, g)
    beh = job.recipe.behaviour
    tp_, cp_, dp_, ep_, z = (_f(x) for x in (tp, cp, dp, ep, zero))
    etp_ = tp_ if etp is None else _f(etp)
    zeros = np.zeros(np.broadcast(tp_, cp_, dp_, ep_, z, etp_).shape)
    dense, expert = zeros.copy(), zeros.copy()
    if beh.zero2_reduce != "step":
        z2 = np.logical_and(z == 2, np.logical_not(pp_deferred(job, tp_, cp_, dp_)))
        rec = job.recipe
        cb = float(rec.weight_bytes if beh.zero2_reduce == "microbatch" else rec.grad_reduce_bytes)
        ref = 1e9
        rep_ = np.maximum(_f(rep), 1.0)
        n_dense = dp_ * cp_ / rep_
        n_exp = expert_dp_size(tp_, cp_, dp_, ep_, etp) / rep_

        def rs(n: FloatArray, st: FloatArray) -> FloatArray:
            one = comm.reduce_scatter(nd, n, st, ref * cb) - comm.reduce_scatter(nd, n, st, 0.0)
            return np.where(n > 1, one / ref, 0.0)

        dense = dense + np.where(z2, rs(n_dense, tp_), 0.0)
        expert = expert + np.where(z2, rs(n_exp, etp_ * ep_), 0.0)
    if beh.bf16_accum_pass:
        rec = job.recipe
        per = float(rec.weight_bytes + 4 * rec.grad_bytes)
        acc = np.where(z <= 1, float(hbm_time(nd.gpu, per)), 0.0)
        dense = dense + acc
        expert = expert + acc
    if beh.autograd_grad_accum:
        add = np.where(z <= 1, float(hbm_time(nd.gpu, 3.0 * job.recipe.weight_bytes)), 0.0)
        dense = dense + add
        expert = expert + add
    grad_back = autocast_grad_s(job, g, beh.autograd_grad_accum)
    acc = grad_back.cast_back + np.where(z <= 1, grad_back.accumulate, 0.0)
    dense = dense + acc
    expert = expert + acc
    return dense, expert


def zero3_copy_factor(job: Job, g: int) -> float:
    """Seconds per tp-local dense parameter per micro-batch of ZeRO-3's memory-bound packing:
    the FSDP2 copy-out (`FSDP_COPY_OUT_BYTES_PER_PARAM`, when the recipe's behaviour has
    `fsdp_copy_out`) and the cast of the bf16 unsharded gradient into the reduce dtype
    (r2 w grad_reduce_bytes; FSDP1 `_reduce_grad` and FSDP2 `_chunk_cat` both do it); for
    DeepSpeed's ZeRO-3 (`zero3_predivide`) the in-place division of each reduce bucket before
    its reduce-scatter (r + w in the reduce dtype); 0 for Megatron."""
    if not _is_pytorch(job.recipe):
        if job.recipe.behaviour.zero3_predivide:
            return float(hbm_time(node(job, g).gpu, 2.0 * float(job.recipe.grad_reduce_bytes)))
        return 0.0
    copy_out = FSDP_COPY_OUT_BYTES_PER_PARAM if job.recipe.behaviour.fsdp_copy_out else 0.0
    per = copy_out + 2.0 + float(job.recipe.grad_reduce_bytes)
    return float(hbm_time(node(job, g).gpu, per))


def _warmup_group(pp: FloatArray, m: FloatArray) -> FloatArray:
    """N of the interleaved warm-up, elementwise: pp where pp | m, else `_group`."""
    return np.where(m % pp == 0, pp, _group(pp, m) if (m % pp).any() else pp)


def _group(pp: FloatArray, m: FloatArray) -> FloatArray:
    """Megatron's micro-batch group size per virtual stage (`spec.plan.microbatch_group`)."""
    pairs = {(int(a), int(b)) for a, b in zip(pp.ravel(), m.ravel(), strict=True)}
    size = {k: float(microbatch_group(*k)) for k in pairs}
    return np.vectorize(lambda a, b: size[int(a), int(b)], otypes=[float])(pp, m)


def inflight(pp: ArrayLike, vpp: ArrayLike, m: ArrayLike, stage: ArrayLike) -> FloatArray:
    """Micro-batches whose activations stage `stage` holds at its peak, in full-stage units,
    when its vpp model chunks hold equal layer counts.

    1F1B: min(pp - stage, m) (Korthikanti §4.2.3, Galvatron). Interleaved (Megatron-LM
    d98e8a64 core/pipeline_parallel/schedules.py `get_pp_rank_microbatches`): the warm-up
    runs W = (pp - stage - 1)·2 + (vpp - 1)·N forward chunks (N = `microbatch_group`, pp when
    pp | m), capped at the m·vpp chunks of the step; the steady state then runs one forward
    before each backward, so W + 1 chunks are held (all m·vpp when W covers the step), in
    units of one chunk = 1/vpp of the stage; on the first stage with N = pp this is
    pp·(1 + (pp-1)/(pp·vpp)) (Korthikanti §4.2.3). Megatron before 4295be1a6c (2024-11) ran
    every forward first when m == pp; the schedule of today caps by W only.
    """
    pp_, vpp_, m_, j = np.broadcast_arrays(*(_f(x) for x in (pp, vpp, m, stage)))
    one_f = np.minimum(pp_ - j, m_)
    group = _warmup_group(pp_, m_)
    warm = (pp_ - j - 1) * 2 + (vpp_ - 1) * group + 1
    chunks = np.minimum(warm, m_ * vpp_)
    return np.where(vpp_ > 1, chunks / vpp_, one_f)


def stage_inflight(pp: int, vpp: int, m: int, stage: int, chunks: Sequence[int]) -> float:
    """`inflight` of a stage whose vpp model chunks hold `chunks` layers (in chunk order): the
    peak over the interleaved schedule of the in-flight chunks' layers, in full-stage units
    (sum over held chunks of layers / stage layers).

    Equal chunks: `inflight`. Otherwise the schedule of Megatron-LM d98e8a64 schedules.py is
    walked: forward chunk ids from `get_schedule_table` (groups of N micro-batches, chunk by
    chunk), backward ids mirrored (vpp - 1 - chunk, `get_model_chunk_id`), W warm-up forwards,
    then per step one forward and one backward; the peak is the largest held sum right after
    a forward. A stage's activations and recomputed layers are spread over its chunks in
    proportion to their layers (memory.py composes f_j x the stage's activations)."""
    if vpp == 1 or len(set(chunks)) <= 1 or sum(chunks) == 0:
        return float(inflight(pp, vpp, m, stage))
    group = microbatch_group(pp, m) or pp
    order: list[int] = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        order += [c for c in range(vpp) for _ in range(lo, hi)]
    total = len(order)
    warm = min((pp - stage - 1) * 2 + (vpp - 1) * group, total)
    held = peak = 0  # layers, in integers: the ratio below is exact to one rounding
    for k in range(warm):
        held += chunks[order[k]]
        peak = max(peak, held)
    for k in range(total - warm):
        held += chunks[order[warm + k]]
        peak = max(peak, held)
        held -= chunks[vpp - 1 - order[k]]
    return peak / sum(chunks)
