"""`ap-solve`: the command line of INTERFACE.md (the command group is in cli/app.py).

`main` is loaded on first use (PEP 562), so a Ctrl-C while the solver's libraries are still
importing (seconds on a busy machine) is exit 130 with "interrupted" like one during the search,
and a SIGTERM then is exit 143 with "terminated", never a traceback.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

__all__ = ["main"]


def _terminated(signum: int, frame: FrameType | None) -> None:
    """SIGTERM while the libraries import: nothing is written or started yet, so end at once
    (no exception that could surface half-way through an import)."""
    os.write(2, b"ap-solve: terminated\n")
    os._exit(143)


def __getattr__(name: str) -> Any:
    if name != "main":
        raise AttributeError(f"module 'autoparallel_cp.cli' has no attribute {name!r}")
    early = (threading.current_thread() is threading.main_thread()
             and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
    if early:
        signal.signal(signal.SIGTERM, _terminated)
    try:
        from autoparallel_cp.cli.app import main
    except KeyboardInterrupt:
        sys.stderr.write("ap-solve: interrupted\n")
        raise SystemExit(130) from None
    finally:
        if early:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return main
