"""`backward_splits` (cost/pass_split.py): the (F, B, W) shares of a whole grid of probe plans
from one array evaluation are, bit for bit, those of `backward_split` on each probe plan (the
search reads the grid, evaluate the scalar path: the bubble ratios must agree exactly)."""

from __future__ import annotations

import itertools

import pytest

from autoparallel_cp import api
from autoparallel_cp.cost.pass_split import backward_split, backward_splits
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan


@pytest.mark.parametrize(("model", "cluster", "gpus", "seq", "recipe", "etp"), [
    ("llama3-8b", "dgx-h100", 64, 8192, "megatron-bf16", None),
    ("mistral-7b", "dgx-h100", 64, 16384, "megatron-bf16", None),  # a sliding window
    ("mixtral-8x7b", "dgx-h100", 64, 4096, "megatron-bf16", 1),  # MoE, folded experts
    ("deepseek-v3", "dgx-h800", 256, 4096, "deepseek-v3-fp8", None),  # dense prefix, FP8
    ("bloom-176b", "dgx-a100", 384, 2048, "deepspeed", None),
])
def test_the_grid_is_the_scalar_path_bit_for_bit(model: str, cluster: str, gpus: int,
                                                 seq: int, recipe: str,
                                                 etp: int | None) -> None:
    job = api.make_job(model, cluster, gpus=gpus, seq_len=seq, global_batch=512,
                       recipe=recipe)
    tp, cp, ep, sp, mbs = [1, 2, 8], [1, 4], ([1, 8] if job.model.moe else [1]), [0, 1], [1, 2]
    f, b, w = backward_splits(job, tp, cp, ep, sp, mbs, etp)
    assert f.shape == (len(tp), len(cp), len(ep), 2, len(mbs), 3)
    for idx in itertools.product(*(range(n) for n in f.shape)):
        i, j, k, q, o, r = idx
        probe = Plan(pp=2, tp=tp[i], cp=cp[j], ep=ep[k], etp=etp, sp=sp[q], mbs=mbs[o],
                     recompute=RECOMPUTE_MODES[r])
        assert (float(f[idx]), float(b[idx]), float(w[idx])) == backward_split(job, probe)
