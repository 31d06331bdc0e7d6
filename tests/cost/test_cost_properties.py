"""Monotonicity properties of the cost model (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_steptime import _job

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.factors import layer_param_counts
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.plan import Plan

FAST = settings(max_examples=15, deadline=None)
modes = st.sampled_from(["none", "selective", "full"])
recipes = st.sampled_from(["megatron-bf16", "pytorch-amp", "torchtitan-fsdp"])


def _rjob(recipe: str, **kw: float) -> Job:
    return _job(**kw).model_copy(update={"recipe": RECIPES[recipe]})  # type: ignore[arg-type]


@FAST
@given(tp=st.sampled_from([1, 2, 4, 8]), mbs=st.sampled_from([1, 2]), mode=modes,
       recipe=recipes)
def test_memory_grows_with_mbs(tp: int, mbs: int, mode: str, recipe: str) -> None:
    job = _rjob(recipe)
    dp = 16 // tp
    a = evaluate(job, Plan(dp=dp, tp=tp, mbs=mbs, num_microbatches=64 // (dp * mbs),
                           recompute=mode))
    b = evaluate(job, Plan(dp=dp, tp=tp, mbs=2 * mbs, num_microbatches=64 // (dp * 2 * mbs),
                           recompute=mode))
    assert b.memory.peak_bytes >= a.memory.peak_bytes


@FAST
@given(seq=st.sampled_from([1024, 2048, 4096]), tp=st.sampled_from([1, 4]), recipe=recipes)
def test_memory_grows_with_seq(seq: int, tp: int, recipe: str) -> None:
    p = Plan(dp=16 // tp, tp=tp, mbs=1, num_microbatches=64 // (16 // tp))
    a = evaluate(_rjob(recipe).model_copy(update={"seq_len": seq}), p)
    b = evaluate(_rjob(recipe).model_copy(update={"seq_len": 2 * seq}), p)
    assert b.memory.peak_bytes >= a.memory.peak_bytes


@FAST
@given(tp=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 2]), recipe=recipes)
def test_more_recompute_less_memory(tp: int, pp: int, recipe: str) -> None:
    dp = 16 // (tp * pp)
    peaks = [evaluate(_rjob(recipe), Plan(dp=dp, tp=tp, pp=pp, mbs=1, num_microbatches=64 // dp,
                                   recompute=m)).memory.peak_bytes
             for m in ("none", "selective", "full")]
    assert peaks[0] >= peaks[1] >= peaks[2]


@FAST
@given(tp=st.sampled_from([1, 2, 4]))
def test_more_tp_less_weights(tp: int) -> None:
    job = _job()
    a = evaluate(job, Plan(dp=16 // tp, tp=tp, mbs=1, num_microbatches=64 // (16 // tp)))
    b = evaluate(job, Plan(dp=8 // tp, tp=2 * tp, mbs=1, num_microbatches=64 // (8 // tp)))
    assert b.memory.params_bytes <= a.memory.params_bytes
    assert float(layer_param_counts(job, False, 2 * tp, 1)[0]) <= float(
        layer_param_counts(job, False, tp, 1)[0])


@FAST
@given(bw=st.sampled_from([12.5, 25.0, 50.0]), tp=st.sampled_from([2, 8]),
       zero=st.sampled_from([0, 1, 3]), recipe=recipes)
def test_slower_network_never_faster(bw: float, tp: int, zero: int, recipe: str) -> None:
    dp = 16 // tp
    p = Plan(dp=dp, tp=tp, mbs=1, num_microbatches=64 // dp, zero=zero)
    fast = evaluate(_rjob(recipe, inter=bw * 2), p).time.step_s
    slow = evaluate(_rjob(recipe, inter=bw), p).time.step_s
    assert slow >= fast
