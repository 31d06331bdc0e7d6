"""A compiled loss's memory and traffic (behaviour `compiled_loss`) and routed experts'
own state bytes (`TrainingRecipe.expert_grad_bytes` / `expert_master_weight_bytes`).

Expected values by hand: the loss peak holds tokens x vocab logits at 12 B each eagerly
(fp32 log-softmax output, nll gradient, log-softmax gradient) against 4 B compiled (bf16
input + bf16 gradient); its traffic is 48 B per logit eagerly against 8 B compiled; at
tp > 1 the vocab-parallel loss keeps 14 B. An expert's state bytes follow ZeRO §5 with its
own gradient and master bytes.
"""

from __future__ import annotations

import pytest

from autoparallel_cp.cost.efficiency import EAGER_CE_HBM_FRACTION, hbm_time, hbm_time_at
from autoparallel_cp.cost.embedding_head import edge_factors
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.model_state import layer_param_counts
from autoparallel_cp.spec import RECIPES, Job, ModelSpec, MoESpec
from autoparallel_cp.spec.loaders import load_cluster
from autoparallel_cp.spec.plan import parse_plan

V, S = 32000, 4096


def _dense_job(compiled: bool) -> Job:
    m = ModelSpec(name="mini", num_layers=2, hidden_size=1024, ffn_hidden_size=4096,
                  num_attention_heads=8, num_kv_heads=8, vocab_size=V)
    rec = RECIPES["torchtitan-fsdp"].with_behaviour(compiled_loss=compiled)
    return Job(model=m, cluster=load_cluster("dgx-h100").take_gpus(8), recipe=rec,
               seq_len=S, global_batch=8)


def test_compiled_loss_holds_and_moves_fewer_bytes_per_logit() -> None:
    tokens = 2 * S  # mbs 2
    eager = edge_factors(_dense_job(False), 0, 1, 1, 0, 2)
    comp = edge_factors(_dense_job(True), 0, 1, 1, 0, 2)
    assert float(eager.head_work_bytes) == pytest.approx(tokens * V * 12.0)
    assert float(comp.head_work_bytes) == pytest.approx(tokens * V * 4.0)
    gpu = _dense_job(True).cluster.node_groups[0].gpu
    # the eager chain streams at its measured rate (efficiency.EAGER_CE_HBM_FRACTION)
    saved = float(hbm_time_at(gpu, tokens * V * 48.0, EAGER_CE_HBM_FRACTION)) \
        - float(hbm_time(gpu, tokens * V * 8.0))
    assert float(eager.head_compute_s) - float(comp.head_compute_s) == pytest.approx(saved,
                                                                                     rel=1e-9)


def test_vocab_parallel_loss_keeps_its_figure_when_compiled() -> None:
    eager = edge_factors(_dense_job(False), 0, 2, 1, 1, 2)
    comp = edge_factors(_dense_job(True), 0, 2, 1, 1, 2)
    assert float(comp.head_work_bytes) == float(eager.head_work_bytes) == pytest.approx(
        2 * S * V / 2 * 14.0)
    assert float(comp.head_time_s) == float(eager.head_time_s)


def _moe_job(recipe_update: dict[str, object]) -> Job:
    m = ModelSpec(name="mini-moe", num_layers=2, hidden_size=1024, ffn_hidden_size=2816,
                  num_attention_heads=8, num_kv_heads=8, vocab_size=V,
                  moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1408))
    rec = RECIPES["megatron-bf16"].model_copy(update=recipe_update)
    return Job(model=m, cluster=load_cluster("dgx-h100").take_gpus(8), recipe=rec,
               seq_len=S, global_batch=8)


def test_expert_states_take_their_own_bytes() -> None:
    """ep 8 over dp 8, ZeRO-1: each GPU holds 1 expert per layer; with the experts' gradient
    at 2 B (not 4) and no master copy (not 4 B sharded over edp = 1), the states drop by
    (2 + 4) B per local expert parameter; dense states do not move."""
    plan = parse_plan("dp=8,ep=8,zero=1,mbs=1")
    base = evaluate(_moe_job({}), plan).memory
    own = evaluate(_moe_job({"expert_grad_bytes": 2, "expert_master_weight_bytes": 0}),
                   plan).memory
    _, e = layer_param_counts(_moe_job({}), True, 1, 8)
    experts = 2 * float(e)  # two MoE layers
    assert base.grads_bytes - own.grads_bytes == pytest.approx(experts * 2.0)
    assert base.optimizer_bytes - own.optimizer_bytes == pytest.approx(experts * 4.0)
    assert own.params_bytes == base.params_bytes


def test_for_experts_is_the_recipe_itself_without_overrides() -> None:
    rec = RECIPES["megatron-bf16"]
    assert rec.for_experts() is rec
    over = rec.model_copy(update={"expert_grad_bytes": 2}).for_experts()
    assert (over.grad_bytes, over.master_weight_bytes) == (2, rec.master_weight_bytes)


def test_float8_all_gather_halves_the_zero3_gathers_only() -> None:
    """FSDP over 8 GPUs, fp8 torchao recipe: with the float8 weight all-gather the two
    per-micro-batch gathers move 1 B per weight instead of 2 (the gathers' bandwidth term
    halves); the reduce-scatter (fp32) and the step's terms do not move; a bf16 recipe
    ignores the flag."""
    from autoparallel_cp.cost import comm
    from autoparallel_cp.cost.sync import dp_sync_factors

    def job(fp8: bool, flag: bool) -> Job:
        j = _dense_job(False)
        rec = j.recipe.model_copy(update={"compute_dtype": "fp8" if fp8 else "bf16"})
        return j.model_copy(update={"recipe": rec.with_behaviour(fsdp_float8_all_gather=flag)})

    nd = job(True, True).cluster.node_groups[0]
    ag = (float(comm.all_gather(nd, 8, 1, 2e9)) - float(comm.all_gather(nd, 8, 1, 0.0))) / 1e9
    off = dp_sync_factors(job(True, False), 0, 1, 1, 8, 1, 3)
    on = dp_sync_factors(job(True, True), 0, 1, 1, 8, 1, 3)
    assert float(off[2]) - float(on[2]) == pytest.approx(ag, rel=1e-9)  # 2 gathers x 1 B
    assert [float(x) for x in (off[0], off[1], off[3])] == [float(x) for x in (on[0], on[1],
                                                                               on[3])]
    bf16 = [float(x) for x in dp_sync_factors(job(False, True), 0, 1, 1, 8, 1, 3)]
    assert bf16 == [float(x) for x in dp_sync_factors(job(False, False), 0, 1, 1, 8, 1, 3)]
