"""Held-out rows to training recipes: per framework family (Megatron, NeMo, torchtitan,
llm-foundry, OLMo-core, DeepSpeed, AutoModel) the recipe a row's framework ran, with FP8
scaling and attention kernels as its source states or its framework's defaults set."""

from __future__ import annotations

from autoparallel_cp.spec import RECIPES, TrainingRecipe
from harness import heldout_automodel as automodel
from harness.heldout_common import _for_model, _int
from harness.heldout_megatron import _megatron_lm_defaults, _p2p_overlap
from harness.heldout_stated import UB_RS_SM_MARGIN, _stated_settings

#: MPT sizes the llm-foundry "Large Scale" H100 table ran with `--attn_impl flash`
#: (scripts/train/benchmarking/sweep.py @5e85bd62d, the commit that added the table: 1b, 3b,
#: 7b, 70b flash; 13b, 30b triton), on `.[gpu-flash2]` = flash-attn 2.4.2, the first release
#: with ALiBi (llm-foundry attention.py requires it for alibi_slopes).
LLMFOUNDRY_LARGE_SCALE_FLASH = ("MPT-1b", "MPT-3b", "MPT-7b", "MPT-70b")


def _llmfoundry_attention(r: dict[str, str]) -> str:
    """The attention kernel an llm-foundry benchmark row ran (efficiency.ATTN_KERNELS).

    Every other table was written by scripts/train/benchmarking/sweep.sh, which passes no
    `--attn_impl`, through submit_benchmarks.py, whose default `--attn_impl triton` overwrites
    the YAML's attn_config (llm-foundry a7d6a4475 .. 5e85bd62d): FlashAttention in Triton on
    the pre-MLIR compiler. submit_benchmarks.run_config installs llm-foundry v0.3.0 whatever
    `--git_commit` says (b2a43a147, the commit that added the H100 tables; sweep.sh image
    mosaicml/pytorch:2.1.0_cu121), and v0.3.0's setup.py install_requires (not the `gpu`
    extras) take `triton-pre-mlir` from vchiley/triton@triton_pre_mlir_sm90 (86c7fe23, pinned
    by llm-foundry 9c941b03d): against triton_pre_mlir (2dd3b957) that branch only adds the
    sm_90 JIT target and raises the NVVM compute-capability / PTX ceilings to 90 / 8.0, so on
    H100 the kernel keeps the Ampere mma.sync code generator (efficiency.ATTN_KERNELS)."""
    if "Large Scale" in r["source"] and r["model"] in LLMFOUNDRY_LARGE_SCALE_FLASH:
        return "fa2"
    return "triton"


def _with_unfused(recipe: TrainingRecipe, stated: object, assumed: list[str]
                  ) -> TrainingRecipe:
    """The recipe with the STATED_SETTINGS `unfused_ops` (ops, citation) set, noted in the
    row's `assumed` list."""
    assert isinstance(stated, tuple) and len(stated) == 2
    ops, cite = stated
    assumed.append(f"unfused {', '.join(ops)} ({cite})")
    return recipe.with_behaviour(unfused_ops=tuple(ops))


def _fp8_scaling(r: dict[str, str]) -> tuple[str, str] | None:
    """(Transformer Engine fp8 recipe, citation) of an fp8 Megatron row other than the default
    delayed scaling: what the row's source states, or Megatron-Bridge's performance default
    for the row's GPU where it states none (H100: `fp8_cs`, scripts/performance/
    dump_perf_configs.py @067f987df, every H100 fp8 config; Hopper has no MXFP8)."""
    extra = r["extra_config"].lower()
    if "mxfp8" in extra:
        return "mxfp8", "MXFP8 block scaling (the source's table)"
    if "current scaling" in extra:
        return "current", "fp8 current scaling (the source's table)"
    if r["source_id"] == "mbridge-perf" and "h100" in r["gpu"].lower():
        return "current", ("fp8 current scaling (Megatron-Bridge's H100 fp8 perf configs are "
                           "fp8_cs, dump_perf_configs.py @067f987df)")
    return None


