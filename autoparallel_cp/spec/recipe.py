"""Training recipe spec: precision, optimizer state, framework behaviour, and the presets.

Kept whole (about 560 lines): `FrameworkBehaviour`'s docstring is the sourced account of what
each field means in the frameworks, beside the field; the presets are those fields' values, so
the three read together.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import MAX_BYTES, Bounded, Strict

Bytes = Annotated[int, Bounded(1, MAX_BYTES, "4x Adam's m and v in fp64")]
Bytes0 = Annotated[int, Bounded(0, MAX_BYTES, "4x Adam's m and v in fp64")]
Fraction = Annotated[float, Bounded(0.0, 1.0, "a fraction", low_open=False)]
SmMargin = Annotated[int, Bounded(0, 1024, "~8x an H100's 132 SMs")]
CpuThreads = Annotated[int, Bounded(1, 4096, "~10x a dual-socket 192-core host's threads")]
#: bytes per element of a cached activation format (fp8 1, E5M6 1.5, bf16 2, fp32 4)
ElemBytes = Annotated[float, Bounded(0.0, 8.0, "fp64", low_open=True)]


#: Megatron-Core `--recompute-modules` choices the cost model prices (transformer_config.py).
RecomputeModule = Literal["core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe",
                          "shared_experts"]
#: Elementwise ops a Megatron layer can run as its PyTorch ops (cost/unfused_ops.py).
UnfusedOp = Literal["rope", "rope-legacy", "swiglu", "qkv-slice"]
#: Megatron-Core `--cuda-graph-scope` parts of a layer the host does not issue op by op
#: (cost/moe_host.py).
CudaGraphScope = Literal["attn", "moe_router", "moe_preprocess"]


class FrameworkBehaviour(Strict):
    """How the training framework runs a layer, where frameworks differ (not a plan axis).

    The cost model reads it as `factors.CostOptions` through `factors.options_for`; the
    defaults describe Megatron-LM with Transformer Engine.

    - ``dropout``: GPT-style dropout after attention, MLP and embedding (1-byte masks,
      Korthikanti §4.1); modern decoders train without it.
    - ``tp_comm_overlap``: fraction of TP collectives hidden behind GEMMs (Megatron
      ``--tp-comm-overlap``); 0 = exposed (Megatron default). In a PyTorch recipe any value
      > 0 turns on torch async TP (Inductor's micro-pipeline TP, torchtitan
      ``enable_async_tensor_parallel``), which is costed by what that pass fuses and how much
      each fused matmul hides (cost/async_tp.py), not as a fraction.
    - ``tp_comm_overlap_bwd``: the same for the backward pass; None = as forward (Megatron's
      userbuffer overlap covers dgrad/wgrad). Ignored by PyTorch async TP (cost/async_tp.py
      says which backward collectives it fuses).
    - ``dp_overlap``: DP gradient reduction overlapped with backward (Megatron
      ``--overlap-grad-reduce``, FSDP/DDP default).
    - ``fused``: fused elementwise kernels (Megatron / torch.compile); None = framework default.
    - ``selective_policy``: what `recompute=selective` means: "attention" (Megatron: recompute
      the attention core, Korthikanti §5) or "op" (torchtitan op-level SAC: keep the layer
      input, the attention output and every other matmul output; recompute the rest).
    - ``attention_kernel``: flash-attention kernel generation, "cudnn" (default: cuDNN /
      FlashAttention-3 class, what the H200 curves measured), "fa2" (FlashAttention-2, e.g.
      PyTorch SDPA 2.5-2.10 on H100) or "triton" (FlashAttention in Triton on the pre-MLIR
      compiler, llm-foundry's `attn_impl: triton` for ALiBi in 2023); efficiency.ATTN_KERNELS,
      with Ampere fractions in efficiency.ATTN_KERNELS_SM80.
    - ``gqa_repeat_kv``: grouped-query K, V are expanded to all query heads with a copy before
      the attention kernel (torchtitan 2024 Llama `repeat_kv`; SDPA then saves the expanded
      K, V), instead of a kernel that reads the shared heads (TE, SDPA `enable_gqa`).
    - ``eager_ops``: how unfused (eager) elementwise code is costed: "generic" (the fused
      traffic times EAGER_ELEMENTWISE_FACTOR, calibrated on the H200 script) or
      "llama-upcast" (op by op for Llama modules written with an fp32-upcast RMSNorm and fp32
      RoPE, as torchtitan and HF transformers do: EAGER_LLAMA_*).
    - ``cp_ring``: how context parallelism exchanges K, V: "p2p" (Megatron / Transformer
      Engine: one send/recv per ring step, each hidden behind that step's attention; dK, dV
      in bf16) or "torch-allgather" (PyTorch ring attention with torchtitan's default
      `context_parallel_rotate_method="allgather"`: all K, V gathered behind the first step
      only, fp32 dK, dV shifted every step, fp32 merge of every step's output and gradients;
      under torch.compile (`fused`) the traced collectives are waited on at once and hide
      behind nothing, `cost/cp_ring.py`).
    - ``fsdp_copy_out``: ZeRO-3 in PyTorch copies the all-gathered parameters out of the
      communication buffer in forward and again in backward (FSDP2 `split_with_sizes_copy`,
      torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py); FSDP1 gathers straight into
      its flat parameter and hands out views (torch/distributed/fsdp/_flat_param.py), so no
      copy: False. PyTorch recipes only (Megatron's buffers are views).
    - ``recompute_modules``: what `recompute=selective` replays under the "attention" policy:
      Megatron-Core's `--recompute-modules` (megatron/core/transformer/transformer_config.py
      `recompute_modules`, default ["core_attn"]): "core_attn" (the attention core),
      "layernorm" (both norms' outputs, output-discarding), "moe_act" (the routed experts'
      activation output, output-discarding), "mla_up_proj" (MLA up-projections and RoPE,
      output-discarding), "mlp" (the dense MLP), "moe" (the whole MoE block, dispatch and
      combine included), "shared_experts". Megatron-Bridge's performance recipes set it per
      model (e.g. GPT-OSS ["layernorm", "moe_act"], DeepSeek-V3 ["mla_up_proj", "mlp"]).
    - ``ep_dispatcher``: how MoE tokens reach their experts: "alltoall" (Megatron-Core's
      `--moe-token-dispatcher-type alltoall`: every routed copy crosses to its expert's rank,
      NCCL all-to-all) or "flex" (`--moe-token-dispatcher-type flex` with the DeepEP or
      HybridEP backend: a token crosses the network once per destination node and is fanned
      out over NVLink there, DeepSeek-V3 report §3.2.2; `comm.flex_dispatch`) or "allgather"
      (`--moe-token-dispatcher-type allgather`, Megatron-Core's default through core_v0.6.0,
      arguments.py l. 1592-1594: every token gathered over the tp x ep ranks and permuted
      locally with index gathers and scatters, `moe_comm.allgather_permute_bytes`; its
      gather over tp is the MLP's sequence-parallel all-gather; with ep > 1 the cost model
      still prices the exchange as the all-to-all's).
    - ``ep_overlap``: Megatron-Core `--overlap-moe-expert-parallel-comm` (with
      `--delay-wgrad-compute`): the forward of one micro-batch and the backward of another run
      as one schedule node, each one's dispatch and combine hidden behind the other's compute
      (megatron/core/pipeline_parallel/combined_1f1b.py). Megatron refuses it with full
      recompute, with "moe" among the recompute modules, and with pp > 1 without interleaving
      (transformer_config.py:3002-3037); the cost model leaves EP exposed in the first two and
      `--emit megatron` refuses the third.
    - ``moe_prob_scaling``: where Megatron-Core multiplies the routed tokens by their router
      probabilities, and so what the MoE block keeps for the probabilities' gradient:
      "activation" (Megatron-Core 0.13 and later, "Memory efficient token permutation",
      commit 2659630721, 2025-04-09, first tagged core_v0.13.0: the experts' weighted
      activation `weighted_bias_swiglu_impl` scales the activation output and keeps only the
      fp32 probabilities beside the fc1 output it saves anyway; the unpermute after the
      combine takes no probabilities and saves no tokens, experts.py / token_dispatcher.py
      @d98e8a64) or "combine" (earlier Megatron-Core: the unpermute multiplies the expert
      outputs by the probabilities and keeps those outputs, top_k x h per token, for the
      probabilities' gradient).
    - ``zero2_reduce``: when ZeRO-2 reduces the gradients. "unit" (the default: each FSDP
      unit's gradients are reduce-scattered in every micro-batch's backward, in
      `grad_reduce_bytes`: Megatron-FSDP's `optim_grads`, which is what zero=2 means for
      Megatron, megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py:760-774
      @d98e8a64 `grad_reduce_every_bprop`, and PyTorch FSDP's SHARD_GRAD_OP / FSDP2
      `reshard_after_forward=False`, which reduce unless `no_sync` /
      `set_requires_gradient_sync(False)` is entered, see ``zero3_reduce``);
      "microbatch" (DeepSpeed: stage_1_and_2.py @v0.11.1 l. 1327-1328
      `reduce_ready_partitions_and_remove_grads` reduces when `partition_gradients` (stage 2)
      or at the accumulation boundary, so stage 2 reduce-scatters every micro-batch's
      gradients in `communication_data_type`, the model dtype by default, engine.py
      @v0.11.1 l. 798-809; the updated weights are all-gathered once per step); or "step"
      (once, after the last micro-batch, as Megatron's distributed optimizer and FSDP's
      no_sync do: the gradients then stay whole until the step, so the memory model keeps
      them unsharded, cost/model_state.py). Megatron's DDP with `--use-distributed-optimizer`
      is zero=1 (it reduce-scatters once, at the last micro-batch, into full fp32 buffers).
    - ``zero3_reduce``: when ZeRO-3 (FSDP FULL_SHARD) reduce-scatters each unit's gradients:
      "microbatch" (the default: in every micro-batch's backward, overlapped like the unit's
      all-gathers; Megatron-FSDP's `optim_grads_params`, which is what zero=3 means for
      Megatron, "RS & AG communication groups on all microbatches",
      megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:167-169 and megatron_fsdp.py:760-774
      @d98e8a64) or "step" (once, after the last micro-batch, as FSDP's no_sync: the
      gradients then stay whole until the step, and the memory model keeps them
      unsharded). PyTorch FSDP skips the reduction only under `no_sync` /
      `set_requires_gradient_sync(False)`, and the trainers the PyTorch recipes stand for
      call neither for FSDP: Composer enters `no_sync` only for
      a DistributedDataParallel model (trainer.py / dist_strategy.py `ddp_sync_context`
      @640518880), OLMo-core only for DDP (train/trainer.py `_train_microbatch_context`
      @a7de3f651c), torchtitan only on the LM head of its chunked loss
      (components/loss.py @b5bcd76c6).
    - ``pp_defers_reduce``: with pp > 1, PyTorch's pipelining runs every micro-batch's backward
      of an FSDP2 stage with `set_requires_gradient_sync(False)` and
      `set_reshard_after_backward(False)` (torch v2.13.0 torch/distributed/pipelining/stage.py
      :843-848 `backward_maybe_with_nosync`) and reduce-scatters once, in the REDUCE_GRAD
      action after the step's last backward (`perform_reduce_grad`, stage.py:1164-1195, called
      at schedules.py:960, 1177 and 2605-2607): ZeRO-2 and ZeRO-3 then reduce the dense and
      expert gradients once per step, and the unsharded gradients stay whole until then
      (FSDP2 accumulates them unsharded between syncs), as ``zero2_reduce`` /
      ``zero3_reduce`` "step" do. On for torchtitan (its pipelined stages are FSDP2 modules);
      pp = 1 keeps ``zero2_reduce`` / ``zero3_reduce``.
    - ``fsdp_float8_all_gather``: with torchao float8 linears (`compute_dtype: fp8`), FSDP2
      all-gathers their weights cast to float8, 1 B per element instead of bf16's 2
      (torchao `Float8LinearConfig.enable_fsdp_float8_all_gather`: torchtitan's
      `enable_fsdp_float8_all_gather` option, OLMo-core's `Float8Config` default True,
      float8.py @a7de3f651c l. 134). Costed on the ZeRO-3 per-micro-batch gathers of the
      layers (cost/sync.py); the per-step scale precompute is one fused pass, not costed.
    - ``compiled_loss``: the cross entropy (with its fp32 upcast) runs under torch.compile
      (OLMo-core `compile_loss=True`, PR allenai/OLMo-core#77 "move logits FP32 casting into
      loss function"; torchtitan compiles the loss with the model since pytorch/torchtitan#1033,
      2025-04): Inductor fuses cast, log-softmax and its backward, so the loss holds its bf16
      input and the bf16 gradient it writes (PyTorch compiler maintainers: "~0 [extra memory]
      for just fwd and ~d_input for fw+bw", Dao-AILab/quack#48) and moves each logit a few
      times instead of the eager chain's eight passes (cost/constants.py
      COMPILED_LOGITS_BYTES, COMPILED_CE_BYTES_PER_LOGIT). PyTorch recipes at tp = 1 only:
      the vocab-parallel DTensor loss keeps its own figure.
    - ``bf16_accum_pass``: DeepSpeed's BF16_Optimizer (bf16 with ZeRO stage 0, or stage 1
      with fp32 `grad_accum_dtype`: engine.py @v0.11.1 `_do_optimizer_sanity_check` l.
      1135-1177, `get_data_types` l. 859-872) adds every micro-batch's bf16 gradients into
      fp32 ones, one unfused cast and add per parameter (`update_hp_grads`, bf16_optimizer.py;
      called after each backward, pipe/engine.py @v0.11.1 l. 762): applies at zero <= 1.
    - ``autograd_grad_accum``: gradients accumulate across micro-batches in each parameter's
      `.grad` through autograd, in the parameter dtype: PyTorch's AccumulateGrad adds every
      later micro-batch's gradient in place (`variable_grad += new_grad`,
      torch/csrc/autograd/functions/accumulate_grad.h), one unfused pass per parameter per
      micro-batch. DeepSpeed ZeRO-1 with `grad_accum_dtype` equal to the bf16 parameters
      keeps them there until the accumulation boundary (stage_1_and_2.py @v0.11.0 l. 284-291
      `use_grad_accum_attribute` False, l. 1327-1329 no reduction before the boundary at stage
      1); BF16_Optimizer (`bf16_accum_pass`) clears them after every micro-batch instead, and
      Megatron's fused `main_grad` accumulation has no such pass. Applies at zero <= 1.
    - ``moe_glu_clamp_bias``: the routed experts run Megatron-Core's `TEGroupedMLP` with a
      clamped GLU and expert biases (GPT-OSS: `activation_func_clamp_value`,
      `add_bias_linear`) without the TE op fuser: the clamp/cat chain before the fused
      activation and the fc2 bias added per expert in fp32 outside the GEMM are eager passes
      over the routed copies (experts.py / fusions/fused_bias_geglu.py, core_v0.15.0 to
      core_v0.18.0; cost/moe_glu_bias.py).
    - ``fp8_linear``: which library runs the fp8 linear layers of a `compute_dtype: fp8`
      recipe, and so what they save for backward: "te" (Transformer Engine: `te.Linear` /
      `LayerNormLinear` quantize their input and save that fp8 copy for the weight gradient,
      transformer_engine/pytorch/module/linear.py) or "torchao" (torchao float8 training
      saves the high-precision input and re-casts it in backward) or "xla" (MaxText: XLA
      fuses the casts into the producing ops; saves as torchao does). None = the framework's
      default: "te" for Megatron, "torchao" for PyTorch recipes (torchtitan's float8). The
      library also sets the quantization traffic each GEMM pays (cost/fp8_casts.py).
    - ``fp8_scaling``: Transformer Engine's fp8 recipe, which sets that traffic: "delayed"
      (`DelayedScaling`, TE's and NeMo's default: nemo/lightning/pytorch/plugins/
      mixed_precision.py @8cfedd7203 l. 71 `fp8_recipe="delayed"`), "current"
      (`Float8CurrentScaling`, Megatron-Bridge's `fp8_cs`) or "mxfp8" (`MXFP8BlockScaling`,
      Blackwell). Ignored by torchao (tensorwise dynamic) and XLA.
    - ``unfused_ops``: elementwise ops a fused (Megatron) layer runs as their plain PyTorch
      ops, costed op by op, forward and backward (cost/unfused_ops.py): "rope" (Megatron-Core's
      `apply_rotary_pos_emb` without `--apply-rope-fusion`, e.g. FlagScale's legacy layer),
      "rope-legacy" (Megatron-DeepSpeed's megatron/model/rotary_pos_embedding.py), "swiglu"
      (the legacy `ParallelMLP`'s `silu(x1) * x2`, its fc1 bias added before it), "qkv-slice"
      (Megatron-DeepSpeed's slice/select split of the fused QKV output and its FlashAttention
      path's `.contiguous()` copies). With `gqa_repeat_kv` an unfused RoPE runs on the
      expanded K (FlagScale's legacy layer repeats before its RoPE). Default empty: every op
      fused. Ignored when the whole layer is eager (`fused` False).
    - ``attention_unpad``: every attention call unpads q, k, v into packed tokens and pads the
      output back (flash-attn's `bert_padding.unpad_input` / `pad_input` around
      `flash_attn_varlen_func`), padding or not: llm-foundry's `attn_impl: flash`
      (llmfoundry/models/layers/attention.py `flash_attn_fn` @5e85bd62d). Gathers forward,
      zero-fill and scatter backward (cost/attention_padding.py). Default False.
    - ``eager_attention``: how a non-flash attention core (`flash_attention` False) runs
      between its two batched GEMMs: "fused" (Megatron's fused scale-mask-softmax kernel, one
      read and one write of the scores each way) or "scale-mask-clamp" (the Hugging Face eager
      chain of Baichuan2-13B's remote code, modeling_baichuan.py `BaichuanAttention.forward`,
      FlagPerf @b3382b9b training/benchmarks/baichuan2_13b/deepspeed/model/: divide by
      sqrt(head_dim), add the ALiBi mask, clamp with `torch.max` at the dtype's minimum,
      softmax, each its own kernel on the activation-dtype scores; costed per score element
      in cost/constants.py EAGER_ATTN_*). Default "fused".
    - ``zero3_predivide``: DeepSpeed's ZeRO-3 divides every reduce bucket by the data-parallel
      size in place before its reduce-scatter, in every micro-batch's backward (stage3.py
      @v0.11.1 l. 1159 / 1228 `__avg_scatter_grads` -> runtime/comm/coalesced_collectives.py
      l. 116 `tensor_partition_flat_buffer.div_(world_sz)`; the all-reduce path without
      `reduce_scatter` divides the same way): one read and one write of every gradient element
      in the communication dtype (cost/sync.py `zero3_copy_factor`). Default False (Megatron's
      and PyTorch FSDP's reductions scale inside or after the collective).
    - ``overlap_p2p_comm``: Megatron-Core's `overlap_p2p_comm` (with `batch_p2p_comm` off): the
      interleaved schedule posts each send and receive before the other direction's model chunk
      and waits for it after, so the steady state's transfers run beside compute; the warm-up
      and cool-down ones stay exposed (cost/sync.py `p2p_exposed_share`). No effect without
      interleaving (Megatron turns it off there). Field default off, every transfer exposed:
      Megatron-LM before 4eeff55d1f (2023-10-23, "Make overlap_p2p_comm the default"; the
      option itself came with f9283c5a8a, 2023-05-31, as store_true `--overlap-p2p-
      communication`), Megatron-DeepSpeed, NeMo 1.x without the YAML key. The Megatron-LM main
      recipes (`megatron-bf16`, `megatron-fp8`) turn it on, as Megatron-LM main does
      (MEGATRON_MAIN_P2P_OVERLAP); `--emit megatron` writes `--no-overlap-p2p-communication`
      for an interleaved plan of a recipe with it off.
    - ``pp_scatter_gather``: each tp rank sends 1/tp of a stage's output to the next stage even
      without sequence parallelism (Megatron-LM's `--scatter-gather-tensors-in-pipeline`
      before Megatron-Core, 2021-02 to 2023-03; DeepSpeed's PipelineEngine); off: Megatron-Core
      sends the whole [s/cp, b, h] from every tp rank unless sequence parallel (cost/sync.py
      `p2p_factor`).
    - ``cuda_graph_scopes``: the parts of each layer Megatron-Core replays as Transformer
      Engine CUDA graphs (`--cuda-graph-impl transformer_engine --cuda-graph-scope ...`,
      transformer_config.py `cuda_graph_scope`; Megatron-Bridge perf recipes set e.g.
      ["moe_router", "moe_preprocess"]): "attn" (the attention block), "moe_router" (the
      router and its aux loss), "moe_preprocess" (the dispatcher's metadata). A graphed part
      costs the host one replay instead of its ops (cost/moe_host.py). Default empty (Megatron's
      default `cuda_graph_impl` "none").
    - ``ub_rs_sm_margin``: SMs that Transformer Engine's userbuffers take from the attention
      output projection's and the MLP fc2's forward GEMMs (in that order) while they
      reduce-scatter its output in `pipeline` mode with `set_sm_margin`: the GEMM then runs on
      `GPUSpec.sm_count` minus `num_sm` SMs (cost/efficiency.py `sm_reserve_stretch`). Only
      with tp > 1 (TE disables userbuffers at one TP rank). Default (0, 0): TE's own
      defaults (`initialize_ub` `get_default_config`: `set_sm_margin` False) and every
      framework without userbuffers.
    - ``offload_copies_overlap``: whether optimizer offload pipelines the gradient D2H, the
      CPU step and the weight H2D over parameter groups (True), or runs them one after the
      other (False): Megatron-Core's HybridDeviceOptimizer without
      `overlap_cpu_optimizer_d2h_h2d` (optimizer_config.py:356, default False) copies on the
      current stream and steps one CPU optimizer over all offloaded parameters after the D2H
      event (hybrid_optimizer.py:173-174,203-221 @d98e8a64). None: the framework's default
      as `--emit` writes it (cost/offload.py `overlaps_optimizer_copies`).
    - ``offload_gpu_master``: with optimizer offload the GPU keeps the offloaded parameters'
      fp32 main copy and only their Adam moments live on the host; the CPU step's result is
      copied back into that copy (master_weight_bytes per parameter H2D). Megatron-Core
      without `--use-precision-aware-optimizer`: the distributed optimizer makes fp32 main
      shards on the GPU (distrib_optimizer.py:421-440 @d98e8a64) and HybridDeviceOptimizer
      clones the offloaded ones to pinned host memory and copies them back into the GPU ones
      (hybrid_optimizer.py `_get_sub_optimizer_param_groups`, `param_copy_back_gpu_hook`);
      Megatron-LM's arguments.py:1884-1888 requires the precision-aware optimizer (what
      `--emit megatron` writes), Megatron-Bridge does not. Default off: the host holds the only
      fp32 copy (cost/offload.py `gpu_kept_optimizer_share`).
    - ``cpu_optimizer_threads``: CPU threads the host-offloaded optimizer step runs on per GPU
      process (torch's intra-op pool, OMP_NUM_THREADS). None: the launcher's default. torchrun
      sets OMP_NUM_THREADS=1 for every worker when nproc_per_node > 1 and the variable is unset
      (torch/distributed/run.py `config_from_args` @010929fd), and Megatron-LM / Megatron-Bridge
      training code sets no thread count (no OMP_NUM_THREADS / set_num_threads outside examples
      and docs @d98e8a64, @067f987df0), so torch's fused CPU AdamW, which HybridDeviceOptimizer
      uses, runs on 1 thread. DeepSpeed's launcher sets OMP_NUM_THREADS only with
      `--bind_cores_to_rank`, to the cores bound per rank (launcher/launch.py:230-232
      @38327e07), and DeepSpeedCPUAdam steps in an OpenMP loop (csrc/adam/cpu_adam_impl.cpp:43)
      on those threads; without that flag the variable stays unset and OpenMP runs one thread
      per CPU (GCC libgomp manual, OMP_NUM_THREADS: "If undefined one thread per CPU is
      used"). "all" says so: the team spans the host's CPUs, so the step runs at the node's
      DRAM share (the `deepspeed` preset, launched by the `deepspeed` launcher as DeepSpeed's
      ZeRO-Offload tutorial does, docs/_tutorials/zero-offload.md:37 @38327e07). Read only
      where the host states `core_stream_gbps`.
    - ``moe_swiglu_fp8_input``: the MoE SwiGLU operators (routed and shared experts) cache
      their input, the fc1 output, in FP8 (1 B per element, fine-grained tiles) and, with
      "moe_act" among the recompute modules, recompute their output from it in backward for
      the shared expert as for the routed copies (DeepSeek-V3 report arXiv 2412.19437 §3.3.3
      "Low-Precision Activation" (2): "we cache the inputs of the SwiGLU operator and
      recompute its output in the backward pass. These activations are also stored in FP8").
      Default off: Megatron / TE keep the fc1 output in the activation dtype.
    - ``attn_out_cache_bytes``: one cached copy of the attention output, the input of the
      linear after attention, serves both the attention backward and that linear's weight
      gradient, at this many bytes per element; None: the framework's layout (the flash
      backward's bf16 output plus, with TE fp8 linears, the linear's own fp8 copy).
      DeepSeek-V3 1.5: "a customized E5M6 data format exclusively for these activations"
      (§3.3.3 (1)), 12 bits.
    - ``norm_recompute_drops_cache``: "layernorm" recompute drops the norms' outputs in the
      form the next linear caches them (its fp8 copy too, rebuilt from the recomputed norm
      output in backward) and covers every RMSNorm, MLA's latent norms included (their outputs
      are the up-projections' inputs): DeepSeek-V3 §3.2.3 "We recompute all RMSNorm operations
      and MLA up-projections during back-propagation, thereby eliminating the need to
      persistently store their output activations". Default off: Megatron's "layernorm"
      recompute covers the two block norms, and TE's fp8 linears keep their fp8 input copy.
    """

    selective_policy: Literal["attention", "op"] = "attention"
    dropout: bool = False
    tp_comm_overlap: Fraction = 0.0
    tp_comm_overlap_bwd: Fraction | None = None
    dp_overlap: bool = True
    fused: bool | None = None  # None: fused for megatron, eager for pytorch
    attention_kernel: Literal["cudnn", "fa3", "fa2", "triton"] = "cudnn"
    gqa_repeat_kv: bool = False
    eager_ops: Literal["generic", "llama-upcast"] = "generic"
    cp_ring: Literal["p2p", "torch-allgather"] = "p2p"
    fsdp_copy_out: bool = True
    recompute_modules: tuple[RecomputeModule, ...] = ("core_attn",)
    ep_dispatcher: Literal["alltoall", "flex", "allgather"] = "alltoall"
    ep_overlap: bool = False
    fp8_linear: Literal["te", "torchao", "xla"] | None = None
    fp8_scaling: Literal["delayed", "current", "mxfp8"] = "delayed"
    moe_prob_scaling: Literal["activation", "combine"] = "activation"
    zero2_reduce: Literal["step", "microbatch", "unit"] = "unit"
    zero3_reduce: Literal["step", "microbatch"] = "microbatch"
    pp_defers_reduce: bool = False
    compiled_loss: bool = False
    fsdp_float8_all_gather: bool = False
    bf16_accum_pass: bool = False
    autograd_grad_accum: bool = False
    moe_glu_clamp_bias: bool = False
    unfused_ops: tuple[UnfusedOp, ...] = ()
    attention_unpad: bool = False
    eager_attention: Literal["fused", "scale-mask-clamp"] = "fused"
    zero3_predivide: bool = False
    overlap_p2p_comm: bool = False
    pp_scatter_gather: bool = False
    cuda_graph_scopes: tuple[CudaGraphScope, ...] = ()
    ub_rs_sm_margin: tuple[SmMargin, SmMargin] = (0, 0)
    offload_copies_overlap: bool | None = None
    offload_gpu_master: bool = False
    cpu_optimizer_threads: CpuThreads | Literal["all"] | None = None
    moe_swiglu_fp8_input: bool = False
    attn_out_cache_bytes: ElemBytes | None = None
    norm_recompute_drops_cache: bool = False


class TrainingRecipe(Strict):
    """Precisions and optimizer: how many bytes each parameter costs, and the GEMM precision.

    Bytes per parameter follow Megatron's distributed-optimizer table
    (docs/user-guide/features/dist_optimizer.md): bf16 params + fp32 main grads = 6 + 12/d.
    """

    name: str
    framework: Literal["megatron", "pytorch"] = "megatron"
    weight_bytes: Bytes = 2  # the copy used in forward/backward (bf16=2, fp32=4)
    grad_bytes: Bytes = 4  # accumulated (main) gradient
    #: bytes per gradient element on the wire of the DP reduction. Megatron forces fp32
    #: accumulation *and* all-reduce for bf16 (`arguments.py`: "bfloat16 requires gradient
    #: accumulation and all-reduce to be done in fp32") unless --grad-reduce-in-bf16; FSDP2
    #: `reduce_dtype=float32` (torchtitan default). fp16 Megatron (2021) reduced in fp16 (2).
    grad_reduce_bytes: Bytes = 4
    master_weight_bytes: Bytes0 = 4  # fp32 master copy; 0 when weights are already fp32
    optimizer_state_bytes: Bytes0 = 8  # Adam m and v in fp32
    #: gradient and master-copy bytes of the routed experts' parameters where the framework
    #: keeps them outside the dense parameters' sharding (None: as the dense ones). NeMo
    #: AutoModel, for one: with one expert-data-parallel rank its experts are plain bf16
    #: parameters that FSDP does not manage, so they accumulate bf16 `.grad`s and have no
    #: second copy while the dense ones hold fp32 accumulated gradients (`for_experts`).
    expert_grad_bytes: Bytes | None = None
    expert_master_weight_bytes: Bytes0 | None = None
    activation_bytes: Bytes = 2  # bf16 activations
    compute_dtype: Literal["bf16", "fp8"] = "bf16"
    transient_weight_copy_bytes: Bytes0 = 0  # autocast bf16 weight copies (pytorch-amp)
    flash_attention: bool = True
    optimizer: Literal["adam"] = "adam"
    #: Adam implementation: "fused" (Megatron FusedAdam / torch `fused=True`: one pass over
    #: param, grad, m, v) or "foreach" (torch multi-tensor AdamW, torchtitan's 2024 default
    #: `fused=False`: one pass per arithmetic step, factors.ADAM_FOREACH_BYTES_PER_PARAM).
    optimizer_kernel: Literal["fused", "foreach"] = "fused"
    #: global gradient-norm clipping every step (Megatron --clip-grad 1.0, torchtitan
    #: max_norm 1.0 by default): one norm pass and one scaling pass over the local gradients.
    grad_clip: bool = True
    #: framework behaviour the cost model needs (recompute policy, fusion, attention kernel,
    #: TP overlap...); `evaluate(..., options=...)` overrides it for one call.
    behaviour: FrameworkBehaviour = Field(default_factory=FrameworkBehaviour)
    source: str = ""

    def for_experts(self) -> TrainingRecipe:
        """This recipe with the routed experts' gradient and master-copy bytes in place of the
        dense ones (itself when it states none)."""
        update: dict[str, object] = {}
        if self.expert_grad_bytes is not None:
            update["grad_bytes"] = self.expert_grad_bytes
        if self.expert_master_weight_bytes is not None:
            update["master_weight_bytes"] = self.expert_master_weight_bytes
        return self.model_copy(update=update) if update else self

    def with_behaviour(self, **update: object) -> TrainingRecipe:
        """This recipe with the named `behaviour` fields replaced (the rest kept)."""
        return self.model_copy(update={"behaviour": self.behaviour.model_copy(update=update)})

    @property
    def state_bytes_per_param(self) -> int:
        """Unsharded model-state bytes per parameter (18 for megatron-bf16, 16 for pytorch-amp)."""
        return (
            self.weight_bytes + self.grad_bytes + self.master_weight_bytes
            + self.optimizer_state_bytes
        )


#: Megatron-LM main @ d98e8a64 (the `megatron` emit target, frameworks.VERSIONS) overlaps the
#: interleaved schedule's pipeline sends by default: `--no-overlap-p2p-communication` is a
#: store_false flag for `overlap_p2p_comm` (megatron/training/arguments.py:3118-3120), forced
#: off only without interleaving (arguments.py:1010-1012), and `batch_p2p_comm = not
#: overlap_p2p_comm` (megatron/training/argument_utils.py:307). Megatron-Core's own dataclass
#: default stays False (model_parallel_config.py:385), which the training arguments override
#: (arguments.py:2361 lists it as an "incompatible default"). Megatron-Bridge / NeMo 2 set the
#: same at vpp > 1 (CommOverlapConfig, src/megatron/bridge/training/comm_overlap.py:453-457
#: @067f987). Without interleaving the field changes nothing (cost/sync.py).
MEGATRON_MAIN_P2P_OVERLAP = True

RECIPES: dict[str, TrainingRecipe] = {
    "megatron-bf16": TrainingRecipe(
        name="megatron-bf16",
        framework="megatron",
        weight_bytes=2,
        grad_bytes=4,
        master_weight_bytes=4,
        optimizer_state_bytes=8,
        compute_dtype="bf16",
        behaviour=FrameworkBehaviour(overlap_p2p_comm=MEGATRON_MAIN_P2P_OVERLAP),
        source=("Megatron-LM dist_optimizer.md: bf16 params, fp32 main grads, "
                "fp32 Adam (18 B/param); Megatron-LM main's defaults (interleaved pipeline "
                "sends overlapped)"),
    ),
    "pytorch-amp": TrainingRecipe(
        name="pytorch-amp",
        framework="pytorch",
        weight_bytes=4,
        grad_bytes=4,
        master_weight_bytes=0,
        optimizer_state_bytes=8,
        compute_dtype="bf16",
        transient_weight_copy_bytes=2,
        source="PyTorch autocast(bf16) with fp32 params/grads and fused AdamW (16 B/param)",
    ),
    "torchtitan-fsdp": TrainingRecipe(
        name="torchtitan-fsdp",
        framework="pytorch",
        weight_bytes=4,
        grad_bytes=4,
        master_weight_bytes=0,
        optimizer_state_bytes=8,
        compute_dtype="bf16",
        optimizer_kernel="foreach",
        behaviour=FrameworkBehaviour(selective_policy="op", fused=True, attention_kernel="fa2",
                                     gqa_repeat_kv=True, eager_ops="llama-upcast",
                                     cp_ring="torch-allgather", zero3_reduce="microbatch",
                                     pp_defers_reduce=True),
        source=("torchtitan 2024-12 Llama: FSDP2 with fp32 sharded params, bf16 compute, fp32 "
                "reduce, reduce-scattered every micro-batch (once per step with pp > 1: "
                "PyTorch pipelining defers it to the last backward); foreach AdamW; "
                "torch.compile per block; op-level SAC as `selective`; "
                "SDPA on FlashAttention-2; repeat_kv for GQA; all-gather ring attention "
                "(16 B/param)"),
    ),
    "pytorch-fsdp": TrainingRecipe(
        name="pytorch-fsdp",
        framework="pytorch",
        weight_bytes=4,
        grad_bytes=4,
        master_weight_bytes=0,
        optimizer_state_bytes=8,
        compute_dtype="bf16",
        optimizer_kernel="foreach",
        behaviour=FrameworkBehaviour(fused=False, attention_kernel="fa2", gqa_repeat_kv=True,
                                     fsdp_copy_out=False, fp8_linear="te",
                                     zero3_reduce="microbatch"),
        source=("PyTorch FSDP1 as llm-foundry / Composer and HF Accelerate run it: fp32 flat "
                "parameters sharded by FULL_SHARD (zero=3, gradients reduce-scattered every "
                "micro-batch) or SHARD_GRAD_OP (zero=2), "
                "MixedPrecision(param_dtype=bf16, reduce_dtype=fp32) (Composer 'DEFAULT'), "
                "eager modules (no torch.compile), FlashAttention-2, HF-style repeat_kv for "
                "GQA, foreach AdamW (torch's default when fused is not set), clipping; 16 "
                "B/param; fp8 through Transformer Engine linears (Composer `amp_fp8` is "
                "te.fp8_autocast, and llm-foundry's H100 fp8 benchmarks set model.fc_type "
                "'te': scripts/train/benchmarking/submit_benchmarks.py)"),
    ),
    "deepspeed": TrainingRecipe(
        name="deepspeed",
        framework="megatron",
        weight_bytes=2,
        grad_bytes=4,
        master_weight_bytes=4,
        optimizer_state_bytes=8,
        compute_dtype="bf16",
        # overlap_p2p_comm left off: DeepSpeed's PipelineEngine runs no interleaved schedule
        # (frameworks.py refuses vpp > 1 for it), so no plan DeepSpeed runs has the overlap
        behaviour=FrameworkBehaviour(dp_overlap=False, zero2_reduce="microbatch",
                                     bf16_accum_pass=True, pp_scatter_gather=True,
                                     zero3_predivide=True, cpu_optimizer_threads="all"),
        source=("DeepSpeed engine with Megatron-DeepSpeed's fused Megatron layers: bf16 "
                "weights, fp32 gradient accumulation and master weights (BF16_Optimizer / "
                "ZeRO bf16), fp32 Adam, ZeRO-1/2/3 as zero=1/2/3; gradient reduction not "
                "overlapped with backward (`zero_optimization.overlap_comm` defaults to "
                "false, DeepSpeed config docs); ZeRO-2 reduce-scatters every micro-batch "
                "(stage_1_and_2.py), BF16_Optimizer's fp32 accumulation pass every "
                "micro-batch at zero <= 1; the PipelineEngine sends 1/tp of each activation "
                "and gradient per rank (pipe/engine.py @v0.11.1 l. 132-133); ZeRO-3 "
                "divides each reduce bucket in place before reducing it (coalesced_collectives"
                ".py l. 116); 18 B/param; launched by the `deepspeed` launcher, which leaves "
                "OMP_NUM_THREADS unset (launcher/launch.py:230-232), so DeepSpeedCPUAdam's "
                "OpenMP team spans the host's CPUs"),
    ),
    "megatron-fp8": TrainingRecipe(
        name="megatron-fp8",
        framework="megatron",
        weight_bytes=2,
        grad_bytes=4,
        master_weight_bytes=4,
        optimizer_state_bytes=8,
        compute_dtype="fp8",
        behaviour=FrameworkBehaviour(overlap_p2p_comm=MEGATRON_MAIN_P2P_OVERLAP),
        source="megatron-bf16 with Transformer Engine fp8 GEMMs (delayed scaling)",
    ),
    "deepseek-v3-fp8": TrainingRecipe(
        name="deepseek-v3-fp8",
        framework="megatron",
        weight_bytes=2,
        grad_bytes=4,
        master_weight_bytes=4,
        optimizer_state_bytes=4,
        compute_dtype="fp8",
        behaviour=FrameworkBehaviour(
            overlap_p2p_comm=MEGATRON_MAIN_P2P_OVERLAP, ep_dispatcher="flex",
            recompute_modules=("layernorm", "mla_up_proj", "moe_act"),
            moe_swiglu_fp8_input=True, attn_out_cache_bytes=1.5,
            norm_recompute_drops_cache=True),
        source="DeepSeek-V3's training recipe (arXiv 2412.19437): FP8 GEMMs with the inputs "
               "of linear layers cached in FP8 (§3.3), fp32 master weights and gradients with "
               "AdamW moments in BF16 (§3.3.3: 2+2 B), node-limited dispatch forwarded over "
               "NVLink (§3.2.2: the flex dispatcher), every RMSNorm (their outputs, fp8 "
               "caches included) and the MLA up-projections recomputed in backward (§3.2.3), "
               "the MoE SwiGLU inputs cached in FP8 and their outputs recomputed (§3.3.3 (2)) "
               "under recompute=selective, and one E5M6 (12-bit) copy of the attention output "
               "for the attention backward and the output projection (§3.3.3 (1)). Its "
               "schedule is a plan field: schedule=dualpipe (§3.2.1)",
    ),
}
