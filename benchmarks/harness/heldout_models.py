"""Held-out rows to clusters and models: the interconnects the sources name, the node groups of
the CSV's GPU text, and the model specs (packaged models, Hugging Face configs, sliding windows)
with the recompute and ZeRO cells."""

from __future__ import annotations

from autoparallel_cp.spec import LinkSpec, ModelSpec, MoESpec, NodeGroup
from autoparallel_cp.spec.loaders import load_cluster, load_model
from harness import heldout_automodel as automodel
from harness.corpus import H100_96_500W, NDR_IB, NVLINK4
from harness.heldout_common import DATA, _for_model, _int

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

#: FlagPerf's H800 hosts: "多机网络类型、带宽: InfiniBand, 200Gb/s" (training/nvidia/*/README.md
#: @1b5a030398, H800 environment sections), read per GPU as on its A800 hosts (one 200 Gb/s
#: HDR/NDR200 port per GPU, 25 GB/s), where the dgx-h800 preset has 400 Gb/s per GPU.
IB_200_PER_GPU = LinkSpec(bandwidth_gbps=200 / 8, latency_us=8.0,
                          source="FlagPerf H800 README: InfiniBand 200 Gb/s, one port per GPU")


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
