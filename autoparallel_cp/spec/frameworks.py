"""What each training framework can run: one sourced row per rule, and the check of a plan.

Every row names the plan field it restricts (or the job's: model, recipe, seq_len), the rule, and
the framework source that enforces it (file:line at the commit or release named in VERSIONS).
`refusals(job, plan, fw)` lists the rows a plan breaks, each with the closest plan the framework
can run; `--emit` refuses such a plan (exit 2) instead of printing settings that differ from it.
The search reads the same rows as a space (`framework_space.Restriction`): `solve --emit X` and
`--recipe deepspeed / torchtitan-fsdp / pytorch-fsdp` search only the plans the framework runs.

The row and verdict types are in `framework_rule.py`; the rows of the frameworks with no
emitter (Megatron-DeepSpeed, FSDP1) in `framework_rows_unemitted.py`. Kept whole (about 540
lines): one table of the emitted frameworks' sourced rows and the predicates they name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoparallel_cp.spec import Job
from autoparallel_cp.spec.framework_rows_unemitted import FSDP1_RULES, MDS_RULES
from autoparallel_cp.spec.framework_rule import JOB_FIELDS, Refusal, Rule
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.schedules import V_SHAPED
from autoparallel_cp.spec.splits import model_order

# The framework versions the emitters target and `benchmarks/frameworks_check.py` validates.
VERSIONS: dict[str, str] = {
    "megatron": "Megatron-LM main @ d98e8a64 (2026-08-22; megatron-core 0.16+)",
    "torchtitan": "torchtitan 0.3.0 (PyPI; Python Trainer.Config)",
    "torchtitan-toml": "torchtitan v0.2.2 (TOML job_config)",
    "deepspeed": "DeepSpeed 0.19 (checked against 0.19.8)",
}

# torchtitan 0.3.0 model registries with a flavor that builds our preset exactly:
# (torchtitan module, config_registry baseline, model_registry flavor).
TORCHTITAN_MODELS: dict[str, tuple[str, str, str]] = {
    "llama3-8b": ("llama3", "llama3_8b", "8B"),
    "llama3-70b": ("llama3", "llama3_70b", "70B"),
    "llama3-405b": ("llama3", "llama3_405b", "405B"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b", "671B"),
}



def _empty_middle_chunk(job: Job, plan: Plan) -> bool:
    """Some model chunk holds no module at all: no layer, and neither the embedding (first
    chunk) nor the final norm and output (last chunk), in model order (`model_order`: a V's
    rank 0 without layers holds the first and the last, so it runs)."""
    layout = model_order(plan.layout(job.model.num_layers), plan.pp,
                         plan.pipeline_schedule in V_SHAPED)
    return any(n == 0 for n in layout[1:-1])


def _tt_interleaved_m(job: Job, plan: Plan) -> dict[str, Any] | None:
    if plan.vpp > 1 and plan.num_microbatches % plan.pp:
        return {"vpp": 1}
    return None


def _partial(plan: Plan) -> bool:
    return plan.recompute == "full" and plan.recompute_layers is not None


def _mg_recompute(job: Job, plan: Plan) -> dict[str, Any] | None:
    if not (_partial(plan) and plan.vpp > 1):
        return None
    k = plan.recompute_layers or 0
    L = job.model.num_layers
    most = max(plan.layers_per_stage(L))
    if k >= most:
        return None
    if k % plan.vpp:
        return {"recompute_layers": min(most, -(-k // plan.vpp) * plan.vpp)}
    # per chunk Megatron recomputes min(k/vpp, chunk): the plan's min(k, stage) on every
    # stage only when the stage's chunks all hold >= k/vpp or all <= k/vpp layers
    per = k // plan.vpp
    for chunks in plan.chunks_per_stage(L):
        if min(chunks) < per < max(chunks):
            least = min(min(c) for c in plan.chunks_per_stage(L))
            return {"recompute_layers": least * plan.vpp if least else "all (omit the field)"}
    return None


def _mg_ep_overlap(job: Job, plan: Plan) -> dict[str, Any] | None:
    if job.recipe.behaviour.ep_overlap and plan.ep > 1 and plan.pp > 1 and plan.vpp == 1:
        return {"vpp": 2}
    return None


def _tt_selective(job: Job, plan: Plan) -> dict[str, Any] | None:
    if plan.recompute == "selective" and job.recipe.behaviour.selective_policy != "op":
        return {"recompute": "full"}
    return None


def _tt_ep(job: Job, plan: Plan) -> dict[str, Any] | None:
    shard = plan.dp if plan.zero else 1
    # the sparse mesh's efsdp = dp_shard*cp*tp / (etp*ep) must be whole (etp = 1 in 0.3.0,
    # which has no expert TP; v0.2.2 runs etp = tp or 1, `_tt_etp`)
    etp = plan.expert_tp if plan.ep > 1 and plan.expert_tp in (1, plan.tp) else 1
    if plan.ep > 1 and (shard * plan.cp * plan.tp) % (plan.ep * etp):
        return {"zero": 3}
    return None


def _tt_etp(job: Job, plan: Plan) -> dict[str, Any] | None:
    """torchtitan 0.3.0: routed experts are sharded over ep only when ep > 1 (etp = 1), and
    tensor-parallel like a dense MLP when ep = 1 (etp = tp)."""
    if job.model.moe is None:
        return None
    want = 1 if plan.ep > 1 else plan.tp
    if plan.expert_tp == want:
        return None
    out: dict[str, Any] = {"etp": want}
    if want != plan.tp and plan.tp > 1 and not plan.sp:
        out["sp"] = 1  # a folded plan with tp > 1 needs sp (spec/plan.py)
    return out


def _tt_toml_etp(job: Job, plan: Plan) -> dict[str, Any] | None:
    """torchtitan v0.2.2: with ep > 1, etp is tp or 1."""
    if plan.ep > 1 and plan.expert_tp not in (1, plan.tp):
        return {"etp": 1}
    return None


def _tt_model(job: Job, plan: Plan) -> dict[str, Any] | None:
    return None if job.model.name in TORCHTITAN_MODELS else {"model": "one of "
                                                              + "/".join(TORCHTITAN_MODELS)}


def _tt_window(job: Job, plan: Plan) -> dict[str, Any] | None:
    if job.model.sliding_window_left is None:
        return None
    return {"sliding_window_left": "a model without it (full causal attention on every layer)"}


def _mg_model(job: Job, plan: Plan) -> dict[str, Any] | None:
    m = job.model
    biases_ok = (m.attn_out_bias == m.mlp_bias) and (m.qkv_bias or not m.attn_out_bias)
    # Megatron-Core's router has a bias exactly when every linear has one (moe/router.py:67
    # @d98e8a64 `add_bias_linear`), as GPT-OSS's
    router_ok = m.moe is None or not m.moe.router_linear_bias or m.mlp_bias
    if m.position_embedding == "alibi" or m.embedding_norm or not biases_ok or not router_ok \
            or m.post_norms or m.mlp == "geglu":
        return {"model": "one with RoPE or learned positions, no embedding norm, no post-"
                         "sublayer norms (Gemma), a GELU, SwiGLU or quick-GEGLU MLP, and biases "
                         "on all linears or on qkv only"}
    return None


def _bf16_params(job: Job) -> bool:
    """Megatron's --bf16 layout: bf16 weights, fp32 main grads, fp32 master weights and Adam."""
    r = job.recipe
    return (r.weight_bytes, r.grad_bytes, r.master_weight_bytes) == (2, 4, 4)


