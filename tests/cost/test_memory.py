"""Memory closed forms (Korthikanti Table 2, ZeRO, Megatron) and the H200 measured peaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.factors import korthikanti_gpt_layer_bytes, state_bytes_per_param
from autoparallel_cp.spec import (
    RECIPES,
    ClusterSpec,
    GPUSpec,
    Job,
    LinkSpec,
    ModelSpec,
    NodeGroup,
    TrainingRecipe,
)
from autoparallel_cp.spec.plan import Plan

S, B, H, A = 2048, 4, 6144, 48


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table2(t: int) -> None:
    sbh = S * B * H
    assert korthikanti_gpt_layer_bytes(S, B, H, A, t) == pytest.approx(
        sbh * (10 + 24 / t + 5 * A * S / (H * t)))
    assert korthikanti_gpt_layer_bytes(S, B, H, A, t, sp=True) == pytest.approx(
        sbh * (34 / t + 5 * A * S / (H * t)))
    assert korthikanti_gpt_layer_bytes(S, B, H, A, t, mode="selective") == pytest.approx(
        sbh * (10 + 24 / t))
    assert korthikanti_gpt_layer_bytes(S, B, H, A, t, sp=True, mode="selective") == \
        pytest.approx(sbh * 34 / t)
    assert korthikanti_gpt_layer_bytes(S, B, H, A, t, mode="full") == pytest.approx(2 * sbh)


def test_korthikanti_eq1() -> None:
    assert korthikanti_gpt_layer_bytes(S, B, H, A) == pytest.approx(
        S * B * H * (34 + 5 * A * S / H))


ZERO_PAPER = TrainingRecipe(name="zero-fp16", weight_bytes=2, grad_bytes=2)


@pytest.mark.parametrize("d", [1, 8, 64])
def test_zero_stages(d: int) -> None:
    tot = [sum(float(x) for x in state_bytes_per_param(ZERO_PAPER, z, d)) for z in range(4)]
    assert tot[0] == pytest.approx(16)
    assert tot[1] == pytest.approx(4 + 12 / d)
    assert tot[2] == pytest.approx(2 + 14 / d)
    assert tot[3] == pytest.approx(16 / d)


@pytest.mark.parametrize("d", [1, 4, 32])
def test_megatron_bytes_per_param(d: int) -> None:
    r = RECIPES["megatron-bf16"]
    assert sum(float(x) for x in state_bytes_per_param(r, 0, d)) == pytest.approx(18)
    assert sum(float(x) for x in state_bytes_per_param(r, 1, d)) == pytest.approx(6 + 12 / d)
    assert sum(float(x) for x in state_bytes_per_param(RECIPES["pytorch-amp"], 0, d)) == 16


def _h200_rows() -> list[tuple[dict, Job, Plan]]:
    gpu = GPUSpec(name="H200", memory_gib=139.8, bf16_tflops=989, hbm_gbps=4800)
    link = LinkSpec(bandwidth_gbps=450)
    cl = ClusterSpec(name="h200", node_groups=[NodeGroup(
        name="a", gpu=gpu, gpus_per_node=1, num_nodes=1, intra_node=link, inter_node=link)])
    out = []
    path = Path(__file__).resolve().parents[2] / "benchmarks/data/h200_pytorch_amp_train.jsonl"
    for line in path.read_text().splitlines():
        r = json.loads(line)
        m = ModelSpec(name=r["model"], num_layers=r["L"], hidden_size=r["h"],
                      ffn_hidden_size=r["ffn"], num_attention_heads=r["nh"],
                      num_kv_heads=r["nkv"], vocab_size=r["V"])
        # measure_h200.py: fused AdamW, no gradient clipping
        recipe = RECIPES["pytorch-amp"].model_copy(update={"grad_clip": False})
        job = Job(model=m, cluster=cl, recipe=recipe, seq_len=r["seq"], global_batch=r["mbs"])
        out.append((r, job, Plan(mbs=r["mbs"], num_microbatches=1,
                                 recompute="full" if r["recompute"] else "none")))
    return out


def test_h200_peak_memory_within_10pct() -> None:
    for r, job, plan in _h200_rows():
        ev = evaluate(job, plan)
        assert ev.memory.peak_bytes == pytest.approx(r["peak_bytes"], rel=0.10)
        states = ev.memory.params_bytes + ev.memory.grads_bytes + ev.memory.optimizer_bytes
        assert states == pytest.approx(r["static_bytes"], rel=0.02)


def test_pytorch_loss_peak_bytes_per_logit() -> None:
    """PyTorch CE peaks at 12 B per logit (backward); with TP, DTensor loss parallelism's
    log-softmax holds 14 B per local logit in forward; Megatron's in-place CE 6 B."""
    from autoparallel_cp.cost import factors as F

    r = _h200_rows()[0][1]
    tokens = 2.0 * r.seq_len
    v = r.model.vocab_size
    e1 = F.edge_factors(r, 0, 1, 1, 0, 2)
    e2 = F.edge_factors(r, 0, 2, 1, 0, 2)
    assert float(e1.head_work_bytes) == pytest.approx(tokens * v * 12.0)
    assert float(e2.head_work_bytes) == pytest.approx(tokens * v / 2 * 14.0)
    m = r.model_copy(update={"recipe": RECIPES["megatron-bf16"]})
    assert float(F.edge_factors(m, 0, 2, 1, 0, 2).head_work_bytes) == pytest.approx(
        tokens * v / 2 * 6.0)


