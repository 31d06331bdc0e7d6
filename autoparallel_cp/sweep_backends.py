"""Where the points of a what-if sweep run: local processes (the default) or Ray tasks.

`run_tasks(fn, args, backend=...)` calls `fn(*a)` for every `a` of `args` and returns the results
in the order of `args`, whatever order they finish in, so both backends give the same rows. A call
that raises, or whose worker is lost, leaves a `TaskFailure` in its slot: it is reported, never
dropped.

- `local`: a `fork` process pool of `jobs` processes (or the calling process when `jobs` is 1).
- `ray`: every call is a Ray task of one CPU on a cluster (`address`: a `host:port`, `auto` or a
  `ray://` client address, as `ray.init` reads it; the `RAY_ADDRESS` variable when not given), or
  on a local runtime of `jobs` CPUs that this module starts and shuts down. Results are collected
  with `ray.wait` as tasks finish. Ray re-runs a task whose worker process or node died
  (`max_retries`: Ray's "system failures", docs.ray.io, "Task Fault Tolerance"); an exception
  raised by the call itself is retried only for a `MemoryError` (a node shared with other tasks
  may have memory again), since the solves are deterministic and any other exception would recur.
  A cluster address is asked, as Ray would ask it, whether Ray answers there (`probe_address`,
  bounded by CONNECT_TIMEOUT_S) before `ray.init`, which retries a wrong address without end.
  While Ray starts, runs and stops, SIGINT and SIGTERM only request a stop that the driver acts
  on between its calls into Ray (`_signals_deferred`): a signal inside Ray's C++ code crashed the
  driver, and one during `ray.init` left Ray's agents running. Then the tasks not finished are
  cancelled (`ray.cancel(force=True)` kills their workers) and a runtime this module started is
  shut down; a cluster it connected to keeps running.

Ray is optional (`pip install 'autoparallel-cp[ray]'`) and imported only when the ray backend
runs.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import Any

from autoparallel_cp import __version__
from autoparallel_cp.errors import UserError
from autoparallel_cp.search.limits import check as check_interrupt
from autoparallel_cp.search.limits import request_stop

BACKENDS: tuple[str, ...] = ("local", "ray")
RAY_EXTRA = "pip install 'autoparallel-cp[ray]'"
#: Re-runs of a Ray task whose worker or node died (Ray's own default for tasks is 3 too).
MAX_RETRIES = 3
#: Exceptions raised by a call that Ray retries (within MAX_RETRIES): only memory, which another
#: task on the same node may give back; the solves are deterministic, anything else would recur.
RETRY_EXCEPTIONS: tuple[type[BaseException], ...] = (MemoryError,)
#: Seconds between two looks for a Ctrl-C while the driver waits for Ray tasks.
POLL_S = 0.2
#: Seconds a cluster address gets to answer as Ray (`probe_address`): `ray.init` itself retries
#: an address where no Ray answers without end (Ray 2.60), deaf to SIGTERM.
CONNECT_TIMEOUT_S = 10.0
#: Signals that stop a sweep (exit 130 / 143 in the CLI).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class TaskFailure:
    """A call that raised, or whose worker was lost, after its retries: what went wrong."""

    message: str


OnDone = Callable[[int, int], None]


def require_ray() -> ModuleType:
    """The `ray` module, or a clear error (exit 2) naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise UserError(f"--backend ray needs Ray: {RAY_EXTRA}") from None
    return ray


def run_tasks(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *,
              backend: str = "local", jobs: int | None = None, address: str | None = None,
              on_done: OnDone | None = None, max_retries: int = MAX_RETRIES) -> list[Any]:
    """`[fn(*a) for a in args]` on `backend`, a `TaskFailure` where a call failed.

    `jobs`: calls at once (local processes; the CPUs of a Ray runtime started here; with a Ray
    `address`, the tasks in flight, default all). `on_done(finished, total)` after each call.
    `fn` must be importable by name in the workers (a module-level function)."""
    if backend not in BACKENDS:
        raise UserError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if address is not None and backend != "ray":
        raise UserError("--address: only with --backend ray")
    if not args:
        return []
    if backend == "ray":
        return _run_ray(fn, args, jobs=jobs, address=address, on_done=on_done,
                        max_retries=max_retries)
    return _run_local(fn, args, jobs=jobs, on_done=on_done)


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _call(task: tuple[int, Callable[..., Any], tuple[Any, ...]]) -> tuple[int, Any]:
    """One local call `(i, fn, a)`, an exception kept as its TaskFailure (a pool worker)."""
    i, fn, a = task
    try:
        return i, fn(*a)
    except Exception as exc:
        return i, TaskFailure(_describe(exc))