def _fp32_params(job: Job) -> bool:
    """FSDP2 / autocast layout: fp32 weights and grads (no master copy), bf16 or fp8 compute."""
    r = job.recipe
    return (r.weight_bytes, r.grad_bytes, r.master_weight_bytes) == (4, 4, 0)


def _recipe_for(fmt: str) -> Callable[[Job, Plan], dict[str, Any] | None]:
    def broken(job: Job, plan: Plan) -> dict[str, Any] | None:
        fp8 = job.recipe.compute_dtype == "fp8"
        if fmt == "megatron" and not _bf16_params(job):
            return {"recipe": "megatron-fp8" if fp8 else "megatron-bf16"}
        if fmt == "torchtitan" and not _fp32_params(job):
            return {"recipe": "torchtitan-fsdp" + (" (with compute_dtype fp8)" if fp8 else "")}
        if fmt == "deepspeed" and not (_bf16_params(job) or _fp32_params(job)):
            return {"recipe": "megatron-bf16"}
        return None
    return broken


def _hai_llm_caches(job: Job, plan: Plan) -> dict[str, Any] | None:
    """The closest recipe without the DeepSeek-V3 report's activation caches (recipe
    `deepseek-v3-fp8`), which no emitted framework's layers keep."""
    b = job.recipe.behaviour
    if b.moe_swiglu_fp8_input or b.attn_out_cache_bytes is not None \
            or b.norm_recompute_drops_cache:
        return {"recipe": "megatron-fp8"}
    return None


