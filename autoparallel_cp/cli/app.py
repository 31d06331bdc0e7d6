"""`ap-solve`'s command group (INTERFACE.md); `autoparallel_cp.cli.main` loads it.

Exit codes: 0 success; 1 no feasible plan, proven (explanation on stderr); 2 bad input (one line
naming the file / field on stderr); 3 no plan within the time limit, not proven infeasible (JSON
status `timeout`); 4 (`whatif` only) a point's solve crashed or its worker was lost after the
retries (row status `failed`, all rows written); 130 interrupted (SIGINT), 143 terminated
(SIGTERM; outputs untouched). A user's mistake never shows a Python traceback. A reader of stdout
that goes away early (`| head -1`) or a closed stdout (`>&-`) is no error: the command runs on
and exits as it would have. See docs/user-guide.md, "Exit codes, statuses and errors".
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import click

from autoparallel_cp import __version__, streams
from autoparallel_cp.cli.calibrate_command import calibrate, measure
from autoparallel_cp.cli.catalog_commands import clusters, models, validate
from autoparallel_cp.cli.common import EXIT_BAD_INPUT, say
from autoparallel_cp.cli.plan_commands import evaluate, explain
from autoparallel_cp.cli.search_commands import enumerate_cmd, solve
from autoparallel_cp.cli.signals import exit_code as interrupt_exit_code
from autoparallel_cp.cli.signals import message as interrupt_message
from autoparallel_cp.cli.signals import raise_on_signal
from autoparallel_cp.cli.whatif_command import whatif
from autoparallel_cp.errors import UserError


class _Main(click.Group):
    """The command group; a Ctrl-C while click parses the options is exit 130 too (click itself
    would say "Aborted!" and exit 1). stdout is `streams.PipeSafe` while a command runs: a
    reader that went away is not an error (click would exit 1 on EPIPE, Python print a
    BrokenPipeError at exit), and closed standard streams are reopened on /dev/null."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        streams.ensure_std_streams()
        real = sys.stdout
        if not isinstance(real, streams.PipeSafe):
            sys.stdout = streams.PipeSafe(real)
        # SIGTERM while click parses: KeyboardInterrupt, recorded (exit 143); each command's
        # `guarded` installs the full handling (signals.stop_watcher) while it runs
        old_term = None
        if threading.current_thread() is threading.main_thread():
            old_term = signal.signal(signal.SIGTERM, raise_on_signal)
        try:
            return super().main(*args, **kwargs)
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            try:
                sys.stdout.flush()  # what is buffered, while a closed pipe is still caught
            except UserError as exc:  # stdout failed otherwise (>/dev/full): exit 2
                say(f"ap-solve: error: {exc}")
                sys.exit(EXIT_BAD_INPUT)
            finally:
                sys.stdout = real

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            say(f"ap-solve: {interrupt_message()}")
            sys.exit(interrupt_exit_code())

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            say(f"ap-solve: {interrupt_message()}")
            sys.exit(interrupt_exit_code())


@click.group(cls=_Main,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ap-solve")
def main() -> None:
    """Find the fastest (and the simplest good) way to train a transformer on your GPUs.

    Data, tensor, pipeline (interleaved), context and expert parallelism, sequence parallelism,
    ZeRO, micro-batch size and activation recompute, chosen jointly by OR-Tools CP-SAT over an
    analytical memory and step-time model.
    """


for _command in (solve, enumerate_cmd, evaluate, explain, whatif, models, clusters, validate):
    main.add_command(_command)
main.add_command(calibrate)
main.add_command(measure)


if __name__ == "__main__":  # pragma: no cover
    main()
