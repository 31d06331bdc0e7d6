"""Hugging Face import of the Qwen3, Qwen3-MoE, Qwen2-MoE, GPT-OSS and Gemma 2 / 3 families.

Modules read (huggingface/transformers, file @commit): Qwen3
modeling_qwen3.py @9ee3f431 / configuration_qwen3.py @1f3ae2b3 (q/k/v/o with
`attention_bias`, `q_norm` / `k_norm` RMSNorm over head_dim, head_dim default 128); Qwen3-MoE
modeling_qwen3_moe.py @16b6c53c (Qwen3's attention, router Linear(h, E) without bias, experts
of `moe_intermediate_size`, no shared expert); Qwen2-MoE modeling_qwen2_moe.py @1c351314
(q/k/v bias, o without; layer i is sparse iff i not in `mlp_only_layers` and (i + 1) %
`decoder_sparse_step` == 0, else a dense MLP of `intermediate_size`; one shared expert of
`shared_expert_intermediate_size` with a sigmoid `shared_expert_gate` Linear(h, 1)); GPT-OSS
modeling_gpt_oss.py @6edf5b31 / configuration_gpt_oss.py @828a27fd (every layer MoE; q/k/v/o
biases always, `attention_bias = True` whatever the file says; `sinks`: one logit per head;
router Linear(h, E) with bias; experts `gate_up_proj` (h x 2f) + bias, `down_proj` (f x h) +
bias; a clamped SwiGLU, same GEMMs); Gemma 2 / 3 modeling_gemma2.py @9a80143c,
modeling_gemma3.py @f14d0cbc, configuration_gemma3.py @d98ac17c (four RMSNorms per layer, gated
GELU-tanh MLP = GeGLU: the SwiGLU matrices and FLOPs; Gemma 3 adds q_norm / k_norm; head_dim
default 256, tied embeddings by default; logit soft-capping and the sqrt(h) embedding scale
carry no parameters).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.hf_fields import (
    _bool,
    _decoder,
    _gated_act,
    _get,
    _heads,
    _int,
    _llama_like,
    _sliding_window,
    check_layers,
)


def _sparse_layers(cfg: Mapping[str, Any], source: str, layers: int) -> tuple[int, int] | None:
    """(first_k_dense_layers, moe_layer_freq) of a Qwen2-MoE / Qwen3-MoE config, None if no
    layer is sparse.

    transformers: layer i has the sparse block iff i is not in `mlp_only_layers` and
    (i + 1) % `decoder_sparse_step` == 0; the spec's pattern is i >= k and (i - k) % f == 0,
    which covers a dense prefix and a fixed step; any other set is refused, naming the field.
    """
    check_layers(layers, source)
    step = _int(cfg, "decoder_sparse_step", source, 1)
    if step < 1:
        raise InputError(f"expected a positive integer, got {step}", source=source,
                         field="decoder_sparse_step")
    only = _get(cfg, "mlp_only_layers", source, [])
    if not isinstance(only, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise InputError(f"expected a list of layer indices, got {only!r:.80}", source=source,
                         field="mlp_only_layers")
    sparse = [i not in only and (i + 1) % step == 0 for i in range(layers)]
    idx = [i for i, f in enumerate(sparse) if f]
    if not idx:
        return None
    k = idx[0]
    f = idx[1] - idx[0] if len(idx) > 1 else layers
    if sparse != [i >= k and (i - k) % f == 0 for i in range(layers)]:
        raise InputError(
            f"sparse layers {idx[:12]}{'...' if len(idx) > 12 else ''} are not a dense prefix "
            "followed by every n-th layer (moe.first_k_dense_layers / moe_layer_freq)",
            source=source, field="mlp_only_layers" if only else "decoder_sparse_step")
    return k, f


def _experts(cfg: Mapping[str, Any], source: str, key: str) -> int:
    n = _int(cfg, key, source)
    if n < 0:
        raise InputError(f"expected a non-negative integer, got {n}", source=source, field=key)
    return int(n)


def _qwen(cfg: Mapping[str, Any], source: str, arch: str) -> dict[str, Any]:
    """Qwen3, Qwen3-MoE and Qwen2-MoE (see the module docstring for the modules read)."""
    qwen3 = arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
    out = _llama_like({k: v for k, v in cfg.items() if k != "attention_bias"}, source, arch)
    h, a = out["hidden_size"], out["num_attention_heads"]
    for key in ("num_kv_heads", "head_dim"):
        out.pop(key, None)
    out.update(_heads(cfg, source, h, a, 128 if qwen3 else None))
    if qwen3:
        out["qk_norm"] = True  # q_norm / k_norm: RMSNorm(head_dim) each
        if _bool(cfg, "attention_bias", source, False):
            out["qkv_bias"] = out["attn_out_bias"] = True  # q, k, v and o
    elif _bool(cfg, "qkv_bias", source, True):
        out["qkv_bias"] = True  # Qwen2MoeAttention: q/k/v with bias, o without
    if arch == "Qwen3ForCausalLM":
        return out
    experts = _experts(cfg, source, "num_experts")
    layout = _sparse_layers(cfg, source, out["num_layers"]) if experts else None
    if layout is None:
        return out  # no sparse layer: a dense model of intermediate_size
    moe: dict[str, Any] = {
        "num_experts": experts,
        "top_k": _int(cfg, "num_experts_per_tok", source),
        "expert_ffn_hidden_size": _int(cfg, "moe_intermediate_size", source),
        "first_k_dense_layers": layout[0],
        "moe_layer_freq": layout[1],
    }
    if arch == "Qwen2MoeForCausalLM":
        shared = _int(cfg, "shared_expert_intermediate_size", source)
        if shared < 0:
            raise InputError(f"expected a non-negative integer, got {shared}", source=source,
                             field="shared_expert_intermediate_size")
        if shared:
            moe.update(num_shared_experts=1, shared_expert_ffn_hidden_size=shared,
                       shared_expert_gate=True)
    out["moe"] = moe
    return out


#: GptOssConfig's defaults of the integer fields a file may leave out
#: (configuration_gpt_oss.py @828a27fd)
_GPT_OSS_DEFAULTS = {"hidden_size": 2880, "num_attention_heads": 64, "num_hidden_layers": 36,
                     "intermediate_size": 2880, "vocab_size": 201088,
                     "max_position_embeddings": 131072}


def _gpt_oss(cfg: Mapping[str, Any], source: str, arch: str) -> dict[str, Any]:
    """GPT-OSS: every layer MoE, biases everywhere, attention sinks, alternating windows."""
    _gated_act(cfg, source, arch, "hidden_act", "silu", ("silu", "swish"),
               "gated SiLU expert MLP")
    top_k = _int(cfg, "num_experts_per_tok", source, 4)
    alias = _int(cfg, "experts_per_token", source, top_k)
    if alias != top_k:
        raise InputError(f"experts_per_token ({alias}) disagrees with num_experts_per_tok "
                         f"({top_k}), which transformers reads", source=source,
                         field="experts_per_token")
    # ffn_hidden_size: no dense layer; it is the experts' width.
    # mlp: modeling_gpt_oss.py's gate * sigmoid(1.702 gate), times (up + 1)
    out = _decoder({"num_key_value_heads": 8, **cfg}, source, mlp="quick-geglu", head_dim=64,
                   defaults=_GPT_OSS_DEFAULTS)
    out.update({
        "qkv_bias": True,
        "attn_out_bias": True,
        "mlp_bias": True,  # gate_up_proj_bias and down_proj_bias of every expert
        "attention_sinks": True,
        "moe": {
            "num_experts": _int(cfg, "num_local_experts", source, 128),
            "top_k": top_k,
            "expert_ffn_hidden_size": out["ffn_hidden_size"],
            "router_linear_bias": True,
        },
    })
    out.update(_sliding_window(cfg, source, arch, out["num_layers"]))
    return out


def _gemma(cfg: Mapping[str, Any], source: str, arch: str) -> dict[str, Any]:
    """Gemma 2 / Gemma 3 text: GeGLU, four norms per layer, explicit head_dim (Gemma 3: QK norm)."""
    key = "hidden_activation" if "hidden_activation" in cfg else "hidden_act"
    _gated_act(cfg, source, arch, key, "gelu_pytorch_tanh", ("gelu",), "gated GELU MLP (GeGLU)",
               prefix=True)
    out = _decoder(cfg, source, mlp="geglu", head_dim=256, tie=True,
                   defaults={"max_position_embeddings": 8192})
    out["post_norms"] = True
    if arch == "Gemma3ForCausalLM":
        out["qk_norm"] = True
    if _bool(cfg, "attention_bias", source, False):
        out["qkv_bias"] = out["attn_out_bias"] = True
    out.update(_sliding_window(cfg, source, arch, out["num_layers"]))
    return out