def fp8_library(job: Job) -> str:
    """The library the recipe's fp8 linears were costed with (behaviour `fp8_linear`; None:
    Transformer Engine for Megatron recipes, torchao float8 for PyTorch ones), as
    cost/common.py `_fp8_lib` reads it (tests/emit/test_emit_costed.py keeps them equal)."""
    lib = job.recipe.behaviour.fp8_linear
    return lib if lib is not None else ("torchao" if job.recipe.framework == "pytorch" else "te")


def _tt_fp8(job: Job, plan: Plan) -> dict[str, Any] | None:
    if job.recipe.compute_dtype == "fp8" and fp8_library(job) != "torchao":
        return {"recipe": "one whose fp8_linear is torchao (torchtitan-fsdp with compute_dtype "
                          "fp8)"}
    return None


def _tt_async_tp(job: Job, plan: Plan) -> dict[str, Any] | None:
    b = job.recipe.behaviour
    if b.tp_comm_overlap > 0 and not (b.fused if b.fused is not None
                                      else job.recipe.framework == "megatron"):
        return {"recipe": "one with fused: true (torch.compile) when it costs async TP"}
    return None


#: the schedules each framework runs (spec/schedules.py names; torchtitan: every schedule of
#: torch.distributed.pipelining it names, TORCHTITAN_SCHEDULES)
RUNS_SCHEDULES: dict[str, tuple[str, ...]] = {
    "megatron": ("1f1b", "interleaved"),
    "torchtitan": ("1f1b", "interleaved", "gpipe", "zbv", "dualpipev"),
    "deepspeed": ("1f1b",),
}
#: torchtitan's `pipeline_parallel_schedule` names (torch.distributed.pipelining schedules.py
#: `get_schedule_class`: Schedule1F1B, ScheduleInterleaved1F1B, ScheduleGPipe,
#: ScheduleZBVZeroBubble, ScheduleDualPipeV)
TORCHTITAN_SCHEDULES: dict[str, str] = {
    "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe",
    "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV",
}


def _schedule(fw: str) -> Callable[[Job, Plan], dict[str, Any] | None]:
    """The closest schedule `fw` runs when the plan's is not one of them: its default."""
    def broken(job: Job, plan: Plan) -> dict[str, Any] | None:
        if plan.pipeline_schedule in RUNS_SCHEDULES[fw]:
            return None
        return {"schedule": "interleaved" if plan.vpp > 1 and fw != "deepspeed" else "1f1b"}
    return broken


def _ds_offload(job: Job, plan: Plan) -> dict[str, Any] | None:
    """DeepSpeed offloads the whole optimizer (ZeRO 1-2) or a `ratio` of it (ZeRO-3), with a
    ZeRO stage >= 1."""
    x = plan.optimizer_offload
    if x and plan.zero == 0:
        return {"zero": 1}
    if 0 < x < 1 and plan.zero < 3:
        return {"optimizer_offload": 1}
    return None


def _learned_positions(job: Job, plan: Plan) -> dict[str, Any] | None:
    m = job.model
    if m.position_embedding == "learned" and job.seq_len > m.max_position_embeddings:
        return {"seq_len": m.max_position_embeddings}
    return None


_MG = "Megatron-LM d98e8a64"
_TT = "torchtitan 0.3.0"
_DS = "DeepSpeed 0.19.8"

