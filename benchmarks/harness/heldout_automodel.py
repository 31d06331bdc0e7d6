"""NeMo AutoModel's pre-training rows (`automodel-perf`, data/heldout_sources.md): the settings
its benchmark configs state, written as a recipe and a plan.

The table (NVIDIA-NeMo/Automodel `docs/performance-summary.md`, "Pre-Training Performance",
DGX-H100 BF16) links one YAML per model (`examples/benchmark/configs/*.yaml`); each row's
`extra_config` records, as `key=value` items separated by ';', what that YAML sets at the commit
named in the row's `source` cell:

- `ac` (`parallelizer.activation_checkpointing`), `reshard_after_forward`
  (`parallelizer.reshard_after_forward`; `parallelize_model`'s default False where unset),
  `fsdp_opt` (`model.backend.enable_fsdp_optimizations`; BackendConfig default False),
  `attn` (`model.backend.attn`: te / flex), `deepep` (`model.backend.enable_deepep`),
  `lbs` (`step_scheduler.local_batch_size`), `ga` (the table's GA cell =
  global_batch_size / (local_batch_size x dp), benchmark.py `run_benchmark`),
  `layers_per_stage` (`autopipeline.layers_per_stage`).

What the framework does with them, read at 364f600be (2025-10-08, the last commit that changed
the table's numbers) unless noted:

- parameters in bf16: the custom models build their layers in `config.torch_dtype`
  (bfloat16 in every model's public config.json) and `initialize_weights(dtype=bfloat16)` casts
  the model (components/models/{deepseek_v3,qwen3_moe,gpt_oss}/model.py); FSDP2's
  `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` (moe/parallelizer.py
  `apply_fsdp`); the YAMLs' optimizer is `torch.optim.Adam` (states `zeros_like` the bf16
  parameters, foreach on CUDA when neither `fused` nor `foreach` is set) with no gradient
  clipping (recipes/llm/benchmark.py calls none; the table's notes say so);
- experts: `apply_fsdp` removes them from the block's FSDP unit (`ignored_params`) when ep
  holds them, and shards them again over the expert-data-parallel mesh only when that mesh
  has more than one rank; ep = dp in every row here, so each rank holds its experts whole and
  never reduces their gradients (the plan's ep carved out of dp, edp = 1);
- `ac`: `apply_ac` wraps every decoder block in `checkpoint_wrapper` with no context policy:
  the whole block is recomputed (`recompute=full`);
- FSDP across micro-batches: with pipeline parallelism, `patched_backward_maybe_with_nosync`
  (moe/fsdp_mixin.py) turns gradient sync and resharding off for every backward but the
  step's last; without it, `fsdp_opt` does the same through
  `prepare_for_grad_accumulation` / `prepare_for_final_backward`. With
  `reshard_after_forward` False the bf16 parameters are then gathered once and kept for the
  whole step, the gradients accumulate unsharded in the fp32 reduce dtype (torch
  `FSDPParam.to_accumulated_grad_if_needed`) and are reduce-scattered once: ZeRO-1 in the
  plan's terms, as train_rows.py writes torchtitan's FSDP under PP. Otherwise FSDP2's defaults
  hold: `reshard_after_forward` False = SHARD_GRAD_OP (zero=2), True = FULL_SHARD (zero=3);
- pipeline: `interleaved1f1b` over ceil(L / layers_per_stage) + 1 virtual stages (rounded
  down to a multiple of pp), stage s on rank s mod pp (`stage_ids_this_rank` "loop"), the
  first L mod S stages one layer more (`generate_hf_model_fqn_per_model_part`); the embedding
  on stage 0, the final norm and LM head on the last;
- kernels: TE linears, RMSNorm and DotProductAttention (`attn: te`, cuDNN-class fused
  attention on Hopper, grouped-query heads read in place) or FlexAttention (`attn: flex`,
  `enable_gqa=True`, a torch.compile'd Triton template: the FA2 class on H100,
  FlashAttention-3 paper arXiv 2407.08608 Fig. 5, Triton 389 vs FA2 368 vs cuDNN 609 TFLOP/s
  at head dim 128, seq 4k); DeepEP dispatch (`deepep`: one network crossing per destination
  node) through Megatron-Core's `MoEFlexTokenDispatcher` copied into components/moe/megatron/
  with `moe_permute_fusion=True`, the experts' activation Megatron-Core's torch.compile'd
  `weighted_bias_swiglu_impl` or the compiled `quick_geglu_deepep` (GPT-OSS), grouped GEMMs
  (components/moe/layers.py). The YAMLs have no `compile` section, so the rest of the block
  runs eagerly: the residual adds (the same traffic as a fused add) and the RoPE
  (`_apply_rotary_emb`: chunk, four products, a sum, a difference and a cat on q and k,
  components/models/gpt_oss/layers.py, which qwen3_moe/layers.py imports): the layer is a
  fused layer with the RoPE unfused (behaviour `unfused_ops` "rope", Megatron-Core's
  unfused RoPE of the same op class; cost/unfused_ops.py skips MLA, whose rope dims DeepSeek-V3
  runs through its own eager `apply_rotary_emb`). Not costed: GPT-OSS's eager per-expert bias
  adds (`GroupedExpertsDeepEP._apply_bias`: split, add, cat on the fc1 and fc2 outputs), its
  q/k/v/output transposes to contiguous copies and the sink correction after FlexAttention.
"""

