"""Straggler term (cost/straggler.py): a synchronous step waits for its slowest GPU.

Expected values are derived here from the cited figures, not from the implementation:
- sigma from Sinha et al. (arXiv 2208.11035 v3): 8% average whisker-span variation, whisker
  span = (Q3 + 1.5 IQR) - (Q1 - 1.5 IQR) = 4 IQR of a normal, IQR from scipy's normal quantiles;
- E[max of n standard normals] in closed form for n = 2, 3, 4 (n = 2: 1/sqrt(pi); n = 3:
  3/(2 sqrt(pi)); n = 4: 3/(2 sqrt(pi)) (1 + 2 asin(1/3) / pi), Bose & Gupta 1959), and by a
  seeded Monte-Carlo draw for large n.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from autoparallel_cp.cost import straggler
from autoparallel_cp.cost.efficiency import gemm_time, hbm_time
from autoparallel_cp.cost.factors import edge_factors
from autoparallel_cp.cost.flops import head_gemm
from autoparallel_cp.spec import RECIPES, ClusterSpec, Job, LinkSpec, ModelSpec, NodeGroup
from tests.cost.toy_cluster import h100_cluster

SIGMA = 0.08 / (4.0 * (norm.ppf(0.75) - norm.ppf(0.25)))


def test_sigma_from_sinha_whisker_span() -> None:
    assert pytest.approx(0.014826, abs=1e-6) == SIGMA
    assert pytest.approx(SIGMA, rel=1e-9) == straggler.GPU_SPEED_SIGMA


@pytest.mark.parametrize(("n", "expected"), [
    (1, 0.0),
    (2, 1.0 / math.sqrt(math.pi)),
    (3, 3.0 / (2.0 * math.sqrt(math.pi))),
    (4, 3.0 / (2.0 * math.sqrt(math.pi)) * (1.0 + 2.0 * math.asin(1.0 / 3.0) / math.pi)),
])
def test_expected_max_closed_forms(n: int, expected: float) -> None:
    assert straggler.expected_max_std_normal(n) == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize("n", [64, 1024])
def test_expected_max_matches_a_seeded_draw(n: int) -> None:
    draws = np.random.default_rng(15).standard_normal((4000, n)).max(axis=1)
    # standard error of the mean of 4,000 maxima is below 0.01 for these n
    assert straggler.expected_max_std_normal(n) == pytest.approx(draws.mean(), abs=0.03)


def test_stretch_is_one_at_one_gpu_and_grows_with_n() -> None:
    assert straggler.compute_stretch(1) == 1.0
    assert straggler.compute_stretch(2) == pytest.approx(1.0 + SIGMA / math.sqrt(math.pi))
    ns = [1, 2, 8, 64, 512, 4096, 16384]
    stretches = [straggler.compute_stretch(n) for n in ns]
    assert all(np.diff(stretches) > 0)
    # about 6% of the compute-bound time at 16K GPUs (E[max] ~ 3.97 sigma)
    assert stretches[-1] - 1.0 == pytest.approx(3.97 * SIGMA, rel=0.01)


def test_rejects_zero_gpus() -> None:
    with pytest.raises(ValueError):
        straggler.expected_max_std_normal(0)


def _model() -> ModelSpec:
    return ModelSpec(name="toy", num_layers=4, hidden_size=4096, ffn_hidden_size=16384,
                     num_attention_heads=32, num_kv_heads=32, vocab_size=50304)


def _one_gpu() -> ClusterSpec:
    base = h100_cluster().node_groups[0]
    nd = NodeGroup(name="n", gpu=base.gpu, gpus_per_node=1, num_nodes=1,
                   intra_node=LinkSpec(bandwidth_gbps=450, latency_us=3.0),
                   inter_node=LinkSpec(bandwidth_gbps=50, latency_us=8.0))
    return ClusterSpec(name="one", node_groups=[nd])


def _job(cluster: ClusterSpec) -> Job:
    return Job(model=_model(), cluster=cluster, recipe=RECIPES["megatron-bf16"], seq_len=2048,
               global_batch=64)


def test_head_gemm_stretched_embedding_hbm_time_not() -> None:
    """The LM-head GEMMs of a 16-GPU job take c_16 x their single-GPU time; the embedding
    (HBM-bound) does not move."""
    one, many = _job(_one_gpu()), _job(h100_cluster(num_nodes=2))
    e1 = edge_factors(one, 0, 1, 1, 0, 1)
    e16 = edge_factors(many, 0, 1, 1, 0, 1)
    gpu = one.cluster.node_groups[0].gpu
    hg = head_gemm(_model(), 2048.0, 1.0)
    gemms = sum(float(gemm_time(gpu, a, b, c, "bf16"))
                for a, b, c in ((hg.m, hg.k, hg.n), (hg.m, hg.n, hg.k), (hg.k, hg.m, hg.n)))
    c16 = 1.0 + SIGMA * 1.7659913  # E[max of 16] (tables of normal order statistics)
    assert float(e16.head_compute_s) - float(e1.head_compute_s) == pytest.approx(
        (c16 - 1.0) * gemms, rel=1e-4)
    assert float(e16.emb_time_s) == float(e1.emb_time_s)
    assert float(e1.emb_time_s) == pytest.approx(
        float(hbm_time(gpu, 2048.0 * 4096 * (2 + 2) * 3.0)))
