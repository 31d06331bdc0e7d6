"""Sliding-window attention: pair counts, the windowed kernel's tiles, layer factors, MFU FLOPs.

Expected values are counted here by brute force (keys per query, FlashAttention-3's loop bounds
per query tile, hopper/block.h `get_n_block_min_max` @0251105a) or derived by hand in the test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoparallel_cp.cost import comm
from autoparallel_cp.cost import efficiency as E
from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.cost.flops import (
    FLASH_QUERY_TILE,
    attention_core_flops,
    model_flops_per_token,
    window_flops_ratio,
    window_kernel_length,
    window_pairs,
)
from autoparallel_cp.spec import Job, ModelSpec, MoESpec
from autoparallel_cp.spec.loaders import load_cluster


def _keys_per_query(s: int, w: int) -> int:
    """Keys query i attends under a (w, 0) window: j in [i - w, i], j >= 0."""
    return sum(len(range(max(0, i - w), i + 1)) for i in range(s))


@pytest.mark.parametrize(("s", "w"), [(8, 2), (8, 0), (8, 7), (8, 20), (1000, 128), (4096, 127)])
def test_window_pairs_counts_every_query(s: int, w: int) -> None:
    assert window_pairs(s, w) == _keys_per_query(s, w)


def test_flops_ratio_by_hand() -> None:
    # s = 8, w = 2: queries see 1, 2, 3, 3, 3, 3, 3, 3 keys = 21 of the causal 36
    assert window_flops_ratio(8, 2) == pytest.approx(21 / 36)
    assert window_flops_ratio(8, None) == 1.0
    assert window_flops_ratio(8, 7) == 1.0  # the window covers the sequence
    assert window_flops_ratio(8, 100) == 1.0


def _fa3_local_tiles(s: int, w: int, b: int) -> int:
    """Key tiles a FA3 local kernel loops over, summed over query tiles (B_M = B_N = b)."""
    total = 0
    for m in range(math.ceil(s / b)):
        n_max = math.ceil(min((m + 1) * b, s) / b)
        n_min = max(0, (m * b - w) // b)
        total += n_max - n_min
    return total


def _causal_tiles(length: float, b: int) -> float:
    mm = length / b
    return mm * (mm + 1) / 2


@pytest.mark.parametrize(("s", "w"), [(8192, 512), (4096, 128), (32768, 4096), (8192, 4096),
                                      (4096, 3840)])
def test_kernel_length_reproduces_the_tile_count(s: int, w: int) -> None:
    """s/L causal kernels of length L run exactly the windowed kernel's tiles (B divides w, s)."""
    b = FLASH_QUERY_TILE
    length = window_kernel_length(s, w)
    assert length is not None
    assert s / length * _causal_tiles(length, b) == pytest.approx(_fa3_local_tiles(s, w, b),
                                                                 rel=1e-12)


def test_kernel_length_limits() -> None:
    b = FLASH_QUERY_TILE
    assert window_kernel_length(4096, None) is None
    assert window_kernel_length(4096, 4096 - b) is None  # the band covers every causal tile
    # just below: continuous with a full causal kernel of length s
    assert window_kernel_length(4096, 4096 - b - 1) == pytest.approx(4096, rel=1e-3)
    # w << s: 2w + B (the band's w + B keys per query tile, twice a causal kernel's mean)
    assert window_kernel_length(10**7, 128) == pytest.approx(2 * 128 + b, rel=1e-4)
    # unaligned window: within one tile per query tile of the loop bounds' count
    s, w = 4096, 127
    length = window_kernel_length(s, w)
    assert length is not None
    per_tile = s / length * _causal_tiles(length, b) / (s / b)
    assert abs(per_tile - _fa3_local_tiles(s, w, b) / (s / b)) <= 1.0


def _mini(window: int | None, pattern: tuple[bool, ...] | None = None,
          moe: bool = False) -> ModelSpec:
    return ModelSpec(
        name="mini", num_layers=4, hidden_size=1024, ffn_hidden_size=2816,
        num_attention_heads=8, num_kv_heads=4, vocab_size=32000,
        moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=1408) if moe else None,
        sliding_window_left=window, sliding_window_layers=pattern)


def _job(model: ModelSpec, s: int, gpus: int = 1) -> Job:
    return Job(model=model, cluster=load_cluster("dgx-h100").take_gpus(gpus), seq_len=s,
               global_batch=8)