@pytest.mark.parametrize("mlp", ["swiglu", "gelu"])
def test_te_fp8_saves_fp8_linear_inputs(mlp: str) -> None:
    """Transformer Engine under fp8 saves the fp8 copy (1 B) of each linear layer's input for
    the weight gradient (TE layernorm_linear.py / linear.py): per token and layer, the QKV input
    (h), the fc1 input (h) and the fc2 input (ffn) shrink by 1 B each, and the output
    projection adds a 1 B copy of the attention output (h) beside the bf16 one the flash
    backward keeps: bf16 - fp8 = h + h + ffn - h = h + ffn bytes. torchao float8 (PyTorch
    recipes) keeps the bf16 inputs: no change."""
    from autoparallel_cp.cost.factors import layer_activation_per_token
    from autoparallel_cp.spec.loaders import load_cluster

    h, ffn = 1024, 3072
    model = ModelSpec(name="m", num_layers=2, hidden_size=h, ffn_hidden_size=ffn,
                      num_attention_heads=8, num_kv_heads=2, vocab_size=1000, mlp=mlp,
                      norm="rmsnorm" if mlp == "swiglu" else "layernorm")
    cl = load_cluster("dgx-h100").take_gpus(8)
    per: dict[str, float] = {}
    for name in ("megatron-bf16", "megatron-fp8", "torchtitan-fsdp"):
        recipe = RECIPES[name]
        job = Job(model=model, cluster=cl, recipe=recipe, seq_len=1024, global_batch=8)
        per[name] = float(layer_activation_per_token(job, False, 1, 1, 1, 0).kept)
    assert per["megatron-bf16"] - per["megatron-fp8"] == pytest.approx(h + ffn)
    fp8_titan = RECIPES["torchtitan-fsdp"].model_copy(update={"compute_dtype": "fp8"})
    job = Job(model=model, cluster=cl, recipe=fp8_titan, seq_len=1024, global_batch=8)
    assert float(layer_activation_per_token(job, False, 1, 1, 1, 0).kept) == pytest.approx(
        per["torchtitan-fsdp"])


def test_te_fp8_in_a_pytorch_recipe() -> None:
    """`fp8_linear: te` in a PyTorch recipe (llm-foundry's fp8 runs: te.Linear layers):
    per token and layer the QKV and fc1 inputs (bf16 h -> fp8 h) and the fc2 input (ffn)
    shrink by 1 B per element, and the out projection saves TE's 1 B cast of the attention
    output instead of PyTorch's 2 B contiguous copy of it (h): bf16 - fp8 = 3h + ffn bytes.
    The same recipe with `fp8_linear: torchao` saves what bf16 saves."""
    from autoparallel_cp.cost.factors import layer_activation_per_token
    from autoparallel_cp.spec.loaders import load_cluster

    h, ffn = 1024, 4096
    model = ModelSpec(name="m", num_layers=2, hidden_size=h, ffn_hidden_size=ffn,
                      num_attention_heads=8, num_kv_heads=8, vocab_size=1000, mlp="gelu",
                      norm="layernorm")
    cl = load_cluster("dgx-h100").take_gpus(8)
    base = RECIPES["pytorch-fsdp"]
    assert base.behaviour.fp8_linear == "te"

    def kept(recipe: TrainingRecipe) -> float:
        job = Job(model=model, cluster=cl, recipe=recipe, seq_len=1024, global_batch=8)
        return float(layer_activation_per_token(job, False, 1, 1, 1, 0).kept)

    fp8 = base.model_copy(update={"compute_dtype": "fp8"})
    assert kept(base) - kept(fp8) == pytest.approx(3 * h + ffn)
    ao = fp8.model_copy(update={"behaviour": fp8.behaviour.model_copy(
        update={"fp8_linear": "torchao"})})
    assert kept(ao) == pytest.approx(kept(base))
