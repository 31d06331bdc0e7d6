"""DeepSeek-V3 multi-token prediction on the last stage (cost/mtp.py, memory.mtp_terms): a small
MoE model with one MTP depth costs, on its last stage only, one more MoE layer (in the plan's
recompute mode: replayed only under uniform full recompute, Megatron's `_checkpointed_forward`)
plus the MTP projection, norms, embedding lookup and a second LM head + loss; its parameters
(and, with pp > 1, the embedding copy) go through the stage's model-state rules. Expected values
are derived by hand from the model's shapes."""

from __future__ import annotations

import pytest

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.efficiency import gemm_time, hbm_time
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.steptime import stage_times
from autoparallel_cp.cost.straggler import GPU_SPEED_SIGMA
from autoparallel_cp.spec import Job, ModelSpec, MoESpec
from autoparallel_cp.spec.loaders import load_cluster
from autoparallel_cp.spec.params import stage_params
from autoparallel_cp.spec.plan import Plan

H, V, S = 1024, 32000, 4096


def _model(mtp: int) -> ModelSpec:
    return ModelSpec(name="mini-mtp", num_layers=4, hidden_size=H, ffn_hidden_size=2816,
                     num_attention_heads=8, num_kv_heads=4, vocab_size=V, mtp_layers=mtp,
                     moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=1408))


def _job(mtp: int) -> Job:
    return Job(model=_model(mtp), cluster=load_cluster("dgx-h100").take_gpus(8), seq_len=S,
               global_batch=16)


#: one MoE layer by hand: q, o (h x h) + k, v (h x 4 kv heads x 128) + router (4 x h) +
#: 4 experts x SwiGLU (3 x h x 1408) + 2 RMSNorms
MOE_LAYER = 2 * H * H + 2 * H * 512 + 4 * H + 4 * 3 * H * 1408 + 2 * H
#: MTP extras: eh_proj 2h -> h, enorm + hnorm + final norm (RMSNorm: h each)
MTP_EXTRA = 2 * H * H + 3 * H
#: the 8-GPU job's GEMMs wait for its slowest GPU (cost/straggler.py): E[max of 8 standard
#: normals] = 1.42360 (tables of normal order statistics)
C8 = 1.0 + GPU_SPEED_SIGMA * 1.4236003


def _plan(**kw: object) -> Plan:
    base: dict[str, object] = dict(dp=4, tp=1, pp=2, vpp=1, cp=1, ep=1, sp=0, zero=0, mbs=1,
                                   num_microbatches=4, recompute="none")
    base.update(kw)
    return Plan(**base)  # type: ignore[arg-type]


def test_last_stage_params_grow_by_one_moe_layer_extras_and_embedding_copy() -> None:
    """zero 0, megatron-bf16: 2 B of weights per parameter; pp = 2 keeps a word-embedding copy
    on the last stage (v x h); the first stage is unchanged."""
    plan = _plan()
    with_, without = stage_memory(_job(1), plan), stage_memory(_job(0), plan)
    assert with_[0].params_bytes == without[0].params_bytes
    delta = with_[1].params_bytes - without[1].params_bytes
    assert delta == pytest.approx(2.0 * (MOE_LAYER + MTP_EXTRA + V * H), rel=1e-12)
    # the same count as spec/params.stage_params (the embedding copy included)
    sp = stage_params(_model(1), [2, 2], include_mtp=True)[1]
    sp0 = stage_params(_model(0), [2, 2])[1]
    assert sp.total - sp0.total == MOE_LAYER + MTP_EXTRA + V * H


def test_single_stage_has_no_embedding_copy() -> None:
    plan = _plan(dp=8, pp=1, num_microbatches=2)
    delta = stage_memory(_job(1), plan)[0].params_bytes - stage_memory(_job(0), plan)[0] \
        .params_bytes
    assert delta == pytest.approx(2.0 * (MOE_LAYER + MTP_EXTRA), rel=1e-12)


def test_last_stage_activations_one_microbatch_of_layer_and_mtp() -> None:
    """tp 1, no SP, bf16 activations and residual: the MoE layer's kept bytes + the enorm input
    (2h) + eh_proj's input (2 x 2h) + final-norm and head inputs (2 x 2h) + labels (8) + the
    second loss's logits (6 B each, LOGITS_BYTES megatron) per token, one micro-batch."""
    plan = _plan()
    job = _job(1)
    lf = F.layer_factors(job, 0, 1, 1, 1, 0, 1, "none", moe=True)
    tokens = S
    extras = tokens * (2 * H + 4 * H + 4 * H + 8) + tokens * V * 6
    delta = stage_memory(job, plan)[1].activations_bytes \
        - stage_memory(_job(0), plan)[1].activations_bytes
    assert delta == pytest.approx(float(lf.act_bytes) + extras, rel=1e-9)


def _extras_time(job: Job) -> float:
    """Embedding lookup (read + write of the fp32/bf16 copies, 3 passes as the first stage's),
    three norms and the concat at HBM bandwidth (forward + 2x backward), eh_proj's GEMM three
    ways, the LM head's three GEMMs and its cross entropy (52 B per logit), tp = 1 (no comm);
    the GEMMs x C8."""
    gpu = job.cluster.node_groups[0].gpu
    ew = hbm_time(gpu, S * (3 * 4 * H + 2 * 2 * 2 * H))
    emb = hbm_time(gpu, S * H * 4 * 3)
    proj = C8 * (gemm_time(gpu, S, 2 * H, H, "bf16") + gemm_time(gpu, S, H, 2 * H, "bf16")
                 + gemm_time(gpu, 2 * H, S, H, "bf16"))
    head = C8 * (gemm_time(gpu, S, H, V, "bf16") + gemm_time(gpu, S, V, H, "bf16")
                 + gemm_time(gpu, H, S, V, "bf16")) + hbm_time(gpu, S * V * 52)
    return float(emb + 3 * ew + proj + head)


@pytest.mark.parametrize("recompute,layers,replayed", [
    ("none", None, False), ("selective", None, False),
    ("full", None, True),  # uniform: Megatron checkpoints the MTP layer
    ("full", 1, False),  # block: Megatron skips MTP recompute
])
def test_last_stage_time_grows_by_one_moe_layer_and_head_work(
        recompute: str, layers: int | None, replayed: bool) -> None:
    job = _job(1)
    plan = _plan(recompute=recompute, recompute_layers=layers)
    mode = "selective" if recompute == "selective" else "none"
    lf = F.layer_factors(job, 0, 1, 1, 1, 0, 1, "full" if replayed else mode, moe=True)
    layer = float(lf.time_s) + (float(lf.recompute_s) if replayed else 0.0)
    with_, without = stage_times(job, plan), stage_times(_job(0), plan)
    assert with_[0].total_s == without[0].total_s
    delta = with_[1].total_s - without[1].total_s
    assert delta == pytest.approx(layer + _extras_time(job), rel=1e-9)
    # the kept activations follow the same choice: checkpoint bytes only when replayed
    mem = stage_memory(job, plan)[1].activations_bytes \
        - stage_memory(_job(0), plan)[1].activations_bytes
    kept = float(lf.ckpt_bytes if replayed else lf.act_bytes)
    assert mem == pytest.approx(kept + S * (10 * H + 8) + S * V * 6, rel=1e-9)


def test_mtp_recomputed_follows_the_emitted_method() -> None:
    assert F.mtp_recomputed("full", None)
    assert not F.mtp_recomputed("full", 2)
    assert not F.mtp_recomputed("selective", None)
    assert F.mtp_layer_kind(_job(1))