def _run_local(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *, jobs: int | None,
               on_done: OnDone | None) -> list[Any]:
    n = len(args)
    jobs = max(1, min(jobs or os.cpu_count() or 1, n))
    out: list[Any] = [None] * n
    done = 0
    if jobs == 1:
        for i, a in enumerate(args):
            out[i] = _call((i, fn, a))[1]
            done += 1
            if on_done is not None:
                on_done(done, n)
        return out
    # multiprocessing.Pool, not ProcessPoolExecutor: on Ctrl-C `terminate` stops the point
    # processes at once (the executor's shutdown waits for the running points)
    pool = multiprocessing.get_context("fork").Pool(jobs, initializer=_pool_child)
    try:
        tasks = [(i, fn, a) for i, a in enumerate(args)]
        for i, res in pool.imap_unordered(_call, tasks, chunksize=1):
            out[i] = res
            done += 1
            if on_done is not None:
                on_done(done, n)
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()
    return out


def _pool_child() -> None:
    """A forked pool process: SIGTERM back to its default (`Pool.terminate` sends it; a
    handler inherited from the CLI would raise there), and the parent's signal wakeup fd
    (inherited by fork) no longer written: the parent's signals are its own."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)


def _ray_call(fn: Callable[..., Any], a: tuple[Any, ...], version: str) -> Any:
    """One Ray task: the same package version as the driver (same rows), then `fn(*a)`."""
    if version != __version__:
        raise RuntimeError(f"this worker has autoparallel-cp {__version__}, the driver {version}:"
                           " install the same version on every node")
    return fn(*a)


def parse_address(address: str, option: str = "--address") -> tuple[str, int, bool] | None:
    """(host, port, is a Ray client address) of `[ray://]host:port`; None for `auto` and
    `local`, which `ray.init` reads itself. UserError (exit 2) for anything else."""
    text = address.strip()
    if text in ("auto", "local"):
        return None
    client = text.startswith("ray://")
    host, sep, port = text.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{option} {address!r}: expected host:port (a Ray cluster's GCS), "
                        "ray://host:port (a Ray client server), auto or local")
    return host, int(port), client


def probe_address(address: str, timeout: float = CONNECT_TIMEOUT_S,
                  option: str = "--address") -> None:
    """Refuse (exit 2), within about `timeout` seconds, an address where no Ray answers.

    `host:port` must answer as a Ray cluster's GCS answers a driver (`gcs_probe.probe_gcs`:
    the GetClusterId call over gRPC); `ray://host:port` must accept a connection (the Ray
    client, from Ray's `client` extra, bounds its own handshake)."""
    from autoparallel_cp.gcs_probe import NotRay, probe_gcs

    parsed = parse_address(address, option)
    if parsed is None:
        return
    host, port, client = parsed
    what = "Ray client server" if client else "Ray cluster (GCS)"
    try:
        if client:
            socket.create_connection((host, port), timeout=timeout).close()
        else:
            probe_gcs(host, port, timeout)
    except NotRay as exc:
        raise UserError(f"{option} {address}: no {what} answers there: {exc}") from None
    except (OSError, OverflowError, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UserError(f"{option} {address}: no {what} answers there ({why})") from None


@contextlib.contextmanager
def _ray_keeps_our_sigterm() -> Iterator[None]:
    """While `ray.init` runs, its first act, a SIGTERM handler `sys.exit(signum)` (Ray 2.60
    ray/_private/worker.py:1668-1677, through `ray._private.utils.set_sigterm_handler`), is
    skipped: a SIGTERM while Ray starts raised SystemExit(15) anywhere inside `ray.init` (exit
    15, half-started processes); the deferred handler of `_signals_deferred` stays in place."""
    try:
        import ray._private.utils as ray_utils
    except ImportError:
        yield
        return
    original = getattr(ray_utils, "set_sigterm_handler", None)
    if original is None:
        yield
        return
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original


@contextlib.contextmanager
def _signals_deferred() -> Iterator[Callable[[], None]]:
    """While active (main thread only), SIGINT and SIGTERM only request a stop
    (`limits.request_stop`), which the driver turns into KeyboardInterrupt at its next
    `check_interrupt`, between calls into Ray. Yields `rearm`, to call after `ray.init`: Ray's
    core worker installs C++ handlers of its own (a SIGTERM then printed a stack dump and exited
    1). The previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def stop(signum: int, frame: FrameType | None) -> None:
        request_stop()

    def rearm() -> None:
        for s in STOP_SIGNALS:
            signal.signal(s, stop)

    rearm()
    try:
        yield rearm
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def _connect(ray: Any, address: str | None, cpus: int) -> bool:
    """Join a cluster or start a local runtime; True when the caller must `ray.shutdown()`.

    A runtime already initialized in this process (by the caller) is used as it is."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    try:
        with _ray_keeps_our_sigterm():
            if address is None:
                ray.init(address="local", num_cpus=cpus, include_dashboard=False, **quiet)
            else:
                ray.init(address=address, **quiet)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        with contextlib.suppress(Exception):
            ray.shutdown()
        where = "start a local Ray runtime" if address is None else f"connect to {address}"
        raise UserError(f"--backend ray: cannot {where}: {_describe(exc)}") from None
    except BaseException:
        with contextlib.suppress(Exception):
            ray.shutdown()
        raise
    return True


def _outcome(ray: Any, ref: Any, max_retries: int) -> Any:
    """A finished task's result, or its TaskFailure."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:  # the call raised (retried if RETRY_EXCEPTIONS)
        return TaskFailure(_describe(exc.cause if exc.cause is not None else exc))
    except ray.exceptions.RayError as exc:  # worker or node lost, after max_retries re-runs
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        retries = f"{max_retries} retr{'y' if max_retries == 1 else 'ies'}"
        return TaskFailure(f"{type(exc).__name__}: {first} (after {retries})")


def _run_ray(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *, jobs: int | None,
             address: str | None, on_done: OnDone | None, max_retries: int) -> list[Any]:
    ray = require_ray()
    if not ray.is_initialized() and (address or os.environ.get("RAY_ADDRESS")):
        # before the signals are deferred: a Ctrl-C or SIGTERM ends the probe at once
        probe_address(address or os.environ["RAY_ADDRESS"],
                      option="--address" if address else "RAY_ADDRESS")
    with _signals_deferred() as rearm:
        owned = _connect(ray, address, min(jobs or os.cpu_count() or 1, len(args)))
        rearm()
        try:
            return _ray_loop(ray, fn, args, jobs=jobs, address=address, on_done=on_done,
                             max_retries=max_retries)
        finally:
            if owned:
                # a runtime started here stops; a cluster joined by address is only
                # disconnected from (ray.shutdown ends the processes this driver started)
                ray.shutdown()


def _ray_loop(ray: Any, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *,
              jobs: int | None, address: str | None, on_done: OnDone | None,
              max_retries: int) -> list[Any]:
    n = len(args)
    local = address is None and not os.environ.get("RAY_ADDRESS")
    # a runtime of `jobs` CPUs runs `jobs` tasks at once by itself; on a cluster, cap the tasks
    # in flight only when asked (--jobs)
    cap = n if (local or jobs is None) else jobs
    out: list[Any] = [None] * n
    index: dict[Any, int] = {}
    pending: list[Any] = []
    todo = iter(enumerate(args))
    done = 0
    try:
        check_interrupt()  # a signal that came while Ray started
        task = ray.remote(_ray_call).options(num_cpus=1, max_retries=max_retries,
                                             retry_exceptions=list(RETRY_EXCEPTIONS))
        for i, a in todo:
            ref = task.remote(fn, a, __version__)
            index[ref] = i
            pending.append(ref)
            if len(pending) >= cap:
                break
        while pending:
            check_interrupt()
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in ready:
                out[index.pop(ref)] = _outcome(ray, ref, max_retries)
                done += 1
                if on_done is not None:
                    on_done(done, n)
                nxt = next(todo, None)
                if nxt is not None:
                    ref = task.remote(fn, nxt[1], __version__)
                    index[ref] = nxt[0]
                    pending.append(ref)
    except BaseException:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    return out
