"""SIGINT and SIGTERM while a command runs: both stop the work at once, and the command exits
130 (SIGINT) or 143 (SIGTERM, 128 + 15, the shell's convention) with one line and no traceback.

Python runs a signal handler only in the main thread between bytecodes, never while it waits in
CP-SAT's C++ search; the handler's wakeup fd (`signal.set_wakeup_fd`) is written at once, so a
thread reading it calls `limits.request_stop`, which stops every running solve, for both
signals. The handlers raise KeyboardInterrupt, so every cleanup written for a Ctrl-C (Ray tasks
cancelled, pools terminated, no output written) runs for SIGTERM too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from autoparallel_cp.search import limits

#: Exit codes of INTERFACE.md: interrupted (Ctrl-C) and terminated (128 + SIGTERM).
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_first: list[int] = []


def _record(signum: int) -> None:
    if not _first:
        _first.append(signum)


def raise_on_signal(signum: int, frame: FrameType | None) -> None:
    """A handler: record the signal (`received`), raise KeyboardInterrupt."""
    _record(signum)
    raise KeyboardInterrupt


def received() -> int | None:
    """The first stop signal received while `stop_watcher` was active, if any."""
    return _first[0] if _first else None


def exit_code() -> int:
    """143 when a SIGTERM stopped the command, else 130."""
    return EXIT_TERMINATED if received() == signal.SIGTERM else EXIT_INTERRUPTED


def message() -> str:
    return "terminated" if received() == signal.SIGTERM else "interrupted"


@contextlib.contextmanager
def stop_watcher() -> Iterator[None]:
    """While active: SIGINT and SIGTERM raise KeyboardInterrupt in the main thread and stop
    running CP-SAT solves at once; the previous handlers come back after. A no-op off the main
    thread."""
    limits.reset()
    _first.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old_fd = signal.set_wakeup_fd(w)
    except ValueError:
        os.close(r)
        os.close(w)
        yield
        return
    for s in STOP_SIGNALS:
        signal.signal(s, raise_on_signal)

    def watch() -> None:
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:
                return
            for s in data:
                if s in STOP_SIGNALS:
                    _record(s)
                    limits.request_stop()

    thread = threading.Thread(target=watch, name="ap-solve-signals", daemon=True)
    thread.start()
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(old_fd)
        os.close(w)
        thread.join(timeout=1.0)
        with contextlib.suppress(OSError):
            os.close(r)
