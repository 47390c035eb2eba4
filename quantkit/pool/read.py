"""Read a pool: every source the user named, each record validated and described by task,
modality combination and size bucket; exact duplicates dropped.

Media are probed from their headers only, once per file, so memory stays bounded on big pools.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from quantkit.errors import InputError
from quantkit.fsutil import sha256_file
from quantkit.mediasources import MediaRoots, MediaStore
from quantkit.pool.dedupe import drop_duplicates, id_conflicts
from quantkit.pool.index import PoolIndex
from quantkit.pool.jsonfile import json_array_at, jsonl_at, read_json_array, read_jsonl
from quantkit.pool.parse import MediaProbe, ParseContext, RecordParser
from quantkit.pool.record import (
    FileEncodingError,
    PoolReadResult,
    RecordError,
    SkippedRecord,
    SourceStats,
    check_text_encoding,
    not_unicode,
)
from quantkit.pool.sources import Source, resolve_sources
from quantkit.pool.split import SplitRead, array_part_bounds, part_bounds, part_count
from quantkit.pool.tables import csv_at, iter_csv, iter_table, table_at
from quantkit.taskassign import ORIGINS
from quantkit.taxonomy import ImageRule, Taxonomy

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|\d+(\.\d+)?")


def reason_kind(reason: str) -> str:
    """A skip reason without its particulars (file names, values, counts): what the report groups by."""
    head, sep, rest = reason.partition(": ")
    if sep and ("." in head or "/" in head) and " " not in head:  # "media/x.png: unreadable image: ..."
        reason = rest
    reason = (
        reason.split(";")[0].split(": ")[0] if not reason.startswith("malformed JSON") else "malformed JSON"
    )
    return _QUOTED.sub("…", reason).strip()


def pool_files(paths: list[Path]) -> list[Path]:
    """The files and folders read for ``paths`` (resolved), as the sources name them."""
    return [source.path for source in resolve_sources(paths)[0]]


def read_pool(
    paths: list[Path],
    taxonomy: Taxonomy,
    *,
    image_rule: ImageRule | None = None,
    task_field: str = "task",
    skip_invalid: bool = False,
    on_bytes: Callable[[int], None] | None = None,
    media_roots: tuple[Path, ...] = (),
    datasets: tuple[str, ...] = (),
    split: str | None = None,
    store: MediaStore | None = None,
    assigner: object | None = None,
    verify_media: frozenset[str] = frozenset(),
    workers: int | None = None,
    ignore_fields: tuple[str, ...] = (),
) -> PoolReadResult:
    """Read and validate every record of every source; drop exact duplicates (same text, same
    media bytes).

    ``workers``: processes a JSONL file or JSON array is read in (quantkit.pool.split; the result
    is the same for any number); None: one per CPU for files of at least 2 x split.MIN_PART_BYTES.

    The first invalid record raises InputError naming file and line, unless ``skip_invalid``.
    A field no reading of the record uses is counted per source; one holding media is an error
    unless named in ``ignore_fields``.
    With an ``assigner`` (quantkit.taskassign.TaskAssigner) records without a task field get one
    from it; those it cannot assign are left out, and the caller asks it for the error.
    """
    sources, notes = resolve_sources(paths, datasets, split)
    for root in media_roots:
        if not Path(root).is_dir():
            raise InputError(
                "media root not found (or not a folder)", path=root, hint="--media-root takes a folder"
            )
    with gc_paused():
        result = _read_sources(
            sources, taxonomy, image_rule, task_field, skip_invalid, on_bytes, media_roots, store, assigner,
            frozenset(verify_media), workers, frozenset(ignore_fields),
        )  # fmt: skip
    result.notes = notes + result.notes
    unassigned = sum(stats.task_origins.get("none", 0) for stats in result.sources)
    if not len(result.index) and not unassigned:
        why = list(result.notes)  # what was not read, and why
        if result.skipped:
            first = result.skipped[0]
            why.insert(0, f"all {len(result.skipped)} record(s) were invalid, the first {first.source}:{first.line}: {first.reason}")
        raise InputError(
            "the pool has no valid records",
            path=sources[0].path if len(sources) == 1 else None,
            hint="; ".join(why) or None,
        )
    result.duplicates = drop_duplicates(result.index)
    count, examples = id_conflicts(result.index)
    if count:
        result.id_conflicts = examples
        result.notes.append(
            f"{count} record(s) reuse the id of another record with different content, e.g. {examples[0]}: "
            "both are kept; give them distinct ids"
        )
    if assigner is not None:
        result.task_assignment = assigner.summary()
    return result


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while records pile up: they form no cycles (the parsed JSON
    is freed by reference counting), and collections that walk 100k live records cost more than a
    quarter of the parsing. (`quantize --dry-run` pauses the same way while it imports.)"""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                # Move what piled up into the oldest generation (freeze then unfreeze: two list
                # splices), or the first collection after this walks all of it as young objects.
                # Only when nothing else is frozen: unfreeze would thaw a caller's frozen objects.
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _read_sources(
    sources: list[Source],
    taxonomy: Taxonomy,
    image_rule: ImageRule | None,
    task_field: str,
    skip_invalid: bool,
    on_bytes: Callable[[int], None] | None,
    media_roots: tuple[Path, ...],
    store: MediaStore | None,
    assigner: object | None,
    verify_media: frozenset[str],
    workers: int | None,
    ignore_fields: frozenset[str] = frozenset(),
) -> PoolReadResult:
    probe = MediaProbe(verify_media)
    rule = image_rule or taxonomy.buckets.image_rule
    index = PoolIndex()
    result = PoolReadResult(index=index)
    for number_of_source, source in enumerate(sources):
        path = source.path
        result.inputs[str(path)] = ""  # keeps the files' order
        stats = SourceStats(name=source.label, format=source.format_name())
        result.sources.append(stats)
        before = len(index.group)
        origins_before = _origin_totals(assigner)
        context = ParseContext(
            roots=MediaRoots(source.base, (*source.roots, *media_roots)),
            store=store,
            source=str(path),
            named=source.named,
            dataset=source.dataset,
            spec=source.spec,
            taxonomy=taxonomy,
            buckets=taxonomy.buckets,
            image_rule=rule,
            task_field=task_field,
            probe=probe,
            result=result,
            stats=stats,
            assigner=assigner,
            source_index=number_of_source,
            ignore_fields=ignore_fields,
        )
        parser = RecordParser(context)
        parse = parser.parse
        index.sources.append(str(path))
        index.readers.append(functools.partial(_read_again, source, context, parser))
        if source.kind in ("jsonl", "json"):
            try:
                check_text_encoding(path)
            except FileEncodingError as err:
                raise InputError(str(err), path=path, hint=err.hint(path)) from None
        split = None
        if source.kind in ("jsonl", "json"):
            parts = part_count(path.stat().st_size, workers)
            if parts > 1:
                bounds = (part_bounds if source.kind == "jsonl" else array_part_bounds)(path, parts)
                if len(bounds) > 1:  # forked before the hashing thread starts; None if it could not fork
                    split = SplitRead(path, bounds, context, parser, skip_invalid, source.kind).start()
        try:
            # The file's hash is computed beside the parsing: hashlib and file reads release the GIL.
            digest = _in_background(sha256_file if path.is_file() else _folder_hash, path)

            def on_error(
                number: int, err: RecordError, path: Path = path, stats: SourceStats = stats, before: int = before
            ) -> None:
                if isinstance(err, FileEncodingError):
                    raise InputError(str(err), path=path, line=number, hint=err.hint(path)) from None
                if not skip_invalid:
                    # --skip-invalid only where it would keep something: records read before this one
                    raise InputError(
                        str(err),
                        path=path,
                        line=number,
                        hint="fix the record, or pass --skip-invalid to skip it"
                        if len(index.group) > before
                        else "fix the record",
                    ) from None
                result.skipped.append(SkippedRecord(str(path), number, str(err)))
                stats.skipped[reason_kind(str(err))] += 1

            if split is not None:
                split.read(on_error, on_bytes)
            elif source.kind == "jsonl":
                read_jsonl(path, parse, on_error, on_bytes)
            elif source.kind == "json":
                read_json_array(path, parse, on_error, on_bytes)
            elif source.kind == "csv":
                for number, (line, row) in enumerate(iter_csv(path)):
                    try:
                        parse(row, line, number)
                    except RecordError as err:
                        on_error(line, err)
            else:
                for number, row in iter_table(path, source.split):
                    try:
                        parse(row, number, number - 1)
                    except RecordError as err:
                        on_error(number, err)
                    except UnicodeEncodeError as err:
                        on_error(number, not_unicode(err))
        finally:
            if split is not None:  # whatever stopped the read: no child left running
                split.close()
        _count_source(stats, index, before, assigner, origins_before)
        result.inputs[str(path)] = digest()
    return result


