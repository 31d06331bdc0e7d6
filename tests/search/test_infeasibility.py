"""When no plan fits, the solver says so with `infeasibility.explain`'s numbers, which are
checked here against a hand count of the model states."""

from __future__ import annotations

import re

import pytest

from autoparallel_cp import api
from autoparallel_cp.errors import InfeasibleError

GIB = 2**30


def test_a_405b_model_on_one_node_is_explained() -> None:
    # Llama 3.1 405B (Meta, "The Llama 3 Herd of Models", 2024: 405B parameters) on 8 H100s.
    # Adam keeps an fp32 master copy, m and v: 12 bytes a parameter; the most any plan can
    # shard them on 8 GPUs is 8 ways, so no plan keeps less than 405e9 * 12 / 8 bytes of
    # optimizer state on a GPU (567 GiB), about 7x an 80 GB H100: nothing fits, and the optimizer
    # states are the largest term (bf16 parameters are 2 bytes, gradients at most 4).
    job = api.make_job("llama3-405b", "dgx-h100", gpus=8, seq_len=8192, global_batch=8)
    with pytest.raises(InfeasibleError) as err:
        api.solve(job, time_limit=10)
    text = str(err.value)
    m = re.match(r"no plan fits: the smallest memory any plan reaches is ([\d.]+) GiB on a "
                 r"([\d.]+) GiB GPU \((.+)\); the largest term is optimizer states \(([\d.]+) "
                 r"GiB\)\. Would fit with: more GPUs \(about ([\d.]+)x\)", text)
    assert m, text
    need, cap, plan, opt, ratio = (float(m[1]), float(m[2]), m[3], float(m[4]), float(m[5]))
    assert opt == pytest.approx(405e9 * 12 / 8 / GIB, rel=0.01)
    assert 74 < cap < 80  # an 80 GB H100 less the CUDA context and the allocator's reserve
    assert need > opt + 405e9 * 2 / 8 / GIB  # parameters come on top of the optimizer states
    assert ratio == pytest.approx(need / cap, abs=0.06)
    assert "tp=8" in plan or "pp=8" in plan  # the states are sharded as far as they go


# --- issue 28.6: an empty space names the rule and the pin that empty it ---------------------


def _no_plan(model: str, gpus: int, seq: int, batch: int, fix: str) -> str:
    job = api.make_job(model, "dgx-h100", gpus=gpus, seq_len=seq, global_batch=batch)
    with pytest.raises(InfeasibleError) as err:
        api.solve(job, fix=fix, time_limit=10)
    text = str(err.value)
    assert "check --fix pins and divisibility" not in text  # the old generic hint
    return text


def test_interleaving_without_a_pipeline_is_named() -> None:
    text = _no_plan("llama3-8b", 64, 4096, 512, "pp=1,vpp=2")
    assert "vpp=2 (interleaving) needs pp > 1" in text
    assert "Dropping the pin pp=1 or vpp=2 leaves plans" in text


def test_a_batch_that_does_not_split_over_dp_is_named() -> None:
    # 64 GPUs of pure data parallelism: dp = 64, and 96 sequences do not split 64 ways
    text = _no_plan("llama3-8b", 64, 4096, 96, "tp=1,pp=1,cp=1")
    assert "the global batch 96 does not split into dp*mbs = 64*1" in text


def test_a_pinned_dp_that_the_degrees_do_not_give_is_named() -> None:
    text = _no_plan("llama3-70b", 64, 4096, 64, "tp=8,pp=4,cp=1,dp=4")
    assert "dp = GPUs/(tp*cp*pp) = 2, not the pinned dp=4" in text
    assert "Dropping the pin" in text


def test_expert_parallelism_beyond_dp_cp_is_folded_or_named() -> None:
    from autoparallel_cp.search.infeasibility import empty_space
    from autoparallel_cp.search.space import SearchSpace

    # DeepSeek-V3 as NVIDIA's benchmark runs it (tp 2, pp 16, ep 64 on 1,024 GPUs): dp*cp = 32.
    # The search folds the experts over the tensor ranks (etp is an axis), so the space is not
    # empty; pinning the experts to Megatron's default etp = tp empties it, and the message
    # names the expert grid's rule with the numbers.
    job = api.make_job("deepseek-v3", "dgx-h100", gpus=1024, seq_len=4096, global_batch=4096)
    assert SearchSpace.for_job(job, fix="tp=2,pp=16,ep=64,cp=1").num_degree_combinations() > 0
    sp = SearchSpace.for_job(job, fix="tp=2,pp=16,ep=64,cp=1,etp=2")
    assert sp.num_degree_combinations() == 0
    text = empty_space(job, sp)
    assert "etp*ep = 2*64 does not divide tp*cp*dp = 64" in text and "etp=2" in text


def test_an_expert_grid_no_searched_etp_gives_is_named_with_the_sizes() -> None:
    from autoparallel_cp.search.infeasibility import empty_space
    from autoparallel_cp.search.space import SearchSpace

    # ep 256 on tp 2 x dp 32: dp*cp = 32 and tp*cp*dp = 64 are both below 256
    job = api.make_job("deepseek-v3", "dgx-h100", gpus=1024, seq_len=4096, global_batch=4096)
    sp = SearchSpace.for_job(job, fix="tp=2,pp=16,ep=256,cp=1")
    text = empty_space(job, sp)
    assert "ep=256 fits no searched expert grid: ep | dp*cp = 32 with etp = tp" in text
    assert "etp*ep | tp*cp*dp = 64 for etp in {tp, 1}" in text
