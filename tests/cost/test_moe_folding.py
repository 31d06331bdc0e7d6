"""MoE parallel folding (plan field `etp`), by hand.

Expected values are written out from Megatron-Core's rules and the mesh, not from the cost model:
- rank grids (Megatron-LM d98e8a64 megatron/core/parallel_state.py:857-902): attention layers
  tp x cp x dp x pp in order tp-cp-ep-dp-pp, MoE layers etp x ep x edp x pp over the same ranks
  (cp = 1 in the expert grid), so within a stage the expert-TP groups are consecutive ranks, the
  EP groups have stride etp and the expert-DP groups stride etp*ep; world % (etp*ep*pp) == 0 and
  edp = world / (etp*ep*pp); etp defaults to tp (arguments.py:587-588);
- the alltoall token dispatcher (megatron/core/transformer/moe/token_dispatcher.py): a rank
  enters the MoE with its tokens/tp sequence-parallel share, sends its top_k routed copies by
  all-to-all over ep, all-gathers the received tokens over the expert-TP group and
  reduce-scatters the outputs (none of that when etp = 1); the routed experts run no collective
  over the attention tp group (a shared expert, a dense tp MLP, keeps its AG / RS);
- collectives: the alpha-beta model of comm.py (tests/cost/test_comm.py), NVLink 450 GB/s and
  the network 50 GB/s per GPU per direction at the module's efficiencies, 8 GPUs per node.
The default layout (etp unset) costs exactly what etp = tp costs: the same dispatcher path.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from autoparallel_cp.cli import main
from autoparallel_cp.cost import comm
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.flops import moe_gemms
from autoparallel_cp.cost.layer_factors import layer_factors
from autoparallel_cp.cost.model_state import layer_param_counts
from autoparallel_cp.cost.sync import dp_sync_factors, expert_dp_size
from autoparallel_cp.spec import RECIPES, Job, ModelSpec, MoESpec
from autoparallel_cp.spec.loaders import load_cluster
from autoparallel_cp.spec.plan import Plan, parse_plan, plan_violations

NV = 450e9 * comm.NVLINK_EFFICIENCY
NET = 50e9 * comm.NETWORK_EFFICIENCY
NV_LAT, NET_LAT = 3e-6, 8e-6  # clusters/dgx-h100.yaml

#: Qwen3-235B-A22B (public config.json): 94 layers, h 4096, 64 q / 4 kv heads of 128,
#: 128 routed experts top-8 of width 1536, no shared expert.
QWEN = ModelSpec(name="qwen3-235b-like", num_layers=94, hidden_size=4096, ffn_hidden_size=12288,
                 num_attention_heads=64, num_kv_heads=4, head_dim=128, vocab_size=151936,
                 moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=1536))
#: the same with one shared expert of the routed width (DeepSeek-style)
QWEN_SHARED = QWEN.model_copy(update={"name": "shared-like", "moe": QWEN.moe.model_copy(  # type: ignore[union-attr]
    update={"num_shared_experts": 1})})


def _job(model: ModelSpec = QWEN, gpus: int = 256, seq: int = 4096, batch: int = 2048) -> Job:
    return Job(model=model, cluster=load_cluster("dgx-h100").take_gpus(gpus),
               recipe=RECIPES["megatron-bf16"], seq_len=seq, global_batch=batch)


#: Megatron-Bridge's Qwen3-235B H100 recipe layout: tp 2, pp 8, ep 32, etp 1 on 256 GPUs
#: (94 layers on 8 stages: 6 of 12 and 2 of 11)
BRIDGE = ("tp=2,pp=8,ep=32,etp=1,sp=1,zero=1,mbs=1,recompute=none,"
          "stage_layers=11:12:12:12:12:12:12:11")


# ------------------------------------------------------------------------------- plan rules


def test_folded_plan_is_legal_where_the_default_is_not() -> None:
    job = _job()
    plan = parse_plan(BRIDGE, job)
    assert plan.dp == 16 and plan.ep == 32 > plan.dp * plan.cp
    assert plan_violations(job, plan) == []
    assert plan.expert_tp == 1 and plan.folded
    assert plan.expert_dp == 1  # 2*1*16 ranks / (1*32)
    default = parse_plan(BRIDGE.replace("etp=1,", ""), job)
    assert any("(dp*cp) % ep: 16 % 32" in v for v in plan_violations(job, default))


def test_expert_dp_size_and_deepseek_layout() -> None:
    """DeepSeek-V3 on 1,024 H100 (Megatron-Bridge: tp 2, pp 8, ep 64, etp 1): a stage has
    128 ranks, so each expert is held by edp = 128 / 64 = 2 ranks."""
    plan = Plan(tp=2, pp=8, dp=64, ep=64, etp=1, sp=1)
    assert plan.expert_dp == 2
    assert float(expert_dp_size(2, 1, 64, 64, 1)) == 2.0
    assert float(expert_dp_size(2, 1, 64, 64, None)) == 1.0  # default: dp*cp/ep = 64/64
    assert Plan(tp=4, dp=8, cp=2, ep=8).expert_dp == 2  # default: 8*2/8
    assert Plan(tp=4, dp=8, cp=2, ep=8, etp=1).expert_dp == 8  # 64 ranks / 8


@pytest.mark.parametrize("text,why", [
    (BRIDGE.replace("etp=1", "etp=2"), "(tp*cp*dp) % (etp*ep): 32 % (2*32)"),
    (BRIDGE.replace("sp=1", "sp=0"), "needs sp=1"),
    (BRIDGE.replace("etp=1", "etp=5"), "expert ffn % etp: 1536 % 5"),
])
def test_folding_rules(text: str, why: str) -> None:
    job = _job()
    assert any(why in v for v in plan_violations(job, parse_plan(text, job)))


def test_etp_needs_an_moe_model() -> None:
    dense = QWEN.model_copy(update={"moe": None, "name": "dense"})
    job = _job(dense, gpus=8, batch=8)
    assert any("needs an MoE model" in v
               for v in plan_violations(job, parse_plan("tp=2,sp=1,etp=1", job)))


def test_cli_evaluate_and_its_exit_codes() -> None:
    base = ["evaluate", "-m", "mixtral-8x7b", "-c", "dgx-h100", "--gpus", "64", "--seq-len",
            "4096", "--global-batch", "256"]
    ok = CliRunner().invoke(main, [*base, "--plan", "tp=2,pp=4,ep=8,etp=1,sp=1,zero=1",
                                   "--json", "-"])
    assert ok.exit_code == 0, ok.output
    assert '"etp": 1' in ok.output
    for plan, msg in (("tp=2,pp=4,ep=8,etp=1,sp=0", "needs sp=1"),
                      ("tp=2,pp=4,ep=8,etp=4,sp=1", "(tp*cp*dp) % (etp*ep)"),
                      ("tp=2,pp=4,ep=8,etp=0,sp=1", "etp")):
        bad = CliRunner().invoke(main, [*base, "--plan", plan])
        assert bad.exit_code == 2, bad.output
        assert msg in bad.output and "Traceback" not in bad.output
    dense = CliRunner().invoke(main, ["solve", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus",
                                      "8", "--seq-len", "4096", "--global-batch", "8",
                                      "--fix", "etp=1"])
    assert dense.exit_code == 2 and "MoE" in dense.output


# ------------------------------------------------------------------------------- GEMM shapes


def test_expert_gemm_shapes_with_etp() -> None:
    """4096 tokens per rank's micro-batch, tp 2, ep 32 (4 local experts of 128), top-8.

    Default (etp = tp = 2): every expert-TP rank sees all 4096 tokens' copies, 4096*8/128*32 =
    8192 per local expert, on ffn/2 = 768 columns. Folded etp = 1: the rank's 2048
    sequence-parallel tokens, 2048*8*32/128 = 4096 per expert, on the whole width 1536.
    etp = 4 (tp 2): the expert-TP group gathers 4 ranks' tokens, 16384 per expert, 384 wide."""
    def fc(etp: int | None, name: str) -> tuple[float, float, float, float]:
        g = next(x for x in moe_gemms(QWEN, 4096, 2, 32, etp) if x.name == name)
        return float(g.m), float(g.k), float(g.n), float(g.count)

    assert fc(None, "expert_fc1") == (8192, 4096, 2 * 768, 4)
    assert fc(None, "expert_fc2") == (8192, 768, 4096, 4)
    assert fc(1, "expert_fc1") == (4096, 4096, 2 * 1536, 4)
    assert fc(1, "expert_fc2") == (4096, 1536, 4096, 4)
    assert fc(4, "expert_fc1") == (16384, 4096, 2 * 384, 4)
    # the routed FLOPs of a rank do not depend on etp: 2 * 2048 tokens * 8 copies * 4096 *
    # (2 * 1536) per rank (tp 2 ranks share the 4096 tokens)
    for etp in (None, 1, 4):
        m, k, n, c = fc(etp, "expert_fc1")
        assert 2 * m * k * n * c == 2 * 2048 * 8 * 4096 * 3072
    router = next(x for x in moe_gemms(QWEN, 4096, 2, 32, 1) if x.name == "router")
    assert float(router.n) == 128  # unchanged by folding


