"""Megatron-LM arguments (`megatron/training/arguments.py` option names) for a plan."""

from __future__ import annotations

import shlex

from autoparallel_cp.emit.common import (
    chunk_layers,
    first_last_split,
    plan_comment,
    refuse_unrunnable,
    slot_flags,
    uniform_layers,
)
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.frameworks import VERSIONS
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.splits import microbatch_group


def megatron_env(plan: Plan) -> dict[str, str]:
    """Environment the launch needs (Megatron-LM d98e8a64 megatron/training/arguments.py).

    Megatron-FSDP (zero >= 2) asserts CUDA_DEVICE_MAX_CONNECTIONS != "1" (arguments.py:1166-1167);
    otherwise tp > 1 or cp > 1 asserts it == "1" before Blackwell (arguments.py:1452-1479). Many
    of Megatron's example scripts export 1, so the value is always printed.
    """
    if plan.zero >= 2:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}  # > 1 (8 is CUDA's own default)
    if plan.tp > 1 or plan.cp > 1:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def pipeline_layout(job: Job, plan: Plan) -> str:
    """--pipeline-model-parallel-layout: E (embedding), t (layer), m (MTP), L (loss) per stage.

    Syntax from Megatron-LM d98e8a64 megatron/training/arguments.py:3103-3110.
    """
    chunks = chunk_layers(job, plan)
    parts = []
    for i, n in enumerate(chunks):
        items = ["E"] if i == 0 else []
        if n:
            items.append(f"t*{n}")
        if i == len(chunks) - 1:
            items += ["m"] * job.model.mtp_layers + ["L"]
        parts.append(",".join(items))
    return "|".join(parts)


