"""The standard streams of the command line: closed (`>&-`), broken (a reader of a pipe that
went away: `| head -1`) or unable to encode the reports' characters (`PYTHONIOENCODING=ascii`).
None of these is an error of the command (INTERFACE.md "Exit codes"): what cannot be shown is
dropped or spelled in ASCII, and the command ends as it would have.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import IO, Any

from autoparallel_cp.errors import UserError


def stdout_gone(error: OSError | None = None) -> None:
    """stdout cannot be written any more: point its file descriptor at /dev/null, so that what
    is still buffered, and anything written later, is dropped without a second error.

    A reader that went away (EPIPE, `error` a BrokenPipeError or None) is not an error of the
    command (`ap-solve solve ... | head -1` exits as the command would). Any other failure
    (`>/dev/full`: ENOSPC) is: UserError (exit 2) naming stdout and the reason."""
    stream = sys.stdout
    if isinstance(stream, PipeSafe):
        stream.broken = True
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(fd, stream.fileno())
        finally:
            os.close(fd)
    if error is not None and not isinstance(error, BrokenPipeError):
        raise UserError(f"stdout: cannot write: {error.strerror or error}") from None


class PipeSafe:
    """stdout for the CLI: a write or flush whose reader has gone (EPIPE) is dropped quietly,
    any other write error is one UserError (`stdout_gone`); every other attribute is the
    wrapped stream's."""

    def __init__(self, stream: IO[str]) -> None:
        self._s = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._s.write(text)
            except OSError as exc:
                stdout_gone(exc)
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._s.flush()
            except OSError as exc:
                stdout_gone(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


def ensure_std_streams() -> None:
    """File descriptors 0-2 open (on /dev/null where the caller closed them, e.g. `>&-`, so no
    file this process opens takes their place and a child's output goes nowhere harmful), and
    `sys.stdin/stdout/stderr` set (Python leaves them None when closed)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            new = os.open(os.devnull, os.O_RDWR)
            if new != fd:
                os.dup2(new, fd)
                os.close(new)
    for name, mode in (("stdin", "r"), ("stdout", "w"), ("stderr", "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, mode, encoding="utf-8"))  # noqa: SIM115


#: Plain-ASCII stand-ins for the characters the reports use, for a stream that cannot encode
#: them (e.g. PYTHONIOENCODING=ascii or a C locale); anything else becomes "?".
_ASCII = str.maketrans({"\u2264": "<=", "\u2265": ">=", "\u2192": "->", "\u00d7": "x",
                        "\u00b7": "*", "\u2013": "-", "\u2014": "-", "\u2026": "...",
                        "\u2248": "~", "\u00b1": "+/-", "\u2212": "-", "\u2018": "'",
                        "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2502": "|",
                        "\u2500": "-"})


class SafeText(io.TextIOBase):
    """A text stream that never raises UnicodeEncodeError: characters the underlying stream's
    encoding lacks are written as plain ASCII (`_ASCII`, else "?")."""

    def __init__(self, stream: IO[str]) -> None:
        self._s = stream
        self._enc = getattr(stream, "encoding", None) or "utf-8"

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._enc

    def write(self, text: str) -> int:
        try:
            text.encode(self._enc)
        except UnicodeEncodeError:
            text = text.translate(_ASCII).encode(self._enc, "replace").decode(self._enc)
        except LookupError:
            pass
        return self._s.write(text)

    def flush(self) -> None:
        self._s.flush()

    def isatty(self) -> bool:
        return self._s.isatty()

    def fileno(self) -> int:
        return self._s.fileno()


def safe_stream(stream: IO[str]) -> IO[str]:
    """`stream`, wrapped in SafeText unless its encoding is a UTF one."""
    enc = (getattr(stream, "encoding", None) or "utf-8").lower().replace("_", "-")
    if enc.startswith("utf"):
        return stream
    return SafeText(stream)  # type: ignore[return-value]
