"""Progress on stderr while a search or a sweep runs: rich's `Progress`, drawn only on a
terminal and never with `-q`, removed when the work ends (stdout and the files never see it).

A sweep gets a bar of points done out of the total; a solve, whose end CP-SAT's deterministic
budget sets and no wall clock predicts, a pulsing bar with the incumbent's step time, bound and
gap as the solver reports them (`ProgressBar.__call__` is the solver's progress callback)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from autoparallel_cp import report
from autoparallel_cp.spec.plan import Plan


class ProgressBar:
    """A live progress bar on stderr (module docstring). `total`: the units of work (points of
    a sweep), None when unknown; `console`: where to draw (stderr by default)."""

    def __init__(self, enabled: bool, what: str = "solving", total: int | None = None,
                 console: Console | None = None) -> None:
        self.console = console if console is not None else Console(stderr=True)
        tty = self.console.is_terminal if console is not None else sys.stderr.isatty()
        self.enabled = enabled and tty
        self.what = what
        self.total = total
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._t0 = time.monotonic()
        self._n = 0

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            cols: list[ProgressColumn] = [SpinnerColumn(), TextColumn("{task.description}"),
                                          BarColumn()]
            if self.total is not None:
                cols.append(MofNCompleteColumn())
            cols += [TimeElapsedColumn(), TextColumn("{task.fields[detail]}")]
            self._progress = Progress(*cols, console=self.console, transient=True)
            self._task = self._progress.add_task(self.what, total=self.total, detail="")
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def done(self, completed: int, total: int | None = None) -> None:
        """`completed` units of work of `total` (the sweep's callback)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=completed,
                                  total=total if total is not None else self.total)

    def update(self, text: str) -> None:
        """Show `text` beside the bar."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, detail=text)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        """Solver callback: accepts an objective value, a step time, or keyword fields."""
        self._n += 1
        if self._progress is None:
            return
        detail = progress_text(args, kwargs)
        self.update(f"incumbent #{self._n}{': ' + detail if detail else ''}")


def progress_text(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The solver's progress fields as one short text (best step, bound, gap, plan)."""
    parts = []
    fields = dict(kwargs)
    if args and isinstance(args[0], Mapping):
        fields.update(args[0])
    elif args:
        obj = args[0]
        for name in ("step_s", "objective", "best_bound", "gap", "plan"):
            if hasattr(obj, name):
                fields.setdefault(name, getattr(obj, name))
        if isinstance(obj, (int, float)):
            fields.setdefault("objective", obj)
    if fields.get("best_s") is not None:
        parts.append(f"best step {report.fmt_time(float(fields['best_s']))}")
    if fields.get("bound_s") is not None:
        parts.append(f"bound {report.fmt_time(float(fields['bound_s']))}")
    if fields.get("plans") is not None:
        parts.append(f"{fields['plans']} plans kept")
    if "step_s" in fields and fields["step_s"] is not None:
        parts.append(f"step {report.fmt_time(float(fields['step_s']))}")
    elif "objective" in fields and fields["objective"] is not None:
        parts.append(f"objective {fields['objective']}")
    if fields.get("gap") is not None:
        parts.append(f"gap {float(fields['gap']):.1%}")
    if isinstance(fields.get("plan"), Plan):
        parts.append(fields["plan"].short())
    return ", ".join(parts)
