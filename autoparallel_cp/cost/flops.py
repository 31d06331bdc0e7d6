"""FLOPs per op of a transformer layer (forward; backward = dgrad + wgrad = 2x forward GEMMs).

Sources: Narayanan et al. 2021 appendix (per layer forward 24Bsh² + 4Bs²h, logits 2BshV),
Korthikanti et al. 2022 App. A (model FLOPs 72BLsh²(1 + s/6h + V/12hL)), Megatron-LM
`training.py::num_floating_point_operations` (GQA / SwiGLU generalisation), torchtitan
`get_dense_model_nparams_and_flops` (6·N + 12·L·H·Q·T per token, causal attention not halved).

Every GEMM is given per rank as (name, M, K, N, count): the rank multiplies an `[M,K]` by a
`[K,N]` matrix `count` times per micro-batch forward. `tokens` is the number of tokens a rank
processes in one micro-batch (mbs·seq/cp).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from autoparallel_cp.spec import ModelSpec
from autoparallel_cp.spec.params import count_params

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Gemm:
    """One forward GEMM of a layer on one rank: `count` x `[m,k] @ [k,n]`."""

    name: str
    m: FloatArray
    k: FloatArray
    n: FloatArray
    count: FloatArray

    @property
    def flops(self) -> FloatArray:
        return 2.0 * self.m * self.k * self.n * self.count


def _f(x: npt.ArrayLike) -> FloatArray:
    return np.asarray(x, dtype=np.float64)


def attention_dims(model: ModelSpec) -> tuple[int, int, int]:
    """(query heads, qk head dim, v head dim), MLA-aware (DeepSeek-V2 §2.1)."""
    if model.mla is not None:
        m = model.mla
        return model.num_attention_heads, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    return model.num_attention_heads, model.head_size, model.head_size


def attention_gemms(model: ModelSpec, tokens: npt.ArrayLike, tp: npt.ArrayLike) -> list[Gemm]:
    """QKV (or MLA down/up projections) and output projection, sharded over `tp` heads."""
    t = _f(tokens)
    tp_ = _f(tp)
    h = model.hidden_size
    one = np.ones_like(t * tp_)
    a, dqk, dv = attention_dims(model)
    if model.mla is not None:
        m = model.mla
        out: list[Gemm] = []
        # Down projections are replicated over tp in Megatron's MLA (every rank computes them).
        if m.q_lora_rank is not None:
            out.append(Gemm("q_down", t * one, h * one, m.q_lora_rank * one, one))
            out.append(Gemm("q_up", t * one, m.q_lora_rank * one, a * dqk / tp_ * one, one))
        else:
            out.append(Gemm("q_proj", t * one, h * one, a * dqk / tp_ * one, one))
        out.append(Gemm("kv_down", t * one, h * one, (m.kv_lora_rank + m.qk_rope_head_dim) * one,
                        one))
        out.append(Gemm("kv_up", t * one, m.kv_lora_rank * one,
                        a * (m.qk_nope_head_dim + dv) / tp_ * one, one))
        out.append(Gemm("out_proj", t * one, a * dv / tp_ * one, h * one, one))
        return out
    kv = model.kv_heads
    d = model.head_size
    return [
        Gemm("qkv", t * one, h * one, (a + 2 * kv) * d / tp_ * one, one),
        Gemm("out_proj", t * one, a * d / tp_ * one, h * one, one),
    ]


def mlp_gemms(model: ModelSpec, tokens: npt.ArrayLike, tp: npt.ArrayLike, ffn: int,
              name: str = "mlp") -> list[Gemm]:
    """One (dense or shared-expert) MLP of width `ffn`, column/row-parallel over `tp`."""
    t = _f(tokens)
    tp_ = _f(tp)
    one = np.ones_like(t * tp_)
    h = model.hidden_size
    up = 2 * ffn if model.gated_mlp else ffn
    return [
        Gemm(f"{name}_fc1", t * one, h * one, up / tp_ * one, one),
        Gemm(f"{name}_fc2", t * one, ffn / tp_ * one, h * one, one),
    ]


def expert_token_factor(tp: npt.ArrayLike, etp: npt.ArrayLike | None) -> FloatArray:
    """Routed tokens an expert-TP rank processes, relative to the default layout (etp = tp).

    Megatron's alltoall dispatcher (megatron/core/transformer/moe/token_dispatcher.py @d98e8a64,
    `MoEAlltoAllTokenDispatcher.dispatch_postprocess` / `combine_preprocess`) all-gathers the
    tokens an EP rank received over the expert-TP group and reduce-scatters the outputs; each
    rank enters the MoE with its tokens/tp sequence-parallel share (moe_layer.py:636 requires
    SP with TP). An expert-TP rank therefore computes etp x tokens/tp routed tokens: the factor
    etp/tp (exactly 1 when etp is unset or equals tp, so the default costs are unchanged).
    Balanced routing: a caller whose term is the rank's routed work multiplies it by
    `common.routed_load` (--moe-load-imbalance).
    """
    tp_ = _f(tp)
    if etp is None:
        return np.ones_like(tp_)
    etp_ = _f(etp)
    return np.where(etp_ == tp_, 1.0, etp_ / tp_)


def moe_gemms(model: ModelSpec, tokens: npt.ArrayLike, tp: npt.ArrayLike,
              ep: npt.ArrayLike, etp: npt.ArrayLike | None = None,
              load: npt.ArrayLike = 1.0) -> list[Gemm]:
    """Router, routed experts (E/ep local experts, balanced routing) and shared experts.

    Each rank's experts receive on average tokens·top_k·ep/E tokens each (balanced top-k routing
    over the ep group) in the default layout, where expert tensor parallelism equals tp; with
    an expert-TP size `etp` (parallel folding) that is scaled by `expert_token_factor` (etp/tp)
    and the expert linears split over etp instead of tp. Shared experts stay on the attention
    tp group (a dense MLP). `load` is the most-loaded EP rank's routed rows over the balanced
    mean (`common.routed_load`, --moe-load-imbalance): it multiplies the routed experts' rows
    only; the router and the shared experts see every token once.
    """
    moe = model.moe
    assert moe is not None
    t = _f(tokens)
    tp_ = _f(tp)
    ep_ = _f(ep)
    etp_ = tp_ if etp is None else _f(etp)
    fac = expert_token_factor(tp_, etp)
    one = np.ones_like(t * tp_ * ep_ * etp_)
    h = model.hidden_size
    up = 2 * moe.expert_ffn_hidden_size if model.gated_mlp else moe.expert_ffn_hidden_size
    # per-rank routed work: the most-loaded rank's rows (x load)
    per_expert = t * moe.top_k * ep_ / moe.num_experts * fac * _f(load)
    local = moe.num_experts / ep_
    out = [
        Gemm("router", t * one, h * one, moe.num_experts * one, one),
        Gemm("expert_fc1", per_expert * one, h * one, up / etp_ * one, local * one),
        Gemm("expert_fc2", per_expert * one, moe.expert_ffn_hidden_size / etp_ * one, h * one,
             local * one),
    ]
    if moe.num_shared_experts:
        out += mlp_gemms(model, t, tp_, moe.num_shared_experts * moe.shared_ffn, "shared")
    return out


def layer_gemms(model: ModelSpec, moe: bool, tokens: npt.ArrayLike, tp: npt.ArrayLike,
                ep: npt.ArrayLike, etp: npt.ArrayLike | None = None,
                load: npt.ArrayLike = 1.0) -> list[Gemm]:
    """All forward GEMMs of one layer on one rank (attention projections + MLP or MoE; `load`:
    `moe_gemms`)."""
    g = attention_gemms(model, tokens, tp)
    if moe:
        return g + moe_gemms(model, tokens, tp, ep, etp, load)
    return g + mlp_gemms(model, tokens, tp, model.ffn_hidden_size)


def attention_core_flops(model: ModelSpec, mbs: npt.ArrayLike, seq: int, cp: npt.ArrayLike,
                         tp: npt.ArrayLike, causal: bool) -> FloatArray:
    """Forward FLOPs of QKᵀ and attn·V on one rank: 2·b·(s/cp)·s·(a/tp)·(d_qk + d_v).

    `causal=True` halves it (what a causal flash kernel executes); MFU uses `causal=False`
    (Korthikanti Eq. 7, torchtitan; not halved).
    """
    a, dqk, dv = attention_dims(model)
    f = 2.0 * _f(mbs) * (seq / _f(cp)) * seq * (a / _f(tp)) * (dqk + dv)
    return f / 2.0 if causal else f


#: Query rows per flash-attention tile (kBlockM): FlashAttention-3 `tile_size_fwd_sm90`
#: (Dao-AILab/flash-attention hopper/tile_size.h @0251105a) gives 128 x 128 tiles for causal or
#: local (windowed) kernels at head dim 128 (192 x 128 at head dim <= 64), the same tile for
#: both masks. cuDNN's tiles are not published; the FA3 value stands for both.
FLASH_QUERY_TILE = 128


def window_pairs(seq: int, window: int) -> float:
    """(query, key) pairs a causal layer with left window w attends over s positions.

    Query i sees keys max(0, i-w)..i, i.e. min(i+1, w+1) keys (Megatron-Core / Transformer
    Engine / flash-attn `window_size=(w, 0)`). For w < s:
    sum_{i<=w} (i+1) + (s-w-1)(w+1) = (w+1)(w+2)/2 + (s-w-1)(w+1) = (w+1)(s - w/2);
    for w >= s-1 every query sees its whole prefix: s(s+1)/2 (the same formula at w = s-1).
    """
    s, w = float(seq), float(min(window, seq - 1))
    return (w + 1.0) * (s - w / 2.0)


def window_flops_ratio(seq: int, window: int | None) -> float:
    """Attention-core FLOPs of a windowed causal layer over those of a full causal one:
    window_pairs(s, w) / window_pairs(s, s-1) (1 without a window or when it covers s)."""
    if window is None or window >= seq - 1:
        return 1.0
    return window_pairs(seq, window) / window_pairs(seq, seq - 1)


def window_kernel_length(seq: int, window: int | None,
                         tile: int = FLASH_QUERY_TILE) -> float | None:
    """Length L of the causal kernel that a windowed kernel over s positions costs s/L of, or
    None when the window does not bind at tile granularity (w >= s - B: full causal).

    Tiles (B = B_M = B_N query and key rows, M = s/B query tiles, k = w/B): a flash kernel with
    left window w loops query tile m over key tiles max(0, m - k)..m, fully masked tiles
    skipped (flash-attn hopper/block.h @0251105a `get_n_block_min_max`, Is_local): min(m+1, k+1)
    tiles, (k+1)(M - k/2) in all, the tile form of `window_pairs`. A causal kernel of length
    L' = M'B runs M'(M'+1)/2 tiles, (M'+1)/2 per query tile on average. Taking the causal
    kernel with the same mean tiles per query tile, (M'+1)/2 = (k+1)(M - k/2)/M, i.e.
    L' = (w + B)(2s - w)/s - B, the windowed kernel runs exactly s/L' times its tiles:
    (k+1)(M - k/2) = (M/M') · M'(M'+1)/2. So its time is s/L' causal kernels of length L': the
    causal FLOP count at s times L'/s, at the rate the causal curve gives at L'
    (efficiency.flash_attention_time, whose rate depends on the key-loop length), the partly
    masked edge tiles included as the causal fit includes its diagonal ones. L' -> 2w + B for
    w << s and L' = s at w = s - B (continuous with full causal). Exact in tiles when B divides
    w and s, otherwise within one tile per query tile.
    """
    if window is None or window >= seq - tile:
        return None
    s, w, b = float(seq), float(window), float(tile)
    return (w + b) * (2.0 * s - w) / s - b


def head_gemm(model: ModelSpec, tokens: npt.ArrayLike, tp: npt.ArrayLike) -> Gemm:
    """The LM head `[tokens, h] @ [h, V/tp]` (vocab-parallel)."""
    t = _f(tokens)
    tp_ = _f(tp)
    one = np.ones_like(t * tp_)
    return Gemm("lm_head", t * one, model.hidden_size * one, model.vocab_size / tp_ * one, one)


def model_flops_per_token(model: ModelSpec, seq: int) -> float:
    """Model FLOPs per trained token (forward + backward, no recompute, attention not halved).

    6 x (matmul parameters active per token: layers + LM head, embedding lookup excluded)
    + 6 x layers x heads x (d_qk + d_v) x seq (Korthikanti Eq. 7; torchtitan/nanoGPT convention).
    A sliding-window layer counts its attention term x `window_flops_ratio` (the pairs its
    window leaves over a causal layer's), so the causal convention (not halved) carries over
    and a window covering the sequence changes nothing. Megatron-LM's
    `num_floating_point_operations` (megatron/training/training.py @d98e8a64) and torchtitan's
    GPT-OSS `get_nparams_and_flops` (@b5bcd76) ignore windows (every layer full causal): their
    logged MFU of a windowed model is higher than this one by the attention the window skips.
    """
    pc = count_params(model)
    matmul = pc.active_per_token - pc.embedding - pc.position_embedding - pc.embedding_norm
    if model.tie_embeddings:
        matmul += pc.embedding  # the tied head still does the V x h GEMM
    a, dqk, dv = attention_dims(model)
    layers = sum(window_flops_ratio(seq, model.sliding_window_left)
                 if model.is_window_layer(i) else 1.0 for i in range(model.num_layers))
    return 6.0 * matmul + 6.0 * layers * a * (dqk + dv) * seq
