"""Pipeline sends (cost/sync.py `p2p_factor`). Megatron-Core's `overlap_p2p_comm` (behaviour
`overlap_p2p_comm`): the interleaved schedule's steady-state sends and receives run beside a
model chunk's compute and cost COMM_SM_SHARE of their time; the first stage's
W = 2(pp - 1) + (vpp - 1)·N warm-up forwards and as many cool-down backwards wait for theirs
(schedules.py core_v0.10.0 l. 692-696, 1076, 1169-1300, 1437). What each tensor rank sends
(behaviour `pp_scatter_gather`). Expected values are worked out here from those rules, by
hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoparallel_cp.cost.comm import P2P_NVLINK_EFFICIENCY
from autoparallel_cp.cost.constants import COMM_SM_SHARE
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.sync import p2p_exposed_share, p2p_factor
from autoparallel_cp.spec import RECIPES, Job, ModelSpec
from autoparallel_cp.spec.plan import Plan
from tests.cost.toy_cluster import h100_cluster

SM = COMM_SM_SHARE


def _job(overlap: bool, global_batch: int, nodes: int = 1, scatter: bool = False) -> Job:
    model = ModelSpec(name="m", num_layers=16, hidden_size=4096, ffn_hidden_size=14336,
                      num_attention_heads=32, num_kv_heads=8, vocab_size=32000)
    recipe = RECIPES["megatron-bf16"].with_behaviour(overlap_p2p_comm=overlap,
                                                     pp_scatter_gather=scatter)
    return Job(model=model, cluster=h100_cluster(nodes), recipe=recipe, seq_len=4096,
               global_batch=global_batch)


def _one_nvlink(nbytes: float) -> float:
    """One send on the toy node's NVLink: 3 us + bytes / (450 GB/s x P2P_NVLINK_EFFICIENCY,
    NCCL's send/recv share of the link)."""
    return 3e-6 + nbytes / (450e9 * P2P_NVLINK_EFFICIENCY)


def test_exposed_share_counts_the_first_stages_warmup_and_cooldown() -> None:
    # pp 4, vpp 2, m 8 (pp | m: N = pp = 4): W = 2*3 + 1*4 = 10 of 16 chunks exposed
    assert float(p2p_exposed_share(4, 2, 8)) == pytest.approx(10 / 16 + 6 / 16 * SM, rel=1e-12)
    # pp 2, vpp 4, m 16: W = 2 + 3*2 = 8 of 64 chunks
    assert float(p2p_exposed_share(2, 4, 16)) == pytest.approx(8 / 64 + 56 / 64 * SM,
                                                               rel=1e-12)
    # m = 6 on pp 4 (pp does not divide m): N = 6 (6 % 4 = 2 < 4, 6 % 5 = 1 < 4, 6 % 6 = 0),
    # W = 6 + 1*6 = 12 = every one of the 12 chunks: nothing is left to overlap
    assert float(p2p_exposed_share(4, 2, 6)) == pytest.approx(1.0, rel=1e-12)
    # m = 10 on pp 4: N = 5 (10 % 5 = 0), W = 6 + 5 = 11 of 20 chunks
    assert float(p2p_exposed_share(4, 2, 10)) == pytest.approx(11 / 20 + 9 / 20 * SM,
                                                               rel=1e-12)
    # without interleaving Megatron turns the overlap off (arguments.py): all exposed
    assert float(p2p_exposed_share(4, 1, 8)) == 1.0
    # vectorised over the axes as the solver's tables call it
    got = p2p_exposed_share(np.array([4.0, 2.0]), np.array([2.0, 4.0]), np.array([8.0, 16.0]))
    assert got == pytest.approx([10 / 16 + 6 / 16 * SM, 8 / 64 + 56 / 64 * SM], rel=1e-12)


def test_p2p_factor_with_and_without_overlap() -> None:
    # tp 2, cp 1, dp 1, pp 4 on one 8-GPU node: stages 2 ranks apart, NVLink; mbs 1, seq 4096,
    # h 4096, bf16, sequence parallel: 4096 * 4096 * 2 / 2 bytes per send
    one = _one_nvlink(4096 * 4096 * 2 / 2)
    # global batch 8, dp 1, mbs 1: m = 8
    plain = float(p2p_factor(_job(False, 8), 0, 2, 1, 1, 1, 4, 2, 1))
    assert plain == pytest.approx(2 * 2 * one, rel=1e-12)  # fwd + bwd, per chunk (vpp 2)
    over = float(p2p_factor(_job(True, 8), 0, 2, 1, 1, 1, 4, 2, 1))
    assert over == pytest.approx(2 * 2 * one * (10 / 16 + 6 / 16 * SM), rel=1e-12)
    # vpp 1: the flag changes nothing
    assert float(p2p_factor(_job(True, 8), 0, 2, 1, 1, 1, 4, 1, 1)) == pytest.approx(
        2 * one, rel=1e-12)


