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
