"""search/limits.py: the deterministic budget, its wall-clock safety net, and stopping CP-SAT
from another thread (what the CLI's SIGINT watcher does on Ctrl-C)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from autoparallel_cp import api
from autoparallel_cp.search import limits
from autoparallel_cp.search.recommend import simplest_within

#: "stopped within 5 s": in the one-process pass (the `serial` mark in pyproject.toml)
pytestmark = pytest.mark.serial


@pytest.fixture(autouse=True)
def _clean_stop() -> Iterator[None]:
    limits.reset()
    yield
    limits.reset()


def _big_job() -> Any:
    return api.make_job("llama3-405b", "dgx-h100", gpus=16384, seq_len=8192, global_batch=2048)


def test_budget_is_deterministic_time() -> None:
    b = limits.Budget(3.0)
    assert b.dtime == 3.0 * limits.DTIME_PER_SECOND
    assert b.left() == b.dtime and not b.exhausted()
    assert limits.Budget(None).left() is None


def test_wall_clock_net_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "WALL_FACTOR", 0.0)
    monkeypatch.setattr(limits, "WALL_SLACK_S", 0.0)
    job = api.make_job("gpt3-1.3b", "dgx-h100", gpus=8, seq_len=2048, global_batch=32)
    res = api.solve(job, time_limit=5.0)
    assert res.stats["wall_clock_net_hit"] is True
    assert res.status in ("timeout", "feasible")


def _stopped_within(fn: Callable[[], Any], after_s: float, limit_s: float) -> float:
    timer = threading.Timer(after_s, limits.request_stop)
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            fn()
    finally:
        timer.cancel()
    took = time.monotonic() - t0
    assert took < after_s + limit_s, took
    return took


def test_stop_interrupts_a_long_solve() -> None:
    job = _big_job()
    # the top 1000 (the top 100 now ends in about 1.7 s on 2 cores, so a stop after 1 s could
    # land after the search; the default top 5 ends in well under 1 s)
    _stopped_within(lambda: api.solve(job, time_limit=300.0, top_k=1000), 1.0, 5.0)


def test_stop_interrupts_the_recommendation_phase() -> None:
    job = _big_job()
    _stopped_within(lambda: simplest_within(job, 1e6, time_limit=300.0), 1.0, 5.0)
