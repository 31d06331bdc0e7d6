"""Progress bars (cli/progress.py): drawn on a terminal's stderr only, never with -q or when
stderr is not a terminal; a sweep's bar counts its points."""

from __future__ import annotations

import inspect
import io
from typing import Any

from click.testing import CliRunner
from rich.console import Console

from autoparallel_cp.cli import main
from autoparallel_cp.cli.progress import ProgressBar, progress_text


def _terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=120), buf


def test_a_sweep_bar_counts_points_on_a_terminal() -> None:
    console, buf = _terminal()
    with ProgressBar(True, "what-if points", total=3, console=console) as bar:
        for k in range(1, 4):
            bar.done(k, 3)
        bar._progress.refresh()  # type: ignore[union-attr]
    text = buf.getvalue()
    assert "what-if points" in text
    assert "3/3" in text


def test_solver_callback_shows_the_incumbent() -> None:
    console, buf = _terminal()
    with ProgressBar(True, "CP-SAT", console=console) as bar:
        bar(best_s=1.25, bound_s=1.2, gap=0.04)
        bar._progress.refresh()  # type: ignore[union-attr]
    text = buf.getvalue()
    assert "incumbent #1" in text and "best step 1.25 s" in text and "gap 4.0%" in text
    assert progress_text((), {"step_s": 0.5}) == "step 500.0 ms"


def test_quiet_or_no_terminal_draws_nothing() -> None:
    console, buf = _terminal()
    with ProgressBar(False, "x", total=2, console=console) as bar:  # -q
        bar.done(1)
        bar(best_s=1.0)
    assert buf.getvalue() == ""
    plain = io.StringIO()
    with ProgressBar(True, "x", total=2, console=Console(file=plain)) as bar:  # not a tty
        assert not bar.enabled
        bar.done(2)
    assert plain.getvalue() == ""


def test_whatif_stderr_has_no_progress_when_not_a_terminal() -> None:
    kw: dict[str, Any] = ({"mix_stderr": False} if "mix_stderr" in
                          inspect.signature(CliRunner.__init__).parameters else {})
    r = CliRunner(**kw).invoke(main, ["whatif", "-m", "gpt3-1.3b", "-c", "dgx-h100", "--gpus",
                                      "8", "--seq-len", "2048", "--global-batch", "32",
                                      "--fix", "pp=1,cp=1", "--time-limit", "5", "-j", "1"])
    assert r.exit_code == 0, r.output
    assert "what-if points" not in r.stderr
    assert "\x1b[" not in r.stderr
