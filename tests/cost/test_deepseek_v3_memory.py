"""DeepSeek-V3's memory-saving mechanisms (arXiv 2412.19437 §3.2.3, §3.3.3) and DualPipe's
in-flight micro-batches per stage (deepseek-ai/DualPipe dualpipe.py @3da1bbe), by hand.

Per token of one layer of DeepSeek-V3 (h 7168, 128 heads, q/k head dim 192, v head dim 128,
latents 1536 + 512, 8 of 256 experts of width 2048, one shared expert, dense ffn 18432) under
the deepseek-v3-fp8 recipe at tp 1, bf16 activations (2 B), linear inputs cached in fp8 (1 B).
"""

from __future__ import annotations

import pytest

from autoparallel_cp import api
from autoparallel_cp.cost import schedules as S
from autoparallel_cp.cost.activations import layer_activation_per_token
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.spec import GIB, RECIPES, Job, ModelSpec, MoESpec
from autoparallel_cp.spec.loaders import load_cluster
from autoparallel_cp.spec.plan import Plan

H, FE, K = 7168, 2048, 8
Q_LAT, KV_LAT = 1536, 512
QKV = 128 * 192 * 2 * 2 + 128 * 128 * 2  # Q, K (dqk 192) and V (dv 128) in bf16: 131,072
#: one copy of the attention output in E5M6 (1.5 B, §3.3.3 (1)) + fp32 logsumexp per head
ATT_OUT = 128 * 128 * 1.5 + 4 * 128
#: kept in both layer kinds: norm-1 input (bf16), latent norm inputs (bf16), attention output,
#: norm-2 input (bf16); the norm outputs and up-projection outputs are recomputed (§3.2.3)
COMMON = 2 * H + 2 * (Q_LAT + KV_LAT) + ATT_OUT + 2 * H
#: MoE block: fp32 router logits + scores (256 each), the 8 fp8 dispatched copies (§3.3.3
#: "Low-Precision Communication"), each expert's SwiGLU input (gate + up) in fp8 (§3.3.3 (2)),
#: the 8 fp32 routing weights, the shared expert's SwiGLU input in fp8
MOE = 2 * 4 * 256 + K * H + K * 2 * FE + 4 * K + 2 * FE
#: dense MLP (not "in MoE"): bf16 fc1 output (gate + up) + fp8 fc2 input
DENSE = (2 * 2 + 1) * 18432


def _job(recipe: object = "deepseek-v3-fp8") -> Job:
    return api.make_job("deepseek-v3", "dgx-h800", gpus=2048, seq_len=4096,
                        global_batch=15360, recipe=recipe)  # type: ignore[arg-type]


def test_selective_layer_bytes_match_the_report() -> None:
    job = _job()
    moe = layer_activation_per_token(job, True, 1, 1, 64, 0)
    dense = layer_activation_per_token(job, False, 1, 1, 1, 0)
    assert float(moe.selective) == pytest.approx(COMMON + MOE)  # 154,144 B
    assert float(dense.selective) == pytest.approx(COMMON + DENSE)  # 150,016 B
    # what the recompute drops: Q, K, V; both norms' fp8 outputs and the latent norm outputs
    assert float(moe.dropped["mla_up_proj"]) == QKV
    # (fp8, 1 B: the two block norms; bf16, 2 B: the two latent norms)
    assert float(moe.dropped["layernorm"]) == 1 * 2 * H + 2 * (Q_LAT + KV_LAT)
    # the SwiGLU outputs (fp8 fc2 inputs) of the 8 routed copies and of the shared expert
    assert float(moe.dropped["moe_act"]) == K * FE + FE