# ------------------------------------------------------------------------------- memory


def test_expert_parameters_per_gpu() -> None:
    """128 experts x 3 x 4096 x 1536 (SwiGLU) per layer: E/ep = 4 local experts each, split
    over etp."""
    job = _job()
    per_expert = 3 * 4096 * 1536
    _, e1 = layer_param_counts(job, True, 2, 32, 1)
    assert float(e1) == 4 * per_expert
    _, e_def = layer_param_counts(job, True, 2, 32)
    assert float(e_def) == 4 * per_expert / 2  # etp = tp = 2
    d1, _ = layer_param_counts(job, True, 2, 32, 1)
    d_def, _ = layer_param_counts(job, True, 2, 32)
    assert float(d1) == float(d_def)  # attention, router and norms stay on the tp grid


def test_fc1_input_activation_shrinks_with_etp() -> None:
    """Per layer and micro-batch the only activations that depend on etp are those an expert
    rank keeps per routed copy it processes: the dispatched tokens' copy kept as the expert fc1
    input (2 B x h) and the fp32 probability the weighted SwiGLU keeps (4 B), top_k x (etp/tp)
    copies per rank token. tp 2, etp 1, 4096 tokens: (2 x 4096 + 4) x 8 x (1 - 1/2) x 4096
    bytes less than the default."""
    job = _job()
    args = (job, 0, 2, 1, 32, 1, 1, "none")
    default = layer_factors(*args, moe=True)
    folded = layer_factors(*args, moe=True, etp=1)
    assert float(default.act_bytes) - float(folded.act_bytes) == pytest.approx(
        (2 * 4096 + 4) * 8 * 0.5 * 4096, rel=1e-12)