def _read_again(
    source: Source, context: ParseContext, first: RecordParser, places: list[tuple[int, int]]
) -> list:
    """The full records of ``source`` at (line, locator) ``places``: parsed again, as when read
    (by ``first``'s media paths and combinations)."""
    out: list = []
    parse = RecordParser(dataclasses.replace(context, emit=out), reuse=first).parse
    if source.kind == "jsonl":
        jsonl_at(source.path, places, parse)
    elif source.kind == "json":
        json_array_at(source.path, places, parse)
    elif source.kind == "csv":
        csv_at(source.path, places, parse)
    else:
        table_at(source.path, source.split, places, parse)
    return out


def _origin_totals(assigner: object | None) -> Counter:
    """Records the assigner has given a task, by origin (and 'none': those it could not)."""
    totals: Counter = Counter()
    if assigner is not None:
        summary = assigner.summary()
        for row in summary["tasks"].values():
            for origin in ORIGINS:
                totals[origin] += row.get(origin, 0)
        totals["none"] = summary["unassigned"]["count"]
    return totals


def _count_source(
    stats: SourceStats, index: PoolIndex, before: int, assigner: object | None, origins_before: Counter
) -> None:
    """A source's records, tasks by origin and modalities, from what it added (counted once per
    source rather than per record: the parser's hot loop stays as it was)."""
    added = len(index.group) - before
    if assigner is None:
        origins = Counter({"field": added}) if added else Counter()
    else:
        origins = _origin_totals(assigner)
        origins.subtract(origins_before)
        origins = +origins  # drops the zeros
    stats.task_origins = origins
    # Counted by group (a record's group gives its modality); the unassigned are counted already.
    added_groups = index.group_of(np.arange(before, len(index.group)))
    for g, count in enumerate(np.bincount(added_groups, minlength=len(index.groups)).tolist()):
        if count:
            stats.modalities[index.groups[g].modality] += count
    stats.records = added + origins.get("none", 0)
    # The spellings detected: those normalize() mapped, and plain chat turns (the fast path) for the rest.
    plain = stats.records - sum(stats.formats.values())
    if plain > 0:
        stats.formats["chat turns"] += plain
    named = [name for name, _ in stats.formats.most_common() if name not in stats.format.split()]
    if named:  # (a dataset_info.json entry's formatting is in the name already)
        stats.format += ": " + ", ".join(named)


def _in_background(function: Callable[[Path], str], path: Path) -> Callable[[], str]:
    """Start ``function(path)`` in a thread; the returned callable waits for its value (or raises
    its error). Daemonic, so an error in the caller never waits for it."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = function(path)
        except BaseException as err:  # handed to the caller
            box["error"] = err

    thread = threading.Thread(target=run, name="quantkit-pool-hash", daemon=True)
    thread.start()

    def value() -> str:
        thread.join()
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]

    return value


def _folder_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(file.relative_to(folder).as_posix().encode())
        digest.update(sha256_file(file).encode())
    return digest.hexdigest()