@pytest.mark.parametrize(("field", "value", "moe_kept", "dropped"), [
    # each routed and shared SwiGLU input drops from bf16 to fp8: (8 + 1) x 2 x 2048 x 1 B
    ("moe_swiglu_fp8_input", True, -(K + 1) * 2 * FE, {"moe_act": FE}),
    # bf16 output (2 B) + TE's fp8 copy (1 B) -> one 1.5 B copy
    ("attn_out_cache_bytes", 1.5, -128 * 128 * 1.5, {}),
    # TE's fp8 copies of both norms' outputs + the bf16 latent norm outputs
    ("norm_recompute_drops_cache", True, 0.0, {"layernorm": 2 * H + 2 * (Q_LAT + KV_LAT)}),
])
def test_each_mechanism_alone(field: str, value: object, moe_kept: float,
                              dropped: dict[str, float]) -> None:
    rec = RECIPES["deepseek-v3-fp8"]
    off = rec.with_behaviour(**{field: type(rec.behaviour).model_fields[field].default})
    on = rec.with_behaviour(**{field: value})
    a = layer_activation_per_token(_job(off), True, 1, 1, 64, 0)
    b = layer_activation_per_token(_job(on), True, 1, 1, 64, 0)
    assert float(b.kept - a.kept) == pytest.approx(moe_kept)
    for key, more in dropped.items():
        assert float(b.dropped[key] - a.dropped[key]) == pytest.approx(more)


def _dualpipe_held(p: int, rank: int, m: int) -> tuple[int, int, int]:
    """(peak of both, peak of phase 0, peak of phase 1) chunks held by `rank`, walking
    `DualPipe.step` (dualpipe.py @3da1bbe, steps 1-8): a chunk is held from its forward to its
    backward, or to its W when the backward defers it (enable_zb, WeightGradStore FIFO); in a
    forward-backward pair the forward's chunk is counted before the backward frees its own."""
    half = p // 2
    h = min(rank, p - 1 - rank)
    held = [0, 0]
    peaks = [0, 0, 0]
    deferred: list[int] = []

    def f(ph: int) -> None:
        held[ph] += 1
        peaks[0] = max(peaks[0], sum(held))
        peaks[ph + 1] = max(peaks[ph + 1], held[ph])

    def b(ph: int, zb: bool = False) -> None:
        if zb:
            deferred.append(ph)
        else:
            held[ph] -= 1

    def w() -> None:
        held[deferred.pop(0)] -= 1

    for _ in range((half - h - 1) * 2):  # step 1
        f(0)
    for _ in range(h + 1):  # step 2
        f(0)
        f(1)
    for _ in range(half - h - 1):  # step 3
        b(1, True)
        w()
        f(1)
    for _ in range(m // 2 - p + h + 1):  # step 4
        f(0)
        b(1)
        f(1)
        b(0)
    for _ in range(half - h - 1):  # step 5
        b(1)
        f(1)
        b(0)
    zb = False
    for i in range(h + 1):  # step 6
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        b(1, zb)
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        b(0, zb)
    for _ in range(half - h - 1):  # step 7
        w()
        b(0, True)
    for _ in range(h + 1):  # step 8
        w()
    assert held == [0, 0] and not deferred
    return peaks[0], peaks[1], peaks[2]


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_dualpipe_inflight_walks_the_step(p: int) -> None:
    """Rank r holds stage h = min(r, p-1-r) as schedule phase 0 and stage p-1-h as phase 1:
    p - h and h + 1 chunks at once, p + 1 in all (Table 2), so stage j holds p - j."""
    m = 4 * p
    plan = Plan(pp=p, num_microbatches=m, schedule="dualpipe")
    for r in range(p):
        both, ph0, ph1 = _dualpipe_held(p, r, m)
        h = min(r, p - 1 - r)
        assert (both, ph0, ph1) == (p + 1, p - h, h + 1)
        assert S.inflight_units(plan, h, (1,)) == ph0
        assert S.inflight_units(plan, p - 1 - h, (1,)) == ph1


def test_dualpipe_shares_the_mtp_embedding() -> None:
    """§3.2.3: DualPipe's rank 0 holds stage 0 (embedding) and stage p-1 (MTP): no copy."""
    model = ModelSpec(name="mini-mtp", num_layers=4, hidden_size=1024, ffn_hidden_size=2816,
                      num_attention_heads=8, num_kv_heads=4, vocab_size=32000, mtp_layers=1,
                      moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=1408))
    job = Job(model=model, cluster=load_cluster("dgx-h100").take_gpus(8), seq_len=4096,
              global_batch=16)
    base = dict(dp=4, tp=1, pp=2, mbs=1, num_microbatches=4)
    one = stage_memory(job, Plan(**base))
    two = stage_memory(job, Plan(**base, schedule="dualpipe"))
    copy = 2.0 * 32000 * 1024  # bf16 weights of the v x h embedding copy (zero 0)
    assert two[0].params_bytes == pytest.approx(one[0].params_bytes + one[1].params_bytes
                                                - copy)


