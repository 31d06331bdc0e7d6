"""Sweep backends (issue 14): the local pool and Ray tasks give the same rows in the same order; a
call that raises or whose worker dies is retried (Ray) and then reported as a `failed` row with a
message and exit 4, never dropped; Ctrl-C cancels the Ray tasks; Ray itself is optional.

The Ray tests share one local runtime of 2 CPUs (started once for the module) and are skipped
when ray is not installed.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autoparallel_cp import sweep_backends, whatif
from autoparallel_cp.cli import main
from autoparallel_cp.search import limits
from autoparallel_cp.sweep_backends import TaskFailure

#: one Ray runtime of 2 CPUs for the module and the Ctrl-C test's 10 s: in the one-process pass
#: (the `serial` mark in pyproject.toml)
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[1]
#: 4 small points (2 GPU types x 2 GPU counts) that solve in well under a second each.
SWEEP: dict[str, Any] = {"model": "gpt3-1.3b", "clusters": ["dgx-h100", "dgx-a100"],
                         "gpus": [8, 16], "seq_lens": [2048], "global_batches": [64]}
SOLVE: dict[str, Any] = {"fix": "pp=1,cp=1,vpp=1", "time_limit": 5, "tokens": 1e10}
CLI_SWEEP = ["whatif", "--model", "gpt3-1.3b", "--cluster", "dgx-h100,dgx-a100", "--gpus",
             "8,16", "--seq-len", "2048", "--global-batch", "64", "--fix", "pp=1,cp=1,vpp=1",
             "--time-limit", "5", "--tokens", "1e10", "--quiet"]


def _failing_at(gpus: int) -> Callable[..., dict[str, Any]]:
    """whatif's point solver, raising for the points of `gpus` GPUs."""
    real = whatif._solve_point

    def solve_point(job: Any, *args: Any) -> dict[str, Any]:
        if job.num_gpus == gpus:
            raise RuntimeError(f"injected failure at {gpus} GPUs")
        return real(job, *args)

    return solve_point


# --------------------------------------------------------------------------------------------
# local backend and the CLI (no Ray needed)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("jobs", [1, 2])
def test_local_results_keep_their_order_and_a_failure_keeps_its_slot(jobs: int) -> None:
    seen: list[tuple[int, int]] = []
    out = sweep_backends.run_tasks(math.sqrt, [(4.0,), (-1.0,), (9.0,)], jobs=jobs,
                                   on_done=lambda done, total: seen.append((done, total)))
    assert out[0] == 2.0 and out[2] == 3.0
    assert out[1] == TaskFailure("ValueError: math domain error")
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_unknown_backend_and_address_without_ray_are_user_errors() -> None:
    from autoparallel_cp.errors import UserError

    with pytest.raises(UserError, match="--backend"):
        sweep_backends.run_tasks(math.sqrt, [(1.0,)], backend="dask")
    with pytest.raises(UserError, match="--address"):
        sweep_backends.run_tasks(math.sqrt, [(1.0,)], address="auto")


