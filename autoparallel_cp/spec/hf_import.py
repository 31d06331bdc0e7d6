"""Hugging Face `config.json` -> `ModelSpec`.

Field names follow the transformers configuration classes (LlamaConfig, MistralConfig,
MixtralConfig, Qwen2Config, GPT2Config, DeepseekV2Config / DeepseekV3Config). The result uses
the same conventions as the presets in `models/`: `num_kv_heads` / `head_dim` are set only when
they differ from the multi-head default, so that an imported config equals its preset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import ModelSpec
from autoparallel_cp.spec.validation import validate_model

_ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}


def is_hf_config(data: Mapping[str, Any]) -> bool:
    """Whether a parsed JSON object looks like a Hugging Face config (not our own schema)."""
    return "architectures" in data or "model_type" in data


def _get(cfg: Mapping[str, Any], key: str, source: str, default: Any = ...) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is ...:
        raise InputError("missing in the Hugging Face config", source=source, field=key)
    return default


def _int(cfg: Mapping[str, Any], key: str, source: str, default: Any = ...) -> Any:
    v = _get(cfg, key, source, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"expected an integer, got {v!r:.80}", source=source, field=key)
    return v


def _bool(cfg: Mapping[str, Any], key: str, source: str, default: bool) -> bool:
    v = _get(cfg, key, source, default)
    if not isinstance(v, bool):
        raise InputError(f"expected true or false, got {v!r:.80}", source=source, field=key)
    return v


def _str(cfg: Mapping[str, Any], key: str, source: str, default: str) -> str:
    v = _get(cfg, key, source, default)
    if not isinstance(v, str):
        raise InputError(f"expected a string, got {v!r:.80}", source=source, field=key)
    return v


def _heads(cfg: Mapping[str, Any], source: str, h: int, a: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kv = _int(cfg, "num_key_value_heads", source, a)
    if kv != a:
        out["num_kv_heads"] = kv
    hd = _int(cfg, "head_dim", source, None)
    if hd is not None and hd * a != h:
        out["head_dim"] = hd
    return out


def _period(flags: list[bool]) -> list[bool]:
    """The shortest prefix whose repetition gives `flags` (the whole list if none shorter)."""
    n = len(flags)
    p = next(p for p in range(1, n + 1) if all(flags[i] == flags[i % p] for i in range(n)))
    return flags[:p]


def _sliding_window(cfg: Mapping[str, Any], source: str, arch: str,
                    layers: int) -> dict[str, Any]:
    """`sliding_window_left` / `sliding_window_layers` from a transformers config.

    Which layers are windowed, as transformers decides it (huggingface/transformers): an
    explicit `layer_types` list ("sliding_attention" / "full_attention", one per layer) wins;
    else Gemma 3's `sliding_window_pattern` P (configuration_gemma3.py: layer i slides iff
    (i + 1) % P != 0); else Qwen2's `use_sliding_window` with `max_window_layers` k
    (configuration_qwen2.py @008e5743: `sliding_window` is dropped unless use_sliding_window,
    and layer i slides iff i >= k); else a `sliding_window` applies to every layer
    (MistralConfig: Mistral-7B-v0.1 has 4096, v0.3 null). The window: transformers'
    `sliding_window` W counts the query itself (masking_utils.py `sliding_window_overlay`,
    kv_idx > q_idx - W @2ccc6cae), so the left window is W - 1.
    """
    if arch == "Qwen2ForCausalLM" and not _bool(cfg, "use_sliding_window", source, False):
        return {}
    win = _int(cfg, "sliding_window", source, None)
    types = _get(cfg, "layer_types", source, None)
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or not all(
                t in ("sliding_attention", "full_attention") for t in types):
            raise InputError(
                f"expected {layers} entries, each 'sliding_attention' or 'full_attention', "
                f"got {types!r:.120}", source=source, field="layer_types")
        flags = [t == "sliding_attention" for t in types]
    elif "sliding_window_pattern" in cfg and cfg["sliding_window_pattern"] is not None:
        period = _int(cfg, "sliding_window_pattern", source)
        if period < 1:
            raise InputError(f"expected a positive integer, got {period}", source=source,
                             field="sliding_window_pattern")
        flags = [(i + 1) % period != 0 for i in range(layers)]
    elif arch == "Qwen2ForCausalLM":
        first = _int(cfg, "max_window_layers", source, 28)
        flags = [i >= first for i in range(layers)]
    else:
        flags = [True] * layers
    if win is None or not any(flags):
        return {}
    if win < 1:
        raise InputError(f"expected a window of at least 1 token, got {win}", source=source,
                         field="sliding_window")
    out: dict[str, Any] = {"sliding_window_left": win - 1}
    if not all(flags):
        out["sliding_window_layers"] = _period(flags)
    return out


def _llama_like(cfg: Mapping[str, Any], source: str, arch: str) -> dict[str, Any]:
    h = _int(cfg, "hidden_size", source)
    a = _int(cfg, "num_attention_heads", source)
    act = _str(cfg, "hidden_act", source, "silu")
    if act not in ("silu", "swish"):
        raise InputError(
            f"{arch}: only the gated SiLU MLP (SwiGLU) is supported, got {act!r}",
            source=source, field="hidden_act",
        )
    attn_bias = _bool(cfg, "attention_bias", source, False)
    out: dict[str, Any] = {
        "num_layers": _int(cfg, "num_hidden_layers", source),
        "hidden_size": h,
        "ffn_hidden_size": _int(cfg, "intermediate_size", source),
        "num_attention_heads": a,
        **_heads(cfg, source, h, a),
        "vocab_size": _int(cfg, "vocab_size", source),
        "max_position_embeddings": _int(cfg, "max_position_embeddings", source, 4096),
        "position_embedding": "rope",
        "tie_embeddings": _bool(cfg, "tie_word_embeddings", source, False),
        "mlp": "swiglu",
        "norm": "rmsnorm",
    }
    if arch == "Qwen2ForCausalLM":
        out["qkv_bias"] = True  # Qwen2Attention: q/k/v projections with bias, o without
    elif attn_bias:
        out["qkv_bias"] = True  # LlamaAttention: attention_bias applies to q, k, v and o
        out["attn_out_bias"] = True
    if _bool(cfg, "mlp_bias", source, False):
        out["mlp_bias"] = True
    out.update(_sliding_window(cfg, source, arch, out["num_layers"]))
    if arch == "MixtralForCausalLM":
        out["moe"] = {
            "num_experts": _int(cfg, "num_local_experts", source),
            "top_k": _int(cfg, "num_experts_per_tok", source),
            "expert_ffn_hidden_size": out["ffn_hidden_size"],
        }
    return out


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
