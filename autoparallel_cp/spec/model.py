"""Model architecture spec: dense and MoE decoders, MLA, the layer pattern (units: base.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from .base import Strict


class MoESpec(Strict):
    """Mixture-of-experts MLP (Mixtral, DeepSeek-V3 style)."""

    num_experts: PositiveInt
    top_k: PositiveInt
    expert_ffn_hidden_size: PositiveInt
    num_shared_experts: int = Field(0, ge=0)
    shared_expert_ffn_hidden_size: PositiveInt | None = None  # default: expert_ffn_hidden_size
    first_k_dense_layers: int = Field(0, ge=0)  # DeepSeek `first_k_dense_replace`
    moe_layer_freq: PositiveInt = 1  # every n-th layer (after the dense prefix) is MoE
    router_bias: bool = False  # DeepSeek-V3 `e_score_correction_bias` (num_experts floats)

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k ({self.top_k}) must not exceed num_experts ({self.num_experts})"
            )
        return self

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size


class MLASpec(Strict):
    """DeepSeek multi-head latent attention (arXiv 2405.04434 §2.1)."""

    q_lora_rank: PositiveInt | None  # None: plain q projection (DeepSeek-V2-Lite)
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt


class ModelSpec(Strict):
    """A decoder-only transformer (dense or MoE)."""

    name: str
    num_layers: PositiveInt
    hidden_size: PositiveInt
    ffn_hidden_size: PositiveInt  # dense MLP width (for MoE models: the dense layers' width)
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt | None = None  # default: num_attention_heads (MHA)
    head_dim: PositiveInt | None = None  # default: hidden_size // num_attention_heads
    vocab_size: PositiveInt
    max_position_embeddings: PositiveInt = 4096
    position_embedding: Literal["rope", "learned", "alibi"] = "rope"
    tie_embeddings: bool = False
    mlp: Literal["gelu", "swiglu"] = "swiglu"
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    embedding_norm: bool = False  # norm right after the word embedding (BLOOM)
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    mtp_layers: int = Field(0, ge=0)  # DeepSeek-V3 multi-token-prediction modules
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        a = self.num_attention_heads
        if self.mla is None:
            if self.head_dim is None and self.hidden_size % a != 0:
                raise ValueError(
                    f"num_attention_heads ({a}) must divide hidden_size ({self.hidden_size}) "
                    "unless head_dim is given"
                )
            if self.num_kv_heads is not None and a % self.num_kv_heads != 0:
                raise ValueError(
                    f"num_kv_heads ({self.num_kv_heads}) must divide num_attention_heads ({a})"
                )
        if self.moe is not None and self.moe.first_k_dense_layers > self.num_layers:
            raise ValueError(
                f"moe.first_k_dense_layers ({self.moe.first_k_dense_layers}) exceeds "
                f"num_layers ({self.num_layers})"
            )
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer `i` (0-based) has an MoE MLP (DeepSeek/HF `first_k_dense_replace`)."""
        m = self.moe
        if m is None:
            return False
        return i >= m.first_k_dense_layers and (i - m.first_k_dense_layers) % m.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))
