"""Hugging Face `config.json` -> `ModelSpec`.

Field names follow the transformers configuration classes (LlamaConfig, MistralConfig,
MixtralConfig, Qwen2Config, GPT2Config, DeepseekV2Config / DeepseekV3Config, Qwen3Config,
Qwen3MoeConfig, Qwen2MoeConfig, GptOssConfig, Gemma2Config, Gemma3TextConfig). The result uses
the same conventions as the presets in `models/`: `num_kv_heads` / `head_dim` are set only when
they differ from the multi-head default, so that an imported config equals its preset.
The newer families (Qwen3, Qwen3-MoE, Qwen2-MoE, GPT-OSS, Gemma 2 / 3) live in hf_archs.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import ModelSpec
from autoparallel_cp.spec.hf_archs import _gemma, _gpt_oss, _qwen
from autoparallel_cp.spec.hf_fields import _bool, _int, _llama_like, _str
from autoparallel_cp.spec.validation import validate_model

_ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}


#: Multimodal classes refused with the way to import their text model.
_MULTIMODAL = {"Gemma3ForConditionalGeneration": "Gemma3ForCausalLM"}


def is_hf_config(data: Mapping[str, Any]) -> bool:
    """Whether a parsed JSON object looks like a Hugging Face config (not our own schema)."""
    return "architectures" in data or "model_type" in data


def _gpt2(cfg: Mapping[str, Any], source: str, arch: str) -> dict[str, Any]:
    h = _int(cfg, "n_embd", source)
    act = _str(cfg, "activation_function", source, "gelu_new")
    if not act.startswith("gelu"):
        raise InputError(f"GPT2: only GELU MLPs are supported, got {act!r}",
                         source=source, field="activation_function")
    return {
        "num_layers": _int(cfg, "n_layer", source),
        "hidden_size": h,
        "ffn_hidden_size": _int(cfg, "n_inner", source, 4 * h),
        "num_attention_heads": _int(cfg, "n_head", source),
        "vocab_size": _int(cfg, "vocab_size", source),
        "max_position_embeddings": _int(cfg, "n_positions", source, 1024),
        "position_embedding": "learned",
        "tie_embeddings": _bool(cfg, "tie_word_embeddings", source, True),
        "mlp": "gelu",
        "norm": "layernorm",
        "qkv_bias": True,
        "attn_out_bias": True,
        "mlp_bias": True,
    }


def _deepseek(cfg: Mapping[str, Any], source: str, arch: str) -> dict[str, Any]:
    h = _int(cfg, "hidden_size", source)
    n_routed = _int(cfg, "n_routed_experts", source, None)
    out: dict[str, Any] = {
        "num_layers": _int(cfg, "num_hidden_layers", source),
        "hidden_size": h,
        "ffn_hidden_size": _int(cfg, "intermediate_size", source),
        "num_attention_heads": _int(cfg, "num_attention_heads", source),
        "vocab_size": _int(cfg, "vocab_size", source),
        "max_position_embeddings": _int(cfg, "max_position_embeddings", source, 4096),
        "position_embedding": "rope",
        "tie_embeddings": _bool(cfg, "tie_word_embeddings", source, False),
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "mla": {
            "q_lora_rank": _int(cfg, "q_lora_rank", source, None),
            "kv_lora_rank": _int(cfg, "kv_lora_rank", source),
            "qk_nope_head_dim": _int(cfg, "qk_nope_head_dim", source),
            "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim", source),
            "v_head_dim": _int(cfg, "v_head_dim", source),
        },
    }
    if _bool(cfg, "attention_bias", source, False):
        out["qkv_bias"] = True
        out["attn_out_bias"] = True
    if n_routed:
        first_k = _int(cfg, "first_k_dense_replace", source, 0)
        freq = _int(cfg, "moe_layer_freq", source, 1)
        # HF: layer i is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0; ours
        # counts the period from the dense prefix, which agrees when freq divides first_k.
        if freq > 1 and first_k % freq:
            raise InputError(
                f"moe_layer_freq {freq} with first_k_dense_replace {first_k} (not a multiple) "
                "is not representable", source=source, field="moe_layer_freq",
            )
        out["moe"] = {
            "num_experts": n_routed,
            "top_k": _int(cfg, "num_experts_per_tok", source),
            "expert_ffn_hidden_size": _int(cfg, "moe_intermediate_size", source),
            "num_shared_experts": _int(cfg, "n_shared_experts", source, 0),
            "first_k_dense_layers": first_k,
            "moe_layer_freq": freq,
            # DeepSeek-V3's aux-loss-free balancing adds e_score_correction_bias (noaux_tc)
            "router_bias": _str(cfg, "topk_method", source, "greedy") == "noaux_tc",
        }
        # group-limited routing (DeepSeek-V2 "group_limited_greedy", V3 "noaux_tc": the
        # gate picks topk_group of n_group expert groups; modeling_deepseek_v3.py MoEGate)
        if _str(cfg, "topk_method", source, "greedy") in ("noaux_tc", "group_limited_greedy"):
            n_group = _int(cfg, "n_group", source, 1)
            if n_group > 1:
                out["moe"]["router_groups"] = n_group
                out["moe"]["router_group_topk"] = _int(cfg, "topk_group", source, n_group)
    mtp = _int(cfg, "num_nextn_predict_layers", source, 0)
    if mtp:
        out["mtp_layers"] = mtp
    return out


_IMPORTERS: dict[str, Callable[[Mapping[str, Any], str, str], dict[str, Any]]] = {
    "LlamaForCausalLM": _llama_like,
    "MistralForCausalLM": _llama_like,
    "MixtralForCausalLM": _llama_like,
    "Qwen2ForCausalLM": _llama_like,
    "GPT2LMHeadModel": _gpt2,
    "DeepseekV2ForCausalLM": _deepseek,
    "DeepseekV3ForCausalLM": _deepseek,
    "Qwen3ForCausalLM": _qwen,
    "Qwen3MoeForCausalLM": _qwen,
    "Qwen2MoeForCausalLM": _qwen,
    "GptOssForCausalLM": _gpt_oss,
    "Gemma2ForCausalLM": _gemma,
    "Gemma3ForCausalLM": _gemma,
}

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_IMPORTERS)


def _architecture(cfg: Mapping[str, Any], source: str) -> str:
    archs = cfg.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise InputError(f"expected a list of class names, got {archs!r:.80}", source=source,
                         field="architectures")
    for a in archs:
        if a in _IMPORTERS:
            return str(a)
    for a in archs:
        if a in _MULTIMODAL:
            raise InputError(
                f"{a}: the vision tower and projector are not modelled; to plan the language "
                f"model alone, save its `text_config` object as a config.json with "
                f"\"architectures\": [\"{_MULTIMODAL[a]}\"]", source=source,
                field="architectures")
    mt = cfg.get("model_type")
    if not archs and isinstance(mt, str) and mt in _ARCH_BY_MODEL_TYPE:
        return _ARCH_BY_MODEL_TYPE[mt]
    found = ", ".join(archs)[:200] or f"model_type {mt!r:.80}"
    raise InputError(
        f"unsupported architecture {found}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}",
        source=source, field="architectures",
    )


def hf_config_to_fields(cfg: Mapping[str, Any], source: str = "config.json") -> dict[str, Any]:
    """The `ModelSpec` fields (not yet validated) for a Hugging Face config dict."""
    arch = _architecture(cfg, source)
    fields = _IMPORTERS[arch](cfg, source, arch)
    name = next((v for v in (cfg.get("_name_or_path"), cfg.get("model_type"))
                 if isinstance(v, str) and v), arch)
    fields["name"] = name.rstrip("/").split("/")[-1] or arch
    fields["source"] = f"Hugging Face config ({arch}) from {source}"
    return fields


def model_from_hf_config(
    cfg: Mapping[str, Any], source: str = "config.json", name: str | None = None
) -> ModelSpec:
    """Build a `ModelSpec` from a Hugging Face config dict; errors are `InputError`s."""
    fields = hf_config_to_fields(cfg, source)
    if name is not None:
        fields["name"] = name
    return validate_model(fields, source)
