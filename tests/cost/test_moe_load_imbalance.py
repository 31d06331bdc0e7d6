"""--moe-load-imbalance (Job.moe_load_imbalance, rho): the most-loaded EP rank's routed work.

Expected values are counted by hand from Megatron-Core's dropless MoE layer (router on every
token, routed experts on top_k·tokens·ep/E rows per local expert when balanced, the alltoall
dispatcher's dispatch + combine of top_k copies per token, forward and backward): at rho the
most-loaded rank holds rho x those routed rows, and nothing else of the layer changes.
Model: hidden 1024, 8 experts top-2 of width 1408, SwiGLU, bf16 (2 B) activations, tp 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.activations import layer_activation_per_token
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.cost.flops import moe_gemms
from autoparallel_cp.cost.moe_comm import dispatch_time
from autoparallel_cp.spec import Job, ModelSpec, MoESpec
from autoparallel_cp.spec.loaders import load_cluster, load_model
from autoparallel_cp.spec.plan import parse_plan

H, FE, K, E = 1024, 1408, 2, 8
S = 4096


def _model() -> ModelSpec:
    return ModelSpec(name="mini-moe", num_layers=4, hidden_size=H, ffn_hidden_size=2816,
                     num_attention_heads=8, num_kv_heads=4, vocab_size=32000,
                     moe=MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=FE,
                                 first_k_dense_layers=1))


def _job(rho: float = 1.0, **kw: object) -> Job:
    return Job(model=_model(), cluster=load_cluster("dgx-h100").take_gpus(8), seq_len=S,
               global_batch=16, moe_load_imbalance=rho, **kw)  # type: ignore[arg-type]


def test_expert_gemm_rows_double_router_and_attention_stay() -> None:
    # balanced: tokens·top_k·ep/E = 4096·2·4/8 = 4096 rows per local expert; rho 2: 8192
    one = {g.name: g for g in moe_gemms(_model(), S, 1, 4)}
    two = {g.name: g for g in moe_gemms(_model(), S, 1, 4, load=2.0)}
    assert float(one["expert_fc1"].m) == 4096.0
    assert float(two["expert_fc1"].m) == 8192.0
    assert float(two["expert_fc2"].m) == 8192.0
    assert float(two["expert_fc1"].count) == E / 4  # the same 2 local experts
    assert float(two["router"].m) == float(one["router"].m) == S


def test_rho_2_doubles_the_a2a_bytes() -> None:
    j1, j2 = _job(1.0), _job(2.0)
    nd = j1.cluster.node_groups[0]
    copy = float(S * H * 2)  # one copy of the rank's tokens, bf16
    # the most-loaded rank receives (dispatch) and returns (combine) 2 x top_k copies
    expected = comm.all_to_all(nd, np.float64(4), np.float64(1), np.float64(2 * copy * K))
    got = dispatch_time(j2, 0, np.float64(4), np.float64(1), np.float64(copy), False)
    assert float(got) == pytest.approx(float(expected), rel=1e-12)
    base = dispatch_time(j1, 0, np.float64(4), np.float64(1), np.float64(copy), False)
    assert float(got) > float(base)


def test_rho_2_layer_factors_routed_parts_only() -> None:
    j1, j2 = _job(1.0), _job(2.0)
    f1 = layer_factors(j1, 0, 1, 1, 4, 0, 1, "none", moe=True)
    f2 = layer_factors(j2, 0, 1, 1, 4, 0, 1, "none", moe=True)
    nd = j1.cluster.node_groups[0]
    # EP: dispatch + combine forward and backward (no EP overlap in megatron-bf16), each the
    # all-to-all of 2 x top_k copies of the micro-batch's tokens
    a2a = comm.all_to_all(nd, np.float64(4), np.float64(1), np.float64(2 * S * H * 2 * K))
    assert float(f2.ep_s) == pytest.approx(4 * float(a2a), rel=1e-12)
    # attention / TP / CP do not move; compute grows (expert GEMMs, copies), by less than 2x
    assert float(f2.tp_s) == float(f1.tp_s)
    assert float(f2.cp_s) == float(f1.cp_s)
    assert float(f1.compute_s) < float(f2.compute_s) < 2 * float(f1.compute_s)
    # routed activation bytes per token at tp 1 (fused SwiGLU, bf16, probabilities applied in
    # the activation): fc1 input 2·H·K + per routed copy fc1 output 2·2·FE and fc2 input 2·FE
    # + one fp32 probability = 2·1024·2 + 2·(4·1408 + 2·1408) + 4·2 = 4096 + 16896 + 8
    routed = 2 * H * K + K * (4 * FE + 2 * FE) + 4 * K
    assert routed == 21000
    b1 = layer_activation_per_token(j1, True, 1, 1, 4, 0)
    b2 = layer_activation_per_token(j2, True, 1, 1, 4, 0)
    assert float(b2.kept - b1.kept) == pytest.approx(routed, rel=1e-12)
    assert float(f2.act_bytes - f1.act_bytes) == pytest.approx(routed * S, rel=1e-12)
    # the largest backward workspace: the routed copies' fc1 output, K·2·2·FE per token
    assert float(b2.largest) == pytest.approx(2 * K * 4 * FE, rel=1e-12)


def test_dense_layers_do_not_move() -> None:
    f1 = layer_factors(_job(1.0), 0, 1, 1, 4, 0, 1, "none", moe=False)
    f2 = layer_factors(_job(2.0), 0, 1, 1, 4, 0, 1, "none", moe=False)
    for name in ("time_s", "act_bytes", "compute_s", "ep_s", "recompute_s"):
        assert float(getattr(f2, name)) == float(getattr(f1, name)), name


def test_rho_is_capped_at_ep() -> None:
    """ep = 1: one rank holds every expert, nothing waits; at ep = 2 the most-loaded of two
    ranks holds at most both ranks' tokens (rho 3 costs as 2)."""
    j = _job(1.0)
    p1 = parse_plan("dp=8,ep=1,mbs=1,recompute=none,zero=1", j)
    assert evaluate(_job(2.0), p1).time.step_s == evaluate(j, p1).time.step_s
    p2 = parse_plan("dp=8,ep=2,mbs=1,recompute=none,zero=1", j)
    assert evaluate(_job(3.0), p2).time.step_s == evaluate(_job(2.0), p2).time.step_s
    assert evaluate(_job(2.0), p2).time.step_s > evaluate(j, p2).time.step_s


