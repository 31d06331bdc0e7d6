"""Exact parameter counts of a `ModelSpec`: whole model, per layer, per pipeline stage.

Counting follows the Hugging Face / Megatron module layout:

- attention: q, k, v, o projections (+ biases when the spec has them, + per-head q/k norms,
  + GPT-OSS's sinks: one logit per query head);
  MLA (DeepSeek-V2/V3, arXiv 2405.04434 §2.1): q_a (h x q_lora) + q_a_norm + q_b,
  kv_a (h x (kv_lora + rope)) + kv_a_norm + kv_b (kv_lora x heads (nope + v)), o;
- MLP: SwiGLU has 3 matrices (gate, up, down), GELU (and squared-ReLU) 2 (up, down);
- norms: RMSNorm has a weight (h), LayerNorm a weight and a bias (2h); two per layer, four
  with Gemma's post-attention / post-feedforward norms (`post_norms`);
- MoE layer: router (experts x h, + a bias of `experts` floats for DeepSeek-V3's
  `e_score_correction_bias` and another for GPT-OSS's router Linear bias), routed experts,
  shared experts (each an MLP of its own width, + Qwen2-MoE's Linear(h, 1) shared-expert gate);
- embedding (V x h), learned positions (max_pos x h), optional embedding norm (BLOOM),
  final norm, LM head (V x h; 0 when tied).

`total` excludes the DeepSeek-V3 multi-token-prediction (MTP) modules; `mtp` counts what one
adds when trained (DeepSeek-V3 §2.2: the embedding and output head are *shared* with the main
model, so an MTP module brings two RMSNorms, the 2h x h projection, one transformer block and
its final norm). The Hugging Face checkpoint stores a copy of the embedding and the head with
each MTP module, which is why it reports 685B; `mtp_as_stored` counts those copies too.

Checked against published totals in tests/test_params.py (e.g. Llama-2-7B 6,738,415,616,
DeepSeek-V3 671,026,419,200).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoparallel_cp.spec import ModelSpec


def _norm(model: ModelSpec, size: int) -> int:
    """Parameters of one norm over `size` features (LayerNorm has a bias, RMSNorm not)."""
    return 2 * size if model.norm == "layernorm" else size


def _mlp(model: ModelSpec, ffn: int) -> int:
    """One MLP of width `ffn` (gated SwiGLU / GeGLU: 3 matrices; GELU: 2)."""
    h = model.hidden_size
    if model.gated_mlp:
        return 3 * h * ffn + ((2 * ffn + h) if model.mlp_bias else 0)
    return 2 * h * ffn + ((ffn + h) if model.mlp_bias else 0)


def _attention(model: ModelSpec) -> int:
    h = model.hidden_size
    a = model.num_attention_heads
    mla = model.mla
    if mla is not None:
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank is not None:
            q = h * mla.q_lora_rank + _norm(model, mla.q_lora_rank) + mla.q_lora_rank * a * qk
        else:
            q = h * a * qk
        kv = (
            h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
            + _norm(model, mla.kv_lora_rank)
            + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
        )
        o = a * mla.v_head_dim * h + (h if model.attn_out_bias else 0)
        return q + kv + o
    d = model.head_size
    kv = model.kv_heads
    out = h * a * d + 2 * h * kv * d + a * d * h
    if model.qkv_bias:
        out += a * d + 2 * kv * d
    if model.attn_out_bias:
        out += h
    if model.qk_norm:
        out += 2 * _norm(model, d)
    if model.attention_sinks:
        out += a
    return out


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer layer, by part."""

    attention: int
    dense_mlp: int  # 0 in an MoE layer
    router: int
    routed_experts: int  # all experts of the layer (expert-parallel part)
    shared_experts: int
    norms: int  # the two pre-norms (+ Gemma's two post-norms)

    @property
    def dense(self) -> int:
        """Non-expert parameters (replicated over expert parallelism)."""
        return self.attention + self.dense_mlp + self.router + self.shared_experts + self.norms

    @property
    def expert(self) -> int:
        return self.routed_experts

    @property
    def total(self) -> int:
        return self.dense + self.expert


