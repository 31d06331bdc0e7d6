"""Held-out rows of the Megatron-Bridge sources (mbridge-perf, mbridge-cards): the settings the
bridge's performance recipes set (recompute modules, MoE communication, CUDA graphs, expert TP)
and its uneven pipeline layouts, each table cited at the recipe's commit."""

from __future__ import annotations

from harness.heldout_common import _card_settings, _for_model, _int, _model_name

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