def test_rho_1_is_the_balanced_model() -> None:
    """The default and an explicit rho = 1 give bit-identical evaluations (a real model)."""
    m = load_model("mixtral-8x7b")
    cl = load_cluster("dgx-h100").take_gpus(16)
    a = Job(model=m, cluster=cl, seq_len=4096, global_batch=64)
    b = Job(model=m, cluster=cl, seq_len=4096, global_batch=64, moe_load_imbalance=1.0)
    p = parse_plan("dp=4,tp=2,pp=2,ep=4,mbs=1,recompute=selective,zero=1", a)
    assert evaluate(a, p).model_dump() == evaluate(b, p).model_dump()
    c = evaluate(a.with_moe_load_imbalance(1.5), p)
    assert c.time.step_s > evaluate(a, p).time.step_s
    assert c.memory.peak_bytes > evaluate(a, p).memory.peak_bytes
    assert c.memory.params_bytes == evaluate(a, p).memory.params_bytes


@pytest.mark.parametrize("rho", [0.5, math.nan, math.inf, 9.0])
def test_bad_rho_is_refused(rho: float) -> None:
    with pytest.raises(ValueError, match="moe_load_imbalance"):
        _job(rho)
    with pytest.raises(ValueError, match="moe_load_imbalance"):
        _job(1.0).with_moe_load_imbalance(rho)


def test_dense_model_refuses_rho_above_1() -> None:
    dense = load_model("llama3-8b")
    cl = load_cluster("dgx-h100").take_gpus(8)
    with pytest.raises(ValueError, match="dense model"):
        Job(model=dense, cluster=cl, moe_load_imbalance=1.2)
    assert Job(model=dense, cluster=cl, moe_load_imbalance=1.0).moe_load_imbalance == 1.0


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_routed_elementwise_traffic(dispatcher: str) -> None:
    """SwiGLU over the routed copies (read 2·FE, write FE per copy, bf16) scales; the permute /
    unpermute copies (read + write of H per copy, twice) scale only where they act on received
    copies: the flex dispatcher's, not the alltoall dispatcher's send-side permute."""
    from autoparallel_cp.cost.layer_ops import elementwise_bytes_fwd

    j = _job(1.0)
    opts = j.recipe.behaviour.model_copy(update={"ep_dispatcher": dispatcher})
    one, sp = np.float64(1), np.float64(0)
    b1 = elementwise_bytes_fwd(j, True, one, sp, opts, None, 1.0)
    b2 = elementwise_bytes_fwd(j, True, one, sp, opts, None, 2.0)
    swiglu = 3 * 2 * K * FE  # one more rho's worth of routed activation traffic
    permute = 4 * 2 * H * K if dispatcher == "flex" else 0
    assert float(b2 - b1) == pytest.approx(swiglu + permute, rel=1e-12)


def test_api_make_job_takes_rho() -> None:
    from autoparallel_cp import api
    from autoparallel_cp.errors import InputError

    job = api.make_job("mixtral-8x7b", "dgx-h100", gpus=16, global_batch=64,
                       moe_load_imbalance=1.5)
    assert job.moe_load_imbalance == 1.5
    with pytest.raises(InputError, match="--moe-load-imbalance"):
        api.make_job("llama3-8b", "dgx-h100", gpus=8, moe_load_imbalance=2.0)