# ------------------------------------------------------------------------------- communication


def _a2a(n: int, per_node: int, nbytes: float) -> float:
    """comm.py all-to-all: the off-node share (n-k)/n over the NIC, the rest over NVLink."""
    t_in = (per_node - 1) / n * nbytes / NV + NV_LAT
    if n == per_node:
        return t_in
    return max(t_in, (n - per_node) / n * nbytes / NET + NET_LAT)


def test_folded_all_to_all_crosses_nodes_at_stride_one() -> None:
    """tp 2, ep 32, etp 1: the ep group is 32 consecutive ranks, 8 per node, and each rank sends
    its 2048 SP tokens x 8 copies x 4096 x 2 B; dispatch + combine forward, the same in
    backward; no expert-TP all-gather (etp = 1)."""
    job = _job()
    lf = layer_factors(job, 0, 2, 1, 32, 1, 1, "none", moe=True, etp=1)
    s = 2048 * 8 * 4096 * 2
    assert float(lf.ep_s) == pytest.approx(4 * _a2a(32, 8, s), rel=1e-12)
    assert float(lf.rc_ep_s) == pytest.approx(2 * _a2a(32, 8, s), rel=1e-12)


def test_folded_all_to_all_at_stride_etp_with_expert_tp_gather() -> None:
    """tp 4, etp 2, ep 8 on a stage of 64 ranks: ep members sit 2 ranks apart, so 4 share a
    node; a rank sends 1024 tokens x 8 x 4096 x 2 B; the 2 expert-TP ranks (consecutive, one
    node) all-gather the received copies (2 x that, ring factor 1/2, one latency) and
    reduce-scatter the outputs."""
    job = _job(gpus=64, batch=64)
    lf = layer_factors(job, 0, 4, 1, 8, 1, 1, "none", moe=True, etp=2)
    s = 1024 * 8 * 4096 * 2
    ag = 0.5 * (2 * s) / NV + NV_LAT
    fwd = 2 * _a2a(8, 4, s) + 2 * ag
    assert float(lf.ep_s) == pytest.approx(2 * fwd, rel=1e-12)