def split_args(job: Job, plan: Plan) -> list[str]:
    """The layer-split and schedule flags that reproduce the plan's model chunks exactly
    (Megatron-LM d98e8a64 megatron/training/arguments.py:925-1001, transformer_config.py
    "Uneven PP" / account_for_* / "PP layout", transformer_block.py `get_num_layers_to_build`):

    - every chunk equal: Megatron's default (`--num-layers-per-virtual-pipeline-stage`);
    - without interleaving, only the first / last stage differ:
      `--decoder-first-pipeline-num-layers`, `--decoder-last-pipeline-num-layers`;
    - embedding / loss as layer slots: `--account-for-embedding-in-pipeline-split`,
      `--account-for-loss-in-pipeline-split` (`slot_flags`), with vpp as
      `--num-virtual-stages-per-pipeline-rank`;
    - anything else: `--pipeline-model-parallel-layout` (the chunks verbatim).
    With interleaving and pp not dividing the micro-batches,
    `--microbatch-group-size-per-virtual-pipeline-stage` N (`spec.splits.microbatch_group`;
    schedules.py refuses Megatron's default N = pp there).
    """
    m, pp, vpp = job.model, plan.pp, plan.vpp
    a: list[str] = []
    if pp > 1 and vpp > 1 and plan.num_microbatches % pp:
        a += ["--microbatch-group-size-per-virtual-pipeline-stage",
              str(microbatch_group(pp, plan.num_microbatches))]
    if pp == 1:
        return a
    vflag = ["--num-virtual-stages-per-pipeline-rank", str(vpp)] if vpp > 1 else []
    split = first_last_split(job, plan)
    slots = slot_flags(job, plan)
    if uniform_layers(job, plan):
        if vpp > 1:
            a += ["--num-layers-per-virtual-pipeline-stage", str(m.num_layers // (pp * vpp))]
    elif split is not None and vpp == 1:
        a += ["--decoder-first-pipeline-num-layers", str(split[0]),
              "--decoder-last-pipeline-num-layers", str(split[1])]
    elif slots is not None:
        a += (["--account-for-embedding-in-pipeline-split"] if slots[0] else []) + (
            ["--account-for-loss-in-pipeline-split"] if slots[1] else []) + vflag
    else:
        # any other split: the explicit layout, exactly as planned
        a += ["--pipeline-model-parallel-layout", pipeline_layout(job, plan)]
    return a


def megatron_args(job: Job, plan: Plan) -> tuple[list[str], list[str]]:
    """Megatron-LM command-line arguments (flat list) for the plan, and notes."""
    refuse_unrunnable(job, plan, "megatron")
    m = job.model
    notes: list[str] = []
    if m.mlp == "quick-geglu":
        notes.append("--quick-geglu builds the gated unit without GPT-OSS's clamp 7.0 and "
                     "linear offset 1.0 (TransformerConfig activation_func_clamp_value and "
                     "glu_linear_offset have no command-line flag at d98e8a64): same shapes and "
                     "FLOPs; set them in a model provider for GPT-OSS's numerics")
    a: list[str] = [
        "--tensor-model-parallel-size", str(plan.tp),
        "--pipeline-model-parallel-size", str(plan.pp),
        "--context-parallel-size", str(plan.cp),
    ]
    if plan.ep > 1:
        a += ["--expert-model-parallel-size", str(plan.ep)]
    if plan.etp is not None:
        # MoE parallel folding: the expert grid etp x ep x edp (ModelParallelConfig
        # expert_tensor_parallel_size, model_parallel_config.py:130; default tp)
        a += ["--expert-tensor-parallel-size", str(plan.etp)]
    if plan.ep > 1 or plan.folded:
        # the dispatcher the cost model prices (cost/layer_factors.py): all-to-all over the ep
        # group, then the expert-TP all-gather; Megatron's default is "allgather"
        # (transformer_config.py:891), which gathers every token over tp x ep instead
        if job.recipe.behaviour.ep_dispatcher == "flex":
            # node-deduplicating dispatch (DeepEP; transformer_config.py:898 default backend)
            a += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
                  "deepep"]
        elif job.recipe.behaviour.ep_dispatcher == "allgather":
            a += ["--moe-token-dispatcher-type", "allgather"]
        else:
            a += ["--moe-token-dispatcher-type", "alltoall"]
        moe_replayed = plan.recompute == "selective" and \
            "moe" in job.recipe.behaviour.recompute_modules
        if job.recipe.behaviour.ep_overlap and plan.ep > 1 and plan.recompute != "full" \
                and not moe_replayed:
            # EP dispatch/combine behind the other micro-batch's compute (combined 1F1B); the
            # delayed expert wgrad gives the backward dispatch compute to hide behind
            a += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if plan.cp > 1 and m.sliding_window_left is not None:
        # Transformer Engine refuses the p2p ring for sliding windows (context_parallel.py
        # `attn_forward_func_with_cp` @v2.9: "a2a" or "all_gather"); the windowed layers run
        # (and are costed as) the all-gather, the others the ring (transformer_config.py:1030
        # @d98e8a64: one cp_comm_type per layer)
        kinds = ["all_gather" if m.is_window_layer(i) else "p2p" for i in range(m.num_layers)]
        a += ["--cp-comm-type", *(kinds if "p2p" in kinds else kinds[:1])]
    if plan.sp:
        a.append("--sequence-parallel")
    a += split_args(job, plan)
    if plan.pp > 2 and plan.vpp > 1 and not job.recipe.behaviour.overlap_p2p_comm:
        # Megatron-LM overlaps the interleaved schedule's sends and receives unless told not to
        # (arguments.py:3118-3120 @d98e8a64, store_false `overlap_p2p_comm`; no flag turns it
        # on, so a recipe with the overlap, megatron-bf16 / -fp8, needs none); this recipe's
        # cost charges them exposed, so the launch matches it (behaviour `overlap_p2p_comm`)
        a.append("--no-overlap-p2p-communication")
    elif plan.pp == 2 and plan.vpp > 1 and not job.recipe.behaviour.overlap_p2p_comm:
        # Megatron refuses interleaving without the overlap on two stages (arguments.py:
        # 1000-1009 @d98e8a64): it runs this plan with the overlap, faster than costed
        notes.append("Megatron overlaps the pipeline sends of an interleaved plan on pp 2 (it "
                     "refuses --no-overlap-p2p-communication there); the recipe "
                     f"{job.recipe.name!r} costs them exposed, so the step time is an upper "
                     "estimate (set behaviour overlap_p2p_comm to cost the overlap)")
    # ZeRO: 1 = distributed optimizer; 2/3 = Megatron-FSDP sharding strategies.
    if plan.zero >= 1:
        a.append("--use-distributed-optimizer")
    if plan.optimizer_offload:
        # HybridDeviceOptimizer (megatron/core/optimizer/cpu_offloading): that share of the
        # optimizer on the CPU, its copies pipelined with the CPU step (cost/offload.py);
        # d98e8a64 arguments.py:1884-1888 requires the precision-aware optimizer with it
        a += ["--optimizer-cpu-offload", "--optimizer-offload-fraction",
              f"{plan.optimizer_offload:g}", "--overlap-cpu-optimizer-d2h-h2d",
              "--use-precision-aware-optimizer"]
    if plan.activation_offload:  # Transformer Engine CPU offloading (pp = 1: frameworks.py)
        # (d98e8a64 arguments.py:1950-1951: a positive count turns cpu_offloading on)
        a += ["--cpu-offloading-num-layers", str(plan.activation_offload)]
    if plan.zero >= 2:
        strategy = "optim_grads" if plan.zero == 2 else "optim_grads_params"
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy,
              "--ckpt-format", "fsdp_dtensor"]
    if plan.dp_replicate > 1:
        # hybrid sharding: R distributed-optimizer instances, each a consecutive slice of the
        # dp-cp ranks (parallel_state.py:922-929, 984-990), all-reduced across instances
        # (param_and_grad_buffer.py:734-745); Megatron-FSDP's HSDP reads the same flag
        # (fsdp/mcore_fsdp_adapter.py:346); arguments.py:3216
        a += ["--num-distributed-optimizer-instances", str(plan.dp_replicate)]
    a += [
        "--micro-batch-size", str(plan.mbs),
        "--global-batch-size", str(job.global_batch),
        "--seq-length", str(job.seq_len),
    ]
    if plan.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
        modules = list(job.recipe.behaviour.recompute_modules)
        if modules != ["core_attn"]:  # Megatron's default (transformer_config.py)
            a += ["--recompute-modules", *modules]
    elif plan.recompute == "full":
        layers_max = max(plan.layers_per_stage(m.num_layers))
        k = plan.recompute_layers
        if k is None or k >= layers_max:
            a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", "1"]
        else:
            if plan.vpp > 1:
                # Megatron counts block-recomputed layers per model chunk (a multiple of vpp
                # is required by frameworks.py, so this is exact)
                k //= plan.vpp
            a += ["--recompute-granularity", "full", "--recompute-method", "block",
                  "--recompute-num-layers", str(k)]
    a.append("--bf16")
    if job.recipe.compute_dtype == "fp8":
        a += ["--fp8-format", "hybrid"]
    if job.recipe.framework != "megatron":
        notes.append(f"recipe {job.recipe.name!r} (fp32 weights) has no exact Megatron "
                     "equivalent; emitted as --bf16 with fp32 main weights")
    a += _megatron_model_args(job, plan.tp)
    return a, notes