from __future__ import annotations

from typing import Literal

from autoparallel_cp.spec import RECIPES, FrameworkBehaviour, TrainingRecipe

SOURCE = "automodel-perf"

#: The source's attention backends as the cost model's kernel curves (module docstring).
ATTENTION_KERNEL: dict[str, Literal["cudnn", "fa2"]] = {"te": "cudnn", "flex": "fa2"}


def settings(r: dict[str, str]) -> dict[str, str]:
    """The `key=value` settings of an automodel-perf row ({} for every other source)."""
    if r["source_id"] != SOURCE:
        return {}
    items = (part.partition("=") for part in r["extra_config"].split(";"))
    return {k.strip(): v.strip() for k, sep, v in items if sep}


def _on(s: dict[str, str], key: str) -> bool:
    return s.get(key, "0") == "1"


def deferred_fsdp(s: dict[str, str], pp: int) -> bool:
    """FSDP keeps the gathered parameters and skips gradient sync until the step's last
    backward (module docstring: pipeline parallelism, or `fsdp_opt`), with no reshard after
    forward."""
    return (pp > 1 or _on(s, "fsdp_opt")) and not _on(s, "reshard_after_forward")


def zero_stage(s: dict[str, str], pp: int, assumed: list[str]) -> int:
    """The plan's ZeRO stage for the row's FSDP2 settings (module docstring)."""
    if deferred_fsdp(s, pp):
        assumed.append("FSDP2 deferred to the step's last backward, no reshard after forward = "
                       "ZeRO-1 (params gathered once, fp32 grads unsharded during the step)")
        return 1
    if _on(s, "reshard_after_forward"):
        assumed.append("FSDP2 reshard_after_forward=True = FULL_SHARD (zero=3)")
        return 3
    assumed.append("FSDP2 reshard_after_forward=False = SHARD_GRAD_OP (zero=2)")
    return 2


def recipe(s: dict[str, str], pp: int, assumed: list[str]) -> TrainingRecipe:
    """The row's recipe: FSDP2 over bf16 parameters (module docstring)."""
    attn = s.get("attn", "te")
    behaviour = FrameworkBehaviour(
        fused=True, unfused_ops=("rope",), attention_kernel=ATTENTION_KERNEL[attn],
        gqa_repeat_kv=False, ep_dispatcher="flex" if _on(s, "deepep") else "alltoall",
        # without the deferral (the zero=1 rows) FSDP2 reduce-scatters each unit's gradients
        # in every micro-batch's backward (its default; spec/recipe.py `zero3_reduce`)
        zero3_reduce="microbatch")
    deferred = deferred_fsdp(s, pp)
    rec = RECIPES["torchtitan-fsdp"].model_copy(update={
        "name": "automodel-fsdp2", "weight_bytes": 2,
        # deferred FSDP: fp32 unsharded gradients, the sharded bf16 parameters as the
        # optimizer's copy; otherwise sharded bf16 gradients and no second copy
        "grad_bytes": 4 if deferred else 2, "master_weight_bytes": 2 if deferred else 0,
        "optimizer_state_bytes": 4, "grad_reduce_bytes": 4, "compute_dtype": "bf16",
        # the experts (edp = 1 in every row: FSDP leaves them unmanaged) are plain bf16
        # parameters: bf16 `.grad`s accumulated by autograd, no second copy
        "expert_grad_bytes": 2, "expert_master_weight_bytes": 0,
        "optimizer_kernel": "foreach", "grad_clip": False, "behaviour": behaviour,
        "source": "NeMo AutoModel FSDP2 + EP benchmark recipe (harness/heldout_automodel.py)"})
    assumed.append("AutoModel: bf16 params, fp32 reduce, bf16 Adam (foreach), no clipping, "
                   f"TE / Megatron-Core MoE kernels with an eager RoPE, {attn} attention"
                   + (", DeepEP dispatch" if _on(s, "deepep") else ""))
    return rec


def chunk_layers(s: dict[str, str], num_layers: int, pp: int, vpp: int
                 ) -> tuple[int, ...] | None:
    """Layers of each virtual stage in stage order (the plan's `chunk_layers`), or None
    without interleaving or when the YAML's split is not the table's pp x vpp."""
    per = _int(s.get("layers_per_stage"))
    if vpp == 1 or per is None:
        return None
    stages = -(-num_layers // per) + 1
    stages -= stages % pp
    if stages != pp * vpp:
        return None
    base, extra = divmod(num_layers, stages)
    return tuple(base + (1 if i < extra else 0) for i in range(stages))


def pipeline_ga_gap(s: dict[str, str], pp: int) -> str:
    """Why a row cannot be written as a plan ('' when it can): with pipeline parallelism each
    gradient-accumulation step runs a whole pipeline schedule of lbs / mbs micro-batches
    (benchmark.py `run_benchmark` calls `_forward_backward_step` once per GA step), so a step
    pays ga fills and drains; a plan has one schedule of all the step's micro-batches."""
    ga = _int(s.get("ga")) or 1
    if pp > 1 and ga > 1:
        return (f"{ga} pipeline schedules per step (one per GA step, benchmark.py): the plan "
                "has one schedule per step (no repeated fill/drain)")
    return ""


def _int(x: str | None) -> int | None:
    return int(x) if x and x.strip().isdigit() else None
