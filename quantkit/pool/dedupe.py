"""Exact duplicates (same text, same media bytes) count once; the same id on different content
is named."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from quantkit.fsutil import sha256_file
from quantkit.pool.record import PoolRecord


def drop_duplicates(records: list[PoolRecord]) -> tuple[list[PoolRecord], int]:
    """Keep the first of records with the same text and the same media bytes.

    Exact without hashing every file: a file whose size no other file has cannot equal another
    file, so only files that share a size are read and hashed.
    """
    combos = {record.media for record in records}  # records share a few media tuples
    real = {path: os.path.realpath(path) for media in combos for path in media}
    sizes = {p: os.path.getsize(p) for p in set(real.values())}
    size_counts = Counter(sizes.values())
    identity = {path: f"size:{size}" for path, size in sizes.items() if size_counts[size] == 1}
    shared = [path for path, size in sizes.items() if size_counts[size] > 1]
    if shared:  # two threads: hashlib and file reads release the GIL
        with ThreadPoolExecutor(max_workers=2) as pool:
            identity.update(zip(shared, pool.map(sha256_file, map(Path, shared)), strict=True))
    # The text keys seen so far for each media identity, one set shared by the media tuples with
    # that identity: a record is a duplicate when its text key is in its media's set.
    by_identity: dict[tuple, set[str]] = {}
    seen_for = {
        media: by_identity.setdefault(tuple(identity[real[p]] for p in media), set()) for media in combos
    }
    kept: list[PoolRecord] = []
    keep = kept.append
    for record in records:
        seen = seen_for[record.media]
        text = record.text_key
        if text not in seen:
            seen.add(text)
            keep(record)
    return kept, len(records) - len(kept)


def id_conflicts(records: list[PoolRecord], limit: int = 20) -> tuple[int, list[str]]:
    """Ids that more than one kept record carries (exact duplicates are already gone, so their
    content differs): the count, and up to ``limit`` of them as "id: file:line, file:line"."""
    first: dict[str, PoolRecord] = {}
    count = 0
    examples: list[str] = []
    for record in records:
        other = first.setdefault(record.record_id, record)
        if other is not record:
            count += 1
            if len(examples) < limit:
                examples.append(
                    f"{record.record_id!r}: {other.source}:{other.line} and {record.source}:{record.line}"
                )
    return count, examples