def test_windowed_layer_saves_the_attention_it_skips() -> None:
    """mode none, one GPU (no straggler stretch, no collectives): a windowed layer's time is the
    full layer's less the causal kernel plus s/L causal kernels of length L."""
    s, w = 16384, 1024
    full = layer_factors(_job(_mini(None), s), 0, 1, 1, 1, 0, 1, "none")
    win = layer_factors(_job(_mini(w), s), 0, 1, 1, 1, 0, 1, "none")
    gpu = load_cluster("dgx-h100").node_groups[0].gpu
    flops = float(2.0 * 1 * s * s * 8 * (128 + 128) / 2)  # causal: 2·b·s·s·a·(dqk+dv)/2
    assert flops == pytest.approx(float(attention_core_flops(_mini(None), 1, s, 1, 1, True)))
    length = 2 * w + 128 - (w + 128) * w / s  # (w + B)(2s - w)/s - B, expanded
    f_full, b_full = E.flash_attention_time(gpu, flops, s, 128)
    f_win, b_win = E.flash_attention_time(gpu, flops * length / s, length, 128)
    saved = float(f_full + b_full - f_win - b_win)
    assert saved > 0
    assert float(full.time_s - win.time_s) == pytest.approx(saved, rel=1e-9)
    assert float(win.act_bytes) == float(full.act_bytes)  # flash keeps O(s) either way


def test_window_that_does_not_bind_changes_nothing() -> None:
    s = 4096
    full = layer_factors(_job(_mini(None), s), 0, 2, 1, 1, 1, 1, "selective")
    wide = layer_factors(_job(_mini(s), s), 0, 2, 1, 1, 1, 1, "selective")
    assert float(wide.time_s) == float(full.time_s)


@pytest.mark.parametrize("moe", [False, True])
def test_alternating_pattern_is_the_mean_of_its_kinds(moe: bool) -> None:
    s, w = 8192, 256
    args = (0, np.array([1, 2]), 1, 1, 1, 1, "full")
    full = layer_factors(_job(_mini(None, moe=moe), s, 8), *args, moe=moe)
    win = layer_factors(_job(_mini(w, moe=moe), s, 8), *args, moe=moe)
    alt = layer_factors(_job(_mini(w, (True, False), moe=moe), s, 8), *args, moe=moe)
    for name in ("time_s", "recompute_s", "compute_s", "cp_s", "act_bytes"):
        expect = 0.5 * getattr(full, name) + 0.5 * getattr(win, name)
        assert np.allclose(getattr(alt, name), expect, rtol=1e-12), name
    # 1 windowed layer in 4 (pattern of period 4)
    quarter = layer_factors(_job(_mini(w, (True, False, False, False), moe=moe), s, 8), *args,
                            moe=moe)
    assert np.allclose(quarter.time_s, 0.75 * full.time_s + 0.25 * win.time_s, rtol=1e-12)


def test_windowed_cp_exchange_is_not_hidden() -> None:
    """Context parallelism on a windowed layer: TE's all-gather CP exposes the K, V exchange;
    charged as the ring's cp steps forward and cp steps of twice the bytes backward."""
    s, w, cp = 32768, 512, 2
    job = _job(_mini(w), s, 8)
    lf = layer_factors(job, 0, 1, cp, 1, 0, 1, "none")
    nd = job.cluster.node_groups[0]
    tokens = s / cp
    kv_chunk = 2.0 * tokens * 4 * 128 * 2  # K and V, 4 KV heads x 128, bf16
    step = float(comm.p2p(nd, 1.0, kv_chunk))
    assert float(lf.cp_s) == pytest.approx(cp * step + cp * 2 * step, rel=1e-9)
    full = layer_factors(_job(_mini(None), s, 8), 0, 1, cp, 1, 0, 1, "none")
    assert float(full.cp_s) < float(lf.cp_s)  # the ring hides most of it behind attention


def test_model_flops_count_the_window() -> None:
    """MFU FLOPs: a windowed layer's attention term (6·a·(dqk+dv)·s per token) x the pairs its
    window leaves; the parameter term is unchanged."""
    s, w = 8192, 1024
    base = model_flops_per_token(_mini(None), s)
    alt = model_flops_per_token(_mini(w, (True, False)), s)
    pairs = (w + 1) * (s - w / 2)  # by hand: (w+1)(s - w/2)
    ratio = pairs / (s * (s + 1) / 2)
    per_layer = 6.0 * 8 * (128 + 128) * s
    assert base - alt == pytest.approx(2 * per_layer * (1 - ratio), rel=1e-12)
    assert model_flops_per_token(_mini(s), s) == base
