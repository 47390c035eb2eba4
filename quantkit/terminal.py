"""What reaches the terminal: quantkit's own consoles, and every other library's output kept off it.

While a command runs, other libraries' output (warnings, logging, loguru, tqdm bars, prints from C
code, and the output of the processes the command starts) goes to ``quantkit.log`` beside what the
command writes; QUANTKIT_VERBOSE=1 (or a command's ``-v``) streams it as it comes instead. The
capture works on file descriptors 1 and 2, so whatever writes to the process's stdout or stderr,
whenever it took hold of them, and every child process writes to the log; quantkit's two consoles
write to the terminal through copies of the original descriptors."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn

VERBOSE_ENV = "QUANTKIT_VERBOSE"
LOG_NAME = "quantkit.log"
# Set while a command captures: a quantkit command started by it (a torchrun rank) appends to the
# same log and finds the terminal on its stdout (its stderr, inherited, is the log already).
LOG_ENV = "QUANTKIT_LOG"

console = Console()
err_console = Console(stderr=True)

_captured_to: Path | None = None


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def captured_to() -> Path | None:
    """The log other libraries' output goes to now; None when it streams (verbose, or no command)."""
    return _captured_to


def progress(*columns: str | ProgressColumn, transient: bool = False) -> Progress:
    """A rich progress display on quantkit's stderr console. While output is captured it must not
    take over sys.stdout / sys.stderr (rich's default), which would carry the libraries' writes
    back onto the terminal above the bar."""
    from rich.progress import Progress  # not at import: the listing commands need no bars

    live_redirect = _captured_to is None
    return Progress(
        *columns,
        console=err_console,
        transient=transient,
        redirect_stdout=live_redirect,
        redirect_stderr=live_redirect,
    )


def child_stdout() -> IO[str] | None:
    """The stdout to give a quantkit process this one starts (torchrun's ranks): the terminal
    while capturing (their own capture sends the rest to the log); None: inherit ours."""
    if _captured_to is None:
        return None
    try:
        console.file.fileno()
    except (AttributeError, OSError, ValueError):
        return None  # an in-memory terminal (a test's runner): the ranks write to the log
    return console.file


def pass_on(source: str, text: str) -> None:
    """A child process's output that quantkit kept apart (a vLLM worker's log, read for its error
    tail) into the command's log, or onto the terminal when verbose; nothing when quantkit runs
    as a library."""
    if text.strip() and (_captured_to is not None or verbose()):
        sys.stderr.write(f"---- {source}\n{text.rstrip()}\n---- end of {source}\n")
        sys.stderr.flush()


def _terminal_stream(stream: IO[str], fd: int) -> tuple[IO[str], bool]:
    """(a stream that reaches what ``fd`` reaches now, whether we opened it): a copy of the
    descriptor for the process's own stream, else the stream itself (a test runner's buffer)."""
    try:
        real = stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        real = False
    if not real:
        return stream, False
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return open(os.dup(fd), "w", encoding=encoding, errors="replace", buffering=1), True  # noqa: SIM115


def _flush_c_stdio() -> None:
    """What C code printed and its stdio still buffers belongs to the log, not the terminal."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


@dataclass
class _Log:
    """The open log and what opening it changed, so that a run that logged nothing leaves nothing
    (a failed command's output folder stays as it was)."""

    path: Path
    handle: IO[str]
    size_before: int
    size_after_header: int
    made: list[Path]  # folders made for it, deepest first

    def close(self, *, keep_header: bool) -> None:
        self.handle.close()
        with suppress(OSError):
            if keep_header or self.path.stat().st_size != self.size_after_header:
                return
            if self.size_before:
                os.truncate(self.path, self.size_before)
                return
            self.path.unlink()
            for folder in self.made:
                folder.rmdir()


def _open_log(log: Path, header: str) -> _Log | None:
    """``log`` opened for appending, with the run's header (its folders made); where that folder
    is not writable (a read-only checkpoint's), the user's log in the temporary folder."""
    for path in (log, Path(tempfile.gettempdir()) / f"quantkit-{os.getuid()}.log"):
        made = [folder for folder in path.parents if not folder.exists()]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            size_before = path.stat().st_size if path.exists() else 0
            handle = open(path, "a", encoding="utf-8", errors="replace", buffering=1)  # noqa: SIM115
        except OSError:
            continue
        try:
            handle.write(header)
            handle.flush()
        except OSError:  # a full disk
            handle.close()
            continue
        return _Log(path, handle, size_before, size_before + len(header.encode("utf-8", "replace")), made)
    return None


@contextmanager
def library_output_to(log: Path, command_line: str) -> Iterator[None]:
    """Run the body with other libraries' output appended to ``log`` (parents made as needed);
    the terminal, restored afterwards, keeps quantkit's consoles. An exception leaves after the
    restore, so its report reaches the terminal. Started by a capturing quantkit (LOG_ENV set), it
    appends to that command's log instead."""
    global _captured_to
    inherited = bool(os.environ.get(LOG_ENV))
    if inherited:
        log = Path(os.environ[LOG_ENV])
    opened = _open_log(
        log, f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {command_line}\n"
    )
    if opened is None:  # nowhere writable: the output streams, as with -v
        yield
        return
    log, handle = opened.path, opened.handle
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    terminal_out, opened_out = _terminal_stream(sys.stdout, 1)
    if inherited:  # a rank of a capturing parent: stderr is the log, stdout the terminal
        terminal_err, opened_err = terminal_out, False
    else:
        terminal_err, opened_err = _terminal_stream(sys.stderr, 2)
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    streams = sys.stdout, sys.stderr
    previous_env = os.environ.get(LOG_ENV)
    try:
        for fd in (1, 2):
            os.dup2(handle.fileno(), fd)
        sys.stdout = sys.stderr = handle
        console.file, err_console.file = terminal_out, terminal_err
        os.environ[LOG_ENV] = str(log)
        _captured_to = log
        if not inherited:
            err_console.print(f"[dim]other libraries' output: {log} (-v shows it here)[/]", soft_wrap=True)
        yield
    finally:
        _captured_to = None
        if previous_env is None:
            os.environ.pop(LOG_ENV, None)
        else:
            os.environ[LOG_ENV] = previous_env
        _flush_c_stdio()
        for stream in (handle, terminal_out, terminal_err, *streams):
            with suppress(OSError, ValueError):
                stream.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        sys.stdout, sys.stderr = streams
        console.file = err_console.file = None  # back to following sys.stdout / sys.stderr
        for stream, ours in ((terminal_out, opened_out), (terminal_err, opened_err)):
            if ours:
                stream.close()
        opened.close(keep_header=inherited)  # ranks append to one log at once: sizes tell nothing
