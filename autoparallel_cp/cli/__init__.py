"""`ap-solve`: the command line of INTERFACE.md (the command group is in cli/app.py).

`main` is loaded on first use (PEP 562), so a Ctrl-C while the solver's libraries are still
importing (seconds on a busy machine) is exit 130 with "interrupted" like one during the search,
never a traceback.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    if name != "main":
        raise AttributeError(f"module 'autoparallel_cp.cli' has no attribute {name!r}")
    try:
        from autoparallel_cp.cli.app import main
    except KeyboardInterrupt:
        sys.stderr.write("ap-solve: interrupted\n")
        raise SystemExit(130) from None
    return main
