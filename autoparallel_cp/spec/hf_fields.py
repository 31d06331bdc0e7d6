"""Shared readers of Hugging Face `config.json` fields (hf_import.py, hf_archs.py).

Typed getters that raise `InputError` naming the field, the multi-head defaults of
`num_kv_heads` / `head_dim`, the sliding-window layout as transformers derives it, and the
Llama-like decoder (Llama, Mistral, Mixtral, Qwen2) the newer families start from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.base import MAX_LAYERS

#: Families whose config drops `sliding_window` unless `use_sliding_window` (Qwen2Config,
#: Qwen3Config @1f3ae2b3: layer i slides iff i >= max_window_layers, default 28).
_QWEN_SWA = ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM",
             "Qwen3MoeForCausalLM")
#: (window default, period) of the families whose config class fills `layer_types` itself
#: when the file has none: layer i slides iff (i + 1) % period != 0 (Gemma2Config and
#: GptOssConfig @828a27fd: every other layer, window 4096 / 128; Gemma3TextConfig
#: @d98ac17c: `sliding_window_pattern` 6, window 4096).
_WINDOW_DEFAULTS = {"Gemma2ForCausalLM": (4096, 2), "Gemma3ForCausalLM": (4096, 6),
                    "GptOssForCausalLM": (128, 2)}


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


def _heads(cfg: Mapping[str, Any], source: str, h: int, a: int,
           head_dim: int | None = None) -> dict[str, Any]:
    """num_kv_heads / head_dim where they differ from MHA (`head_dim`: the config class's
    default when the file has none)."""
    out: dict[str, Any] = {}
    kv = _int(cfg, "num_key_value_heads", source, a)
    if kv != a:
        out["num_kv_heads"] = kv
    hd = _int(cfg, "head_dim", source, head_dim)
    if hd is not None and hd * a != h:
        out["head_dim"] = hd
    return out


def _gated_act(cfg: Mapping[str, Any], source: str, arch: str, key: str, default: str,
               allowed: tuple[str, ...], what: str, *, prefix: bool = False) -> None:
    """Refuse an MLP activation the gated unit `what` does not run (the config's `key`:
    one of `allowed`, or with `prefix` one starting with one of them)."""
    act = _str(cfg, key, source, default)
    if not (act.startswith(allowed) if prefix else act in allowed):
        raise InputError(f"{arch}: only the {what} is supported, got {act!r}", source=source,
                         field=key)


def _decoder(cfg: Mapping[str, Any], source: str, *, mlp: str, head_dim: int | None = None,
             tie: bool = False, defaults: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The spec fields every RoPE / RMSNorm decoder config carries: layers, widths, heads
    (`_heads`, `head_dim` its config class's default), vocabulary, positions, tied embeddings
    (`tie` the class default) and the gated MLP `mlp`. `defaults`: config-class defaults of
    the integer fields a file may leave out (an absent key without one is an error)."""
    d: Mapping[str, Any] = defaults or {}
    h = _int(cfg, "hidden_size", source, d.get("hidden_size", ...))
    a = _int(cfg, "num_attention_heads", source, d.get("num_attention_heads", ...))
    return {
        "num_layers": _int(cfg, "num_hidden_layers", source, d.get("num_hidden_layers", ...)),
        "hidden_size": h,
        "ffn_hidden_size": _int(cfg, "intermediate_size", source,
                                d.get("intermediate_size", ...)),
        "num_attention_heads": a,
        **_heads(cfg, source, h, a, head_dim),
        "vocab_size": _int(cfg, "vocab_size", source, d.get("vocab_size", ...)),
        "max_position_embeddings": _int(cfg, "max_position_embeddings", source,
                                        d.get("max_position_embeddings", 4096)),
        "position_embedding": "rope",
        "tie_embeddings": _bool(cfg, "tie_word_embeddings", source, tie),
        "mlp": mlp,
        "norm": "rmsnorm",
    }


def check_layers(layers: int, source: str) -> None:
    """Refuse a layer count outside the spec's bounds before building per-layer lists."""
    if not 1 <= layers <= MAX_LAYERS:
        raise InputError(f"expected 1 to {MAX_LAYERS} layers, got {layers}", source=source,
                         field="num_hidden_layers")


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
    (MistralConfig: Mistral-7B-v0.1 has 4096, v0.3 null). Qwen2-MoE and Qwen3 follow Qwen2;
    Qwen3-MoE drops the window unless `use_sliding_window` too, but then windows every layer
    (modeling_qwen3_moe.py @16b6c53c: one sliding mask for the model, no max_window_layers).
    Gemma 2 / 3 and GPT-OSS files without `layer_types` take their config class's own default
    (`_WINDOW_DEFAULTS`). The window: transformers' `sliding_window` W counts the query itself
    (masking_utils.py `sliding_window_overlay`, kv_idx > q_idx - W @2ccc6cae), so the left
    window is W - 1.
    """
    if arch in _QWEN_SWA and not _bool(cfg, "use_sliding_window", source, False):
        return {}
    check_layers(layers, source)
    win_default, period_default = _WINDOW_DEFAULTS.get(arch, (None, 1))
    win = _int(cfg, "sliding_window", source, win_default)
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
    elif arch in _QWEN_SWA and arch != "Qwen3MoeForCausalLM":
        first = _int(cfg, "max_window_layers", source, 28)
        flags = [i >= first for i in range(layers)]
    else:
        flags = [(i + 1) % period_default != 0 or period_default == 1 for i in range(layers)]
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
    _gated_act(cfg, source, arch, "hidden_act", "silu", ("silu", "swish"),
               "gated SiLU MLP (SwiGLU)")
    attn_bias = _bool(cfg, "attention_bias", source, False)
    out = _decoder(cfg, source, mlp="swiglu")
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