def test_published_plan_fits_with_the_stated_mechanisms() -> None:
    """The report's plan (stage layers 3/4 x 14/2 here) on its 80 GB H800: rank 1 holds
    stages 1 and 14 (4 MoE layers each), 15 + 2 = 17 micro-batches through a stage; each
    layer keeps COMMON + MOE bytes per token, plus the selective replay's working set (Q, K,
    V) and the backward's gradient buffers of the largest tensor (2 x the 8 copies' bf16 fc1
    workspace)."""
    job = _job()
    plan = api.as_plan(job, "pp=16,ep=64,zero=1,mbs=1,recompute=selective,schedule=dualpipe")
    stages = stage_memory(job, plan)
    t = 4096
    want = 17 * 4 * (COMMON + MOE) * t + QKV * t + 2 * (K * 2 * 2 * FE) * t
    assert stages[1].activations_bytes == pytest.approx(want)
    ev = api.evaluate(job, plan)
    assert ev.fits
    assert ev.memory.peak_bytes < 70 * GIB


def test_shared_expert_recompute_does_not_double_count() -> None:
    """With "shared_experts" recomputed too, its SwiGLU output is dropped once (by that
    module, with the whole shared block), not again by "moe_act"."""
    rec = RECIPES["deepseek-v3-fp8"]
    both = rec.with_behaviour(recompute_modules=("layernorm", "mla_up_proj", "moe_act",
                                                 "shared_experts"))
    br = layer_activation_per_token(_job(both), True, 1, 1, 64, 0)
    assert float(br.dropped["moe_act"]) == K * FE
    assert float(br.dropped["shared_experts"]) == 2 * FE + FE  # fp8 SwiGLU input + fc2 input
    assert float(br.selective) == pytest.approx(COMMON + MOE - 2 * FE)


def test_replay_covers_the_latent_norms_and_the_shared_swiglu() -> None:
    """The selective replay adds the two latent RMSNorms (read c, write norm(c): 2 x 2 B x
    (1536 + 512) a token) and the shared expert's SwiGLU (read gate + up, write the output:
    3 x 2 B x 2048 a token) to what Megatron's modules replay."""
    import numpy as np

    from autoparallel_cp.cost.efficiency import hbm_time
    from autoparallel_cp.cost.layer_ops import selective_replay_s

    rec = RECIPES["deepseek-v3-fp8"]
    off = rec.with_behaviour(moe_swiglu_fp8_input=False, norm_recompute_drops_cache=False)
    tokens = np.array(4096.0)
    one, zero = np.array(1.0), np.array(0.0)

    def replay(recipe: object) -> float:
        job = _job(recipe)
        br = layer_activation_per_token(job, True, 1, 1, 64, 0)
        gpu = job.cluster.node_groups[0].gpu
        return float(selective_replay_s(job, True, br, gpu, tokens, one, zero, zero, {},
                                        job.recipe.behaviour))

    gpu = _job().cluster.node_groups[0].gpu
    want = float(hbm_time(gpu, 2 * 2 * (Q_LAT + KV_LAT) * tokens)
                 + hbm_time(gpu, 3 * 2 * FE * tokens))
    assert replay(rec) - replay(off) == pytest.approx(want)
