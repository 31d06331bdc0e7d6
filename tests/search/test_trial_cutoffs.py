"""The solve's trial cutoffs (`solve.TRIAL_MARGINS`: a key's model first gets the cutoff bound
* (1 + margin); proven empty, the key goes back to the heap with that bound) and its
least-bound-first order across windows change no answer: with no trials, with trials that
always fail (a negative margin: a cutoff below the key's bound), with margin 0 and with the
default ones, the k best plans are the same and the enumerator's."""

from __future__ import annotations

import pytest
from test_solver_vs_enumerate import _compare_tol, _mini, _mixed_small

from autoparallel_cp.search import solve as solve_mod
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster


def _spaces() -> list[tuple[Job, SearchSpace]]:
    out = []
    job = Job(model=_mini(False, 6), cluster=_mixed_small(), seq_len=4096, global_batch=16)
    out.append((job, SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3),
                                         fix="tp=4")))
    job = Job(model=_mini(True, 6), cluster=load_cluster("dgx-a100-40g").take_gpus(8),
              seq_len=8192, global_batch=16)
    out.append((job, SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2)))
    return out


@pytest.mark.parametrize("margins", [(), (-0.5, -0.5), (0.0,), (1e-3, 1.6e-2, 0.25)])
def test_trial_cutoffs_change_no_answer(monkeypatch: pytest.MonkeyPatch,
                                        margins: tuple[float, ...]) -> None:
    monkeypatch.setattr(solve_mod, "TRIAL_MARGINS", margins)
    for job, space in _spaces():
        _compare_tol(job, space, 4)
        res = solve_mod.solve(job, space, top_k=4)
        ctx = res.context
        assert ctx is not None and res.status == "optimal"
        # what a failed trial proved (no plan <= its cutoff) and every bound raised by it hold
        # for the keys that were then solved
        for key, r in ctx.found.items():
            assert ctx.above.get(key, -1.0) < r.step_s
            assert ctx.key_bounds[key] <= r.step_s
        if margins == (-0.5, -0.5):
            # every trial fails (its cutoff is below the key's bound): three models a key
            assert res.stats["models"] == 3 * res.stats["keys_scored"]
        else:
            assert res.stats["models"] >= res.stats["keys_scored"]
        if margins == ():
            assert res.stats["models"] == res.stats["keys_scored"]


def test_trial_cutoffs_give_the_same_plans_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported plans (partitions and placements included) with and without trials."""
    job, space = _spaces()[0]
    with_trials = solve_mod.solve(job, space, top_k=5)
    monkeypatch.setattr(solve_mod, "TRIAL_MARGINS", ())
    without = solve_mod.solve(job, space, top_k=5)
    assert [e.plan for e in with_trials.plans] == [e.plan for e in without.plans]
    assert with_trials.stats["models"] <= without.stats["models"] + 3 * len(with_trials.plans)
