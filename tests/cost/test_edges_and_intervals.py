"""Edge-stage activation bytes by hand (Korthikanti et al. 2022, §4.3), the interval table each
job reads, and the INTERFACE.md plan object."""

from __future__ import annotations

import pytest

from autoparallel_cp.cost import comm
from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.uncertainty import regime
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.loaders import load_cluster, load_model
from autoparallel_cp.spec.plan import Plan


def _job(recipe: str, model: str = "llama3-8b") -> Job:
    return Job(model=load_model(model), cluster=load_cluster("dgx-h100").take_gpus(8),
               recipe=RECIPES[recipe], seq_len=4096, global_batch=8)


@pytest.mark.parametrize("recipe,residual", [("megatron-bf16", 2), ("torchtitan-fsdp", 2),
                                             ("pytorch-amp", 4)])
def test_last_stage_keeps_the_final_norm_and_head_inputs(recipe: str, residual: int) -> None:
    # the final norm's input is the residual stream (fp32 under autocast over fp32 weights,
    # the bf16 activation dtype otherwise), the head's input is bf16, labels are int64:
    # s*b*(res + 2)*h + 8*s*b bytes; sequence parallelism splits the first two over tp
    job = _job(recipe)
    h, s = job.model.hidden_size, job.seq_len
    e = F.edge_factors(job, 0, 1, 1, 0, 1)
    assert float(e.head_act_bytes) == pytest.approx(s * (residual + 2) * h + 8 * s, rel=1e-12)
    e = F.edge_factors(job, 0, 2, 1, 1, 2)
    assert float(e.head_act_bytes) == pytest.approx(
        2 * s * (residual + 2) * h / 2 + 8 * 2 * s, rel=1e-12)


@pytest.mark.parametrize("dropout", [False, True])
def test_first_stage_keeps_the_token_ids_and_the_dropout_mask(dropout: bool) -> None:
    # int64 token ids (8 B a token) and, with GPT-style dropout, the embedding dropout's
    # 1-byte mask of h per token (Korthikanti §4.3), sequence-sharded under SP
    job = _job("megatron-bf16")
    r = job.recipe.model_copy(update={"behaviour": job.recipe.behaviour.model_copy(
        update={"dropout": dropout})})
    job = job.model_copy(update={"recipe": r})
    h, s = job.model.hidden_size, job.seq_len
    for tp, sp in ((1, 0), (4, 1)):
        e = F.edge_factors(job, 0, tp, 1, sp, 1)
        mask = h / tp if dropout else 0.0
        assert float(e.emb_act_bytes) == pytest.approx(s * (8 + mask), rel=1e-12)


def test_vocab_parallel_cross_entropy_all_reduces_three_floats_a_token() -> None:
    # Megatron's vocab-parallel cross entropy (tensor_parallel/cross_entropy.py) all-reduces
    # over tp the logits' max, the sum of exp and the target logit: 3 fp32 values a token
    job = _job("megatron-bf16")
    s = job.seq_len
    e = F.edge_factors(job, 0, 4, 1, 1, 2)
    want = comm.all_reduce(job.cluster.node_groups[0], 4, 1, 2 * s * 3 * 4.0)
    assert float(e.head_time_s - e.head_compute_s) == pytest.approx(float(want), rel=1e-12)


def test_each_job_reads_its_own_interval_table() -> None:
    # uncertainty.py: the family's MoE or dense table where it has one, else the pooled one
    assert regime(_job("megatron-bf16")) == "megatron-dense"
    assert regime(_job("megatron-bf16", "mixtral-8x7b")) == "megatron-moe"
    assert regime(_job("torchtitan-fsdp")) == "pytorch"


def test_plan_object_has_the_interface_fields() -> None:
    job = _job("megatron-bf16", "mixtral-8x7b")
    plan = Plan(dp=4, tp=2, ep=2, sp=1, zero=1, mbs=1, num_microbatches=2, recompute="full")
    d = evaluate(job, plan).to_json()["plan"]
    # INTERFACE.md, "JSON output": the PLAN object's plan fields
    assert {k: d[k] for k in ("dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs",
                              "num_microbatches", "recompute")} == {
        "dp": 4, "tp": 2, "pp": 1, "vpp": 1, "cp": 1, "ep": 2, "sp": 1, "zero": 1, "mbs": 1,
        "num_microbatches": 2, "recompute": "full"}


@pytest.mark.parametrize("model", ["gpt3-1.3b", "llama3-8b"])
def test_op_level_sac_keeps_the_first_mlp_matmul_output(model: str) -> None:
    # torchtitan's op-level SAC (parallelize_llama, 2024-12) saves the output of every odd
    # aten.mm of a block: wq, wv, then fc1 (GELU: wq wk wv wo fc1 fc2) or w1 (SwiGLU: ... w1 w3
    # w2) - one column-parallel tensor of ffn/tp per token; everything else it saves (layer
    # input, attention output, wq/wv outputs, w2's h-wide output) does not depend on ffn. So
    # 1,024 more ffn columns keep 2 bytes x 1,024 / tp more per token.
    base = _job("torchtitan-fsdp", model)
    wider = base.model_copy(update={"model": base.model.model_copy(
        update={"ffn_hidden_size": base.model.ffn_hidden_size + 1024})})
    tp, mbs = 2, 1
    a = F.layer_factors(base, 0, tp, 1, 1, 1, mbs, "selective").act_bytes
    b = F.layer_factors(wider, 0, tp, 1, 1, 1, mbs, "selective").act_bytes
    assert float(b - a) == pytest.approx(mbs * base.seq_len * 2 * 1024 / tp, rel=1e-9)


@pytest.mark.parametrize("fused", [True, False])
def test_llama_fp32_upcast_costs_memory_only_when_eager(fused: bool) -> None:
    # Llama code written with an fp32-upcast RMSNorm and fp32 RoPE (torchtitan, Meta's
    # reference): run eagerly, each of the layer's two norms saves its fp32 input (4 B x h) and
    # RoPE saves fp32 q and k (4 B x (a + kv) x d / tp); torch.compile fuses the upcasts away
    job = _job("torchtitan-fsdp")
    beh = job.recipe.behaviour.model_copy(update={"fused": fused})

    def act(eager_ops: str) -> float:
        r = job.recipe.model_copy(update={"behaviour": beh.model_copy(
            update={"eager_ops": eager_ops})})
        j = job.model_copy(update={"recipe": r})
        return float(F.layer_factors(j, 0, 1, 1, 1, 0, 1, "none").act_bytes)

    m = job.model
    d = m.hidden_size // m.num_attention_heads
    extra = 0.0 if fused else 2 * 4.0 * m.hidden_size + 4.0 * (m.num_attention_heads
                                                               + m.kv_heads) * d
    assert act("llama-upcast") - act("generic") == pytest.approx(job.seq_len * extra, rel=1e-9)