def test_default_layout_dispatches_the_sequence_parallel_share() -> None:
    """Default layout (etp = tp = 2), ep 16: Megatron-Core's alltoall dispatcher sends each
    rank's 4096/2 = 2048 SP tokens x 8 copies x 4096 x 2 B over ep (stride tp = 2, so 4 ep
    ranks per node) and gathers the received copies over the 2 expert-TP ranks
    (token_dispatcher.py:741-751 @d98e8a64; AG of 2 x that, ring factor 1/2, one NVLink
    latency; the same RS back): not the whole micro-batch's 4096 tokens per rank, which
    counted each token tp times."""
    job = _job()
    lf = layer_factors(job, 0, 2, 1, 16, 1, 1, "none", moe=True)
    s = 2048 * 8 * 4096 * 2
    ag = 0.5 * (2 * s) / NV + NV_LAT
    fwd = 2 * _a2a(16, 4, s) + 2 * ag
    assert float(lf.ep_s) == pytest.approx(2 * fwd, rel=1e-12)
    assert float(lf.rc_ep_s) == pytest.approx(fwd, rel=1e-12)


def test_routed_experts_leave_the_attention_tp_group() -> None:
    """With SP each tp block is an all-gather + reduce-scatter of the 4096 x 4096 x 2 B
    activations (tp 2: half over NVLink, one latency each). A MoE layer without shared experts
    charges only the attention's block, folded or not (at etp = tp the alltoall dispatcher
    gathers the routed copies over the expert-TP group itself, the EP term); with a shared
    expert (a dense tp MLP) both."""
    block = 2 * (0.5 * 4096 * 4096 * 2 / NV + NV_LAT)  # AG + RS
    for model, blocks in ((QWEN, 1), (QWEN_SHARED, 2)):
        job = _job(model)
        folded = layer_factors(job, 0, 2, 1, 32, 1, 1, "none", moe=True, etp=1)
        default = layer_factors(job, 0, 2, 1, 16, 1, 1, "none", moe=True)
        assert float(default.tp_s) == pytest.approx(2 * blocks * block, rel=1e-12)  # f + b
        assert float(folded.tp_s) == pytest.approx(2 * blocks * block, rel=1e-12)
        assert float(folded.rc_tp_s) == pytest.approx(blocks * block, rel=1e-12)


def test_expert_gradients_reduce_over_the_expert_dp_group() -> None:
    """DeepSeek-V3's layout, tp 2, dp 64, ep 64, etp 1: edp = 2 ranks 64 apart (different
    nodes, one rank per node): an all-reduce of 4-byte gradients between two nodes,
    2 (n-1)/n = 1 x 4 B / network per parameter. By default (etp = tp) edp = dp/ep = 1:
    nothing to reduce."""
    job = _job(gpus=1024, batch=1024)
    _, per_exp, _, _ = dp_sync_factors(job, 0, 2, 1, 64, 64, 0, 1)
    assert float(per_exp) == pytest.approx(4 / NET, rel=1e-9)
    _, per_exp_default, _, _ = dp_sync_factors(job, 0, 2, 1, 64, 64, 0)
    assert float(per_exp_default) == 0.0