def test_failed_point_is_a_row_and_the_cli_exits_4(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(whatif, "_solve_point", _failing_at(16))
    rows = whatif.run_sweep(whatif.build_points(**SWEEP), jobs=1, **SOLVE)
    assert [(r["cluster"], r["gpus"]) for r in rows] == [
        ("dgx-h100", 8), ("dgx-h100", 16), ("dgx-a100", 8), ("dgx-a100", 16)]
    assert [r["status"] == "failed" for r in rows] == [False, True, False, True]
    for r in rows:
        if r["gpus"] == 16:
            assert r["plan"] is None and r["tokens_per_s"] is None
            assert "RuntimeError: injected failure at 16 GPUs" in r["explanation"]
        else:
            assert r["status"] in ("optimal", "feasible") and r["tokens_per_s"] > 0

    out_csv = tmp_path / "w.csv"
    res = CliRunner().invoke(main, CLI_SWEEP + ["--jobs", "1", "--csv", str(out_csv)])
    assert res.exit_code == 4, res.output
    assert "Traceback" not in res.output
    assert "ap-solve: error: dgx-a100, 16 GPUs, seq 2048, batch 64: the point's solve failed: " \
           "RuntimeError: injected failure at 16 GPUs" in res.stderr
    assert "2 of 4 points failed" in res.stderr
    written = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [r["status"] == "failed" for r in written] == [False, True, False, True]


def test_backend_ray_without_ray_is_exit_2_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    out_csv = tmp_path / "w.csv"
    res = CliRunner().invoke(main, CLI_SWEEP + ["--backend", "ray", "--csv", str(out_csv)])
    assert res.exit_code == 2, res.output
    assert "pip install 'autoparallel-cp[ray]'" in res.stderr
    assert "Traceback" not in res.output and not out_csv.exists()
    # the local backend, the default, needs nothing of Ray
    res = CliRunner().invoke(main, CLI_SWEEP + ["--jobs", "1", "--csv", str(out_csv)])
    assert res.exit_code == 0, res.output


def test_an_address_where_no_ray_answers_is_refused_in_bounded_time() -> None:
    """`ray.init` would retry such an address without end: nothing listening is refused at
    once, a listening service that never answers within the probe's deadline; a listening
    `ray://` port and `auto` pass (Ray's client and `auto` bound themselves)."""
    import socket

    from autoparallel_cp.errors import UserError

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        sweep_backends.probe_address(f"ray://127.0.0.1:{port}")
        t0 = time.monotonic()
        with pytest.raises(UserError, match="no answer as Ray within 1 s"):
            sweep_backends.probe_address(f"127.0.0.1:{port}", timeout=1.0)
        assert time.monotonic() - t0 < 5
    t0 = time.monotonic()
    with pytest.raises(UserError, match=f"--address 127.0.0.1:{port}: no Ray cluster"):
        sweep_backends.probe_address(f"127.0.0.1:{port}")
    assert time.monotonic() - t0 < 5
    sweep_backends.probe_address("auto")


def test_address_needs_the_ray_backend() -> None:
    res = CliRunner().invoke(main, CLI_SWEEP + ["--address", "auto"])
    assert res.exit_code == 2 and "--address: only with --backend ray" in res.stderr


# --------------------------------------------------------------------------------------------
# Ray: one local runtime of 2 CPUs for the module
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    # this module's helpers travel to the workers by value (they cannot import a test module)
    me = sys.modules[__name__]
    ray.cloudpickle.register_pickle_by_value(me)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    try:
        yield ray
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(me)


def test_ray_tasks_run_in_other_processes(ray_runtime: Any) -> None:
    pids = sweep_backends.run_tasks(os.getpid, [(), ()], backend="ray")
    assert all(isinstance(p, int) and p != os.getpid() for p in pids), pids


def test_ray_rows_are_the_local_rows(ray_runtime: Any) -> None:
    points = whatif.build_points(**SWEEP)
    local = whatif.run_sweep(points, jobs=2, **SOLVE)
    seen: list[int] = []
    remote = whatif.run_sweep(points, backend="ray", on_done=lambda d, n: seen.append(d),
                              **SOLVE)
    assert all(r["status"] in ("optimal", "feasible") and r["plan"] for r in local)
    assert remote == local
    assert whatif.rows_csv(remote) == whatif.rows_csv(local)
    assert seen == [1, 2, 3, 4]


def test_ray_failed_point_is_reported_as_the_local_backend_does(
        ray_runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(whatif, "_solve_point", _failing_at(8))
    points = whatif.build_points(**SWEEP)
    remote = whatif.run_sweep(points, backend="ray", **SOLVE)
    local = whatif.run_sweep(points, jobs=1, **SOLVE)
    assert [r["status"] == "failed" for r in remote] == [True, False, True, False]
    assert remote == local


def _attempt(path: str) -> int:
    """Count this call's attempts in `path` (which survives a dead worker)."""
    with open(path, "a") as f:
        f.write("x")
    with open(path) as f:
        return len(f.read())


def test_ray_retries_a_lost_worker_then_reports_it(ray_runtime: Any, tmp_path: Path) -> None:
    def crash_first(path: str, crashes: int) -> int:
        n = _attempt(path)
        if n <= crashes:
            os._exit(1)  # the worker process dies: a Ray system failure
        return n

    once, always = str(tmp_path / "once"), str(tmp_path / "always")
    out = sweep_backends.run_tasks(crash_first, [(once, 1), (always, 9)], backend="ray",
                                   max_retries=1)
    assert out[0] == 2  # crashed on attempt 1, retried, returned on attempt 2
    assert isinstance(out[1], TaskFailure)
    assert out[1].message.startswith("WorkerCrashedError") and "(after 1 retry)" in out[1].message
    assert Path(always).read_text() == "xx"  # the first run and its one retry


def test_ray_retries_memory_errors_only(ray_runtime: Any, tmp_path: Path) -> None:
    def raise_first(path: str, exc: type[Exception]) -> int:
        n = _attempt(path)
        if n == 1:
            raise exc(f"attempt {n}")
        return n

    mem, val = str(tmp_path / "mem"), str(tmp_path / "val")
    out = sweep_backends.run_tasks(raise_first, [(mem, MemoryError), (val, ValueError)],
                                   backend="ray")
    assert out == [2, TaskFailure("ValueError: attempt 1")]
    assert Path(val).read_text() == "x"  # a deterministic error is not run again


def test_ray_interrupt_cancels_the_outstanding_tasks(ray_runtime: Any) -> None:
    cpus = ray_runtime.cluster_resources()["CPU"]
    timer = threading.Timer(1.0, limits.request_stop)  # what the CLI's SIGINT watcher calls
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            sweep_backends.run_tasks(time.sleep, [(60,), (60,), (60,)], backend="ray")
    finally:
        timer.cancel()
        limits.reset()
    assert time.monotonic() - t0 < 10
    # the sleeping tasks were killed: their CPUs come back long before 60 s
    deadline = time.monotonic() + 15
    while ray_runtime.available_resources().get("CPU", 0) < cpus:
        assert time.monotonic() < deadline, ray_runtime.available_resources()
        time.sleep(0.2)
    assert ray_runtime.is_initialized()  # a runtime the caller started is left to the caller


def test_cli_joins_a_cluster_by_address_and_leaves_it_running(ray_runtime: Any,
                                                               tmp_path: Path) -> None:
    address = ray_runtime.get_runtime_context().gcs_address
    out_csv = tmp_path / "ray.csv"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "autoparallel_cp.cli", *CLI_SWEEP, "--backend", "ray",
         "--address", address, "--csv", str(out_csv)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    local = whatif.run_sweep(whatif.build_points(**SWEEP), jobs=2, **SOLVE)
    assert out_csv.read_text() == whatif.rows_csv(local)
    # the cluster the command joined still runs tasks
    assert sweep_backends.run_tasks(math.sqrt, [(16.0,)], backend="ray") == [4.0]
