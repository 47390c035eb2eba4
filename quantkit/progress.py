"""Rich progress displays for the two slow stages; both are no-ops when disabled."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

from quantkit.terminal import progress


def _noop() -> None:
    return None


@contextmanager
def sample_bar(description: str, total: int, *, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """A bar over ``total`` items; yields the function that advances it by one."""
    if not enabled:
        yield _noop
        return
    with progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda: bar.advance(task)


@contextmanager
def calibration_spinner(description: str, *, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """A spinner with elapsed time and a count of decoder-layer forward calls (fed by the hooks)."""
    if not enabled:
        yield _noop
        return
    with progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("[dim]{task.completed} decoder-layer calls"),
        TimeElapsedColumn(),
    ) as spinner:
        task = spinner.add_task(description, total=None)
        yield lambda: spinner.advance(task)