RULES: tuple[Rule, ...] = (
    Rule("megatron", "recipe",
         "--bf16 keeps bf16 weights with fp32 main grads and an fp32 master copy (18 B/param); "
         "Megatron has no fp32-weight autocast mode",
         f"{_MG} megatron/training/arguments.py:1207-1216 (bf16: fp32 grad accumulation) and "
         "docs/user-guide/features/dist_optimizer.md:14 (fp32 main params)",
         _recipe_for("megatron")),
    Rule("torchtitan", "recipe",
         "FSDP2 keeps fp32 sharded weights and grads and casts to bf16 for compute "
         "(mixed_precision_param), no bf16 weights with an fp32 master copy",
         f"{_TT} torchtitan/config/configs.py:78-97 (dtype float32, mixed_precision_param "
         "bfloat16)", _recipe_for("torchtitan")),
    Rule("deepspeed", "recipe",
         "bf16 mode (bf16 weights, fp32 master, fp32 grad accumulation) or torch_autocast "
         "(fp32 weights) only",
         f"{_DS} deepspeed/runtime/constants.py:177-186 (torch_autocast), 384 "
         "(grad_accum_dtype)", _recipe_for("deepspeed")),
    Rule("megatron", "recipe",
         "the recipe caches activations as DeepSeek's HAI-LLM does (FP8 MoE SwiGLU inputs, one "
         "E5M6 attention-output copy, norms recomputed without their caches: 2412.19437 "
         "§3.2.3, §3.3.3); Megatron-Core's moe_act recompute under fp8 keeps the original "
         "(bf16) inputs, so the emitted run would hold more than was costed",
         f"{_MG} megatron/core/transformer/moe/experts.py:269-276 (set_save_original_input)",
         _hai_llm_caches),
    Rule("deepspeed", "recipe",
         "the recipe caches activations as DeepSeek's HAI-LLM does (2412.19437 §3.2.3, "
         "§3.3.3); DeepSpeed runs the model's own modules, which keep their bf16 activations",
         f"{_DS} deepspeed/module_inject/auto_tp.py:210 (AutoTP replaces linears only)",
         _hai_llm_caches),
    Rule("megatron", "model",
         "Megatron builds no ALiBi, no embedding norm, no post-sublayer norms and no GELU-gated "
         "MLP (Gemma: its activations are --swiglu, --quick-geglu, --squared-relu or GELU), and "
         "adds biases to all linears, the MoE router's included (--add-bias-linear) or, with "
         "--disable-bias-linear, to qkv only (--add-qkv-bias)",
         f"{_MG} megatron/training/arguments.py:2397-2399 (--position-embedding-type choices, "
         "--disable-bias-linear, --add-qkv-bias), 2444-2453 (activations), "
         "megatron/core/transformer/moe/router.py:67", _mg_model),
    Rule("megatron", "seq_len",
         "learned positions: --max-position-embeddings sizes the position table, so a sequence "
         "longer than the model's table would build a bigger model than planned",
         f"{_MG} megatron/core/models/common/embeddings/language_model_embedding.py:71 "
         "(Embedding(max_sequence_length, hidden))",
         _learned_positions),
    Rule("megatron", "recompute_layers",
         "with interleaving, --recompute-num-layers (block) counts layers per model chunk, so a "
         "stage recomputes vpp * k layers: recompute_layers must be a multiple of vpp, and a "
         "stage's uneven chunks must all hold at least (or all at most) k layers",
         f"{_MG} megatron/core/transformer/transformer_config.py:551-555 (per TransformerBlock = "
         "per chunk) and transformer_block.py _checkpointed_forward 'block'",
         _mg_recompute, scope="split"),
    Rule("megatron", "cp",
         "attention sinks (--softmax-type learnable) run under context parallelism only with "
         "Transformer Engine's a2a exchange (an all-to-all over heads), not the p2p ring or the "
         "all-gather the cost model charges",
         f"{_MG} megatron/core/extensions/transformer_engine.py:2184-2189 (softmax_type handed "
         "to TE) and Transformer Engine v2.9 transformer_engine/pytorch/attention/"
         "dot_product_attention/context_parallel.py:3825-3827 (softmax_type other than vanilla "
         "only with cp_comm_type 'a2a')",
         lambda j, p: {"cp": 1} if j.model.attention_sinks and p.cp > 1 else None),
    Rule("megatron", "vpp",
         "the recipe's EP overlap (--overlap-moe-expert-parallel-comm) needs an interleaved "
         "schedule when pp > 1",
         f"{_MG} megatron/core/transformer/transformer_config.py:3007-3011",
         _mg_ep_overlap),
    Rule("torchtitan", "recipe",
         "fp8 linears are torchao's Float8Linear (Float8LinearConverter); a recipe costed with "
         "Transformer Engine's fp8 layers saves and casts differently",
         f"{_TT} torchtitan/components/quantization/float8.py:53,77-79 (Float8LinearConverter "
         "needs torchao.float8)", _tt_fp8),
    Rule("torchtitan", "recipe",
         "async tensor parallelism (the recipe's tp_comm_overlap > 0) runs only in a compiled "
         "model: CompileConfig raises 'Async TP requires ... --compile.enable'",
         f"{_TT} torchtitan/config/configs.py:303-310 (CompileConfig.__post_init__)",
         _tt_async_tp),
    Rule("torchtitan", "model",
         "torchtitan builds models from its own registries, with a flavor for "
         + ", ".join(TORCHTITAN_MODELS) + " only",
         f"{_TT} torchtitan/models/llama3/__init__.py:369, deepseek_v3/__init__.py:616 "
         "(model_registry)", _tt_model),
    Rule("torchtitan", "sliding_window_left",
         "the llama3 and deepseek_v3 flavors the settings name build full causal attention on "
         "every layer (no window field); torchtitan's sliding windows belong to its gpt_oss "
         "model (128 tokens on the even layers), which is not one of them",
         f"{_TT} torchtitan/models/llama3/__init__.py:82 and deepseek_v3/__init__.py:106 "
         "(inner_attention = get_attention_config(attn_backend)), "
         "models/common/config_utils.py:83-96 (FlexAttention / VarlenAttention with default "
         "configs), models/common/attention.py:112 (window_size (-1, 0), causal), "
         "gpt_oss/__init__.py:200-209 (the windows); v0.2.2 "
         "torchtitan/models/llama3/model/model.py:510-522 (causal or block-causal masks) and "
         "models/attention.py:98 (varlen window_size (-1, 0))",
         _tt_window),
    Rule("torchtitan", "zero",
         "no optimizer-only sharding: FSDP (zero=2 reshard never, zero=3 reshard always) or "
         "replication (zero=0)",
         f"{_TT} torchtitan/config/configs.py:124-150 (data_parallel_shard_degree, "
         "fsdp_reshard_after_forward)",
         lambda j, p: {"zero": 2} if p.zero == 1 else None,
         domain=lambda j: {"zero": (0, 2, 3)}),
    Rule("torchtitan", "recompute_layers",
         "FullAC wraps every transformer block; no per-stage layer count",
         f"{_TT} torchtitan/distributed/activation_checkpoint.py:152-166 (apply to all layers)",
         lambda j, p: {"recompute_layers": "all (omit the field)"} if (
             _partial(p) and (p.recompute_layers or 0)
             < max(p.layers_per_stage(j.model.num_layers))) else None, scope="split"),
    Rule("torchtitan", "recompute",
         "SelectiveAC is op-level SAC (every 2nd matmul replayed), not attention-core recompute: "
         "only a recipe whose selective_policy is 'op' (torchtitan-fsdp) costs it",
         f"{_TT} torchtitan/distributed/activation_checkpoint.py:185-195", _tt_selective,
         domain=lambda j: {} if j.recipe.behaviour.selective_policy == "op"
         else {"recompute": ("none", "full")}),
    Rule("torchtitan", "ep",
         "expert_parallel_degree must divide dp_shard * cp * tp (dp_shard = 1 when replicating)",
         f"{_TT} torchtitan/distributed/parallel_dims.py:277-279,338-339 (efsdp = dp_shard * cp "
         "* tp // ep in the sparse mesh)", _tt_ep),
    Rule("torchtitan", "etp",
         "no expert tensor parallelism: with ep > 1 routed experts are sharded over ep only "
         "(sparse mesh pp, dp_replicate, efsdp, ep: ep laid over dp_shard*cp*tp, etp = 1); "
         "with ep = 1 they are tensor-parallel like the dense MLP (etp = tp)",
         f"{_TT} torchtitan/distributed/parallel_dims.py:282,326-330 (sparse mesh, efsdp = "
         "dp_shard*cp*tp // ep; line numbers of torchtitan main b5bcd76c) and "
         "torchtitan/models/common/MOE_SHARDING.md (routed experts Shard(0) on EP, TP-sharded "
         "without EP)",
         _tt_etp, formats=("torchtitan",)),
    Rule("torchtitan-toml", "etp",
         "expert_tensor_parallel_degree must be tp or 1 when ep > 1",
         "torchtitan v0.2.2 torchtitan/distributed/parallel_dims.py:58-59, "
         "torchtitan/config/job_config.py:464-472",
         _tt_toml_etp),
    Rule("torchtitan", "stage_layers",
         "every model chunk is a module list (module_fqns_per_model_part); a middle chunk "
         "with no layer would be a pipeline stage with no module",
         f"{_TT} torchtitan/config/configs.py:181-189 (module_fqns_per_model_part)",
         lambda j, p: {"stage_layers": "uniform"} if _empty_middle_chunk(j, p) else None,
         scope="split"),
    Rule("torchtitan", "num_microbatches",
         "interleaving with pp not dividing the micro-batches: PyTorch's Interleaved1F1B "
         "groups micro-batches in rounds of m // pp (and refuses m % rounds != 0), not "
         "Megatron's micro-batch groups the plan's in-flight memory is costed with",
         "torchtitan b5bcd76c (main) torchtitan/distributed/pipeline_parallel.py:267-334 "
         "(_build_pipeline_schedule hands n_microbatches to PyTorch's ScheduleInterleaved1F1B: "
         "number_of_rounds = max(1, n_microbatches // pp_group_size))",
         _tt_interleaved_m),
    Rule("torchtitan", "pp",
         "DeepSeek-V3's multi-token prediction (num_mtp_layers > 0) raises 'MTP does not "
         "support pipeline parallelism yet'",
         f"{_TT} torchtitan/models/deepseek_v3/mtp.py:202",
         lambda j, p: {"pp": 1} if j.model.mtp_layers and p.pp > 1 else None,
         domain=lambda j: {"pp": (1,)} if j.model.mtp_layers else {}),
    Rule("torchtitan", "cp",
         "DeepSeek-V3's multi-token prediction (num_mtp_layers > 0) raises the same with "
         "context parallelism",
         f"{_TT} torchtitan/models/deepseek_v3/mtp.py:202",
         lambda j, p: {"cp": 1} if j.model.mtp_layers and p.cp > 1 else None,
         domain=lambda j: {"cp": (1,)} if j.model.mtp_layers else {}),
    Rule("torchtitan-toml", "zero",
         "zero=0 is DDP, which raises 'DDP has not supported > 1D parallelism' with tp, pp or cp",
         "torchtitan v0.2.2 torchtitan/models/llama3/infra/parallelize.py:148-151",
         lambda j, p: {"zero": 3} if p.zero == 0 and p.dp > 1 and max(p.tp, p.pp, p.cp) > 1
         else None),
    Rule("torchtitan-toml", "sp",
         "v0.2.2 has no enable_sequence_parallel: its tensor parallelism always shards norms "
         "along the sequence (SequenceParallel)",
         "torchtitan v0.2.2 torchtitan/models/llama3/infra/parallelize.py:181-233",
         lambda j, p: {"sp": 1} if p.tp > 1 and not p.sp else None),
    Rule("deepspeed", "zero",
         "the pipeline engine asserts ZeRO stage < 2: 'ZeRO-2 and ZeRO-3 are incompatible "
         "with pipeline parallelism'",
         f"{_DS} deepspeed/runtime/pipe/engine.py:76-77",
         lambda j, p: {"zero": 1} if p.pp > 1 and p.zero >= 2 else None),
    Rule("deepspeed", "dp_replicate",
         "no hybrid sharding: MiCS is removed and its mics_shard_size key rejected ('MiCS "
         "ZeRO-3 sharding has been removed'); hpZ (zero_hpz_partition_size) keeps the states "
         "sharded over all of dp, a different cost",
         f"{_DS} deepspeed/runtime/config.py:119-125,133-141 (_reject_removed_config_keys), "
         "runtime/zero/config.py:324 (hpZ)",
         lambda j, p: {"dp_replicate": 1} if p.dp_replicate > 1 else None),
    Rule("deepspeed", "vpp",
         "the pipeline engine runs one stage per rank (TrainSchedule); no interleaved schedule",
         f"{_DS} deepspeed/runtime/pipe/schedule.py:189 (TrainSchedule)",
         lambda j, p: {"vpp": 1} if p.vpp > 1 else None, domain=lambda j: {"vpp": (1,)}),
    Rule("megatron", "schedule",
         "Megatron-Core runs 1F1B, or interleaved 1F1B with --num-layers-per-virtual-pipeline-"
         "stage; no zero-bubble, DualPipe or GPipe schedule",
         f"{_MG} megatron/core/pipeline_parallel/schedules.py:53,160-167 "
         "(get_forward_backward_func: with / without interleaving, or no pipelining)",
         _schedule("megatron")),
    Rule("megatron", "optimizer_offload",
         "--optimizer-cpu-offload needs --use-precision-aware-optimizer, which runs with the "
         "distributed optimizer only (zero >= 1)",
         f"{_MG} megatron/training/arguments.py:1884-1888, "
         "megatron/core/optimizer/__init__.py:1057-1060",
         lambda j, p: {"zero": 1} if p.optimizer_offload and p.zero == 0 else None),
    Rule("megatron", "activation_offload",
         "Transformer Engine CPU offloading (--cpu-offloading-num-layers k) runs without "
         "pipeline parallelism, without activation recompute, and on k < num_layers layers",
         f"{_MG} megatron/core/transformer/transformer_config.py:1884-1899 (k < num_layers; "
         "'no support for Pipeline parallelism with CPU offloading'; 'does not work when "
         "activation recomputation is enabled'), megatron/training/arguments.py:1950-1951",
         lambda j, p: {"activation_offload": 0} if p.activation_offload and (
             p.pp > 1 or p.recompute != "none"
             or p.activation_offload >= j.model.num_layers) else None),
    Rule("torchtitan", "schedule",
         "pipeline_parallel_schedule names PyTorch's schedules: 1F1B, Interleaved1F1B, GPipe, "
         "ZBVZeroBubble, DualPipeV (InterleavedZeroBubble and LoopedBFS are other layouts); "
         "no ZB-H1 / ZB-H2 or two-copy DualPipe",
         "torchtitan b5bcd76c (main) torchtitan/distributed/pipeline_parallel.py:205,300 "
         "(get_schedule_class(pipeline_parallel_schedule)); torch v2.13.0 "
         "torch/distributed/pipelining/schedules.py:3620 (get_schedule_class), 3199 "
         "(ScheduleZBVZeroBubble), 3393 (ScheduleDualPipeV)", _schedule("torchtitan")),
    Rule("torchtitan", "optimizer_offload",
         "training.enable_cpu_offload is FSDP2's CPUOffloadPolicy: parameters and gradients "
         "go to the host with the optimizer states, which the plan does not cost",
         "torchtitan b5bcd76c (main) torchtitan/config/configs.py:70 (enable_cpu_offload), "
         "torchtitan/distributed/fsdp.py:232 (offload_policy = CPUOffloadPolicy())",
         lambda j, p: {"optimizer_offload": 0} if p.optimizer_offload else None),
    Rule("torchtitan", "activation_offload",
         "no activation offloading to the host",
         f"{_TT} torchtitan/distributed/activation_checkpoint.py:152-166 (recompute only)",
         lambda j, p: {"activation_offload": 0} if p.activation_offload else None),
    Rule("deepspeed", "schedule",
         "the pipeline engine runs TrainSchedule (1F1B) only",
         f"{_DS} deepspeed/runtime/pipe/schedule.py:189 (TrainSchedule)", _schedule("deepspeed")),
    Rule("deepspeed", "optimizer_offload",
         "ZeRO-Offload (zero_optimization.offload_optimizer) needs ZeRO >= 1 and offloads the "
         "whole optimizer; a partial `ratio` exists for ZeRO-3 only",
         "DeepSpeed edaa7221 (0.19.6) deepspeed/runtime/zero/offload_config.py:99-100 "
         "(ratio: 'Only valid with ZeRO Stage 3'), runtime/zero/config.py:164 "
         "(offload_optimizer)", _ds_offload),
    Rule("deepspeed", "activation_offload",
         "activation offloading is cpu_checkpointing of checkpointed activations only, not a "
         "count of layers",
         f"{_DS} deepspeed/runtime/activation_checkpointing/config.py:42-43 "
         "(cpu_checkpointing)",
         lambda j, p: {"activation_offload": 0} if p.activation_offload else None),
    Rule("deepspeed", "cp",
         "no ring context parallelism (Ulysses sequence_parallel_size is all-to-all on heads, a "
         "different cost)",
         f"{_DS} deepspeed/runtime/config.py:457-470 (sequence_parallel_size)",
         lambda j, p: {"cp": 1} if p.cp > 1 else None, domain=lambda j: {"cp": (1,)}),
    Rule("deepspeed", "tp",
         "tensor parallelism is AutoTP (tensor_parallel.autotp_size) on a non-pipeline module; "
         "PipelineModule has no tensor-parallel layers of its own. Runs with tp x pp (MT-NLG's "
         "tp 8 x pp 35) used Megatron-DeepSpeed, Megatron's TP layers inside a PipelineModule "
         "over a PipeModelDataParallelTopology (microsoft/Megatron-DeepSpeed f4157bea "
         "megatron/model/gpt_model.py:322,454-461), a fork whose launch settings this tool "
         "does not emit: the `deepspeed` recipe searches its plans without --emit, and "
         "evaluate --plan scores one",
         f"{_DS} deepspeed/__init__.py:550-553 (AutoTP only on the non-PipelineModule path)",
         lambda j, p: {"tp": 1} if p.tp > 1 and p.pp > 1 else None),
    Rule("deepspeed", "ep",
         "AutoEP (expert_parallel.autoep_size) refuses tensor parallelism from an mpu, which "
         "the batch check needs with tp > 1",
         f"{_DS} deepspeed/runtime/engine.py:832-838",
         lambda j, p: {"tp": 1} if p.ep > 1 and p.tp > 1 else None),
    Rule("deepspeed", "etp",
         "no expert tensor parallelism of its own: AutoEP shards experts over ep (with tp = 1, "
         "etp = 1) and AutoTP splits whatever linears it finds over tp",
         f"{_DS} deepspeed/module_inject/auto_ep_config.py:42-50 (autoep_size only)",
         lambda j, p: {"etp": p.tp} if j.model.moe is not None and p.folded else None),
    Rule("deepspeed", "sp",
         "AutoTP has no sequence parallelism (norm/dropout activations stay replicated)",
         f"{_DS} deepspeed/module_inject/auto_tp.py:210 (AutoTP replaces linears only)",
         lambda j, p: {"sp": 0} if p.sp and p.tp > 1 else None,
         domain=lambda j: {"sp": (0,)}),  # sp = 1 needs tp > 1 (spec/plan.py) anyway
    Rule("deepspeed", "recompute",
         "activation checkpointing wraps whole functions (deepspeed.checkpointing.checkpoint); "
         "no attention-core-only recompute",
         f"{_DS} deepspeed/runtime/activation_checkpointing/checkpointing.py:1048",
         lambda j, p: {"recompute": "full"} if p.recompute == "selective" else None,
         domain=lambda j: {"recompute": ("none", "full")}),
    *FSDP1_RULES,
    *MDS_RULES,
)