def _recipe(family: str, precision: str, r: dict[str, str], tp: int,
            assumed: list[str], tp_overlap: bool | None = None
            ) -> tuple[TrainingRecipe, str, tuple[str, ...]] | None:
    """(recipe, plan sp default, tuned knobs used) of a framework family; `tp_overlap` is
    the row's recipe file's TP-overlap setting where one states it."""
    fp8 = precision == "fp8"
    extra = r["extra_config"].lower()
    if family == "megatron-core":
        recipe = RECIPES["megatron-fp8" if fp8 else "megatron-bf16"]
        knobs: tuple[str, ...] = ()
        nemo = r["framework"] == "nemo"
        if "flash attention 2" in extra and any(k in r["gpu"].lower() for k in ("h100", "h800")):
            # the source names FlashAttention-2 (`--use-flash-attn`), not cuDNN's fused
            # attention: on Hopper that is the FA2 curve (efficiency.ATTN_KERNELS); on Ampere
            # FA2 is what the default curve already describes
            recipe = recipe.with_behaviour(attention_kernel="fa2")
            assumed.append("FlashAttention-2 on Hopper (source's flag)")
        defaults = _megatron_lm_defaults(r)
        if defaults:
            # a plain Megatron-LM run at a stated commit, its flags not stated: the argument
            # defaults of that commit (megatron/arguments.py), see MEGATRON_LM_DEFAULTS
            recipe = recipe.model_copy(update={"flash_attention": False}).with_behaviour(
                dropout=True)
            assumed.append(f"Megatron-LM {defaults['commit']} defaults: no flash attention, "
                           "dropout 0.1, no distributed optimizer; " + str(defaults["memory"]))
        if not nemo and "overlap-grad-reduce" not in extra:
            # Megatron-LM runs gradient reduction after the backward unless
            # `--overlap-grad-reduce` is given (default False, megatron/training/arguments.py;
            # the flag arrived in 2d5220a, 2023-08-16, after MegaScale's 285068c8 baseline).
            # NeMo's recipes turn it on; a plain Megatron-LM row that does not state it runs
            # the framework default.
            recipe = recipe.with_behaviour(dp_overlap=False)
            assumed.append("DP reduction not overlapped (Megatron-LM default)")
        stated = _stated_settings(r)
        if stated.get("bf16_grads"):
            recipe = recipe.model_copy(update={"grad_bytes": 2, "grad_reduce_bytes": 2})
            assumed.append(f"bf16 grads ({stated['bf16_grads']})")
        if stated.get("dropout"):
            recipe = recipe.with_behaviour(dropout=True)
            assumed.append(f"dropout ({stated['dropout']})")
        if stated.get("unfused_ops"):
            recipe = _with_unfused(recipe, stated["unfused_ops"], assumed)
        if stated.get("repeat_kv"):
            recipe = recipe.with_behaviour(gqa_repeat_kv=True)
            assumed.append(f"K, V repeated to every query head ({stated['repeat_kv']})")
        if stated.get("optimizer"):
            dt = 2.0 if stated["optimizer"] == "bf16" else 4.0
            master = 0.0 if dt == 2.0 else (4.0 if stated.get("fp8_params") and fp8 else 2.0)
            recipe = recipe.model_copy(update={"master_weight_bytes": master,
                                               "optimizer_state_bytes": 2 * dt})
            assumed.append(f"Apex distributed Adam, {stated['optimizer']} state, "
                           f"{master:g} B master (the source's YAML)")
        if stated.get("fp8_params") and fp8:
            recipe = recipe.model_copy(update={"weight_bytes": 1})
            assumed.append("fp8 params (model.fp8_params in the source's YAML)")
        if fp8:
            scaling = _fp8_scaling(r)
            if scaling is not None:
                recipe = recipe.with_behaviour(fp8_scaling=scaling[0])
                assumed.append(scaling[1])
        if (_int(r["vpp"]) or 1) > 1:
            on, cite = _p2p_overlap(stated, defaults)
            recipe = recipe.with_behaviour(overlap_p2p_comm=on)
            assumed.append(f"pipeline p2p {'overlapped' if on else 'not overlapped'} ({cite})")
        if nemo and tp > 1 and tp_overlap is False:
            assumed.append("no TP overlap (the recipe's tp_comm_overlap=False)")
        elif nemo and tp > 1:
            # NeMo's performance recipes enable TP communication overlap (userbuffers) with
            # TP > 1 (nemo/collections/llm/recipes/tp_overlap_configs); not in each table.
            assumed.append("TP overlap on (NeMo perf recipes enable it with TP)")
            knobs = ("megatron_tp_overlap",)
            margin = _for_model(UB_RS_SM_MARGIN.get(r["source_id"], {}), r)
            if margin is not None:
                recipe = recipe.with_behaviour(ub_rs_sm_margin=margin[0])
                assumed.append(f"userbuffers reserve {margin[0][0]} / {margin[0][1]} SMs beside "
                               f"the proj / fc2 forward GEMMs ({margin[1]})")
        return recipe, "tp>1", knobs
    if family == "megatron-deepspeed":
        # the `deepspeed` preset; BLOOM (2022) ran Megatron's fused softmax without flash
        # attention, FlagPerf's run states FlashAttention-2
        recipe = RECIPES["deepspeed"]
        if "flash" not in extra:
            recipe = recipe.model_copy(update={"flash_attention": False})
        stated = _stated_settings(r)
        if stated.get("dropout"):
            recipe = recipe.with_behaviour(dropout=True)
            assumed.append(f"dropout ({stated['dropout']})")
        if stated.get("unfused_ops"):
            recipe = _with_unfused(recipe, stated["unfused_ops"], assumed)
        if stated.get("bf16_grad_accum"):
            # ZeRO-1 then leaves each micro-batch's gradient in `.grad`, where autograd adds
            # the next one in place (`autograd_grad_accum`; stage_1_and_2.py @v0.11.0
            # l. 284-291, 1327-1329; FlagPerf's image pins deepspeed==0.11.0)
            recipe = recipe.with_behaviour(bf16_accum_pass=False, autograd_grad_accum=True)
            assumed.append(f"bf16 gradient accumulation in .grad by autograd "
                           f"({stated['bf16_grad_accum']})")
        if stated.get("half_grad_accum"):
            # DeepSpeed's fp16 path: no fp32 accumulation pass, fp16 `.grad` and reduction
            recipe = recipe.model_copy(update={"grad_bytes": 2, "grad_reduce_bytes": 2})
            recipe = recipe.with_behaviour(bf16_accum_pass=False, autograd_grad_accum=True)
            assumed.append("fp16 gradients in .grad, reduced in fp16 "
                           f"({stated['half_grad_accum']})")
        if stated.get("no_sp"):
            assumed.append(f"no sequence parallelism ({stated['no_sp']})")
            return recipe, "0", ()
        return recipe, "tp>1", ()
    if family == "deepspeed-hf":
        return _deepspeed_hf(r, assumed), "0", ()
    if family == "pytorch-fsdp":
        # the `pytorch-fsdp` preset (FSDP1 as llm-foundry / Composer run it); MPT's modules
        # are not HF Llama code, so no repeat_kv (MHA anyway) and generic eager ops
        recipe = RECIPES["pytorch-fsdp"].model_copy(update={
            "compute_dtype": "fp8" if fp8 else "bf16"})
        if r["source_id"] == "llmfoundry-bench":
            kernel = _llmfoundry_attention(r)
            recipe = recipe.with_behaviour(attention_kernel=kernel,
                                           attention_unpad=kernel == "fa2")
            assumed.append(f"attention kernel {kernel} (the benchmark sweep's attn_impl)")
            if kernel == "fa2":
                # `attn_impl: flash` runs llm-foundry's flash_attn_fn (attention.py
                # @5e85bd62d): unpad_input on q, k, v and pad_input on the output every call
                assumed.append("flash_attn_fn unpads q, k, v and pads the output (llm-foundry)")
        if "mixed_precision pure" in extra:
            # the table's "MP Mode" PURE: Composer's get_mixed_precision (composer/trainer/
            # mosaic_fsdp_utils.py @v0.16.4 l. 68-100) sets param, reduce and buffer dtype to
            # the precision (bf16), so gradients reduce-scatter in bf16; DEFAULT reduces in fp32
            recipe = recipe.model_copy(update={"grad_reduce_bytes": 2})
            assumed.append("bf16 gradient reduction (FSDP mixed_precision PURE, Composer)")
        return recipe, "0", ()
    if family == "automodel":
        # NeMo AutoModel's FSDP2 + EP benchmark recipe, as its YAML sets it
        rec = automodel.recipe(automodel.settings(r), _int(r["pp"]) or 1, assumed)
        return rec, "0", ()
    if family == "torchtitan":
        base = RECIPES["torchtitan-fsdp"]
        async_tp = "async tp" in extra
        # the table's "async TP" column: Inductor micro-pipeline TP, costed by what it fuses
        # (cost/async_tp.py); any tp_comm_overlap > 0 turns it on in a PyTorch recipe
        # torchtitan compiles the loss with the model since pytorch/torchtitan#1033
        # (components/loss.py `build_cross_entropy_loss` @820504e and @e7c0cae, the 2025-06
        # rows' commits: torch.compile when training.compile; the fp32 upcast inside)
        compiled_loss = "compile" in extra and any(
            f"torchtitan {c}" in r["framework_version"] for c in TORCHTITAN_COMPILED_LOSS)
        # torchao's float8 weight all-gather where the row states it
        fp8_ag = fp8 and "enable_fsdp_float8_all_gather" in extra
        behaviour = base.behaviour.model_copy(update={
            "fused": "compile" in extra, "compiled_loss": compiled_loss,
            "fsdp_float8_all_gather": fp8_ag,
            "tp_comm_overlap": 1.0 if async_tp else 0.0, "tp_comm_overlap_bwd": None})
        if compiled_loss:
            assumed.append("compiled loss (torchtitan build_cross_entropy_loss under "
                           "training.compile, pytorch/torchtitan#1033)")
        if fp8_ag:
            assumed.append("float8 FSDP all-gather (enable_fsdp_float8_all_gather, stated)")
        if async_tp:
            assumed.append("async TP: Inductor micro-pipeline TP (cost/async_tp.py)")
        knobs = ()
        recipe = base.model_copy(update={"behaviour": behaviour,
                                         "compute_dtype": "fp8" if fp8 else "bf16"})
        if "96gb" in r["gpu"].lower():
            knobs = (*knobs, "h100_96_peak")
        return recipe, "tp>1", knobs
    if family == "olmo-core":
        return _olmo_core_recipe(precision == "fp8", assumed)
    if family == "maxtext":
        # MaxText (JAX/XLA): whole-graph fused, cuDNN flash attention on GPU, ZeRO-3-like FSDP
        # in bf16 with fp32 optimizer states (MaxText defaults; not stated per row).
        base = RECIPES["torchtitan-fsdp"]
        behaviour = base.behaviour.model_copy(update={
            "fused": True, "attention_kernel": "cudnn", "gqa_repeat_kv": False,
            "eager_ops": "generic", "selective_policy": "attention"})
        recipe = base.model_copy(update={"name": "maxtext", "behaviour": behaviour,
                                         "optimizer_kernel": "fused",
                                         "compute_dtype": "fp8" if fp8 else "bf16"})
        assumed.append("MaxText: fused XLA, cuDNN attention, fused Adam")
        if fp8:
            # MaxText's fp8 matmuls are XLA-rewritten fp8 dots (`quantization: fp8`), the
            # casts fused into the producing fusions (cost/fp8_casts.py)
            recipe = recipe.with_behaviour(fp8_linear="xla")
            assumed.append("fp8 through XLA's fused fp8 dots (MaxText quantization=fp8)")
        return recipe, "0", ()
    return None