def test_expert_dp_group_stride_is_etp_times_ep() -> None:
    """tp 4, dp 4, ep 2, etp 1 on a 16-rank stage: edp = 16 / 2 = 8 ranks, 2 apart, so 4 share
    a node and the group spans 2 nodes: hierarchical all-reduce of 4-byte gradients, an
    NVLink reduce-scatter and all-gather among 4 ((4-1)/4 each) and a 2-node ring of a quarter
    (2 (2-1)/2 x 1/4). (At the default layout's stride tp*ep = 8 it would be 8 nodes.)"""
    job = _job(gpus=16, batch=16)
    _, per_exp, _, _ = dp_sync_factors(job, 0, 4, 1, 4, 2, 0, 1)
    assert float(per_exp) == pytest.approx(4 * (2 * 0.75 / NV + 0.25 / NET), rel=1e-9)


# ------------------------------------------------------------------------------- default kept


@pytest.mark.parametrize("tp,ep,sp,mode", [(2, 8, 1, "none"), (4, 4, 0, "selective"),
                                           (1, 8, 0, "full"), (8, 2, 1, "full")])
def test_explicit_default_etp_costs_exactly_the_unset_one(tp: int, ep: int, sp: int,
                                                          mode: str) -> None:
    job = _job(QWEN_SHARED, gpus=64, batch=64)
    a = layer_factors(job, 0, tp, 1, ep, sp, 1, mode, moe=True)
    b = layer_factors(job, 0, tp, 1, ep, sp, 1, mode, moe=True, etp=tp)
    for f in a.__dataclass_fields__:
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert [float(x) for x in dp_sync_factors(job, 0, tp, 1, 64 // tp, ep, 1)] == [
        float(x) for x in dp_sync_factors(job, 0, tp, 1, 64 // tp, ep, 1, tp)]


def test_plans_with_etp_equal_to_tp_evaluate_as_unset() -> None:
    job = Job(model=QWEN_SHARED.model_copy(update={"num_layers": 8}),
              cluster=load_cluster("dgx-h100").take_gpus(64), seq_len=4096, global_batch=64)
    a = evaluate(job, parse_plan("tp=2,pp=2,ep=8,sp=1,zero=1", job)).to_json()
    b = evaluate(job, parse_plan("tp=2,pp=2,ep=8,sp=1,zero=1,etp=2", job)).to_json()
    assert b["plan"].pop("etp") == 2
    assert a == b


def test_folding_moves_the_cost_the_way_the_mesh_says() -> None:
    """Mixtral 8x7B, 64 H100, tp 2, pp 4, ep 8 (dp 8): by default the ep group has stride tp =
    2 and spans two nodes; folded (etp 1) it is 8 consecutive ranks on one node, so the EP
    all-to-alls (of twice the tokens: no tp split) leave the network; the experts are no
    longer halved over tp (more parameter memory) and their gradients now reduce over
    edp = 16 / 8 = 2 ranks."""
    from autoparallel_cp.api import make_job

    job = make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=256)
    d = evaluate(job, parse_plan("tp=2,pp=4,ep=8,sp=1,zero=1", job))
    f = evaluate(job, parse_plan("tp=2,pp=4,ep=8,sp=1,zero=1,etp=1", job))
    assert f.time.ep_comm_s < d.time.ep_comm_s / 5
    # the layers' TP collectives are the attention's in both (no shared expert)
    assert f.time.tp_comm_s == pytest.approx(d.time.tp_comm_s, rel=1e-12)
    assert f.memory.params_bytes > d.memory.params_bytes
    assert f.time.dp_comm_s > d.time.dp_comm_s


def test_cluster_is_dgx_h100_as_the_constants_say() -> None:
    g = load_cluster("dgx-h100").node_groups[0]
    assert (g.gpus_per_node, g.intra_node.bandwidth_gbps, g.inter_node.bandwidth_gbps) == (
        8, 450.0, 50.0)
    assert (g.intra_node.latency_us, g.inter_node.latency_us) == (3.0, 8.0)