FRAMEWORKS: tuple[str, ...] = ("megatron", "torchtitan", "torchtitan-toml", "deepspeed")


def _family(fmt: str) -> str:
    return "torchtitan" if fmt.startswith("torchtitan") else fmt


def rules_for(fmt: str) -> tuple[Rule, ...]:
    """The rows that apply to format `fmt` (its family's, less those of another format)."""
    return tuple(r for r in RULES if r.framework in (fmt, _family(fmt))
                 and (r.formats is None or fmt in r.formats))


def refusals(job: Job, plan: Plan, fmt: str) -> list[Refusal]:
    """The capability rows of framework `fmt` that `plan` breaks for `job` (empty: it runs)."""
    out: list[Refusal] = []
    for r in rules_for(fmt):
        closest = r.broken(job, plan)
        if closest is not None:
            out.append(Refusal(r.framework, r.field, r.rule, r.source, closest))
    return out


def job_refusal(job: Job, fmt: str) -> str | None:
    """Why framework `fmt` cannot train this job's model at all (no plan helps), or None."""
    for r in RULES:
        if r.framework in (fmt, _family(fmt)) and r.field in JOB_FIELDS:
            closest = r.broken(job, Plan())
            if closest is not None:
                return Refusal(fmt, r.field, r.rule, r.source, closest).message(Plan()).replace(
                    "cannot run this plan", f"cannot train {job.model.name} as planned", 1)
    return None
