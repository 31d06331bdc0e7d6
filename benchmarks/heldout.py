"""Held-out published runs (`data/published_runs_heldout.csv`): rows to (job, plan, options).

The 172 rows of 17 sources (`data/heldout_sources.md`) were collected after the cost model was
developed on `published_runs_train.csv`; no constant or mechanism was chosen while looking at
them. Each row becomes a job and a plan by rules per framework family, written once here and
cited; anything a source does not state is flagged in `assumed`, and rows that cannot be written
as a plan are skipped with the reason (the plan-space gaps of issue 15: MLA variants). Uneven
interleaved splits take the layout of the source's Megatron-Bridge recipe (`_bridge_layout`);
expert parallelism folded over tensor ranks is expressed with the plan's `etp` (MoE parallel
folding) where a Megatron-Bridge recipe sets it.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import heldout_automodel as automodel
from tuned import flag, knob
from validate import H100_96_500W, NDR_IB, NVLINK4

from autoparallel_cp.cost.factors import CostOptions, recipe_options
from autoparallel_cp.spec import (
    RECIPES,
    ClusterSpec,
    Job,
    LinkSpec,
    ModelSpec,
    MoESpec,
    NodeGroup,
    TrainingRecipe,
)
from autoparallel_cp.spec.loaders import load_cluster, load_model
from autoparallel_cp.spec.plan import Plan, plan_violations

DATA = Path(__file__).resolve().parent / "data"

#: NVIDIA A800 SXM4 80GB: the A100 with NVLink cut to 400 GB/s total = 200 GB/s per direction
#: (NVIDIA A800 datasheet); compute and HBM as the A100 80GB.
A800_NVLINK = LinkSpec(bandwidth_gbps=200.0, latency_us=3.0,
                       source="A800 datasheet: NVLink 400 GB/s (200 per direction)")
#: Jean Zay's A100 nodes as the BLOOM README states them ("8 GPUs per node ... 4 OmniPath links",
#: "Inter-node connect: Omni-Path Architecture (OPA)"): four 100 Gb/s Omni-Path 100 ports per
#: node of 8 GPUs = 6.25 GB/s per GPU per direction (the DGX A100 preset has 25).
OPA_4X100 = LinkSpec(bandwidth_gbps=4 * 12.5 / 8, latency_us=8.0,
                     source="BLOOM README: 4 Omni-Path links per node; OPA 100 Series 100 Gb/s "
                            "per port")


@dataclass
class HeldOutRow:
    """One held-out run as the cost model sees it (job is None when skipped)."""

    idx: int
    name: str
    source: str  # the source_id (one independent source)
    family: str
    job: Job | None
    plan: Plan | None
    options: CostOptions
    measured_tps: float | None
    measured_mem_gib: float | None
    assumed: list[str] = field(default_factory=list)
    skip: str = ""
    #: which tuned constants (validate.TUNED) this row's prediction depends on
    knobs: tuple[str, ...] = ()


def _int(x: str) -> int | None:
    x = (x or "").strip()
    if not x:
        return None
    try:
        return int(float(x))
    except ValueError:
        return None


def _node_group(gpu_text: str, n: int) -> tuple[NodeGroup, str] | None:
    """The node group a source's GPU cell names (hardware from the cluster presets)."""
    g = gpu_text.lower()
    if "b200" in g:
        preset = "dgx-b200"
    elif "h200" in g:
        preset = "dgx-h200"
    elif "h800" in g:
        preset = "dgx-h800"
    elif "h100" in g and "96gb" in g:
        grp = NodeGroup(name="gt", gpu=H100_96_500W, gpus_per_node=8, num_nodes=max(n // 8, 1),
                        intra_node=NVLINK4, inter_node=NDR_IB)
        return grp, "H100-96GB"
    elif "h100" in g:
        preset = "dgx-h100"
    elif "a100 40gb" in g:
        preset = "dgx-a100-40g"
    elif "a800" in g or "a100" in g or "ampere" in g:
        preset = "dgx-a100"
    else:
        return None
    base = load_cluster(preset).node_groups[0]
    grp = base.model_copy(update={"num_nodes": max(n // base.gpus_per_node, 1)})
    if "a800" in g:
        grp = grp.model_copy(update={"intra_node": A800_NVLINK})
    return grp, preset


#: Models whose shape comes from their public Hugging Face config.json (model prefix -> file in
#: data/hf_configs/, the Hub repository of the same name; see its README) through the importer
#: (autoparallel_cp.spec.hf_import) instead of the CSV's columns, which cannot state head_dim
#: (Qwen3 MoE: 128 at hidden 2048 / 32 heads and 4096 / 64; GPT-OSS 64 at 2880 / 64), the Qwen3
#: q/k norms, or GPT-OSS's attention / expert / router biases and attention sinks. The CSV's
#: own cells are checked against the config (`_hf_model`).
HF_CONFIG: dict[str, str] = {
    "qwen3 30b": "Qwen3-30B-A3B.json", "qwen3 235b": "Qwen3-235B-A22B.json",
    "qwen3 8b": "Qwen3-8B.json", "gpt oss 120b": "gpt-oss-120b.json",
    "gpt oss 20b": "gpt-oss-20b.json",
}

#: Sliding-window attention of the models whose source runs it (model prefix -> (framework
#: versions whose window differs, their left window), the left window otherwise, the pattern,
#: citation)), `ModelSpec.sliding_window_left` / `sliding_window_layers`. GPT-OSS on
#: Megatron-Bridge, every other layer windowed (`window_attn_skip_freq = 2`: 1-based layers
#: 1, 3, ... i.e. 0-based even layers, Megatron-Core transformer/utils.py
#: `is_layer_window_attention` @d98e8a64) with learnable softmax: v0.2.0 (NeMo 25.11,
#: tag 717c62de40) `GPTOSSProvider` `window_size=(128, 0)`, which its `GPTOSSBridge` keeps;
#: from v0.4.0 (NeMo 26.04, and the cards' commits 6799f09971 / a8038f6d99) the bridge sets
#: `window_size = (hf sliding_window - 1, 0)` = (127, 0) from openai/gpt-oss's config.json
#: `sliding_window: 128` (gpt_oss_bridge.py l. 86-88 @067f987).
SLIDING_WINDOW: dict[str, tuple[tuple[str, ...], int, int, tuple[bool, ...], str]] = {
    "gpt oss": (("NeMo 25.11",), 128, 127, (True, False),
                "window (w, 0) on every other layer: Megatron-Bridge gpt_oss_provider.py "
                "window_size=(128, 0) @v0.2.0 / gpt_oss_bridge.py (sliding_window - 1, 0) "
                "@v0.4.0+, window_attn_skip_freq=2"),
}


def _window(r: dict[str, str], assumed: list[str]) -> tuple[int | None, tuple[bool, ...] | None]:
    """(left window, layer pattern) the row's framework version runs (`SLIDING_WINDOW`)."""
    swa = _for_model(SLIDING_WINDOW, r)
    if swa is None:
        return None, None
    if r["source_id"] == automodel.SOURCE:
        # AutoModel's GPT-OSS (components/models/gpt_oss/model.py @364f600be) windows the
        # layers its config.json's `layer_types` marks "sliding_attention" (0-based even
        # layers) with `sliding_window` 128; its FlexAttention mask keeps kv_idx <= q_idx and
        # q_idx - kv_idx < 128 (components/attention/flex_attention.py): 127 to the left
        assumed.append("sliding window 127 on even layers (AutoModel gpt_oss layers.py / "
                       "flex_attention.py: q - kv < config.sliding_window 128)")
        return 127, (True, False)
    versions, w_old, w_new, pattern, cite = swa
    window = w_old if any(v in r["framework_version"] for v in versions) else w_new
    assumed.append(f"sliding window {window} ({cite})")
    return window, pattern


def _hf_model(r: dict[str, str], file: str, assumed: list[str]) -> ModelSpec:
    """The row's model imported from its public config.json, its CSV cells checked against it
    and the window its framework version runs."""
    model = load_model(DATA / "hf_configs" / file).model_copy(update={"name": r["model"]})
    moe = model.moe
    stated = {"layers": model.num_layers, "hidden": model.hidden_size,
              "heads": model.num_attention_heads, "kv_heads": model.kv_heads,
              "vocab": model.vocab_size,
              "ffn_hidden": moe.expert_ffn_hidden_size if moe else model.ffn_hidden_size,
              "moe_experts": moe.num_experts if moe else None,
              "moe_topk": moe.top_k if moe else None}
    for col, value in stated.items():
        if _int(r[col]) != value:
            raise ValueError(f"held-out row {r['model']}: {col} {r[col]!r} != {value} in "
                             f"data/hf_configs/{file}")
    window, pattern = _window(r, assumed)
    if window is not None:
        model = model.model_copy(update={"sliding_window_left": window,
                                         "sliding_window_layers": pattern})
    return model


def _model(r: dict[str, str], assumed: list[str]) -> ModelSpec | None:
    name = r["model"]
    low = name.lower()
    if "deepseek" in low:
        return load_model("deepseek-v3")
    hf = _for_model(HF_CONFIG, r)
    if hf is not None:
        return _hf_model(r, hf, assumed)
    L, h, a = _int(r["layers"]), _int(r["hidden"]), _int(r["heads"])
    if L is None or h is None or a is None:
        return None
    ffn = _int(r["ffn_hidden"])
    if ffn is None:
        ffn = 4 * h
        assumed.append("ffn=4h")
    kv = _int(r["kv_heads"]) or a
    vocab = _int(r["vocab"])
    if vocab is None:
        vocab = 51200
        assumed.append("vocab=51200 (Megatron's padded GPT-2 vocab)")
    gated = any(k in low for k in ("llama", "mixtral", "qwen", "grok", "gpt oss"))
    pos = "alibi" if ("mpt" in low or "bloom" in low) else (
        "learned" if ("gpt" in low and "oss" not in low) or "opt" in low else "rope")
    moe = None
    experts, topk = _int(r["moe_experts"]), _int(r["moe_topk"])
    if experts and topk:
        moe = MoESpec(num_experts=experts, top_k=topk, expert_ffn_hidden_size=ffn)
    # the output layer shares the word embedding where the framework's GPT / BLOOM / MPT
    # model does unless told otherwise: Megatron-LM 285068c8 has no untie flag (always
    # shared), NeMo's megatron_gpt_model.py (@v2.0.0 l. 513) defaults
    # share_embeddings_and_output_weights to True and the launcher's gpt3 YAMLs (24.07) do not
    # set it, BLOOM's README states tied embeddings, llm-foundry's MPT (v0.3.0
    # modeling_mpt.py) computes the logits with the token embedding
    tied = pos in ("learned", "alibi")
    if tied:
        assumed.append("tied embedding and output weights (the framework's default)")
    window, pattern = _window(r, assumed)
    return ModelSpec(name=name, num_layers=L, hidden_size=h, ffn_hidden_size=ffn,
                     tie_embeddings=tied, num_attention_heads=a, num_kv_heads=kv,
                     vocab_size=vocab,
                     max_position_embeddings=max(_int(r["seq_len"]) or 4096, 4096),
                     position_embedding=pos, mlp="swiglu" if gated else "gelu",
                     norm="rmsnorm" if gated else "layernorm",
                     embedding_norm="bloom" in low, moe=moe,
                     sliding_window_left=window, sliding_window_layers=pattern)


def _recompute(text: str) -> str | None:
    t = text.strip().lower()
    if not t:
        return None
    for mode in ("full", "selective", "none"):
        if t.startswith(mode):
            return mode
    return None


def _zero(text: str) -> int | None:
    t = text.strip().upper()
    if not t:
        return None
    if "SHARD_GRAD_OP" in t or "ZERO-2" in t:
        return 2
    if t.startswith("FSDP") or t == "3":
        return 3
    return int(t) if t.isdigit() else None


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
        if stated.get("no_sp"):
            assumed.append(f"no sequence parallelism ({stated['no_sp']})")
            return recipe, "0", ()
        return recipe, "tp>1", ()
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
        knobs: tuple[str, ...] = ()
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


#: Megatron-Bridge performance recipes (src/megatron/bridge/perf_recipes/<model>/<gpu>/*.py at
#: 067f987df, the commit of the performance-summary archive the mbridge-perf rows cite):
#: `recompute_modules` with `recompute_granularity = "selective"` (deepseek/common.py
#: `_deepseek_v3_common`; gpt_oss/<gpu>/gpt_oss.py). Keyed by (model prefix, GPU prefix,
#: pipeline size) where the recipes of one model differ by layout; the Qwen3 and Llama
#: recipes set no recompute. Rows of older containers take the recipe of the same layout.
BRIDGE_RECOMPUTE_MODULES: dict[tuple[str, str, int | None], tuple[str, ...]] = {
    ("gpt oss", "", None): ("layernorm", "moe_act"),
    ("deepseekv3", "b200", 16): ("mla_up_proj",),  # 256gpu_b200_{bf16,fp8cs}: pp 16, ep 8
    ("deepseekv3", "b200", 8): ("mla_up_proj", "mlp"),  # 256gpu_b200_fp8mx: pp 8, vpp 2
    ("deepseekv3", "h100", None): ("mla_up_proj", "mlp"),  # 1024gpu_h100_*: pp 8, vpp 4
}


#: MoE communication the Megatron-Bridge recipes (@067f987df) set, for the rows whose plan
#: (tp, pp, vpp, ep, micro-batch) is the recipe's: the token dispatcher ("flex": DeepEP /
#: HybridEP backends, `moe_token_dispatcher_type = "flex"` after
#: `apply_flex_dispatcher_backend`, training/flex_dispatcher_backend.py) and EP overlap
#: (`comm_overlap.overlap_moe_expert_parallel_comm`). Keyed by (model prefix, GPU prefix, tp,
#: pp, vpp, ep, mbs); every other row keeps Megatron's alltoall without overlap. The third
#: value is the recipe's TP overlap (`comm_overlap.tp_comm_overlap`), where tp > 1.
#: - DeepSeek-V3 1,024 H100: perf_recipes/deepseek/h100/deepseek_v3.py:28-52 on the base
#:   recipes/deepseek/h100/deepseek_v3.py:159-161,228-230,256 (hybridep, no EP overlap, no
#:   TP overlap);
#: - DeepSeek-V3 256 B200 MXFP8: perf_recipes/deepseek/b200/deepseek_v3.py:124-156 (deepep,
#:   overlap with delayed wgrad);
#: - DeepSeek-V3 256 B200 pp 16: perf_recipes/deepseek/b200/deepseek_v3.py:28-48 on the same
#:   base (hybridep, no overlap);
#: - Qwen3 30B-A3B 8 B200 MXFP8: perf_recipes/qwen/b200/qwen3_moe.py:285-324 (hybridep,
#:   overlap);
#: - Qwen3 235B-A22B 256 H100: perf_recipes/qwen/h100/qwen3_moe.py:136-170 (alltoall, EP
#:   overlap, no TP overlap).
BRIDGE_MOE_COMM: dict[tuple[str, str, int, int, int, int, int], tuple[str, bool, bool | None]] = {
    ("deepseekv3", "h100", 2, 8, 4, 64, 1): ("flex", False, False),
    ("deepseekv3", "b200", 1, 8, 2, 32, 1): ("flex", True, None),
    ("deepseekv3", "b200", 1, 16, 1, 8, 1): ("flex", False, None),
    ("qwen3 30b", "b200", 1, 1, 1, 8, 4): ("flex", True, None),
    ("qwen3 235b", "h100", 2, 8, 4, 32, 1): ("alltoall", True, False),
}


#: BRIDGE_MOE_COMM of rows whose container's performance config (scripts/performance/ of the
#: Megatron-Bridge release in that container) sets the MoE communication, keyed by (model
#: prefix, GPU prefix, container in `framework_version`, tp, pp, vpp, ep, mbs); consulted first.
#: - GPT-OSS 120B 64 B200 BF16 GBS 1280, NeMo 26.04 / 26.04.01 (Megatron-Bridge v0.4.0 /
#:   v0.4.1): scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py
#:   `GPT_OSS_120B_PRETRAIN_CONFIG_B200_BF16_V2` sets `expert_model_parallel_size=8`,
#:   `moe_flex_dispatcher_backend="hybridep"` (applied by `apply_flex_dispatcher_backend` in
#:   gpt_oss_llm_pretrain.py) and no `moe_a2a_overlap`; tp_comm_overlap: tp = 1.
BRIDGE_MOE_COMM_CONTAINER: dict[tuple[str, str, str, int, int, int, int, int],
                                tuple[str, bool, bool | None]] = {
    ("gpt oss", "b200", "NeMo 26.04", 1, 1, 1, 8, 4): ("flex", False, None),
}


#: Transformer Engine CUDA-graph scopes (`cuda_graph_impl = "transformer_engine"`,
#: `cuda_graph_scope`) of the Megatron-Bridge perf recipes the Qwen3 30B-A3B mbridge-perf rows
#: ran, keyed by (model prefix, GPU prefix, container in `framework_version`, mbs); the
#: behaviour `cuda_graph_scopes` (cost/moe_host.py). Rows of other models are GPU-bound in
#: cost/moe_host.py whatever their scopes, and keep the default (none).
#: - NeMo 25.11 (Megatron-Bridge v0.2.0) B200 FP8: scripts/performance/configs/qwen3/
#:   workload_base_configs.py `QWEN3_30B_A3B_B200_FP8_CS_BASE_CONFIG` (FP8_MX is the same
#:   config): ["moe_router", "moe_preprocess"]; the H100 FP8-CS config sets none;
#: - NeMo 26.04.01 (v0.4.1) B200: scripts/performance/configs/qwen/
#:   qwen3_workload_base_configs.py:394-407 (`QWEN3_30B_A3B_PRETRAIN_CONFIG_B200_*_V1`,
#:   mbs 4): ["attn", "moe_router", "moe_preprocess"].
BRIDGE_CUDA_GRAPHS: dict[tuple[str, str, str, int], tuple[str, ...]] = {
    ("qwen3 30b", "b200", "NeMo 25.11", 1): ("moe_router", "moe_preprocess"),
    ("qwen3 30b", "b200", "NeMo 26.04", 4): ("attn", "moe_router", "moe_preprocess"),
}


#: Settings of the mbridge-cards rows (Megatron-Bridge model verification cards): each row's
#: `extra_config` states, as `key=value` items separated by ';', what its card and the recipe
#: at the card's bridge commit set (the citations are in the row's `source` and `notes`):
#: `grads` (bf16: grad_reduce_in_fp32=False), `dispatcher` (alltoall, or flex after
#: apply_flex_dispatcher_backend), `ep_overlap` (overlap_moe_expert_parallel_comm), `tp_overlap`
#: (comm_overlap.tp_comm_overlap), `dp_overlap` (ddp.overlap_grad_reduce), `etp`
#: (expert_tensor_parallel_size), `recompute_modules` ('/'-joined), `cuda_graphs` (TE CUDA-graph
#: scopes, '/'-joined: behaviour `cuda_graph_scopes`); `routing` is recorded, not modelled.
CARD_SOURCE = "mbridge-cards"


def _card_settings(r: dict[str, str]) -> dict[str, str]:
    """The `key=value` settings of an mbridge-cards row ({} for every other source)."""
    if r["source_id"] != CARD_SOURCE:
        return {}
    items = (part.partition("=") for part in r["extra_config"].split(";"))
    return {k.strip(): v.strip() for k, sep, v in items if sep}


def _bridge_moe_comm(r: dict[str, str], tp: int, pp: int, vpp: int, ep: int,
                     mbs: int) -> tuple[str, bool, bool | None] | None:
    """(dispatcher, EP overlap, TP overlap) of the Megatron-Bridge recipe this row's plan is,
    or None."""
    card = _card_settings(r)
    if card:
        return (card.get("dispatcher", "alltoall"), card.get("ep_overlap") == "1",
                card.get("tp_overlap") == "1")
    if r["source_id"] != "mbridge-perf" or not _int(r["moe_experts"]):
        return None
    model, gpu = _model_name(r), r["gpu"].lower()
    by_container = next((v for (m, g, c, *plan), v in BRIDGE_MOE_COMM_CONTAINER.items()
                         if model.startswith(m) and g in gpu and c in r["framework_version"]
                         and tuple(plan) == (tp, pp, vpp, ep, mbs)), None)
    if by_container is not None:
        return by_container
    return next((v for (m, g, *plan), v in BRIDGE_MOE_COMM.items()
                 if model.startswith(m) and g in gpu and tuple(plan) == (tp, pp, vpp, ep, mbs)),
                None)


def _bridge_cuda_graphs(r: dict[str, str], mbs: int) -> tuple[str, ...]:
    """The CUDA-graph scopes of this row's Megatron-Bridge recipe or card (() when none)."""
    card = _card_settings(r)
    if card:
        return tuple(s for s in card.get("cuda_graphs", "").split("/") if s)
    if r["source_id"] != "mbridge-perf":
        return ()
    model, gpu = _model_name(r), r["gpu"].lower()
    return next((v for (m, g, c, b), v in BRIDGE_CUDA_GRAPHS.items()
                 if model.startswith(m) and g in gpu and c in r["framework_version"]
                 and b == mbs), ())


#: Expert-tensor-parallel size of the Megatron-Bridge recipes the mbridge-perf MoE rows run
#: (@067f987df): every perf recipe starts from a base recipe that sets
#: `expert_tensor_parallel_size = 1` (MoE parallel folding: ep laid over tp x dp ranks) and does
#: not change it. Qwen3 235B-A22B: recipes/qwen/h100/qwen3_moe.py:255 (the base of
#: perf_recipes/qwen/{h100,b200}/qwen3_moe.py via perf_recipes/qwen/common.py); Qwen3 30B-A3B:
#: :60 and :174; DeepSeek-V3: recipes/deepseek/h100/deepseek_v3.py:132 (via
#: recipes/deepseek/deepseek_v3.py); GPT-OSS 120B: recipes/gpt_oss/h100/gpt_oss.py:190.
#: Models whose Megatron-Bridge provider sets a clamped GLU activation with expert biases:
#: GPT-OSS (src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py @067f987:
#: `activation_func_clamp_value = 7.0`, `add_bias_linear = True`, `bias_activation_fusion =
#: True`, quick_gelu GLU; the same fields in v0.2.0's gpt_oss_provider.py, the Bridge of
#: NeMo 25.11, with `attention_dropout = 0.0`). Every GPT-OSS row ran Megatron Core 0.15
#: (NeMo 25.11) or later (docs/releases/software-versions.md), whose TEGroupedMLP runs the
#: clamp and the fc2 bias eagerly (behaviour `moe_glu_clamp_bias`, cost/moe_glu_bias.py).
CLAMPED_GLU_BIAS_MODELS: tuple[str, ...] = ("gpt oss",)

BRIDGE_EXPERT_TP: dict[str, int] = {"qwen3": 1, "deepseekv3": 1, "gpt oss": 1}


def _bridge_expert_tp(r: dict[str, str]) -> int | None:
    """The expert-TP size the Megatron-Bridge recipe of this MoE row sets, or None."""
    if _card_settings(r).get("etp"):
        return int(_card_settings(r)["etp"])
    if r["source_id"] != "mbridge-perf" or not _int(r["moe_experts"]):
        return None
    return _for_model(BRIDGE_EXPERT_TP, r)


#: Settings the sources' published configuration files state, per source and model prefix
#: (`_model_name`; "" matches every model of the source):
#: - `bf16_grads`: gradient buffers and their reduction in bf16 (the value names the setting).
#:   NeMo 1.x YAMLs: `optim.grad_sync_dtype: bf16` (unset means the optimizer's fp32: Apex
#:   DistributedFusedAdam's `grad_sync_dtype` defaults to its `dtype`, which NeMo sets to fp32).
#:   Megatron-Bridge benchmark recipes: `grad_reduce_in_fp32 = False` (perf_recipes/_common.py
#:   `_benchmark_common` / `_perf_precision` @067f987), so Megatron's DDP grad buffer takes the
#:   param dtype.
#: - `fp8_params`: fp8 weight storage in FP8 runs (`model.fp8_params: true`; dgxc-bench-25.02's
#:   llama3.1/configure.sh and nemotron/configure.sh pass `+model.fp8_params=$FP8_ENABLED`,
#:   grok1/configure.sh `model.fp8_params=${FP8_ENABLED^}`: true in the FP8 runs only).
#: - `recompute`: `activations_checkpoint_granularity` (null unless listed).
#: - `dropout`: `hidden_dropout` / `attention_dropout` 0.1 (the GPT-3 YAMLs of both sources;
#:   their Llama, Nemotron and Grok YAMLs set 0.0).
#: - `optimizer`: `optim.name: distributed_fused_adam` (Apex DistributedFusedAdam; the Grok-1 and
#:   Nemotron-4 15B YAMLs use Megatron-Core's `mcore_distributed_optim` instead) with the state
#:   dtype `optim.dtype` (fp32 when unset). NeMo (nemo/collections/nlp/models/language_modeling/
#:   megatron_base_model.py `setup_optimization` @v2.0.0) keeps no master copy when the state
#:   dtype is the bf16 model dtype (store_params False), only the 16 trailing bits of the fp32
#:   master when the state is fp32 (store_param_remainders; Apex: "store bits required to
#:   reconstruct FP32 params"), and a full fp32 copy with fp8 params (store_params True): master
#:   0 / 2 / 4 B per parameter, Adam's two moments 2 x the state dtype.
#: - `overlap_p2p` / `no_overlap_p2p`: Megatron-Core's interleaved-schedule p2p overlap on /
#:   off (behaviour `overlap_p2p_comm`), as the YAML's `overlap_p2p_comm` / `batch_p2p_comm` or
#:   the recipe's CommOverlapConfig sets it. Every interleaved Megatron-Core row's setting is
#:   stated here or by its Megatron-LM commit (MEGATRON_LM_DEFAULTS), not taken from the
#:   recipes' Megatron-LM main default (`_p2p_overlap`).
#: Kept for the record, not applied: the launcher 24.07 YAMLs of GPT-3 175B (gpt3/175b.yaml
#: l. 149, 175b_fp8.yaml l. 149) and Nemotron-4 340B (nemotron/nemotron_340b.yaml l. 156) set
#: `ub_tp_comm_overlap: False`, while the nemo-perf-24.07 rows assume TP overlap on (as every
#: NeMo row with tp > 1). Those YAMLs (and examples/training/gpt/h100/175b_fp8_16node.sh) run
#: plans the table does not (vpp 12 against the table's 6; pp 12 x vpp 8 against pp 8 x vpp
#: 12), so they are not the table's launch files for these two models, and the table's GPT-3
#: 175B FP8 at 128 GPUs (716 tokens/s/GPU) matches dgxc-bench-25.02's NeMo 24.12 run of the
#: same plan with userbuffers on (256 x 2048 / 5.626 s / 128 = 728). Applied, the three rows
#: went +6.9 / -6.3 / -0.7% to -3.3 / -15.0 / -13.6% (in-sample nemo-perf 5.8 / +3.5 -> 7.3 /
#: +0.8%).
#: Files: dgxc-bench-25.02: NVIDIA/dgxc-benchmarking @8f5cbb3799 (tag v25.02)
#: llama3.1/llama3.1_{8b,70b,405b}.yaml, nemo_megatron/gpt3_175b_hydra.yaml,
#: nemotron/nemotron4-{15b,340b}-synth.yaml, grok1/grok1_314b.yaml; nemo-perf-24.07:
#: NVIDIA/NeMo-Framework-Launcher tag 24.07, launcher_scripts/conf/training/{gpt3,llama,
#: nemotron}/*.yaml (only Nemotron 340B sets grad_sync_dtype and selective recompute).
_FLAGPERF_DROPOUT = ("FlagPerf @1b5a030398 training/benchmarks/%s sets no dropout flag: "
                     "Megatron core_v0.6.0 arguments.py default 0.1")
_YAML_GRADS = "optim.grad_sync_dtype in the source's YAML"
_YAML_DROPOUT = "hidden/attention dropout 0.1 in the source's YAML"
_YAML_P2P = "overlap_p2p_comm true, batch_p2p_comm false in the source's %s"
STATED_SETTINGS: dict[str, dict[str, dict[str, object]]] = {
    "dgxc-bench-25.02": {
        "llama 3.1": {"bf16_grads": _YAML_GRADS, "optimizer": "fp32", "fp8_params": True,
                      "overlap_p2p": _YAML_P2P % "llama3.1_{70b,405b}.yaml"},
        "gpt-3 175b": {"bf16_grads": _YAML_GRADS, "fp8_params": True, "dropout": _YAML_DROPOUT,
                       "optimizer": "fp32",
                       "overlap_p2p": _YAML_P2P % "gpt3_175b_hydra.yaml l. 91-92"},
        "nemotron-4 340b": {"bf16_grads": _YAML_GRADS, "recompute": "selective",
                            "optimizer": "bf16", "fp8_params": True,
                            "overlap_p2p": _YAML_P2P % "nemotron/configure.sh l. 86-88 "
                                                       "overrides"},
        "nemotron-4 15b": {"fp8_params": True},
        "grok-1": {"bf16_grads": _YAML_GRADS, "fp8_params": True,
                   "overlap_p2p": _YAML_P2P % "grok1_314b.yaml l. 97-98"},
    },
    "nemo-perf-24.07": {
        "nemotron-340b": {"bf16_grads": _YAML_GRADS, "recompute": "selective",
                          "optimizer": "bf16",
                          "no_overlap_p2p": "overlap_p2p_comm false, batch_p2p_comm true in "
                                            "the source's nemotron/nemotron_340b.yaml l. "
                                            "135-136 (24.07)"},
        "gpt3": {"dropout": _YAML_DROPOUT, "optimizer": "fp32",
                 "overlap_p2p": _YAML_P2P % "gpt3/175b.yaml l. 108-109 (24.07)"},
        "llama2-13b": {"optimizer": "fp32",
                       "overlap_p2p": _YAML_P2P % "llama/llama2_13b.yaml l. 137 (24.07)"},
        "llama2-70b": {"optimizer": "fp32",
                       "overlap_p2p": _YAML_P2P % "llama/llama2_70b.yaml l. 140 (24.07)"},
        "llama3-70b": {"optimizer": "fp32",
                       "overlap_p2p": _YAML_P2P % "llama/llama3_70b.yaml l. 138 (24.07)"},
        "nemotron-22b": {"optimizer": "fp32",
                         "overlap_p2p": _YAML_P2P % "nemotron/nemotron_22b.yaml l. 138 (24.07)"},
        "": {"optimizer": "fp32"},
    },
    # Every Megatron-Bridge perf config runs with a CommOverlapConfig (scripts/performance/
    # configs/{llama31,qwen3,deepseek}/*_llm_pretrain.py set or update `cfg.comm_overlap` at
    # v0.2.0 717c62de40 and v0.4.1; the DeepSeek-V3 recipe creates one when unset), and its
    # `_get_model_comm_overlap_cfgs` sets overlap_p2p_comm true / batch_p2p_comm false at
    # pp > 1 with vpp > 1 (src/megatron/bridge/training/comm_overlap.py l. 451-457, the same
    # at v0.1.0rc4, v0.2.0 and v0.4.1): the interleaved rows' p2p overlap is stated.
    # The mbridge-cards DeepSeek-V3 card's recipe (perf_recipes/deepseek/h100/deepseek_v3.py
    # on recipes/deepseek/h100/deepseek_v3.py l. 228 `cfg.comm_overlap = CommOverlapConfig(
    # tp_comm_overlap=False)` at the card's bridge_commit 79308d0d9) runs the same setup
    # (training/config.py l. 2027-2029, comm_overlap.py l. 453-457 @79308d0d9): at vpp 4 its
    # p2p overlap is on.
    "mbridge-cards": {"deepseekv3": {"overlap_p2p": "overlap_p2p_comm true, batch_p2p_comm "
                                                    "false by Megatron-Bridge's CommOverlapConfig "
                                                    "at vpp > 1 (training/comm_overlap.py l. "
                                                    "453-457 @79308d0d9)"}},
    "mbridge-perf": {"": {"bf16_grads": "Megatron-Bridge benchmark default",
                          "overlap_p2p": "overlap_p2p_comm true, batch_p2p_comm false by "
                                         "Megatron-Bridge's CommOverlapConfig at vpp > 1 "
                                         "(training/comm_overlap.py l. 451-457)"}},
    # bigscience train/tr11-176B-ml/tr11-176B-ml.slurm @9e64ede sets no dropout flag, so the
    # fork's defaults hold (bigscience-workshop/Megatron-DeepSpeed megatron/arguments.py
    # @8387ae17: --attention-dropout / --hidden-dropout 0.1), and that fork has no sequence
    # parallelism (no such argument)
    "bloom-tr11": {"bloom": {"dropout": "tr11 slurm sets none: the fork's default 0.1",
                             "no_sp": "the bigscience Megatron-DeepSpeed fork has none"}},
    # FlagOpen/FlagPerf @1b5a030398 training/nvidia/llama2_7b-megatron-deepspeed/config/
    # ds_config.json: bf16, ZeRO stage 1, "data_types": {"grad_accum_dtype": "bf16"}; DeepSpeed
    # then runs its ZeRO optimizer, not BF16_Optimizer (engine.py @v0.11.1
    # `_do_optimizer_sanity_check` l. 1135-1177: BF16_Optimizer only with fp32 accumulation).
    # The Megatron-Core rows (core_v0.6.0, cac60ce4) launch with the flags of FlagPerf's
    # training/benchmarks/<model>/megatron/*.sh, which set no --attention-dropout /
    # --hidden-dropout, so Megatron's defaults hold (megatron/training/arguments.py @core_v0.6.0
    # l. 854-857: 0.1 each). FlagScale's llama2_70B megatron_main.sh sets both to 0.0.
    # Unfused elementwise ops (behaviour `unfused_ops`, cost/unfused_ops.py):
    # - Llama 2 70B: FlagPerf's llama2_70B/megatron/megatron_main.sh passes --swiglu and
    #   --use-rotary-position-embeddings and neither --use-mcore-models nor --transformer-impl,
    #   so FlagScale @26cd664 builds its legacy layer (arguments.py l. 614 default 'local'):
    #   megatron/model/transformer.py l. 138-145 `F.silu(x[0]) * x[1]`, l. 868-869
    #   Megatron-Core's unfused `apply_rotary_pos_emb`; the RMSNorm is Apex's
    #   MixedFusedRMSNorm (megatron/model/__init__.py) and bias-dropout-add jit-fused.
    # - Llama 2 7B: megatron-deepspeed_main.sh passes --swiglu and
    #   --use-rotary-position-embeddings before its '#' line; microsoft/Megatron-DeepSpeed
    #   @6d4c535e megatron/model/transformer.py l. 130-134 (swiglu, its fc1 bias added before
    #   it: skip_bias_add=True, l. 117, 163-165) and l. 777-778 (megatron/model/
    #   rotary_pos_embedding.py); the LayerNorm is Apex's MixedFusedLayerNorm.
    #   Megatron-DeepSpeed's attention also splits the fused QKV output with slices and
    #   selects (l. 641-644: a zeros-filled gradient of the whole output per part in backward)
    #   and copies the strided v before FlashAttention-2 (l. 799-800); FlagPerf's image pins
    #   11f2d934 (training/nvidia/docker_image/megatron-deepspeed/megatron-deepspeed_install.sh),
    #   two commits before 6d4c535e with the same megatron/model/.
    # - Llama 2 70B, grouped-query: the legacy layer expands K and V to all 64 heads with
    #   `repeat_interleave` (l. 855-864) before the RoPE (behaviour `gqa_repeat_kv`; the RoPE
    #   then runs on 64 K heads, cost/unfused_ops.py).
    # - Mixtral: mixtral_8x7B/megatron/megatron_main.sh passes --no-rope-fusion: Megatron-LM
    #   core_v0.6.0 (cac60ce4) attention.py l. 289-292 then runs rotary_pos_embedding.py
    #   `apply_rotary_pos_emb_bshd` (l. 173-196); the TE layer keeps the rest fused.
    "flagperf": {
        "llama2 7b": {"bf16_grad_accum": "ds_config.json: ZeRO-1 with grad_accum_dtype bf16, "
                                         "no BF16_Optimizer",
                      "unfused_ops": (("rope-legacy", "swiglu", "qkv-slice"),
                                      "megatron-deepspeed_main.sh @1b5a030398 --swiglu "
                                      "--use-rotary-position-embeddings --use-flash-attn-v2: "
                                      "Megatron-DeepSpeed @6d4c535e megatron/model/"
                                      "transformer.py l. 130-134, 641-644, 777-778, 799-800")},
        "llama2 70b": {"unfused_ops": (("rope", "swiglu"),
                                       "llama2_70B/megatron/megatron_main.sh @1b5a030398: "
                                       "FlagScale @26cd664 legacy layer, "
                                       "megatron/model/transformer.py l. 138-145, 868-869"),
                       "repeat_kv": "FlagScale @26cd664 legacy layer: repeat_interleave "
                                    "before RoPE, megatron/model/transformer.py l. 855-864"},
        "llama3": {"dropout": _FLAGPERF_DROPOUT % "llama3_{8B,70B}/megatron/pretrain_llama3.sh"},
        "mixtral": {"dropout": _FLAGPERF_DROPOUT % "mixtral_8x7B/megatron/megatron_main.sh",
                    "unfused_ops": (("rope",),
                                    "mixtral_8x7B/megatron/megatron_main.sh @1b5a030398 "
                                    "--no-rope-fusion: Megatron-LM cac60ce4 "
                                    "rotary_pos_embedding.py l. 173-196")},
    },
}


#: Plan cells a source's launch files set where its tables' headers say otherwise (source id ->
#: (model prefix, precision or "" for both) -> ({"cp"/"vpp": value}, citation)); dp follows as
#: gpus / (tp*pp*cp). dgxc-bench-25.02 (@8f5cbb3799, tag v25.02) changed them in this release,
#: the commit that re-measured those tables, and left the table headers at their v25.01.1
#: (e6afea3) text, so the launch files are taken as the runs:
#: - nemotron/configure.sh l. 71-77: the 340B runs `CP=1`, `CP=2` when `DTYPE = bf16`, passed as
#:   `model.context_parallel_size=$CP` (absent at v25.01.1); the BF16 table went 4.77 -> 4.61 s
#:   at 128 GPUs, its header "(TP=8, PP=8, MBS=1, GA=16, VP=12)" (GA 16 is cp 1's) unchanged.
#: Kept for the record, not applied: nemo_megatron/gpt3_175b_hydra.yaml l. 57 sets
#: `virtual_pipeline_model_parallel_size: 6` (12 at v25.01.1; configure.sh overrides no parallel
#: size) and both GPT-3 tables were re-measured (128 GPUs BF16 8.91 -> 8.309 s, FP8 5.92 ->
#: 5.626 s) under headers still "VP=12". With vpp 6 the model sends half the interleaved p2p
#: messages, rows 62-65 went +15.8/+16.6/+6.8/+10.9 -> +18.7/+19.5/+10.8/+15.0 and LOSO all
#: 14.5 -> 14.6% (ranking 870 -> 868/896). With the p2p overlap costed (behaviour
#: `overlap_p2p_comm`, cost/sync.py; the YAML sets `overlap_p2p_comm: true`, `batch_p2p_comm:
#: false` l. 91-92) vpp 6 and 12 cost nearly the same (+21.6/+22.3/+14.6/+18.8 against
#: +21.4/+22.2/+14.0/+18.2), but the overlap itself is not applied to any row: set on every
#: interleaved row whose files state it (dgxc-bench-25.02's Llama 3.1 70B/405B, GPT-3, Nemotron-4
#: 340B, Grok-1; NeMo launcher 24.07's gpt3/175b, llama2_13b/70b, llama3_70b, nemotron_22b
#: YAMLs), with this vpp 6, it moved dgxc-bench-25.02 from 11.4 / +6.5 to 12.8 / +8.5 in-sample
#: (CV 8.3 / +2.0 -> 8.7 / +2.7), nemo-perf-24.07 from 11.0 / +10.6 to 13.0 / +12.9 (CV 9.2 /
#: +5.5 -> 10.0 / +7.6), mcore's CV (the refitted TP-overlap constant) 10.6 -> 12.6, and LOSO
#: all 14.1 / +8.0 -> 14.4 / +8.2% (held-out 16.2 -> 16.4%, ranking 870/896 unchanged): these
#: rows are already optimistic, the hidden transfers only add to it.
#: SMs the source's userbuffers configuration reserves from the forward GEMMs whose output it
#: reduce-scatters in `pipeline` mode (source id -> model prefix -> ((proj_fprop, fc2_fprop)
#: `num_sm` with `set_sm_margin: 1`, citation); behaviour `ub_rs_sm_margin`,
#: cost/efficiency.py `sm_reserve_stretch`). Both precisions run the same YAML; the
#: dgxc-bench-25.02 models not listed run `ub_tp_comm_overlap` with Transformer Engine's
#: default configuration (no SM margin: Nemotron-4 15B, and 340B via configure.sh) or without
#: userbuffers (Grok-1, Llama 3.1 8B at tp 1).
#: Kept for the record, not applied: the only launch setting that differs between a BF16 run
#: and its FP8 twin besides fp8 / fp8_hybrid / fp8_params (and 340B's cp, STATED_PLAN) is
#: `NVTE_UB_SPLIT_AG`, which nemo_megatron/ and nemotron/configure.sh take from
#: NeMo-Framework-Launcher's conditional_cfgs.py `get_ag_overlap` (0 on sm90 in BF16: "Disable
#: AG overlap with P2P ring-exchange at H100 BF16 training"); Transformer Engine stopped reading
#: that variable in v1.4 (bdf1afeef, "Use arguments instead of env vars for TP comm overlap"),
#: before NeMo 24.12's TE, so the BF16 runs keep the YAMLs' ring-exchange all-gathers. The
#: 405B FP8 runs also set `fp8_buf` on proj_fprop / fc2_fprop (fp8 reduce-scatter buffers).
UB_RS_SM_MARGIN: dict[str, dict[str, tuple[tuple[int, int], str]]] = {
    "dgxc-bench-25.02": {
        "llama 3.1 70b": ((24, 16), "llama3.1/llama3.1_70b.yaml @8f5cbb3799 "
                                    "ub_tp_comm_overlap_cfg: proj_fprop num_sm 24, fc2_fprop "
                                    "num_sm 16, pipeline, set_sm_margin 1"),
        "llama 3.1 405b": ((24, 8), "llama3.1/llama3.1_405b.yaml @8f5cbb3799 "
                                    "ub_tp_comm_overlap_cfg: proj_fprop num_sm 24, fc2_fprop "
                                    "num_sm 8, pipeline, set_sm_margin 1"),
        "gpt-3 175b": ((24, 20), "nemo_megatron/gpt3_175b_hydra.yaml @8f5cbb3799 "
                                 "ub_tp_comm_overlap_cfg: proj_fprop num_sm 24, fc2_fprop "
                                 "num_sm 20, pipeline, set_sm_margin 1"),
    },
    # the NeMo-Framework-Launcher 24.07 training YAMLs that set `ub_tp_comm_overlap: true` and
    # name a tp_overlap file (launcher_scripts/conf/training/tp_overlap/*.yaml @24.07)
    "nemo-perf-24.07": {
        "llama2-70b": ((24, 16), "llama/llama2_70b.yaml -> tp_overlap/ub_cfg_h100_h8192_tp4_"
                                 "mbs1_seqlen4096.yaml (24.07): proj_fprop / fc2_fprop num_sm "
                                 "24 / 16, pipeline, set_sm_margin 1"),
        "llama3-70b": ((24, 16), "llama/llama3_70b.yaml -> tp_overlap/ub_cfg_h100_h8192_tp4_"
                                 "mbs1_seqlen8192.yaml (24.07): proj_fprop / fc2_fprop num_sm "
                                 "24 / 16, pipeline, set_sm_margin 1"),
        "gpt3-20b": ((16, 24), "gpt3/20b.yaml -> tp_overlap/ub_cfg_h100_h6144_tp2_mbs2_"
                               "seqlen2048.yaml (24.07): proj_fprop / fc2_fprop num_sm 16 / 24, "
                               "pipeline, set_sm_margin 1"),
    },
}


STATED_PLAN: dict[str, dict[tuple[str, str], tuple[dict[str, int], str]]] = {
    "dgxc-bench-25.02": {
        ("nemotron-4 340b", "bf16"): ({"cp": 2}, "cp=2 in BF16 (nemotron/configure.sh "
                                                 "@8f5cbb3799)"),
        ("gpt-3 175b", ""): ({"vpp": 6}, "vpp=6 (nemo_megatron/gpt3_175b_hydra.yaml l. 57 "
                                         "@8f5cbb3799)"),
    },
}


#: Plan cells of mbridge-perf rows where the performance-summary table disagrees with the
#: Megatron-Bridge performance config of the row's own container, keyed by (model prefix, GPU
#: prefix, container in `framework_version`) -> ({"ep"/"vpp"/"mbs": value}, citation); the config is
#: taken as the run (NVIDIA-NeMo/Megatron-Bridge, read at the mirror; NeMo 25.11 ships
#: Megatron-Bridge v0.2.0 = 717c62de40, docs/releases/software-versions.md @067f987df):
#: - GPT-OSS 120B, 64 B200, BF16, GBS 512 (25.11 table: EP 8): v0.2.0 scripts/performance/
#:   configs/gpt_oss/workload_base_configs.py `GPT_OSS_120B_B200_BF16_BASE_CONFIG` sets
#:   `expert_model_parallel_size=64`, `micro_batch_size=4` (since 34641780a, 2025-11-20, "fix
#:   GPT-OSS perf scripts"), and the GBS-512 B200 config keeps EP 64 in v0.3.0/v0.3.1/v0.4.x
#:   (`..._B200_BF16_V1`); EP 8 (with HybridEP) is only the GBS-1280 `_V2` of v0.4.0. The
#:   archive's tables follow the configs elsewhere: 26.02 (v0.3.0, V2 = V1 + GBS 1280, EP 64)
#:   states EP 64 at 8,047 tokens/s/GPU, 26.02.01 EP 8 at 13,722; this row's 8,213 is the EP-64
#:   figure. Its GA cell (2) holds for either EP (dp = 64).
#: - Qwen3 30B-A3B, 16 H100, FP8-CS (25.11 table: VP 24): every version of v0.2.0's
#:   scripts/performance/configs/qwen3/workload_base_configs.py
#:   `QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG` (fbf96a3dc .. 717c62de40) sets
#:   `pipeline_model_parallel_size=2`, `virtual_pipeline_model_parallel_size=12` (24 is the
#:   layers per pipeline stage, 48 / 2). Its micro-batch stays the table's 2 (GA 32 agrees):
#:   the config had `micro_batch_size=2` until 8aed9a229 (2025-11-21), which dropped it to 1 and
#:   added `moe_a2a_overlap` together, so the table's cells are the earlier config's, without
#:   the EP overlap (87aa39ce7: pp 2, vpp 12, mbs 2, no dispatcher backend, no CUDA graphs;
#:   qwen3_llm_pretrain.py: recompute off, `moe_router_fusion`; Qwen3MoEModelProvider:
#:   alltoall, `moe_permute_fusion`, grouped GEMM, no `moe_router_padding_for_fp8`).
#:   Kept for the record (predicted +114%, nothing costed): the same archive file times this
#:   plan's pipeline layout at about 33 ms per layer and micro-batch whatever the micro-batch:
#:   25.11 mbs 2 (5,275 tokens/s/GPU: 24.8 s / (32 x 24)) and 26.02 (Megatron-Bridge v0.3.0
#:   `QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1`: pp 2, vpp 12, ep 8, DeepEP, EP overlap)
#:   mbs 1 GBS 1024 (5,113: 51.3 s / (64 x 24)); the 25.09 table's token-drop run of the same
#:   plan (16 H100, mbs 2, PP 2, EP 8) made 10,494 (16.3 ms). The next patch release's table
#:   (26.02.01) prints the same cells (pp 2, vpp 12, ep 8, mbs 1, GBS 1024) at 9,058, but its
#:   Megatron-Bridge v0.3.1 `QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1` runs pp 1, ep 16,
#:   HybridEP, no EP overlap (the cells look carried over), as 26.04 (v0.4.0) states at 8,901
#:   (9.7 ms at mbs 1). The model predicts about the token-drop figure here
#:   (11,289) and on the 8 B200 mbs-1 row (16,604 against 25.09's token-drop 18,066 and 25.11's
#:   dropless 9,299). A cost fixed per layer and micro-batch that only the
#:   dropless pp-2 layout pays is no mechanism read in the sources: the interleaved schedule
#:   (get_schedule_table, group = pp) with a per-chunk P2P latency of 0.7-3 ms adds 0.06-0.16 s
#:   to this row's step (simulated; sync.py's overlap already hides the steady state), and
#:   TE v2.9's current-scaling `split_quantize` (cast.cpp: per-expert allocation, amax,
#:   scale and cast launches) adds host ops to a layer that stays GPU-bound in moe_host.py.
#: - GPT-OSS 120B, 64 H100, BF16, GBS 512 (25.11 table: MBS 4, EP 8, GA 2, the B200 row's cells
#:   with PP 4; GA 2 contradicts gbs / (mbs * dp) = 8): v0.2.0's
#:   `GPT_OSS_120B_H100_BF16_BASE_CONFIG` sets `pipeline_model_parallel_size=4` on the base's
#:   `expert_model_parallel_size=8`, `micro_batch_size=1` (GA 512 / 16 = 32); the same in
#:   v0.4.x `_H100_BF16_V1`, whose GBS-1280 `_V2` the 26.04.01 table states as MBS 1.
#: Kept for the record (the per-step costs of these MoE rows, read in Megatron-Core 0d8e0714 =
#: v0.2.0's 3rdparty/Megatron-LM and d7288711 = v0.4.1's; nothing added): the same-plan pair
#: rows 32 / 44 (GPT-OSS H100 pp4 ep8 mbs1, 32 and 80 micro-batches, 25.11 / 26.04.01) gives
#: 0.172 s per micro-batch + 0.32 s per step measured against the model's 0.143 + 0.46, so
#: the gap is per micro-batch; 38 / 47 are no pair (EP 64 alltoall vs EP 8 HybridEP). Expert
#: gradients sit in their own DDP buffers (`expert_parallel_buffers`,
#: distributed/distributed_data_parallel.py:316-321) reduced over the expert-DP group, in
#: buckets of max(40M, 1M x dp) parameters (:58-60), overlapped like the dense ones; with
#: `overlap_param_gather` the distributed optimizer skips its synchronous all-gather
#: (optimizer/distrib_optimizer.py:2593-2599) and the forward pre-hooks gather one bucket
#: group ahead in the next step's first forward (param_and_grad_buffer.py:283-301), a window
#: cost/steptime.py does not split out (charging all-gather and reduce-scatter against the last
#: backward: 0.709 s exposed on row 47 against 0.46 s with the split; the split over
#: every overlapped Megatron row moved in-sample all 12.1 / +6.2% to 12.2 / +6.5%, not
#: applied). The perf runs turn off `check_for_nan_in_grad` and `check_for_nan_in_loss`
#: (scripts/performance/utils/helpers.py v0.2.0 `set_common_perf_overrides`; overrides.py
#: v0.4.1), leave `num_distributed_optimizer_instances` at 1; the grad-norm all-reduce, the
#: per-step loss / MoE-metric reductions (`log_interval = 1`) and the calculate_per_token_loss
#: token-count all-reduce are a few elements each.
BRIDGE_STATED_PLAN: dict[tuple[str, str, str], tuple[dict[str, int], str]] = {
    ("gpt oss", "b200", "NeMo 25.11"): (
        {"ep": 64}, "ep=64 (Megatron-Bridge v0.2.0 scripts/performance/configs/gpt_oss/"
                    "workload_base_configs.py GPT_OSS_120B_B200_BF16_BASE_CONFIG)"),
    ("gpt oss", "h100", "NeMo 25.11"): (
        {"mbs": 1}, "mbs=1 (Megatron-Bridge v0.2.0 scripts/performance/configs/gpt_oss/"
                    "workload_base_configs.py BASE_GPT_OSS_120B_CONFIG, H100 BF16)"),
    ("qwen3 30b", "h100", "NeMo 25.11"): (
        {"vpp": 12}, "vpp=12 (Megatron-Bridge v0.2.0 scripts/performance/configs/qwen3/"
                     "workload_base_configs.py QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG)"),
}


def _stated_plan(r: dict[str, str]) -> tuple[dict[str, int], str] | None:
    """(plan cells, citation) a row's source's launch files set for its model and precision
    (for mbridge-perf rows: its container's performance config, BRIDGE_STATED_PLAN)."""
    if r["source_id"] == "mbridge-perf":
        model, gpu = _model_name(r), r["gpu"].lower()
        return next((v for (m, g, c), v in BRIDGE_STATED_PLAN.items()
                     if model.startswith(m) and g in gpu and c in r["framework_version"]),
                    None)
    table = STATED_PLAN.get(r["source_id"], {})
    prec = r["precision"].strip().lower()
    return next((v for (m, p), v in table.items()
                 if _model_name(r).startswith(m) and p in ("", prec)), None)


#: Argument defaults of the plain Megatron-LM commits rows state as their software, for the
#: flags a row's source does not state (`megatron/arguments.py` at that commit; read at the
#: NVIDIA/Megatron-LM mirror). 285068c8 (2023-01-11, MegaScale's baseline): `--use-flash-attn`
#: store_true (l. 655: attention through the fused-softmax kernel otherwise),
#: `--attention-dropout` / `--hidden-dropout` default 0.1 (ll. 531-534),
#: `--use-distributed-optimizer` store_true (l. 874); with bf16, gradients are accumulated and
#: all-reduced in fp32 (ll. 155-158), as the megatron-bf16 recipe has it. Those defaults alone
#: do not fit a 175B model on 80 GB (attention scores materialised on every layer), so the
#: memory flags are the ones Megatron-LM's authors give for GPT-3 175B at that time: sequence
#: parallelism with selective recomputation (`--sequence-parallel`, `--recompute-activations`;
#: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
#: MLSys 2023, Table 5: GPT-3 175B with both; the Megatron-LM README of 2022 reports its
#: scaling table with the same two). The interleaved schedule's p2p ran exposed: Megatron-LM
#: gained `--overlap-p2p-communication` (store_true) in f9283c5a8a, 2023-05-31, and made the
#: overlap the default (`--no-overlap-p2p-communication`) in 4eeff55d1f, 2023-10-23, both after
#: 285068c8 (`git merge-base --is-ancestor` at the mirror: neither is its ancestor).
MEGATRON_LM_DEFAULTS: dict[str, dict[str, object]] = {
    "285068c8": {"distributed_optimizer": False,
                 "memory": "sequence parallelism + selective recompute (Korthikanti et al. "
                           "2022, the Megatron-LM authors' 175B setting)",
                 "overlap_p2p": (False, "Megatron-LM 285068c8 (2023-01-11) has no p2p overlap: "
                                        "the option came with f9283c5a8a (2023-05-31), the "
                                        "default with 4eeff55d1f (2023-10-23)")},
}


def _megatron_lm_defaults(r: dict[str, str]) -> dict[str, object]:
    """MEGATRON_LM_DEFAULTS of a plain Megatron-LM row's stated commit, with the commit under
    "commit" ({} otherwise)."""
    if r["framework"] != "megatron":
        return {}
    m = re.search(r"Megatron-LM commit ([0-9a-f]{7,40})", r["framework_version"])
    if m is None:
        return {}
    return next(({"commit": k, **v} for k, v in MEGATRON_LM_DEFAULTS.items()
                 if m.group(1).startswith(k)), {})


#: The `assumed` note of an interleaved Megatron-Core row whose source states no p2p overlap
#: setting: it runs the megatron-bf16 / megatron-fp8 recipe's, Megatron-LM main's default
#: (spec/recipe.py MEGATRON_MAIN_P2P_OVERLAP). No row of the corpus takes it (every
#: interleaved row's source or software era states the setting; tests/cost/
#: test_validation_data.py checks that).
P2P_MAIN_DEFAULT = "Megatron-LM main default; the source states no setting"


def _p2p_overlap(stated: Mapping[str, object], defaults: Mapping[str, object]
                 ) -> tuple[bool, str]:
    """(overlap_p2p_comm, citation) of an interleaved Megatron-Core row: what the source's
    files state (STATED_SETTINGS `overlap_p2p` / `no_overlap_p2p`), else the default of the
    plain Megatron-LM commit it names (MEGATRON_LM_DEFAULTS `overlap_p2p`), else the recipe's
    (Megatron-LM main: on, flagged P2P_MAIN_DEFAULT)."""
    if stated.get("overlap_p2p"):
        return True, str(stated["overlap_p2p"])
    if stated.get("no_overlap_p2p"):
        return False, str(stated["no_overlap_p2p"])
    era = defaults.get("overlap_p2p")
    if isinstance(era, tuple):
        return bool(era[0]), str(era[1])
    return True, P2P_MAIN_DEFAULT


#: The first NeMo container of Megatron-Core 0.13 (tag core_v0.13.0, c550cf6c41, 2025-07-25,
#: the first tag holding 2659630721 "Memory efficient token permutation", which moved the
#: router-probability scaling from the unpermute into the experts' activation): NeMo
#: containers ship a released Megatron-Core, and 25.07 is the first one dated after it.
#: Megatron-Bridge rows run Megatron-Core 0.14 or later (Megatron-Bridge v0.1.0 pyproject:
#: megatron-core>=0.14.0a0; v0.2.0: >=0.15.0a0).
_NEMO_MCORE_013 = (25, 7)


def _mcore_before_013(r: dict[str, str]) -> bool:
    """Whether the row's stated software is a Megatron-Core older than 0.13 (its MoE layers
    scale by the router probabilities at the combine: behaviour `moe_prob_scaling`)."""
    ver = r["framework_version"]
    if "megatron-bridge" in ver.lower():
        return False
    m = re.search(r"core_v0\.(\d+)", ver)
    if m is not None:
        return int(m.group(1)) < 13
    m = re.search(r"NeMo (\d\d)\.(\d\d)", ver)
    return m is not None and (int(m.group(1)), int(m.group(2))) < _NEMO_MCORE_013


def _plain_mcore_minor(r: dict[str, str]) -> int | None:
    """The Megatron-Core minor version (core_v0.N) a plain Megatron-LM row states, or None.
    `moe_comm.allgather_permute_bytes` counts the allgather dispatcher of core_v0.6.0."""
    m = re.search(r"core_v0\.(\d+)", r["framework_version"])
    return int(m.group(1)) if m is not None and r["framework"] == "megatron" else None


def _model_name(r: dict[str, str]) -> str:
    """The row's model name as the lookup tables spell their prefixes."""
    return r["model"].lower().replace("_", " ")


T = TypeVar("T")


def _for_model(table: Mapping[str, T], r: dict[str, str]) -> T | None:
    """The entry of a model-prefix table that this row's model name starts with, or None."""
    return next((v for k, v in table.items() if _model_name(r).startswith(k)), None)


#: Layer-shape flags a source's launch command leaves at its framework's defaults, where the
#: row's public model config says otherwise (source id -> model prefix -> (ModelSpec updates,
#: citation)):
#: - FlagPerf Llama 3 on Megatron-Core core_v0.6.0 (cac60ce4): pretrain_llama3.sh @1b5a030398
#:   passes neither --position-embedding-type rope / --use-rotary-position-embeddings, nor
#:   --untie-embeddings-and-output-weights, nor --disable-bias-linear, so arguments.py @core_v0.6.0
#:   defaults hold: learned absolute position embeddings (l. 709), the output layer sharing the
#:   word embedding (l. 754, store_true), biases on every linear layer (l. 1033, store_false
#:   `add_bias_linear`). RMSNorm and SwiGLU are passed.
#: - FlagPerf Llama 2 7B on Megatron-DeepSpeed: megatron-deepspeed_main.sh @1b5a030398 builds the
#:   command in one double-quoted string with backslash continuations and runs `eval $cmd`; the
#:   line `#--recompute-activations \` puts a `#` word inside it, so eval reads everything after
#:   it as a comment: `--normalization rmsnorm`, `--disable-bias-linear`,
#:   `--num-key-value-heads` and the ds_args (whose `--zero-stage=$ZERO_STAGE` is empty and
#:   would not parse) never reach pretrain_gpt.py. Megatron-DeepSpeed's defaults
#:   (microsoft/Megatron-DeepSpeed megatron/arguments.py @6d4c535e, the last commit before the
#:   case was added on 2024-02-06): `--normalization` layernorm (l. 635), biases on (l. 907);
#:   the kv heads default to the 32 heads, as stated.
_BIASES = {"qkv_bias": True, "attn_out_bias": True, "mlp_bias": True}
#: - OLMo-core's OLMo-1124 models (the olmo-core rows): `TransformerConfig.olmo_{1B,7B,13B}`
#:   (nn/transformer/config.py @a7de3f651c) are `llama_like` (SwiGLU FFN, RMSNorm, RoPE, no
#:   biases) with `qk_norm=True` and the reordered-norm block (OLMo 2: each sublayer's output
#:   normed before the residual add, in place of the input pre-norm: the same two norms per
#:   layer, costed at the pre-norm positions). OLMo-core's q / k norms are RMSNorms over the
#:   whole q and k projections (`qk_norm.build(size=d_model)`, nn/attention.py), the model's
#:   `qk_norm` per head: the same elementwise traffic, 2·(h − head_dim) fewer norm weights
#:   per layer (under 0.03% of the parameters).
STATED_SHAPE: dict[str, dict[str, tuple[dict[str, object], str]]] = {
    "olmo-core": {
        "olmo-1124": ({"mlp": "swiglu", "norm": "rmsnorm", "qk_norm": True},
                      "SwiGLU, RMSNorm, QK-norm (OLMo-core TransformerConfig.olmo_* "
                      "@a7de3f651c; whole-projection q/k norms costed per head)"),
    },
    "flagperf": {
        "llama3": ({"position_embedding": "learned", "tie_embeddings": True, **_BIASES},
                   "learned absolute positions, tied output layer, linear biases "
                   "(pretrain_llama3.sh leaves Megatron core_v0.6.0 defaults)"),
        "llama2 7b": ({"norm": "layernorm", **_BIASES},
                      "LayerNorm and linear biases (megatron-deepspeed_main.sh: the "
                      "'#--recompute-activations' line comments out the flags after it under "
                      "eval; Megatron-DeepSpeed defaults)"),
    },
}


def _stated_shape(r: dict[str, str]) -> tuple[dict[str, object], str] | None:
    """The STATED_SHAPE updates and citation of this row's source and model, or None."""
    return _for_model(STATED_SHAPE.get(r["source_id"], {}), r)


def _stated_settings(r: dict[str, str]) -> dict[str, object]:
    """The STATED_SETTINGS of this row's source and model ({} when none are listed)."""
    listed = _for_model(STATED_SETTINGS.get(r["source_id"], {}), r) or {}
    if _card_settings(r).get("grads") == "bf16":
        return {**listed, "bf16_grads": "the card's recipe: grad_reduce_in_fp32=False"}
    return listed


def _bridge_recompute_modules(r: dict[str, str]) -> tuple[str, ...] | None:
    """The recompute modules the Megatron-Bridge perf recipe of this row's model sets."""
    if _card_settings(r).get("recompute_modules"):
        return tuple(_card_settings(r)["recompute_modules"].split("/"))
    if r["source_id"] != "mbridge-perf":
        return None
    model = _model_name(r)
    gpu = r["gpu"].lower()
    pp = _int(r["pp"])
    for (m, g, p), mods in BRIDGE_RECOMPUTE_MODULES.items():
        if model.startswith(m) and g in gpu and p in (None, pp):
            return mods
    return None


def _stated_grad_accum(notes: str) -> int | None:
    """The gradient-accumulation cell a row's notes record from its source table ("source GA
    column says N" / "Source GA N"), None where the source states none."""
    m = re.search(r"[Ss]ource GA (?:column says )?(\d+)", notes)
    return int(m.group(1)) if m else None


def _family(r: dict[str, str]) -> str | None:
    fw = r["framework"]
    if fw in ("nemo", "megatron"):
        return "megatron-core"
    if fw in ("pytorch-fsdp", "torchtitan", "megatron-deepspeed", "olmo-core",
              "automodel"):
        return fw
    if fw == "other" and "maxtext" in r["model"].lower():
        return "maxtext"
    return None


#: Megatron-Bridge 067f987df0 src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py
#: `_get_deepseek_v3_pipeline_layout` (the perf recipes' default layout per (pp, vpp)): decoder
#: layers of every model chunk in layout order; the first chunk also holds the embedding, the
#: last the MTP module and the loss.
_DEEPSEEK_V3_LAYOUTS: dict[tuple[int, int], tuple[int, ...]] = {
    (8, 2): (4,) * 15 + (1,),
    (4, 4): (4,) * 15 + (1,),
    (4, 2): (8,) * 7 + (5,),
}


def _bridge_layout(name: str, L: int, pp: int, vpp: int) -> tuple[tuple[int, ...] | None, str]:
    """The layer layout a Megatron-Bridge performance recipe gives an interleaved pipeline whose
    pp*vpp chunks do not divide the layers (chunk_layers, or None for the plan's default split),
    and the `assumed` note: the tables name pp and vpp, never the layout.

    - Llama 3.1 405B and Qwen3 235B-A22B: the recipes' base configs set
      account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split
      (067f987df0 recipes/llama/h100/llama3.py:1227-1228, recipes/qwen/h100/qwen3_moe.py
      `qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config`): the plan's default split.
    - DeepSeek-V3: perf_recipes/deepseek/h100/deepseek_v3.py:48 lays pp 8 x vpp 4 out as
      "Et|(tt|)*30mL" (= the plan's default split); other (pp, vpp) use `_DEEPSEEK_V3_LAYOUTS`.
    """
    if "deepseek" in name.lower() and (pp, vpp) in _DEEPSEEK_V3_LAYOUTS:
        layout = _DEEPSEEK_V3_LAYOUTS[pp, vpp]
        return layout, ("layout " + ":".join(map(str, layout))
                        + " (Megatron-Bridge DeepSeek-V3 default for this pp x vpp)")
    if "deepseek" in name.lower():
        return None, ("layout Et|(tt|)*30mL: embedding and loss as layer slots "
                      "(Megatron-Bridge DeepSeek-V3 H100 perf recipe)")
    return None, ("embedding and loss as pipeline layer slots (Megatron-Bridge recipe: "
                  "--account-for-embedding/loss-in-pipeline-split)")


def heldout_rows(knobs: Mapping[str, float] | None = None) -> list[HeldOutRow]:
    """Every held-out row; the ones that cannot be evaluated carry `skip`. `knobs` overrides
    the tuned constants (validate.TUNED) for the rows that use them."""
    with open(DATA / "published_runs_heldout.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    out: list[HeldOutRow] = []
    for i, r in enumerate(rows):
        assumed: list[str] = []
        src = r["source_id"]
        name = r["model"]
        measured = float(r["measured_tokens_per_s_per_gpu"] or 0) or None
        mem = float(r["measured_memory_gib"] or 0) or None

        def skip(why: str, fam: str = "", _i: int = i, _n: str = name, _s: str = src,
                 _m: float | None = measured) -> None:
            out.append(HeldOutRow(_i, _n, _s, fam, None, None, CostOptions(), _m, None,
                                  skip=why))

        family = _family(r)
        if family is None:
            skip(f"framework {r['framework']!r} ({r['framework_version'][:40]}) has no recipe")
            continue
        if measured is None:
            skip("no tokens/s/GPU measured", family)
            continue
        gpus = _int(r["num_gpus"])
        tp, pp = _int(r["tp"]), _int(r["pp"])
        seq, gb = _int(r["seq_len"]), _int(r["global_batch"])
        if gpus is None or tp is None or pp is None or seq is None or gb is None:
            skip("plan, sequence or batch not stated", family)
            continue
        cp = _int(r["cp"]) or 1
        vpp = _int(r["vpp"]) or 1
        ep = _int(r["ep"]) or 1
        dp = _int(r["dp"])
        am = automodel.settings(r)
        if am and automodel.pipeline_ga_gap(am, pp):
            skip("not expressible: " + automodel.pipeline_ga_gap(am, pp), family)
            continue
        stated_plan = _stated_plan(r)
        if stated_plan is not None:
            cells, why = stated_plan
            if cells.get("cp", cp) != cp:
                cp, dp = cells["cp"], None
            vpp = cells.get("vpp", vpp)
            ep = cells.get("ep", ep)
            assumed.append(why)
        if dp is None:
            if gpus % (tp * pp * cp):
                skip("gpus not a multiple of tp*pp*cp", family)
                continue
            dp = gpus // (tp * pp * cp)
        if dp * tp * pp * cp != gpus:
            skip(f"tp*pp*cp*dp = {dp * tp * pp * cp} != {gpus} GPUs", family)
            continue
        mbs = _int(r["micro_batch"])
        if stated_plan is not None and "mbs" in stated_plan[0]:
            mbs = stated_plan[0]["mbs"]
        if mbs is None:
            mbs = 1
            assumed.append("mbs=1")
        if gb % (dp * mbs):
            skip(f"global batch {gb} not a multiple of dp*mbs = {dp * mbs}", family)
            continue
        ga = _stated_grad_accum(r["notes"])
        if stated_plan is not None and "mbs" in stated_plan[0]:
            ga = None  # the launch files set the micro-batch: the table's GA cell follows it
        if ga is not None and ga != gb // (dp * mbs):
            # the source's own cells disagree (a table row whose GA cell does not match its
            # batch, micro-batch and parallel cells): which of them is wrong is not known, so
            # the run's plan cannot be written down
            skip(f"the source's GA cell ({ga}) contradicts gbs/(mbs*dp) = {gb // (dp * mbs)}",
                 family)
            continue
        model = _model(r, assumed)
        if model is None:
            skip("model shape not stated", family)
            continue
        shape = _stated_shape(r)
        if shape is not None:
            model = model.model_copy(update=shape[0])
            assumed.append(shape[1])
        if am and model.mtp_layers:
            # AutoModel's DeepseekV3ForCausalLM (components/models/deepseek_v3/model.py
            # @364f600be) builds no multi-token-prediction module
            model = model.model_copy(update={"mtp_layers": 0})
            assumed.append("no MTP module (AutoModel's DeepSeek-V3 model has none)")
        ng = _node_group(r["gpu"], gpus)
        if ng is None:
            skip(f"GPU {r['gpu']!r} not modelled", family)
            continue
        group, _ = ng
        if "4 opa links per node" in r["extra_config"].lower():
            group = group.model_copy(update={"inter_node": OPA_4X100})
            assumed.append("inter-node 4 x 100 Gb/s Omni-Path per node (the source's hardware)")
        precision = r["precision"].strip()
        if not precision:
            precision = "bf16"
            assumed.append("bf16 (precision not stated)")
        moe_comm = _bridge_moe_comm(r, tp, pp, vpp, ep, mbs) \
            if family == "megatron-core" else None
        if moe_comm is not None and not _int(r["moe_experts"]):
            # a dense card row: only the recipe's TP overlap applies
            moe_comm = ("alltoall", False, moe_comm[2])
        got = _recipe(family, precision, r, tp, assumed,
                      None if moe_comm is None else moe_comm[2])
        if got is None:
            skip("no recipe", family)
            continue
        recipe, sp_rule, tags = got
        if "megatron_tp_overlap" in tags:
            name_k = tags[0]
            recipe = recipe.with_behaviour(tp_comm_overlap=knob(knobs, name_k))
            assumed.append(flag(name_k, knobs))
        if "h100_96_peak" in tags:
            peak = knob(knobs, "h100_96_peak")
            group = group.model_copy(update={"gpu": group.gpu.model_copy(update={
                "bf16_tflops": peak, "fp8_tflops": 2 * peak})})
            assumed.append(flag("h100_96_peak", knobs))
        if recipe.compute_dtype == "fp8" and group.gpu.fp8_tflops is None:
            skip("fp8 on a GPU without fp8", family)
            continue
        recompute = _recompute(r["recompute"])
        stated_rc = _stated_settings(r).get("recompute") if family == "megatron-core" else None
        if recompute is None and stated_rc is not None:
            recompute = str(stated_rc)
            assumed.append(f"{recompute} recompute (the source's YAML)")
        modules = _bridge_recompute_modules(r) if family == "megatron-core" else None
        if recompute in (None, "selective") and modules is not None:
            # the Megatron-Bridge performance recipe of this model and GPU states them
            recompute = "selective"
            recipe = recipe.with_behaviour(recompute_modules=modules)
            assumed.append("selective recompute of " + "/".join(modules) + (
                " (the card's recipe)" if src == CARD_SOURCE
                else " (Megatron-Bridge perf recipe @067f987)"))
        if family == "megatron-core" and _model_name(r).startswith(CLAMPED_GLU_BIAS_MODELS):
            recipe = recipe.with_behaviour(moe_glu_clamp_bias=True)
            assumed.append("eager clamp/cat before the fused quick-GEGLU and fp32 per-expert fc2 "
                           "bias (Megatron-Core core_v0.15.0-0.18.0 TEGroupedMLP, GPT-OSS "
                           "clamp 7.0 + expert biases per Megatron-Bridge gpt_oss_bridge.py)")
        if _card_settings(r).get("dp_overlap") == "0":
            # the card's recipe sets ddp.overlap_grad_reduce=False
            recipe = recipe.with_behaviour(dp_overlap=False)
            assumed.append("DP reduction not overlapped (the card's recipe)")
        lm_defaults = _megatron_lm_defaults(r)
        if recompute is None and family == "maxtext":
            # MaxText's configs/base.yml default `remat_policy: 'full'`
            recompute = "full"
            assumed.append("full remat (MaxText default remat_policy)")
        elif recompute is None and lm_defaults:
            # the memory flags of MEGATRON_LM_DEFAULTS (sp follows from the "tp>1" rule)
            recompute = "selective"
        elif recompute is None:
            recompute = "none"
            assumed.append("no recompute (not stated)")
        zero = automodel.zero_stage(am, pp, assumed) if am else _zero(r["zero_stage"])
        if zero is None and lm_defaults:
            zero = 1 if lm_defaults["distributed_optimizer"] else 0
        elif zero is None:
            zero = 1 if family in ("megatron-core", "megatron-deepspeed") else 0
            assumed.append(f"zero={zero} (distributed optimizer)" if zero else "zero=0")
        sp = 1 if (r["sp"].strip().lower() == "yes" or (sp_rule == "tp>1" and tp > 1)) else 0
        if sp and r["sp"].strip().lower() != "yes":
            assumed.append("sp with tp")
        L = model.num_layers
        stage_layers: tuple[int, ...] | None = None
        chunk_layers: tuple[int, ...] | None = None
        if am and vpp > 1:
            chunk_layers = automodel.chunk_layers(am, L, pp, vpp)
            if chunk_layers is None:
                skip(f"{L} layers: the YAML's layers_per_stage does not give pp {pp} x vpp "
                     f"{vpp} virtual stages", family)
                continue
            assumed.append("virtual stages " + ":".join(map(str, chunk_layers))
                           + " (AutoModel autopipeline split of layers_per_stage)")
        elif L % (pp * vpp) and vpp > 1:
            if family != "megatron-core":
                skip(f"{L} layers on pp {pp} x vpp {vpp}: no recipe layout for {family}",
                     family)
                continue
            chunk_layers, why = _bridge_layout(name, L, pp, vpp)
            assumed.append(why)
        elif L % (pp * vpp):
            # first and last stages hold the remainder less (Megatron-DeepSpeed
            # 'type:transformer|embedding', Llama 3's one fewer layer on the edge stages)
            base = -(-L // pp)
            edge = (L - base * (pp - 2)) // 2 if pp > 2 else L // 2
            stage_layers = tuple([edge] + [base] * (pp - 2) + [L - edge - base * (pp - 2)])
            assumed.append(f"stage layers {stage_layers[0]}/{base}/{stage_layers[-1]}")
        etp = _bridge_expert_tp(r) if family == "megatron-core" else None
        where = "the card's recipe" if src == CARD_SOURCE else "Megatron-Bridge recipe @067f987"
        if etp is not None:
            assumed.append(f"etp={etp} ({where})")
        if moe_comm is not None and _int(r["moe_experts"]):
            dispatcher, overlap, _ = moe_comm
            recipe = recipe.with_behaviour(ep_dispatcher=dispatcher, ep_overlap=overlap)
            assumed.append(f"{dispatcher} MoE dispatcher" + (", EP overlap" if overlap else "")
                           + f" ({where})")
        graphs = _bridge_cuda_graphs(r, mbs) if _int(r["moe_experts"]) else ()
        if graphs:
            recipe = recipe.with_behaviour(cuda_graph_scopes=graphs)
            assumed.append("TE CUDA graphs of " + "/".join(graphs) + f" ({where})")
        if family == "megatron-core" and _int(r["moe_experts"]) and _mcore_before_013(r):
            recipe = recipe.with_behaviour(moe_prob_scaling="combine")
            assumed.append("router probabilities applied at the combine (Megatron-Core "
                           "before 0.13)")
        if moe_comm is None and _int(r["moe_experts"]) and _plain_mcore_minor(r) == 6:
            # a plain Megatron-LM launch that names no dispatcher runs the default
            recipe = recipe.with_behaviour(ep_dispatcher="allgather")
            assumed.append("allgather MoE dispatcher (Megatron core_v0.6.0 default, "
                           "arguments.py l. 1592-1594; the launch sets none)")
        cl = ClusterSpec(name=group.name, node_groups=[group])
        try:
            job = Job(model=model, cluster=cl, recipe=recipe, seq_len=seq, global_batch=gb)
            plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sp=sp, zero=zero, mbs=mbs,
                        num_microbatches=gb // (dp * mbs), recompute=recompute,
                        stage_layers=stage_layers, chunk_layers=chunk_layers, etp=etp)
        except ValueError as exc:
            skip(f"not expressible: {str(exc).splitlines()[0][:80]}", family)
            continue
        bad = plan_violations(job, plan)
        if bad:
            skip("plan breaks: " + "; ".join(bad), family)
            continue
        out.append(HeldOutRow(i, name, src, family, job, plan, recipe_options(recipe),
                              measured, mem, assumed, knobs=tags))
    return out
