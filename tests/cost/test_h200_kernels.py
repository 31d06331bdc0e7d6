"""Session 15's H200 kernel mechanisms, by hand: the unaligned LM head, autocast's weight
casts and fp32 accumulation, torch's fused AdamW and the eager cross-entropy at their measured
rates (cost/efficiency.py constants, data/h200_s15/)."""

from __future__ import annotations

import pytest

from autoparallel_cp.cost import autocast as AC
from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost import layer_factors as LF
from autoparallel_cp.cost.efficiency import (
    EAGER_CE_HBM_FRACTION,
    FUSED_ADAMW_HBM_FRACTION,
    GEMM_FIXED_S,
    GEMM_UNALIGNED_BWD_FRACTION,
    GEMM_UNALIGNED_FWD_FRACTION,
    HBM_EFFICIENCY,
    gemm_time,
)
from autoparallel_cp.cost.embedding_head import edge_factors, unaligned_vocab
from autoparallel_cp.cost.flops import layer_gemms
from autoparallel_cp.cost.straggler import job_compute_stretch
from autoparallel_cp.spec import RECIPES, Job, ModelSpec
from autoparallel_cp.spec.loaders import load_cluster

H, S = 1024, 2048


def _job(vocab: int, recipe: str = "pytorch-amp", h: int = H, **update: object) -> Job:
    m = ModelSpec(name="mini", num_layers=4, hidden_size=h, ffn_hidden_size=4 * h,
                  num_attention_heads=8, num_kv_heads=8, vocab_size=vocab)
    rec = RECIPES[recipe].model_copy(update=update) if update else RECIPES[recipe]
    return Job(model=m, cluster=load_cluster("dgx-h200").take_gpus(8), recipe=rec,
               seq_len=S, global_batch=8)


def test_unaligned_vocab_runs_the_head_at_the_measured_slow_rate() -> None:
    """GPT-2's 50,257 tokens in a PyTorch recipe: forward at 0.100, both backward GEMMs at
    0.154 of the dense peak; 50,304 (aligned) and Megatron (pads to 128 x tp) stay on the
    shape curve."""
    assert unaligned_vocab(_job(50257))
    assert not unaligned_vocab(_job(50304))
    assert not unaligned_vocab(_job(50257, "megatron-bf16"))
    odd = edge_factors(_job(50257, grad_clip=False), 0, 1, 1, 0, 1)
    even = edge_factors(_job(50304, grad_clip=False), 0, 1, 1, 0, 1)
    gpu = _job(50257).cluster.node_groups[0].gpu
    peak = gpu.bf16_tflops * 1e12
    flops = 2.0 * S * H * 50257
    stretch = job_compute_stretch(_job(50257))  # the slowest of 8 GPUs (cost/straggler.py)
    head = stretch * (GEMM_FIXED_S + flops / (GEMM_UNALIGNED_FWD_FRACTION * peak)
                      + 2 * (GEMM_FIXED_S + flops / (GEMM_UNALIGNED_BWD_FRACTION * peak)))
    cast = H * 50257 * 6.0 / (gpu.hbm_gbps * 1e9 * HBM_EFFICIENCY)  # autocast's copy
    ce = S * 50257 * 48.0 / (gpu.hbm_gbps * 1e9 * EAGER_CE_HBM_FRACTION)
    assert float(odd.head_compute_s) == pytest.approx(head + cast + ce, rel=1e-9)
    aligned = float(gemm_time(gpu, S, H, 50304) + gemm_time(gpu, S, 50304, H)
                    + gemm_time(gpu, H, S, 50304))
    assert float(even.head_compute_s) < float(odd.head_compute_s) / 2
    assert float(even.head_compute_s) > aligned


def test_autocast_casts_every_weight_each_forward_and_replay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """pytorch-amp (fp32 weights under autocast): each forward casts the layer's weights
    (r4 w2 = 6 B per weight) and a fully recomputed layer casts them again in its replay.
    Hidden 4096 on 4 x 2048 tokens: GPU-bound, above the eager host floor."""
    h = 4096
    amp = _job(32000, h=h)
    gpu = amp.cluster.node_groups[0].gpu
    weights = h * 3 * h + h * h + h * 2 * 4 * h + 4 * h * h  # qkv, o, gate+up, down
    cast = 6.0 * weights / (gpu.hbm_gbps * 1e9 * HBM_EFFICIENCY)
    gemms = layer_gemms(amp.model, False, 4.0 * S, 1.0, 1.0)
    assert float(AC.autocast_cast_s(amp, gpu, gemms)) == pytest.approx(cast, rel=1e-12)
    plain = _job(32000, h=h, transient_weight_copy_bytes=0)
    assert float(AC.autocast_cast_s(plain, gpu, gemms)) == 0.0
    with_cast = {m: LF.layer_factors(amp, 0, 1, 1, 1, 0, 4, m, moe=False)
                 for m in ("none", "full")}
    monkeypatch.setattr(AC, "autocast_cast_s", lambda job, gpu, g: 0.0)
    for mode in ("none", "full"):
        a, b = with_cast[mode], LF.layer_factors(amp, 0, 1, 1, 1, 0, 4, mode, moe=False)
        # once in the forward, once more in the forward a recomputed layer replays
        assert float(a.time_s) - float(b.time_s) == pytest.approx(cast, rel=1e-6)
        assert float(a.recompute_s) - float(b.recompute_s) == pytest.approx(cast, rel=1e-6)


def test_autocast_gradient_cast_back_and_fp32_accumulation_per_microbatch() -> None:
    """The cast node's backward (r2 w4) and AccumulateGrad's fp32 add (r4 r4 w4): 18 B per
    parameter per micro-batch at zero <= 1; only the cast back under ZeRO-2."""
    job = _job(32000)
    gpu = job.cluster.node_groups[0].gpu
    bw = gpu.hbm_gbps * 1e9 * HBM_EFFICIENCY
    d, e = F.microbatch_grad_factors(job, 0, 1, 1, 1, 1, 0, None)
    assert float(d) == pytest.approx(18.0 / bw)
    assert float(e) == pytest.approx(18.0 / bw)
    plain = _job(32000, transient_weight_copy_bytes=0)
    assert float(F.microbatch_grad_factors(plain, 0, 1, 1, 1, 1, 0, None)[0]) == 0.0


def test_torch_fused_adamw_at_its_measured_rate() -> None:
    """28 B per fp32 parameter at 0.592 of the spec (2,840 GB/s on the H200's 4,800)."""
    job = _job(32000, grad_clip=False)
    gpu = job.cluster.node_groups[0].gpu
    assert F.optimizer_factor(job, 0) == pytest.approx(
        28.0 / (gpu.hbm_gbps * 1e9 * FUSED_ADAMW_HBM_FRACTION))
    # Megatron's fused Adam keeps the streaming rate (its kernel was not measured)
    meg = _job(32000, "megatron-bf16", grad_clip=False)
    assert F.optimizer_factor(meg, 0) == pytest.approx(
        28.0 / (gpu.hbm_gbps * 1e9 * HBM_EFFICIENCY))