def _megatron_model_args(job: Job, tp: int) -> list[str]:
    """Every architecture field the plan's parameter count, memory and time depend on.

    Names from Megatron-LM d98e8a64 megatron/training/arguments.py and the TransformerConfig
    fields they fill (megatron/core/transformer/transformer_config.py: mtp_num_layers:68,
    add_bias_linear:212, qk_layernorm:259, multi_latent_attention:288,
    moe_shared_expert_intermediate_size:701, moe_layer_freq:735,
    moe_router_enable_expert_bias:816).
    """
    m = job.model
    a = [
        "--num-layers", str(m.num_layers),
        "--hidden-size", str(m.hidden_size),
        "--ffn-hidden-size", str(m.ffn_hidden_size),
        "--num-attention-heads", str(m.num_attention_heads),
        # RoPE has no table, so it may cover the sequence; learned positions keep the model's
        "--max-position-embeddings", str(m.max_position_embeddings
                                         if m.position_embedding == "learned"
                                         else max(m.max_position_embeddings, job.seq_len)),
        "--vocab-size", str(m.vocab_size),
        # Megatron pads the vocabulary to a multiple of divisor * tp: pick the divisor that
        # keeps the planned size exactly (arguments.py:2441; training/tokenizer padding)
        "--make-vocab-size-divisible-by", str(vocab_divisor(m.vocab_size, tp)),
    ]
    if m.mla is not None:
        a += ["--multi-latent-attention", "--kv-lora-rank", str(m.mla.kv_lora_rank),
              "--qk-head-dim", str(m.mla.qk_nope_head_dim),
              "--qk-pos-emb-head-dim", str(m.mla.qk_rope_head_dim),
              "--v-head-dim", str(m.mla.v_head_dim)]
        if m.mla.q_lora_rank is not None:
            a += ["--q-lora-rank", str(m.mla.q_lora_rank)]
    else:
        if m.head_dim is not None and m.head_dim != m.hidden_size // m.num_attention_heads:
            a += ["--kv-channels", str(m.head_dim)]
        if m.kv_heads != m.num_attention_heads:
            a += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    if m.mlp == "swiglu":
        a.append("--swiglu")
    elif m.mlp == "quick-geglu":
        # arguments.py:2452 @d98e8a64 -> argument_utils.py:323-326 (gated quick_gelu); GPT-OSS's
        # clamp (7.0) and linear offset (1.0) are TransformerConfig fields with no flag
        # (transformer_config.py:231-235): Megatron-LM's command line builds the unclamped unit
        a.append("--quick-geglu")
    unfused = job.recipe.behaviour.unfused_ops
    if any(op.startswith("rope") for op in unfused) and m.position_embedding == "rope":
        a.append("--no-rope-fusion")  # arguments.py:2902 @d98e8a64 (store_false rope_fusion)
    if "swiglu" in unfused and m.mlp == "swiglu":
        a.append("--no-bias-swiglu-fusion")  # arguments.py:2895 @d98e8a64
    a += ["--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"]
    if m.qk_norm or m.mla is not None:
        # with MLA this flag builds the q/kv low-rank norms (q_a/kv_a_layernorm) as
        # layer-norm linears (megatron/core/models/gpt/gpt_layer_specs.py:104-114)
        a.append("--qk-layernorm")
    if not (m.mlp_bias or m.attn_out_bias):
        a.append("--disable-bias-linear")  # Megatron's default adds biases to every linear
    if m.qkv_bias and not (m.mlp_bias or m.attn_out_bias):
        a.append("--add-qkv-bias")
    a += ["--position-embedding-type",
          "rope" if m.position_embedding == "rope" else "learned_absolute"]
    if not m.tie_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if m.moe is not None:
        a += ["--num-experts", str(m.moe.num_experts), "--moe-router-topk", str(m.moe.top_k),
              "--moe-ffn-hidden-size", str(m.moe.expert_ffn_hidden_size)]
        if m.moe.num_shared_experts:
            width = m.moe.shared_expert_ffn_hidden_size or m.moe.expert_ffn_hidden_size
            a += ["--moe-shared-expert-intermediate-size",
                  str(m.moe.num_shared_experts * width)]
        if m.moe.first_k_dense_layers or m.moe.moe_layer_freq > 1:
            a += ["--moe-layer-freq", moe_layer_pattern(job)]
        if m.moe.shared_expert_gate:
            # TransformerConfig.moe_shared_expert_gate (transformer_config.py:713 @d98e8a64),
            # an argument by arguments.py:2373's ArgumentGroupFactory
            a.append("--moe-shared-expert-gate")
        if m.moe.router_groups > 1 and m.moe.groups_picked < m.moe.router_groups:
            # group-limited routing, as costed (cost/comm.py `remote_nodes_per_token`):
            # Megatron-LM's --moe-router-num-groups / --moe-router-group-topk (arguments.py,
            # the MoE group; TransformerConfig.moe_router_num_groups / moe_router_group_topk)
            a += ["--moe-router-num-groups", str(m.moe.router_groups),
                  "--moe-router-group-topk", str(m.moe.groups_picked)]
        if m.moe.router_bias:
            # expert bias needs a sigmoid-type score (transformer_config.py:2621; DeepSeek-V3
            # scores with a sigmoid, arXiv 2412.19437 eq. 15)
            a += ["--moe-router-enable-expert-bias", "--moe-router-score-function", "sigmoid"]
    if m.attention_sinks:
        # TransformerConfig.softmax_type "learnable": one learnable offset per head
        # (transformer_config.py:170 @d98e8a64)
        a += ["--softmax-type", "learnable"]
    if m.mtp_layers:
        a += ["--mtp-num-layers", str(m.mtp_layers)]
    if m.sliding_window_left is not None:
        # arguments.py:2384-2393 @d98e8a64: --window-size "w,0" (tuple_type),
        # --window-attn-skip-freq N or a list expression (1 = windowed layer)
        a += ["--window-size", f"{m.sliding_window_left},0"]
        if m.sliding_window_layers is not None:
            a += ["--window-attn-skip-freq", window_layer_pattern(job)]
    return a


