"""Which knobs a few runs identify (calibrate/prior.py): the share of a knob the runs
determine, from their design alone; hand-built runs where a knob is and is not identified;
under the corpus prior, two runs' shared error is not carried to other plans."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoparallel_cp.api import as_plan, evaluate, make_job
from autoparallel_cp.calibrate.fit import fit, knobs_for
from autoparallel_cp.calibrate.prior import MIN_INFORMATION, WEAK_PRIOR_SIGMA, information
from autoparallel_cp.calibrate.runs import Run

GPU = "compute:H100-SXM5-80GB"


def test_information_by_hand() -> None:
    # one knob, two rows of slope 1, prior width 1: posterior variance 1 / (2 + 1), so the
    # runs determine 1 - 1/3 = 2/3 of it
    assert information(np.array([[1.0], [1.0]]), [1.0])[0] == pytest.approx(2 / 3)
    # two knobs that both rows move alike: precision [[3, 2], [2, 3]], posterior variance
    # 3/5 each: each knob is only 40 % determined, though their sum is well determined
    g = information(np.array([[1.0, 1.0], [1.0, 1.0]]), [1.0, 1.0])
    assert g == pytest.approx([0.4, 0.4])
    assert np.all(g < MIN_INFORMATION)
    # rows that move the knobs differently separate them: precision [[2, 0], [0, 2]] + 1
    g = information(np.array([[1.0, 1.0], [1.0, -1.0]]), [1.0, 1.0])
    assert g == pytest.approx([2 / 3, 2 / 3])
    # a wider prior leaves more to the data: 2 s^2 / (1 + 2 s^2)
    assert information(np.array([[1.0], [1.0]]), [3.0])[0] == pytest.approx(18 / 19)


def _runs(specs: list[tuple[int, str, int]], factor: float) -> list[Run]:
    """Runs whose measured steps are `factor` x the model's (a uniformly slower cluster)."""
    out = []
    for i, (g, p, gb) in enumerate(specs, 1):
        job = make_job("llama3-8b", "dgx-h100", gpus=g, seq_len=4096, global_batch=gb)
        plan = as_plan(job, p)
        out.append(Run(i, job, plan, evaluate(job, plan).time.step_s * factor, None))
    return out


TWO = [(8, "tp=8,mbs=1", 64), (8, "tp=2,mbs=2", 64)]


def _moved(res: object) -> dict[str, float]:
    return {k.name: k.value for k in res.knobs if k.std is not None}  # type: ignore[attr-defined]


def test_two_compute_bound_runs_identify_the_compute_factor() -> None:
    """Two single-node runs 20 % slower, measured exactly: compute is identified (the model
    made the runs, so it has no per-configuration error) and recovers ~1/1.2."""
    res = fit(_runs(TWO, 1.2), model_sigma=0.0)
    moved = _moved(res)
    assert GPU in moved and moved[GPU] == pytest.approx(1 / 1.2, rel=0.05)


def test_the_model_error_leaves_two_runs_without_an_identified_knob() -> None:
    """The same two runs, with a per-configuration model error of 50 %: two runs cannot tell
    a 20 % slower cluster from two plans the model happens to get wrong, so nothing moves and
    the report says the design does not identify the knob."""
    res = fit(_runs(TWO, 1.2), model_sigma=0.5)
    assert _moved(res) == {}
    k = next(k for k in res.knobs if k.name == GPU)
    assert k.value == 1.0 and "design" in k.note
    assert any(n.startswith(GPU) and "runs' design" in n for n in res.notes), res.notes
    assert res.calibration.compute == {}


def test_one_shape_of_run_does_not_separate_compute_from_the_fixed_time() -> None:
    """Two runs of one plan (only the global batch differs by 2x, so the step time doubles):
    the compute factor and a fixed time per micro-batch scale both alike. Under a wide prior
    on the fixed time they are not both identified: at most one moves."""
    same = [(8, "tp=8,mbs=1", 64), (8, "tp=8,mbs=1", 128)]
    widths = dict(WEAK_PRIOR_SIGMA) | {"per_microbatch_s": 1.0}
    res = fit(_runs(same, 1.3), model_sigma=0.0, prior_sigma=widths)
    moved = _moved(res)
    assert len({GPU, "per_microbatch_s"} & moved.keys()) <= 1, moved
    refused = [n for n in res.notes if "runs' design" in n]
    assert refused, res.notes


def test_the_corpus_prior_does_not_carry_two_runs_error_to_other_plans() -> None:
    """Two runs 35 % slower than the model, two other plans of the same cluster exactly as
    modelled (the two runs share an error of their configurations, not of the cluster): the
    calibration under the corpus prior predicts the other plans better than every knob fitted
    under the weak prior with measurement noise only (what `calibrate` did before)."""
    given = _runs(TWO, 1.35)
    others = _runs([(16, "tp=8,pp=2,mbs=1", 64), (8, "tp=4,mbs=1", 32)], 1.0)
    old = fit(given, model_sigma=0.0, prior_sigma=WEAK_PRIOR_SIGMA, select_knobs=False)
    new = fit(given)

    def err(res: object, r: Run) -> float:
        cal = res.calibration  # type: ignore[attr-defined]
        return abs(math.log(evaluate(r.job.calibrated(cal), r.plan).time.step_s / r.step_s))

    for r in others:
        assert err(new, r) < err(old, r), (r.plan, _moved(old), _moved(new))


def test_prior_widths_per_kind() -> None:
    runs = _runs(TWO, 1.0)
    ks = {k.name: k for k in knobs_for(runs, [], {"compute": 0.05, "per_step_s": 0.2})}
    assert ks[GPU].sigma == 0.05 and ks["per_step_s"].sigma == 0.2
    assert ks["net_intra"].sigma > 0