def layer_breakdown(model: ModelSpec, i: int) -> LayerParams:
    """The parts of layer `i` (0-based); MoE or dense per `model.is_moe_layer(i)`."""
    h = model.hidden_size
    attn = _attention(model)
    norms = (4 if model.post_norms else 2) * _norm(model, h)
    m = model.moe
    if m is None or not model.is_moe_layer(i):
        return LayerParams(attn, _mlp(model, model.ffn_hidden_size), 0, 0, 0, norms)
    router = m.num_experts * (h + int(m.router_bias) + int(m.router_linear_bias))
    routed = m.num_experts * _mlp(model, m.expert_ffn_hidden_size)
    shared = m.num_shared_experts * _mlp(model, m.shared_ffn)
    if m.shared_expert_gate:
        shared += h
    return LayerParams(attn, 0, router, routed, shared, norms)


def layer_params(model: ModelSpec, i: int) -> tuple[int, int]:
    """(dense_params, expert_params) of layer `i` (0-based)."""
    lp = layer_breakdown(model, i)
    return lp.dense, lp.expert


def _mtp_module(model: ModelSpec) -> int:
    """One DeepSeek-V3 MTP module without the shared embedding / head (arXiv 2412.19437 §2.2).

    enorm + hnorm, eh_proj (2h -> h, no bias), one transformer block of the kind of the last
    layer (MoE for DeepSeek-V3), and the module's final norm before the shared head.
    """
    h = model.hidden_size
    block = layer_breakdown(model, model.num_layers).total
    return 2 * _norm(model, h) + 2 * h * h + block + _norm(model, h)


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a whole model. `total` excludes MTP; see `total_with_mtp`."""

    embedding: int
    position_embedding: int
    embedding_norm: int
    lm_head: int  # 0 when tied to the embedding
    final_norm: int
    num_layers: int
    num_dense_layers: int
    num_moe_layers: int
    attention_per_layer: int
    dense_mlp_per_layer: int  # width ffn_hidden_size, in each dense layer
    router_per_moe_layer: int
    routed_experts_per_moe_layer: int
    shared_experts_per_moe_layer: int
    expert_params: int  # one routed expert
    norms_per_layer: int
    total: int
    dense_total: int  # everything not in routed experts
    expert_total: int  # routed experts of all layers
    active_per_token: int  # dense_total + top_k experts per MoE layer (== total for dense)
    mtp: int  # unique parameters of the MTP modules (embedding / head shared)
    mtp_as_stored: int  # as in the HF checkpoint: with copies of the embedding and head

    @property
    def total_with_mtp(self) -> int:
        return self.total + self.mtp

    @property
    def layers_total(self) -> int:
        return self.total - self.embedding - self.position_embedding - self.embedding_norm \
            - self.lm_head - self.final_norm


def count_params(model: ModelSpec) -> ParamCounts:
    """Exact parameter counts of `model` (see the module docstring for the layout)."""
    h, v = model.hidden_size, model.vocab_size
    emb = v * h
    pos = model.max_position_embeddings * h if model.position_embedding == "learned" else 0
    emb_norm = _norm(model, h) if model.embedding_norm else 0
    head = 0 if model.tie_embeddings else v * h
    final = _norm(model, h)
    layers = [layer_breakdown(model, i) for i in range(model.num_layers)]
    n_moe = model.num_moe_layers
    dense_mlp = _mlp(model, model.ffn_hidden_size)
    m = model.moe
    moe_layer = next((lp for lp in layers if lp.routed_experts), None)
    expert_one = _mlp(model, m.expert_ffn_hidden_size) if m is not None else 0
    layer_dense = sum(lp.dense for lp in layers)
    expert_total = sum(lp.expert for lp in layers)
    outside = emb + pos + emb_norm + head + final
    total = outside + layer_dense + expert_total
    dense_total = total - expert_total
    active = dense_total + (n_moe * m.top_k * expert_one if m is not None else 0)
    mtp = model.mtp_layers * _mtp_module(model)
    mtp_stored = mtp + model.mtp_layers * 2 * emb
    return ParamCounts(
        embedding=emb,
        position_embedding=pos,
        embedding_norm=emb_norm,
        lm_head=head,
        final_norm=final,
        num_layers=model.num_layers,
        num_dense_layers=model.num_layers - n_moe,
        num_moe_layers=n_moe,
        attention_per_layer=layers[0].attention,
        dense_mlp_per_layer=dense_mlp,
        router_per_moe_layer=moe_layer.router if moe_layer else 0,
        routed_experts_per_moe_layer=moe_layer.routed_experts if moe_layer else 0,
        shared_experts_per_moe_layer=moe_layer.shared_experts if moe_layer else 0,
        expert_params=expert_one,
        norms_per_layer=layers[0].norms,
        total=total,
        dense_total=dense_total,
        expert_total=expert_total,
        active_per_token=active,
        mtp=mtp,
        mtp_as_stored=mtp_stored,
    )


@dataclass(frozen=True)
class StageParams:
    """Parameters held by one pipeline stage (one model-parallel rank before TP/EP sharding).

    `dense` includes everything that is not a routed expert: the stage's layers' dense parts,
    the embedding (first stage), final norm + LM head (last stage), the MTP modules' dense part
    and `embedding_copy` (last stage). `embedding_copy` is the word-embedding copy Megatron keeps
    on the last stage when pp > 1 and the embedding is tied to the head (its gradient is
    all-reduced with the first stage's over the embedding group), or when MTP modules on the last
    stage need the embedding; it is memory, not extra model parameters.
    """

    first_layer: int
    num_layers: int
    dense: int
    expert: int
    embedding: int  # word + position embedding (+ embedding norm) on the first stage
    head: int  # final norm + untied LM head on the last stage
    mtp: int  # MTP modules on the last stage (when included)
    embedding_copy: int

    @property
    def total(self) -> int:
        return self.dense + self.expert

    @property
    def unique(self) -> int:
        """Parameters of this stage that no other stage also holds."""
        return self.total - self.embedding_copy


def stage_params(
    model: ModelSpec, stage_layers: Sequence[int], *, include_mtp: bool = True
) -> list[StageParams]:
    """Per-stage parameters for consecutive layer counts `stage_layers` (one entry per stage).

    Stage j holds layers sum(stage_layers[:j]) .. +stage_layers[j] (contiguous, as in
    Megatron without interleaving). Stages may hold 0 layers. MTP modules, when
    `include_mtp`, sit on the last stage (Megatron-Core's default placement).
    """
    if not stage_layers:
        raise ValueError("stage_layers must have at least one stage")
    if any(n < 0 for n in stage_layers):
        raise ValueError(f"stage_layers must be non-negative, got {list(stage_layers)}")
    if sum(stage_layers) != model.num_layers:
        raise ValueError(
            f"sum(stage_layers) = {sum(stage_layers)} != num_layers = {model.num_layers}"
        )
    pc = count_params(model)
    per_layer = [layer_params(model, i) for i in range(model.num_layers)]
    pp = len(stage_layers)
    mtp_block = layer_breakdown(model, model.num_layers)
    mtp_n = model.mtp_layers if include_mtp else 0
    mtp_expert = mtp_n * mtp_block.expert
    mtp_total = mtp_n * _mtp_module(model)
    out: list[StageParams] = []
    start = 0
    for j, n in enumerate(stage_layers):
        dense = sum(d for d, _ in per_layer[start:start + n])
        expert = sum(e for _, e in per_layer[start:start + n])
        emb = head = mtp = copy = 0
        if j == 0:
            emb = pc.embedding + pc.position_embedding + pc.embedding_norm
        if j == pp - 1:
            head = pc.final_norm + pc.lm_head
            mtp = mtp_total
            if pp > 1 and (model.tie_embeddings or mtp_n > 0):
                copy = pc.embedding
        dense += emb + head + (mtp - mtp_expert if mtp else 0) + copy
        expert += mtp_expert if mtp else 0
        out.append(StageParams(start, n, dense, expert, emb, head, mtp, copy))
        start += n
    return out
