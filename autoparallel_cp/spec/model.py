"""Model architecture spec: dense and MoE decoders, MLA, the layer pattern (units: base.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import StrictBool, model_validator

from .base import (
    MAX_EXPERTS,
    MAX_FFN,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_MTP_LAYERS,
    MAX_PARAMS,
    MAX_POSITIONS,
    MAX_RANK,
    MAX_SHARED_EXPERTS,
    MAX_VOCAB,
    Bounded,
    Strict,
)

Layers = Annotated[int, Bounded(1, MAX_LAYERS, "32x the deepest published LLM")]
LayerCount = Annotated[int, Bounded(0, MAX_LAYERS, "32x the deepest published LLM")]
Hidden = Annotated[int, Bounded(1, MAX_HIDDEN, "12x the widest published LLM")]
Ffn = Annotated[int, Bounded(1, MAX_FFN, "14x the widest published MLP")]
Heads = Annotated[int, Bounded(1, MAX_HEADS, "128x the most heads published")]
HeadDim = Annotated[int, Bounded(1, MAX_HEAD_DIM, "16x the largest published head_dim")]
Rank = Annotated[int, Bounded(1, MAX_RANK, "40x DeepSeek-V3's largest MLA rank")]
Vocab = Annotated[int, Bounded(1, MAX_VOCAB, "16x the largest published vocabulary")]
Positions = Annotated[int, Bounded(1, MAX_POSITIONS, "100x the longest published context")]
Experts = Annotated[int, Bounded(1, MAX_EXPERTS, "PEER's million experts")]
Shared = Annotated[int, Bounded(0, MAX_SHARED_EXPERTS, "512x DeepSeek-V3's 2")]
Mtp = Annotated[int, Bounded(0, MAX_MTP_LAYERS, "512x DeepSeek-V3's 1")]
Window = Annotated[int, Bounded(0, MAX_POSITIONS, "100x the longest published context")]


class MoESpec(Strict):
    """Mixture-of-experts MLP (Mixtral, DeepSeek-V3 style)."""

    num_experts: Experts
    top_k: Experts
    expert_ffn_hidden_size: Ffn
    num_shared_experts: Shared = 0
    shared_expert_ffn_hidden_size: Ffn | None = None  # default: expert_ffn_hidden_size
    first_k_dense_layers: LayerCount = 0  # DeepSeek `first_k_dense_replace`
    moe_layer_freq: Layers = 1  # every n-th layer (after the dense prefix) is MoE
    router_bias: bool = False  # DeepSeek-V3 `e_score_correction_bias` (num_experts floats)
    # GPT-OSS: the router is a Linear with a bias (num_experts trained floats, added to the
    # logits; transformers modeling_gpt_oss.py `GptOssTopKRouter.bias` @6edf5b31)
    router_linear_bias: bool = False
    # Qwen2-MoE: a sigmoid gate Linear(h, 1, bias=False) scales the shared experts' output
    # (modeling_qwen2_moe.py `shared_expert_gate` @1c351314; Megatron-Core
    # `moe_shared_expert_gate`); h parameters per MoE layer
    shared_expert_gate: bool = False
    # Group-limited routing (DeepSeek-V3 §2.1.2 "node-limited routing", M = 4 of 8 nodes;
    # HF config `n_group` / `topk_group`; Megatron-Core `moe_router_num_groups` /
    # `moe_router_group_topk`): the experts split into `router_groups` equal groups of
    # consecutive indices, a token picks `router_group_topk` groups, then its top_k experts
    # within them. 1 group: no limit.
    router_groups: Experts = 1
    router_group_topk: Experts | None = None  # None: every group (no limit)

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k ({self.top_k}) must not exceed num_experts ({self.num_experts})"
            )
        g, t = self.router_groups, self.groups_picked
        if self.num_experts % g:
            raise ValueError(f"router_groups ({g}) must divide num_experts "
                             f"({self.num_experts})")
        if t > g:
            raise ValueError(f"router_group_topk ({t}) must not exceed router_groups ({g})")
        if self.top_k > t * (self.num_experts // g):
            raise ValueError(f"top_k ({self.top_k}) must not exceed the experts of the "
                             f"router_group_topk groups ({t} x {self.num_experts // g})")
        if self.shared_expert_gate and not self.num_shared_experts:
            raise ValueError("shared_expert_gate needs num_shared_experts >= 1 (it gates the "
                             "shared experts' output)")
        return self

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size

    @property
    def groups_picked(self) -> int:
        """Expert groups a token may route to (`router_group_topk`; every group if unset)."""
        return self.router_group_topk or self.router_groups


class MLASpec(Strict):
    """DeepSeek multi-head latent attention (arXiv 2405.04434 §2.1)."""

    q_lora_rank: Rank | None  # None: plain q projection (DeepSeek-V2-Lite)
    kv_lora_rank: Rank
    qk_nope_head_dim: HeadDim
    qk_rope_head_dim: HeadDim
    v_head_dim: HeadDim


class ModelSpec(Strict):
    """A decoder-only transformer (dense or MoE)."""

    name: str
    num_layers: Layers
    hidden_size: Hidden
    ffn_hidden_size: Ffn  # dense MLP width (for MoE models: the dense layers' width)
    num_attention_heads: Heads
    num_kv_heads: Heads | None = None  # default: num_attention_heads (MHA)
    head_dim: HeadDim | None = None  # default: hidden_size // num_attention_heads
    vocab_size: Vocab
    max_position_embeddings: Positions = 4096
    position_embedding: Literal["rope", "learned", "alibi"] = "rope"
    tie_embeddings: bool = False
    # MLP activation: "gelu" (two matrices) or a gated unit (gate, up, down: three matrices,
    # the same FLOPs whatever the gate's function): "swiglu" (SiLU gate, Llama), "geglu" (GELU
    # gate, Gemma's gelu_pytorch_tanh), "quick-geglu" (x * sigmoid(1.702 x) gate, GPT-OSS:
    # transformers modeling_gpt_oss.py `GptOssExperts`, Megatron-LM `--quick-geglu`)
    mlp: Literal["gelu", "swiglu", "geglu", "quick-geglu"] = "swiglu"
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm/LayerNorm of q and k over head_dim (Qwen3, Gemma 3)
    # Gemma 2/3: a norm on the attention output and on the MLP output inside each residual
    # branch, besides the two pre-norms (4 norms per layer: modeling_gemma2.py
    # `post_attention_layernorm` / `pre_feedforward_layernorm` / `post_feedforward_layernorm`)
    post_norms: bool = False
    # GPT-OSS attention sinks: one learnable softmax logit per query head per layer
    # (modeling_gpt_oss.py `GptOssAttention.sinks` @6edf5b31; Megatron-Core
    # `softmax_type="learnable"`)
    attention_sinks: bool = False
    embedding_norm: bool = False  # norm right after the word embedding (BLOOM)
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    mtp_layers: Mtp = 0  # DeepSeek-V3 multi-token-prediction modules
    # Sliding-window attention. `sliding_window_left` = w: a windowed layer's query i attends
    # keys i-w..i (w + 1 keys), Megatron-Core's `window_size=(w, 0)` and flash-attn's
    # `window_size=(w, 0)`; Hugging Face's `sliding_window` W counts the query itself
    # (transformers masking_utils `sliding_window_overlay`: kv_idx > q_idx - W), so W - 1 here.
    # `sliding_window_layers`: which layers are windowed, a pattern repeated over the layers
    # (layer i is windowed iff pattern[i % len(pattern)]; Megatron's `window_attn_skip_freq`
    # N is N-1 trues and a false); None: every layer. None window: full causal everywhere.
    sliding_window_left: Window | None = None
    sliding_window_layers: tuple[StrictBool, ...] | None = None
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
        self._check_window()
        total, _ = self.param_scale()
        if total > MAX_PARAMS:
            raise ValueError(
                f"the model has {total:.3g} parameters, more than {MAX_PARAMS:.0e} "
                "(~600x the largest published model)"
            )
        return self

    def _check_window(self) -> None:
        pat = self.sliding_window_layers
        if pat is None:
            return
        if self.sliding_window_left is None:
            raise ValueError("sliding_window_layers is set but sliding_window_left is not "
                             "(give the window, or drop the pattern)")
        if not 1 <= len(pat) <= self.num_layers:
            raise ValueError(f"sliding_window_layers must hold 1 to num_layers "
                             f"({self.num_layers}) entries, got {len(pat)}")
        if not any(self.is_window_layer(i) for i in range(self.num_layers)):
            raise ValueError("sliding_window_layers marks no layer as windowed "
                             "(drop sliding_window_left for full attention everywhere)")

    def param_scale(self) -> tuple[float, float]:
        """(total, active per token) parameters, an upper estimate for bounds only.

        Per layer: 4 h x heads x head_dim for q, k, v, o (plus MLA's low-rank projections),
        3 h x ffn for a SwiGLU MLP; MoE layers count every (active: top-k) routed and shared
        expert; plus input and output embeddings and learned positions. `params.count_params`
        is exact (it reads this module, so it cannot be used here).
        """
        h, a, mla = self.hidden_size, self.num_attention_heads, self.mla
        if mla is None:
            attn = 4.0 * h * a * self.head_size
        else:
            dim = max(mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim)
            ranks = (mla.q_lora_rank or 0) + mla.kv_lora_rank
            attn = 4.0 * h * a * dim + ranks * (h + 2.0 * a * dim)
        dense = 3.0 * h * self.ffn_hidden_size
        total = active = self.num_layers * (attn + dense)
        if self.moe is not None:
            e = self.moe
            expert = 3.0 * h * max(e.expert_ffn_hidden_size, e.shared_ffn)
            total += self.num_layers * (e.num_experts + e.num_shared_experts) * expert
            active += self.num_layers * (e.top_k + e.num_shared_experts) * expert
        outside = 2.0 * self.vocab_size * h
        if self.position_embedding == "learned":
            outside += float(self.max_position_embeddings) * h
        return total + outside, active + outside

    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP is a gated unit (three matrices; `mlp` other than "gelu")."""
        return self.mlp != "gelu"

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

    def is_window_layer(self, i: int) -> bool:
        """Whether layer `i` (0-based) has sliding-window attention (Megatron-Core
        `is_layer_window_attention` with 1-based layer_number = i + 1)."""
        if self.sliding_window_left is None:
            return False
        pat = self.sliding_window_layers
        return True if pat is None else bool(pat[i % len(pat)])

    def window_share(self, moe: bool) -> float:
        """Fraction of the layers of a kind (MoE or dense) that are windowed (0 if none)."""
        idx = [i for i in range(self.num_layers) if self.is_moe_layer(i) == moe]
        if not idx:
            return 0.0
        return sum(self.is_window_layer(i) for i in idx) / len(idx)