def test_step_time_moves_by_the_hidden_transfers_only() -> None:
    """Step time with and without the overlap differs by exactly the hidden part of every
    stage's transfers, m per step plus the bubble's (pp - 1)/vpp share (steptime.py
    composition: pipeline = m·T_max + (sum_j t_j - T_max)/vpp, p2p inside every t_j)."""
    plan = Plan(dp=1, tp=2, pp=4, vpp=2, cp=1, sp=1, zero=1, mbs=1, num_microbatches=8,
                recompute="none")
    a = evaluate(_job(False, 8), plan)
    b = evaluate(_job(True, 8), plan)
    one = _one_nvlink(4096 * 4096 * 2 / 2)
    saved = 2 * 2 * one * (1 - (10 / 16 + 6 / 16 * SM))  # per micro-batch, every stage
    assert a.time.step_s - b.time.step_s == pytest.approx(saved * (8 + (4 - 1) / 2),
                                                          rel=1e-9)
    assert a.time.pp_comm_s - b.time.pp_comm_s == pytest.approx(8 * saved, rel=1e-9)


def test_an_options_override_reaches_the_pipeline_sends() -> None:
    """`evaluate(job, plan, options)` (calibration runs pass each run's options) prices the
    sends with the override's `overlap_p2p_comm`, as it prices everything else with it: the
    same numbers as a job whose recipe says so."""
    plan = Plan(dp=1, tp=2, pp=4, vpp=2, cp=1, sp=1, zero=1, mbs=1, num_microbatches=8,
                recompute="none")
    off, on = _job(False, 8), _job(True, 8)
    over = evaluate(off, plan, on.recipe.behaviour)
    assert over.time.pp_comm_s == pytest.approx(evaluate(on, plan).time.pp_comm_s, rel=1e-12)
    assert over.time.step_s == pytest.approx(evaluate(on, plan).time.step_s, rel=1e-12)
    assert over.time.pp_comm_s < evaluate(off, plan).time.pp_comm_s


def test_what_each_tensor_rank_sends() -> None:
    """Megatron-Core sends [s/cp, b, h] from every tp rank, [s/(cp·tp), b, h] under sequence
    parallelism (schedules.py core_v0.10.0 l. 676-679); Megatron-LM's 2021-22 scatter/gather
    and DeepSpeed's PipelineEngine send 1/tp per rank either way (`pp_scatter_gather`)."""
    full = 4096 * 4096 * 2  # s·b·h bf16 bytes, mbs 1, cp 1
    # (tp, cp, sp, mbs, pp, vpp, dp) = (4, 1, sp, 1, 2, 1, 1): stages 4 ranks apart, NVLink
    assert float(p2p_factor(_job(False, 8), 0, 4, 1, 0, 1, 2, 1, 1)) == pytest.approx(
        2 * _one_nvlink(full), rel=1e-12)
    assert float(p2p_factor(_job(False, 8), 0, 4, 1, 1, 1, 2, 1, 1)) == pytest.approx(
        2 * _one_nvlink(full / 4), rel=1e-12)
    for sp in (0, 1):
        assert float(p2p_factor(_job(False, 8, scatter=True), 0, 4, 1, sp, 1, 2, 1, 1)) \
            == pytest.approx(2 * _one_nvlink(full / 4), rel=1e-12)
    # the presets: Megatron-Core's rule by default, DeepSpeed's partitioned sends
    assert not RECIPES["megatron-bf16"].behaviour.pp_scatter_gather
    assert RECIPES["deepspeed"].behaviour.pp_scatter_gather


def test_presets_follow_their_frameworks_p2p_default(tmp_path: Path) -> None:
    """Megatron-LM main @ d98e8a64, the megatron recipes' target, overlaps the interleaved
    schedule's p2p unless `--no-overlap-p2p-communication` (store_false, arguments.py:
    3118-3120), so megatron-bf16 and megatron-fp8 cost the overlap; DeepSpeed's PipelineEngine
    has no interleaved schedule and the PyTorch recipes are not Megatron: off. A recipe file
    on a Megatron base keeps it unless it sets it (behaviour merged field by field)."""
    from autoparallel_cp.spec.loaders import load_recipe

    assert RECIPES["megatron-bf16"].behaviour.overlap_p2p_comm is True
    assert RECIPES["megatron-fp8"].behaviour.overlap_p2p_comm is True
    for name in ("deepspeed", "pytorch-amp", "pytorch-fsdp", "torchtitan-fsdp"):
        assert RECIPES[name].behaviour.overlap_p2p_comm is False, name
    (tmp_path / "kept.yaml").write_text("base: megatron-bf16\nbehaviour: {dropout: true}\n")
    (tmp_path / "off.yaml").write_text("base: megatron-fp8\n"
                                       "behaviour: {overlap_p2p_comm: false}\n")
    kept = load_recipe(tmp_path / "kept.yaml")
    assert kept.behaviour.overlap_p2p_comm is True and kept.behaviour.dropout is True
    assert load_recipe(tmp_path / "off.yaml").behaviour.overlap_p2p_comm is False
    # the preset prices the first stage's warm-up/cool-down transfers exposed, the rest
    # beside compute: pp 4, vpp 2, m 8 -> 10 of 16 chunks exposed (as above)
    plan = Plan(dp=1, tp=2, pp=4, vpp=2, cp=1, sp=1, zero=1, mbs=1, num_microbatches=8,
                recompute="none")
    preset = Job(model=_job(True, 8).model, cluster=h100_cluster(1),
                 recipe=RECIPES["megatron-bf16"], seq_len=4096, global_batch=8)
    assert evaluate(preset, plan).time.pp_comm_s == pytest.approx(
        evaluate(_job(True, 8), plan).time.pp_comm_s, rel=1e-12)
    assert evaluate(preset, plan).time.pp_comm_s < evaluate(_job(False, 8), plan).time.pp_comm_s
