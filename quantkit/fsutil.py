"""The file system, used safely: outputs that never overwrite an input, checks before any work
(writable, enough free space; model files: quantkit.modelfiles), and output folders written so
that nothing half-written ever looks complete."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from quantkit.errors import CheckFailed, InputError, shorten

log = logging.getLogger("quantkit")

# What a run leaves beside OUTPUT while it writes: ``.NAME.partial-PID`` (atomic_output_dir) and
# ``.NAME.old-PID`` (the previous output during the final swap).
_STAGING = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|old)-(?P<pid>\d+)$")
DISK_MARGIN_BYTES = 16 * 2**20  # besides 5% of the estimate: sidecar files, a shard rewritten, metadata


# ---------------------------------------------------------------------- inputs and outputs overlap


def _ancestors(path: Path) -> Iterator[Path]:
    yield path
    yield from path.parents


def within(inner: Path, outer: Path) -> bool:
    """``inner`` is ``outer`` or lies below it: by resolved path (symlinks followed), and by file
    identity for what exists (bind mounts, hard-linked or case-folded names)."""
    inner, outer = inner.resolve(), outer.resolve()
    if inner == outer or outer in inner.parents:
        return True
    if not outer.exists():
        return False
    for ancestor in _ancestors(inner):
        try:
            if ancestor.exists() and os.path.samefile(ancestor, outer):
                return True
        except OSError:
            continue
    return False


def refuse_overlap(
    output: Path | None,
    inputs: Mapping[str, Path | Iterable[Path | None] | None],
    *,
    option: str = "--output",
    inside_ok: Iterable[str] = (),
) -> None:
    """Refuse (InputError, exit 2) an ``output`` that is, contains, or sits inside one of
    ``inputs`` (a description -> path(s) mapping; None entries are skipped), whatever --force says.

    Called by every command's stage function before it touches anything: replacing ``output``
    would otherwise delete an input, and writing into it would change one. ``inside_ok`` names
    inputs the output may sit inside by design (verify.json in the checkpoint it audits)."""
    if output is None:
        return
    output, allowed = Path(output), set(inside_ok)
    for what, paths in inputs.items():
        if paths is None:
            continue
        for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
            if path is None:
                continue
            path = Path(path)
            if within(path, output):
                relation = "is" if within(output, path) else "contains"
                raise InputError(
                    f"{option} {relation} the {what} {path}: writing it would destroy that input",
                    path=output,
                    hint=f"choose another {option} outside every input; --force never replaces an input",
                )
            if what not in allowed and within(output, path) and path.is_dir():
                raise InputError(
                    f"{option} sits inside the {what} {path}: quantkit never writes into its inputs",
                    path=output,
                    hint=f"choose another {option} outside {path}",
                )


def refuse_calibrate_overlap(
    output: Path,
    pools: Iterable[Path],
    taxonomy: Path | None,
    model: Path | None,
    media_roots: Iterable[Path] = (),
    *,
    previous_set: bool = False,
) -> None:
    """:func:`refuse_overlap` for ``calibrate``: the pool files, their media folders (media paths
    resolve inside the pool file's folder, or the pool folder itself), the ``--media-root``
    folders, the taxonomy, the model.

    A set may go beside its pool (``calibrate pool.jsonl --output calib``): a new folder inside
    the media folder, or an earlier set there (``previous_set``: the folder has a set's whole
    signature, see calibset.is_calibration_set), holds no media; any other existing folder might."""
    pools, output = [Path(p) for p in pools], Path(output)
    replaceable = not output.exists() or previous_set
    refuse_overlap(
        output,
        {
            "pool": pools,
            "pool's media folder": [p if p.is_dir() else p.parent for p in pools],
            "media root": [Path(root) for root in media_roots],
            "taxonomy": taxonomy,
            "model folder": model,
        },
        inside_ok=["pool's media folder", "media root"] if replaceable else [],
    )


# ---------------------------------------------------------------------- checks before the work


def _existing_ancestor(path: Path) -> Path:
    """The nearest part of ``path`` that exists (where creating it would start)."""
    for ancestor in Path(os.path.abspath(path)).parents:
        if ancestor.exists():
            return ancestor
    return Path("/")


# Bytes a hidden staging name adds to an output's name (".NAME.partial-PID"; ".NAME.old-PID").
STAGING_NAME_EXTRA = len(".") + len(".partial-") + 10


def _check_name_lengths(output: Path, option: str) -> None:
    """Refuse an output whose name (or a folder to create above it) is longer than the file
    system allows: bad input, said before any work, not a failed write at the end."""
    base = _existing_ancestor(output)
    try:
        limit = os.pathconf(base, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    created = Path(os.path.abspath(output)).relative_to(base).parts
    for position, part in enumerate(created):
        extra = STAGING_NAME_EXTRA if position == len(created) - 1 else 0
        size = len(os.fsencode(part))
        if size + extra > limit:
            raise InputError(
                f"{option}: the name {shorten(part, 60)!r} is {size} bytes; this file system allows "
                f"{limit}" + (f", less {extra} for the staging copy written beside it" if extra else ""),
                path=base,
                hint=f"choose a shorter name for {option}",
            )


def check_writable(output: Path, *, option: str = "--output", kind: str | None = None) -> Path:
    """Fail (InputError) unless files can be created where ``output`` goes: its name fits the
    file system, and a probe can be created and removed in the nearest existing folder above it.
    ``kind`` ("file" or "folder"): what ``output`` must be if it exists. Returns that folder."""
    output = Path(output)
    _check_name_lengths(output, option)  # first: stat on too long a name is an OSError
    if kind == "folder" and output.exists() and not output.is_dir():
        raise InputError(
            f"{option} is a file, not a folder", path=output, hint=f"give {option} a folder (new or existing)"
        )
    if kind == "file" and output.is_dir():
        raise InputError(
            f"{option} is a folder; it takes a file path", path=output, hint=f"give {option} a file name"
        )
    base = _existing_ancestor(output)
    if not base.is_dir():
        raise InputError(
            f"{option} is under {base}, which is a file, not a folder",
            path=output,
            hint=f"choose another {option}, in a folder",
        )
    probe = base / f".quantkit-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        raise InputError(
            f"cannot write {option} here: creating a file in {base} fails ({err.strerror})",
            path=output,
            hint=f"choose another {option} on a writable disk, or make {base} writable",
        ) from None
    return base


def check_cache_writable(cache_dir: Path) -> None:
    """Fail (InputError) before any work when the processed-feature cache cannot be written,
    naming the cache and the option that moves it."""
    try:
        check_writable(cache_dir, option="--cache-dir")
    except InputError as err:
        raise InputError(
            f"the processed-feature cache cannot be written: {err.message}",
            path=cache_dir,
            hint="pass --cache-dir DIR on a writable disk (or set QUANTKIT_CACHE)",
        ) from None


def check_free_space(output: Path, need_bytes: int, *, what: str = "the output") -> None:
    """Fail (InputError) when the disk ``output`` goes to holds less than ``need_bytes`` plus a margin."""
    base = _existing_ancestor(output)
    free = shutil.disk_usage(base).free
    required = int(need_bytes * 1.05) + DISK_MARGIN_BYTES
    if free < required:
        raise InputError(
            f"not enough free space for {what}: it needs about {_mib(need_bytes)} "
            f"(plus a margin: {_mib(required)}), the disk holding {base} has {_mib(free)} free",
            path=output,
            hint="free some space or choose an output on another disk",
        )


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size < 2**30 else f"{size / 2**30:.2f} GiB"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_staging(output: Path) -> list[Path]:
    """Remove the ``.NAME.partial-PID`` folders a killed run left beside ``output`` (their PID is
    dead) and say so; a ``.NAME.old-PID`` is removed only when ``output`` exists (otherwise it
    holds the only copy of the previous output: it is named, not removed)."""
    output = Path(output)
    parent = output.parent
    if not parent.is_dir():
        return []
    removed = []
    for entry in sorted(parent.iterdir()):
        match = _STAGING.match(entry.name)
        if not match or match["name"] != output.name or _pid_alive(int(match["pid"])):
            continue
        if match["kind"] == "old" and not output.exists():
            log.warning(
                f"{entry} holds the previous {output.name} of a run that was killed; rename it back to keep it"
            )
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
        log.warning(f"removed {entry}, left by a killed run (process {match['pid']} is gone)")
    return removed


def check_output_free(
    output: Path,
    force: bool,
    *,
    need_bytes: int | None = None,
    replaceable: Callable[[Path], bool] | None = None,
    what: str = "output",
    option: str = "--output",
) -> None:
    """Fail early, before any work: ``output`` exists and ``force`` is off, it is not a folder,
    nothing can be written there, or (with ``need_bytes``) its disk is too full. Removes the
    staging folders killed runs left beside it.

    ``replaceable`` (the signature of what this command writes, e.g. a calibration set's files
    and format marker): with ``force``, an existing non-empty folder is replaced only when it
    has that signature; --force never deletes a folder quantkit did not write as this output."""
    output = Path(output)
    _check_name_lengths(output, "--output")
    if output.exists() and not force:
        raise InputError(f"{option} already exists", path=output, hint="choose another path or pass --force")
    if output.exists() and not output.is_dir():
        raise InputError(f"{option} exists and is not a folder", path=output)
    if output.is_dir() and os.path.ismount(output):
        raise InputError(
            f"{option} is a mount point: it cannot be replaced by the finished folder",
            path=output,
            hint="choose a folder inside it",
        )
    if replaceable is not None and output.is_dir() and any(output.iterdir()) and not replaceable(output):
        raise InputError(
            f"{option} holds files that are not a {what} quantkit wrote: --force replaces only an earlier {what}",
            path=output,
            hint=f"choose another {option} (or empty that folder yourself)",
        )
    check_writable(output, option=option)
    remove_stale_staging(output)
    if need_bytes is not None:
        check_free_space(output, need_bytes)


def check_output_file(
    path: Path,
    force: bool,
    inputs: Mapping[str, Path | Iterable[Path | None] | None],
    *,
    option: str,
) -> None:
    """The output rule for a single file (``--plan-json``, ``--report``): not an input nor inside
    an input folder (:func:`refuse_overlap`), not a folder, not an existing file unless ``force``,
    and writable."""
    path = Path(path)
    refuse_overlap(path, inputs, option=option)
    if path.is_dir():
        raise InputError(f"{option} is a folder, not a file", path=path, hint=f"give {option} a file name")
    if path.exists() and not force:
        raise InputError(f"{option} already exists", path=path, hint="choose another path or pass --force")
    check_writable(path, option=option)


def _lock_path(output: Path) -> Path:
    output = Path(output).absolute()
    return output.parent / f".{output.name}.lock"


def _lock_holder(lock: Path) -> int | None:
    """The live process holding ``lock`` (its PID), or None when free or left by a dead one."""
    try:
        pid = int(lock.read_text(encoding="ascii").strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and pid != os.getpid() and _pid_alive(pid) else None


@contextmanager
def output_lock(output: Path, *, option: str = "--output") -> Iterator[Path]:
    """Hold ``.NAME.lock`` beside ``output`` (it names this process) for the whole run: a second
    run onto the same output fails (InputError) naming the holder instead of replacing the first
    one's result. A lock whose process is gone is taken over."""
    lock = _lock_path(output)
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _attempt in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _lock_holder(lock)
            if holder is not None:
                raise InputError(
                    f"{option} is being written by another quantkit run (process {holder}, lock {lock})",
                    path=output,
                    hint="wait for it to finish, or choose another output",
                ) from None
            lock.unlink(missing_ok=True)  # left by a run that died
            continue
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(f"{os.getpid()}\n")
        break
    else:
        raise InputError(f"cannot take the lock {lock} on {option}", path=output, hint="run again")
    try:
        yield lock
    finally:
        lock.unlink(missing_ok=True)


def as_os_error(err: BaseException) -> OSError | None:
    """``err`` as the OSError it is or wraps: safetensors' writer reports a full disk as a
    SafetensorError whose text ends in "(os error 28)"."""
    if isinstance(err, OSError):
        return err
    found = re.search(r"\(os error (\d+)\)", str(err)) if isinstance(err, Exception) else None
    if found is None:
        return None
    code = int(found[1])
    return OSError(code, os.strerror(code))


def write_error(err: OSError, output: Path) -> CheckFailed:
    """What the user reads when writing ``output`` failed after the work (disk full, quota)."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return CheckFailed(
            f"the disk filled up while writing the output ({err.strerror}); nothing was written",
            path=output,
            hint="free some space (or choose an output on another disk) and run again",
        )
    return CheckFailed(
        f"writing the output failed: {err.strerror or err}; nothing was written",
        path=output,
        hint="check the disk and the folder's permissions, then run again",
    )


def default_mode(directory: bool = False) -> int:
    """The mode a new file (folder) gets under the process's umask, as ``open`` / ``mkdir`` give it."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def share_modes(folder: Path) -> None:
    """Give every file under ``folder`` the umask's default mode: some writers (safetensors) create
    0600 files, and a checkpoint is meant to be read by other users (a vLLM container)."""
    file_mode, dir_mode = default_mode(), default_mode(directory=True)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), dir_mode)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, file_mode)


@contextmanager
def atomic_output_dir(output: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a staging folder beside ``output``; on success it replaces ``output`` in one rename.

    If the body raises or the process dies, ``output`` is untouched and only a hidden
    ``.NAME.partial-PID`` folder can remain, which nothing reads as a result (and the next run
    removes). A full disk while writing is a CheckFailed (exit 1), the staging folder removed.
    """
    output = Path(output)
    check_output_free(output, force)
    staging = output.parent / f".{output.name}.partial-{os.getpid()}"
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
    except OSError as err:
        raise write_error(err, output) from None
    try:
        yield staging
        share_modes(staging)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        cause = as_os_error(err)
        if cause is not None:
            raise write_error(cause, output) from None
        raise
    previous = None
    if output.exists() and not force:  # another run finished there while this one worked
        shutil.rmtree(staging, ignore_errors=True)
        raise InputError(
            "output appeared while this run worked (another run wrote it); it was not replaced",
            path=output,
            hint="pass --force to replace it, or choose another output",
        )
    if output.exists():
        previous = output.parent / f".{output.name}.old-{os.getpid()}"
        output.rename(previous)
    staging.rename(output)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)


def write_file_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a hidden partial file and one rename (the partial file
    removed whatever fails)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


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
