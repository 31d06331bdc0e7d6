"""Ablation pairs (harness.ablation): runs of one job that differ in exactly one choice are
named by that choice; runs that differ in two choices, or in the job, are no pair; the
agreement counts only pairs measured more than the margin apart. Hand-built runs of one
published job (Llama 3 8B on DGX H100)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from harness import ablation as A

from autoparallel_cp.api import load_cluster, load_model
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.plan import Plan


@dataclass(frozen=True)
class Run:
    key: tuple[str, int]
    shape: tuple[int, ...]
    gpus: int
    job: Job
    plan: Plan
    measured: float


MODEL = load_model("llama3-8b")


def _run(i: int, gpus: int = 16, gb: int = 64, seq: int = 8192, recipe: str = "megatron-bf16",
         measured: float = 100.0, **plan: Any) -> Run:
    cl = load_cluster("dgx-h100")
    group = cl.node_groups[0].model_copy(update={"num_nodes": gpus // 8})
    cl = cl.model_copy(update={"node_groups": [group]})
    job = Job(model=MODEL, cluster=cl, recipe=RECIPES[recipe], seq_len=seq, global_batch=gb)
    cells = {"tp": 1, "pp": 1, "cp": 1, "zero": 1, "mbs": 1, **plan}
    dp = gpus // (cells["tp"] * cells["pp"] * cells["cp"])
    p = Plan(dp=dp, num_microbatches=gb // (dp * cells["mbs"]), **cells)
    return Run(("heldout", i), (32, 4096), gpus, job, p, measured)


def test_each_single_choice_is_named() -> None:
    base = _run(0)
    assert A.axis(base, _run(1, cp=2)) == "cp"  # dp 16 -> 8, micro-batches 4 -> 8
    assert A.axis(base, _run(2, zero=2)) == "zero"
    assert A.axis(base, _run(3, gb=256)) == "microbatches"
    assert A.axis(base, _run(4, gpus=32)) == "gpus, fixed batch"
    assert A.axis(base, _run(5, gpus=32, gb=128)) == "gpus"
    assert A.axis(_run(6, gpus=32, gb=128), base) == "gpus"  # order does not matter


def test_two_choices_or_another_job_are_no_pair() -> None:
    base = _run(0)
    assert A.axis(base, _run(1, cp=2, zero=2)) is None
    assert A.axis(base, _run(2, tp=2)) is None  # tensor parallelism is not an ablation axis
    assert A.axis(base, _run(3, cp=2, gb=128)) is None  # cp and the batch
    assert A.axis(base, _run(4, gpus=32, tp=2)) is None  # scale and the model-parallel plan
    assert A.axis(base, _run(5, seq=4096)) is None  # another sequence: another job
    assert A.axis(base, _run(6, recipe="megatron-fp8")) is None  # another recipe
    assert A.axis(base, replace(base, shape=(80, 8192))) is None
    assert A.axis(base, _run(7)) is None  # the same plan twice is no ablation


def test_agreement_scores_pairs_beyond_the_margin_only() -> None:
    runs = [_run(0, measured=100.0), _run(1, cp=2, measured=80.0),  # scored, agrees
            _run(2, zero=2, measured=95.0),  # 5% apart: a pair, not scored
            _run(3, gb=256, measured=130.0)]  # scored, disagrees below
    preds = {("heldout", 0): 100.0, ("heldout", 1): 90.0, ("heldout", 2): 50.0,
             ("heldout", 3): 99.0}
    got = A.agreement(runs, preds)
    assert got["cp"] == (1, 1, 1)
    assert got["zero"] == (0, 0, 1)
    assert got["microbatches"] == (0, 1, 1)
    assert got["gpus"] == got["gpus, fixed batch"] == (0, 0, 0)
    assert set(got) == set(A.AXES)


@pytest.mark.parametrize("margin, scored", [(0.0, 1), (0.3, 0)])
def test_margin_is_the_callers(margin: float, scored: int) -> None:
    runs = [_run(0, measured=100.0), _run(1, zero=2, measured=120.0)]
    preds = {("heldout", 0): 1.0, ("heldout", 1): 2.0}
    assert A.agreement(runs, preds, margin)["zero"] == (scored, scored, 1)


def test_schedule_and_offload_pairs_are_named() -> None:
    """A schedule change at a fixed plan and batch is a `schedule` pair (a V-shaped schedule
    may bring vpp 2 and its chunk layout along); the default 1F1B written out is the same
    schedule, no pair; an offload change alone is an `offload` pair; a schedule together with
    the micro-batch size, or offload together with zero, is no pair."""
    base = _run(0, pp=4)
    assert A.axis(base, _run(1, pp=4, schedule="zb-h1")) == "schedule"
    assert A.axis(_run(2, pp=4, schedule="zb-h2"), _run(3, pp=4, schedule="zb-h1")) == "schedule"
    assert A.axis(base, _run(4, pp=4, schedule="zbv", vpp=2)) == "schedule"
    assert A.axis(base, _run(5, pp=4, schedule="1f1b")) is None
    assert A.axis(base, _run(6, pp=4, schedule="zb-h1", mbs=2)) is None
    assert A.axis(base, _run(7, pp=4, optimizer_offload=1.0)) == "offload"
    assert A.axis(base, _run(8, pp=4, activation_offload=2)) == "offload"
    assert A.axis(base, _run(9, pp=4, optimizer_offload=1.0, zero=2)) is None
    assert A.axis(_run(10, pp=4, gpus=32), _run(11, pp=4, optimizer_offload=1.0)) is None
