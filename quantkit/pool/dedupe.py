"""Exact duplicates (same text, same media bytes) count once; the same id on different content
is named. Both work on the compact index's columns (quantkit.pool.index), sorting arrays."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from quantkit.fsutil import sha256_file
from quantkit.pool.index import PoolIndex

_MIX = np.uint64(0x9E3779B97F4A7C15)


def _media_identities(index: PoolIndex) -> np.ndarray:
    """Per group, a number naming its media by content: groups whose media are the same bytes get
    the same number. Exact without hashing every file: a file whose size no other file has cannot
    equal another file, so only files that share a size are read and hashed."""
    combos = {group.media for group in index.groups}  # records share a few media tuples
    real = {path: os.path.realpath(path) for media in combos for path in media}
    sizes = {p: os.path.getsize(p) for p in set(real.values())}
    size_counts = Counter(sizes.values())
    identity = {path: f"size:{size}" for path, size in sizes.items() if size_counts[size] == 1}
    shared = [path for path, size in sizes.items() if size_counts[size] > 1]
    if shared:  # two threads: hashlib and file reads release the GIL
        with ThreadPoolExecutor(max_workers=2) as pool:
            identity.update(zip(shared, pool.map(sha256_file, map(Path, shared)), strict=True))
    numbers: dict[tuple, int] = {}
    return np.array(
        [numbers.setdefault(tuple(identity[real[p]] for p in g.media), len(numbers)) for g in index.groups],
        dtype=np.uint64,
    )


def _first_of_equal(keys: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Whether each element is the first (in order) of the elements with the same (key, second):
    a stable sort by the 64-bit key, then the rare runs of equal keys checked on both."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    same = np.empty(len(keys), dtype=bool)
    if len(keys):
        same[0] = False
        np.equal(sorted_keys[1:], sorted_keys[:-1], out=same[1:])
    first = np.ones(len(keys), dtype=bool)
    if same.any():
        starts = np.flatnonzero(~same)
        ends = np.append(starts[1:], len(keys))
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            if end - start > 1:  # equal keys: a duplicate when the second part is equal too
                seen: set[int] = set()
                for position in order[start:end].tolist():
                    value = int(second[position])
                    if value in seen:
                        first[position] = False
                    seen.add(value)
    return first


def drop_duplicates(index: PoolIndex) -> int:
    """Keep the first of records with the same text and the same media bytes; the count dropped."""
    rows = index.rows
    if not len(rows):
        return 0
    identity = _media_identities(index)[index.group_of(rows)]
    digests = np.frombuffer(index.digest, dtype="<u8").reshape(-1, 2)[rows]
    keys = digests[:, 0] ^ (identity * _MIX)  # text and media identity in one 64-bit key ...
    first = _first_of_equal(keys, digests[:, 1] ^ identity)  # ... checked on all 128 bits
    del digests, keys, identity
    kept = rows[first]
    index.keep(kept)
    return len(rows) - len(kept)


def id_conflicts(index: PoolIndex, limit: int = 20) -> tuple[int, list[str]]:
    """Ids that more than one kept record carries (exact duplicates are gone, so their content
    differs): the count, and up to ``limit`` of them as "id: file:line and file:line"."""
    rows = index.rows
    hashes = np.frombuffer(index.id_hash, dtype=np.int64)[rows] if len(rows) else np.zeros(0, np.int64)
    order = np.argsort(hashes, kind="stable")
    sorted_hashes = hashes[order]
    candidates = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1]) if len(rows) > 1 else []
    if not len(candidates):
        return 0, []
    involved = sorted(set(order[candidates].tolist()) | set(order[np.asarray(candidates) + 1].tolist()))
    first: dict[str, int] = {}
    count, examples = 0, []
    groups, sources = index.groups, index.sources
    for position in involved:  # in reading order
        n = int(rows[position])
        record_id = index.record_id(n)
        other = first.setdefault(record_id, n)
        if other != n:
            count += 1
            if len(examples) < limit:
                where = [f"{sources[groups[index.group[m]].source]}:{index.line[m]}" for m in (other, n)]
                examples.append(f"{record_id!r}: {where[0]} and {where[1]}")
    return count, examples