def window_layer_pattern(job: Job) -> str:
    """--window-attn-skip-freq: N where the pattern is N-1 windowed layers and a full one
    (transformer/utils.py `is_layer_window_attention`: layer_number % N != 0), else the
    pattern as Megatron's list expression, e.g. ([1,0]*18)."""
    m = job.model
    pat = m.sliding_window_layers
    assert pat is not None
    n = len(pat)
    if n > 1 and all(pat[:-1]) and not pat[-1]:
        return str(n)
    flags = ",".join(str(int(m.is_window_layer(i))) for i in range(n))
    reps, rest = divmod(m.num_layers, n)
    if rest == 0:
        return f"([{flags}]*{reps})"
    tail = ",".join(str(int(m.is_window_layer(i))) for i in range(reps * n, m.num_layers))
    return f"([{flags}]*{reps}+[{tail}])"


def vocab_divisor(vocab: int, tp: int) -> int:
    """Largest power of two <= 128 (Megatron's default) whose multiple with tp divides vocab."""
    d = 128
    while d > 1 and vocab % (d * tp):
        d //= 2
    return d


def moe_layer_pattern(job: Job) -> str:
    """--moe-layer-freq as Megatron's list expression, e.g. ([0]*3+[1]*58) for DeepSeek-V3."""
    flags = [int(job.model.is_moe_layer(i)) for i in range(job.model.num_layers)]
    runs: list[tuple[int, int]] = []
    for f in flags:
        if runs and runs[-1][0] == f:
            runs[-1] = (f, runs[-1][1] + 1)
        else:
            runs.append((f, 1))
    return "(" + "+".join(f"[{f}]*{n}" for f, n in runs) + ")"


def megatron_text(job: Job, plan: Plan, args: list[str], notes: list[str]) -> str:
    g0 = job.cluster.node_groups[0]
    nodes = sum(g.num_nodes for g in job.cluster.node_groups)
    lines = [
        f"# Megatron-LM arguments for {VERSIONS['megatron']}: {job.model.name} on "
        f"{job.num_gpus} GPUs, recipe {job.recipe.name}",
        f"# plan: {plan_comment(plan)}  (data-parallel size dp={plan.dp} is implied)",
    ]
    lines += [f"# note: {n}" for n in notes]
    lines += [f"export {k}={v}" for k, v in megatron_env(plan).items()]
    lines.append("MEGATRON_ARGS=(")
    i = 0
    while i < len(args):
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1  # a flag with its values (several for list flags like --recompute-modules)
        lines.append("    " + " ".join([args[i], *map(shlex.quote, args[i + 1:j])]))
        i = j
    lines.append(")")
    lines.append(
        f"# torchrun --nnodes {nodes} --nproc-per-node {g0.gpus_per_node} "
        'pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...'
    )
    return "\n".join(lines) + "\n"
