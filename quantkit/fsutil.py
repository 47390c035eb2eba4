"""Writing output folders so that nothing half-written ever looks complete."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quantkit.errors import InputError


def check_output_free(output: Path, force: bool) -> None:
    """Fail early, before any work, when ``output`` exists and ``force`` is off."""
    if output.exists() and not force:
        raise InputError("output already exists", path=output, hint="choose another path or pass --force")
    if output.exists() and not output.is_dir():
        raise InputError("output exists and is not a folder", path=output)


@contextmanager
def atomic_output_dir(output: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a staging folder beside ``output``; on success it replaces ``output`` in one rename.

    If the body raises or the process dies, ``output`` is untouched and only a hidden
    ``.NAME.partial-PID`` folder can remain, which nothing reads as a result.
    """
    output = Path(output)
    check_output_free(output, force)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.parent / f".{output.name}.partial-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    previous = None
    if output.exists():
        previous = output.parent / f".{output.name}.old-{os.getpid()}"
        output.rename(previous)
    staging.rename(output)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cache_root(kind: str) -> Path:
    """quantkit's cache folder for ``kind`` (features, models, eval): ``$QUANTKIT_CACHE/kind``, else
    ``$XDG_CACHE_HOME/quantkit/kind``, else ``~/.cache/quantkit/kind``."""
    base = os.environ.get("QUANTKIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "quantkit"
    )
    return Path(base) / kind