#: torchtitan commits of held-out rows that compile the loss with the model (after
#: pytorch/torchtitan#1033, 2025-04-01; `build_cross_entropy_loss`, components/loss.py).
TORCHTITAN_COMPILED_LOSS = ("820504e", "e7c0cae")


#: OLMo-core's official training scripts at the README commit of the olmo-core rows
#: (allenai/OLMo-core @a7de3f651c, 2024-11-05): what each row's run sets, beyond the plan cells.
OLMO_CORE = "allenai/OLMo-core @a7de3f651c"


def _olmo_core_recipe(fp8: bool, assumed: list[str]
                      ) -> tuple[TrainingRecipe, str, tuple[str, ...]]:
    """(recipe, sp rule, knobs) of an OLMo-core script run: the `torchtitan-fsdp` preset (FSDP2
    with fp32 sharded parameters, bf16 compute, fp32 reduce; torch.compile per block; torchao
    float8) with what the scripts state instead of torchtitan's defaults, each noted in
    `assumed`:

    - `AdamWConfig(fused=True)` (src/scripts/train/*.py): fused AdamW, not torchtitan's foreach;
    - attention: `llama_like(compile=True)` sets `use_flash=False` (nn/transformer/config.py), so
      `Attention.forward` calls F.scaled_dot_product_attention (nn/attention.py). The launch
      image is the nightly one (internal/experiment.py `OLMoCoreBeakerImage.nightly`), torch
      2.6.0.dev20241009 (Makefile NIGHTLY_VERSION, installed by src/Dockerfile's `nightly`
      stage), before pytorch/pytorch#138522 (2024-10-22)
      made cuDNN attention opt-in: its description states that main until then ran cuDNN
      attention first on H100 (PyTorch 2.5's "cuDNN backend for SDPA" default), so "cudnn";
    - `compile_loss=True` (each script's TrainerConfig): train/trainer.py wraps
      `cross_entropy_loss` (the fp32 upcast and the z-loss inside) in torch.compile, the
      preset's behaviour `compiled_loss`; FSDP reduce-scatters in every micro-batch
      (`_train_microbatch_context` enters no_sync for DDP only), the preset's `zero3_reduce`;
    - grouped-query K, V repeated to every head before SDPA (nn/attention.py
      `repeat_interleave`), the preset's `gqa_repeat_kv`;
    - no TP: sequence parallelism never applies (rule "0").

    Gradient clipping (GradClipperCallback max_grad_norm 1.0, internal/experiment.py) and the
    fp32 reduce dtype are the preset's. With fp8, torchao's Float8Linear on every linear but
    the output layer (TransformerConfig.build `modules_to_ignore={"w_out"}`) with dynamic
    (tensorwise) scaling (float8.py Float8Config defaults): the preset's torchao fp8 linear,
    the LM head kept in bf16 as the cost model does.
    """
    base = RECIPES["torchtitan-fsdp"]
    recipe = base.model_copy(update={
        "compute_dtype": "fp8" if fp8 else "bf16", "optimizer_kernel": "fused"}
    ).with_behaviour(fused=True, attention_kernel="cudnn", gqa_repeat_kv=True,
                     tp_comm_overlap=0.0, tp_comm_overlap_bwd=None, compiled_loss=True,
                     fsdp_float8_all_gather=fp8)
    assumed.append(f"fused AdamW (AdamWConfig fused=True, src/scripts/train/*.py {OLMO_CORE})")
    assumed.append("torch.compile per block (compile=True; Transformer.apply_compile)")
    assumed.append("compiled loss (TrainerConfig compile_loss=True in each script; "
                   "train/trainer.py wraps cross_entropy_loss, fp32 upcast inside, in "
                   "torch.compile)")
    assumed.append("FSDP reduce-scatter every micro-batch (train/trainer.py "
                   "_train_microbatch_context: no_sync for DDP only)")
    assumed.append("SDPA on cuDNN attention (use_flash False under compile; torch "
                   "2.6.0.dev20241009 of the nightly image, before pytorch/pytorch#138522 made "
                   "cuDNN opt-in)")
    if fp8:
        assumed.append("torchao float8 dynamic (tensorwise) scaling, w_out in bf16, float8 "
                       "FSDP all-gather (float8.py Float8Config defaults, "
                       "enable_fsdp_float8_all_gather=True; TransformerConfig.build)")
    return recipe, "0", ()


