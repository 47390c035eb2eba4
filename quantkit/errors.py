"""Errors that reach the user as a message and an exit code, never as a traceback.

Exit codes, the same for every command: 0 success, 1 a check failed, 2 bad input or usage.
"""

from __future__ import annotations

from pathlib import Path

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2

# The most characters of one part of a message (its location, text or hint) shown: user data (a
# task name, a path, a record) can be megabytes long, and the message is read in a terminal.
SHOWN_CHARS = 600


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` whole when short, else its start and end with the number of characters left out."""
    if len(text) <= limit:
        return text
    head, tail = limit * 3 // 4, limit // 4
    return f"{text[:head]}... ({len(text) - head - tail} characters left out) ...{text[-tail:]}"


class QuantkitError(Exception):
    """Base of every error quantkit reports to the user."""

    exit_code = EXIT_BAD_INPUT

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = Path(path) if path is not None else None
        self.line = line
        self.hint = hint

    def location(self) -> str | None:
        if self.path is None:
            return None
        return f"{self.path}:{self.line}" if self.line is not None else str(self.path)

    def __str__(self) -> str:
        where = self.location()
        text = f"{where}: {self.message}" if where else self.message
        return f"{text} ({self.hint})" if self.hint else text


class InputError(QuantkitError):
    """Bad input or usage: a file, a field, an option. Exit code 2."""

    exit_code = EXIT_BAD_INPUT


class CheckFailed(QuantkitError):
    """The work ran but a check of its result failed. Exit code 1."""

    exit_code = EXIT_CHECK_FAILED
