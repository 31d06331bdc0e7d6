"""SMs Transformer Engine's userbuffers reserve beside the GEMM whose output they
reduce-scatter (behaviour `ub_rs_sm_margin`, cost/efficiency.py `sm_reserve_stretch`).

TE hands cuBLAS `sm_count - num_comm_sm` SMs when `set_sm_margin` is on
(common/comm_gemm_overlap/comm_gemm_overlap.cpp l. 75 @v1.13). Expected factors by hand for
an H100 SXM5 (132 SMs, H100 whitepaper): 24 reserved -> 132 / 108, 16 -> 132 / 116.
Small shape: hidden 64, 4 heads of 16, FFN 96 (GELU), tp 2, micro-batch 2, sequence 256.
"""

from __future__ import annotations

import pytest

from autoparallel_cp.cost.efficiency import gemm_time, sm_reserve_stretch
from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.cost.straggler import job_compute_stretch
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import RECIPES, Job, ModelSpec
from autoparallel_cp.spec.loaders import load_cluster
from tests.cost.toy_cluster import h100_cluster

H, A, D, F = 64, 4, 16, 96
TP, MBS, S = 2, 2, 256


def _model() -> ModelSpec:
    return ModelSpec(name="tiny", num_layers=2, hidden_size=H, ffn_hidden_size=F,
                     num_attention_heads=A, head_dim=D, vocab_size=1024, mlp="gelu")


def _job(margin: tuple[int, int], sm_count: int | None = 132) -> Job:
    rec = RECIPES["megatron-bf16"].with_behaviour(ub_rs_sm_margin=margin)
    return Job(model=_model(), cluster=h100_cluster(sm_count=sm_count), recipe=rec,
               seq_len=S, global_batch=8)


def test_stretch_by_hand() -> None:
    gpu = h100_cluster(sm_count=132).node_groups[0].gpu
    assert sm_reserve_stretch(gpu, 0) == 1.0
    assert sm_reserve_stretch(gpu, 24) == pytest.approx(132 / 108)
    assert sm_reserve_stretch(gpu, 16) == pytest.approx(1.1379310344827587)
    with pytest.raises(ValueError, match="cannot spare"):
        sm_reserve_stretch(h100_cluster().node_groups[0].gpu, 8)


def test_only_proj_and_fc2_forward_grow_and_only_with_tp() -> None:
    """tp 2: the compute grows by (132/108 - 1) x the out-projection forward GEMM
    ([tokens, A*D/tp] @ [A*D/tp, H]) plus (132/116 - 1) x the fc2 forward GEMM
    ([tokens, F/tp] @ [F/tp, H]); backward GEMMs and every other op unchanged. tp 1: no
    userbuffers, nothing changes."""
    tokens = MBS * S
    base_job, ub_job = _job((0, 0)), _job((24, 16))
    args = (0, TP, 1, 1, 1, MBS, "none")
    base = layer_factors(base_job, *args)
    ub = layer_factors(ub_job, *args)
    gpu = base_job.cluster.node_groups[0].gpu
    slow = job_compute_stretch(base_job)
    proj = slow * float(gemm_time(gpu, tokens, A * D / TP, H))
    fc2 = slow * float(gemm_time(gpu, tokens, F / TP, H))
    extra = (132 / 108 - 1) * proj + (132 / 116 - 1) * fc2
    assert float(ub.compute_s - base.compute_s) == pytest.approx(extra, rel=1e-9)
    one = (0, 1, 1, 1, 0, MBS, "none")
    assert float(layer_factors(ub_job, *one).compute_s) == pytest.approx(
        float(layer_factors(base_job, *one).compute_s), rel=1e-12)


def test_reservation_needs_the_sm_count() -> None:
    with pytest.raises((ValueError, InputError), match="sm_count"):
        _job((24, 16), sm_count=None)
    with pytest.raises((ValueError, InputError), match="sm_count"):
        _job((24, 16), sm_count=20)
    _job((0, 0), sm_count=None)  # nothing reserved: no SM count needed


@pytest.mark.parametrize("preset,sms", [("dgx-h100", 132), ("dgx-h200", 132),
                                        ("dgx-h800", 132), ("dgx-a100", 108)])
def test_presets_state_the_sm_count(preset: str, sms: int) -> None:
    assert load_cluster(preset).node_groups[0].gpu.sm_count == sms