def _deepspeed_hf(r: dict[str, str], assumed: list[str]) -> TrainingRecipe:
    """A Hugging Face transformers model under the DeepSpeed engine (FlagPerf's
    `training/benchmarks/*/deepspeed/run_pretraining.py` @1b5a030398: `deepspeed.initialize`
    on the HF module, its ds_config.json): the `deepspeed` preset's precisions (bf16 weights,
    fp32 master and Adam), HF eager modules (no fused Megatron kernels), the attention kernel
    the row states, and the ds_config's ZeRO behaviour (DeepSpeed v0.11.1, the version FlagPerf
    states):

    - bf16 with ZeRO enabled accumulates gradients in bf16 (engine.py l. 866-870: fp32 only
      without ZeRO), so ZeRO-1 runs DeepSpeedZeroOptimizer, not BF16_Optimizer (l. 1151-1154),
      autograd adds each micro-batch's gradient into the bf16 `.grad` (stage_1_and_2.py), and
      the reduction runs in bf16 (`communication_data_type`, l. 798-807);
    - ZeRO-1 reduces once per step, at the accumulation boundary (engine.py l. 1874-1882),
      after the backward: not overlapped whatever `overlap_comm` says;
    - ZeRO-3 reduce-scatters every micro-batch from backward hooks, overlapped with the
      backward when the ds_config sets `overlap_comm` (stage3.py), after dividing each bucket
      in place (the preset's `zero3_predivide`);
    - the HF modules upcast their RMSNorms to fp32 and run RoPE and SwiGLU op by op
      (`eager_ops: llama-upcast`), and Baichuan2-13B's attention without xformers runs its
      scale, ALiBi mask add, clamp and softmax as separate kernels (`eager_attention`).
    """
    extra = r["extra_config"].lower()
    flash = "flash attention 2" in extra
    # gradients held and reduced in bf16: the accumulation dtype is the model's under ZeRO
    # (engine.py l. 866-870) and so is the communication dtype (engine.py l. 798-807)
    recipe = RECIPES["deepspeed"].model_copy(update={"flash_attention": flash,
                                                     "grad_bytes": 2, "grad_reduce_bytes": 2})
    # HF modules (transformers LlamaRMSNorm, Baichuan's RMSNorm) upcast to fp32 in their
    # norms and run RoPE and SwiGLU op by op: the `llama-upcast` eager pricing
    recipe = recipe.with_behaviour(fused=False, pp_scatter_gather=False,
                                   bf16_accum_pass=False, autograd_grad_accum=True,
                                   eager_ops="llama-upcast")
    assumed.append("HF eager modules under the DeepSpeed engine (fp32-upcast RMSNorm), bf16 "
                   "gradient accumulation under ZeRO (DeepSpeed v0.11.1 engine.py l. 866-870, "
                   "1151-1154)")
    if flash:
        recipe = recipe.with_behaviour(attention_kernel="fa2")
    elif "baichuan" in r["model"].lower():
        # Baichuan2-13B's remote code without xformers (FlagPerf's requirements.txt installs
        # none): scale, ALiBi mask add, clamp and softmax as separate kernels
        recipe = recipe.with_behaviour(eager_attention="scale-mask-clamp")
        assumed.append("eager attention: scale, ALiBi mask add, torch.max clamp, softmax "
                       "kernel by kernel (modeling_baichuan.py BaichuanAttention, FlagPerf "
                       "@b3382b9b; no xformers in its requirements.txt)")
    zero = _int(r["zero_stage"])
    if zero == 3 and "overlap_comm" in extra:
        recipe = recipe.with_behaviour(dp_overlap=True)
        assumed.append("ZeRO-3 reduce-scatter overlapped with the backward (ds_config "
                       "overlap_comm)")
    return recipe
