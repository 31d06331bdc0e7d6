"""Errors a user can cause, each mapped to an INTERFACE.md exit code by the CLI."""

from __future__ import annotations


class UserError(Exception):
    """Bad input: the CLI prints the message (one line, naming file and field) and exits 2."""

    exit_code = 2


class InputError(UserError):
    """A model / cluster / plan file or option that does not validate."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        where = ""
        if source:
            where += f"{source}: "
        if field:
            where += f"field '{field}': "
        super().__init__(where + message)


class InfeasibleError(Exception):
    """No plan fits: the CLI prints the explanation and exits 1."""

    exit_code = 1

    def __init__(self, explanation: str):
        self.explanation = explanation
        super().__init__(explanation)
