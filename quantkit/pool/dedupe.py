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


def _duplicates_in(positions: np.ndarray, keys: np.ndarray, second: np.ndarray, first: np.ndarray) -> None:
    """Among ``positions`` (ascending: reading order), clear ``first`` for each one whose (key,
    second) an earlier one has: a stable sort by the 64-bit key, then the rare runs of equal keys
    checked on the second 64 bits too."""
    sub = keys[positions]
    order = np.argsort(sub, kind="stable")
    sub = sub[order]
    equal = sub[1:] == sub[:-1]  # equal to the one before, in sorted order
    if not equal.any():
        return
    in_run = np.zeros(len(sub), dtype=bool)
    in_run[1:] |= equal
    in_run[:-1] |= equal
    seen: dict[int, set[int]] = {}
    for i in np.flatnonzero(in_run).tolist():  # few: the duplicates and their first copies
        position = int(positions[order[i]])
        values = seen.setdefault(int(sub[i]), set())
        value = int(second[position])
        if value in values:
            first[position] = False
        values.add(value)


def drop_duplicates(index: PoolIndex) -> int:
    """Keep the first of records with the same text and the same media bytes; the count dropped.

    The 128-bit text digests, mixed with the media identity, are checked 1/16 of the pool at a
    time (by the key's top 4 bits), so the work arrays stay a few bytes a record."""
    rows = index.rows
    if not len(rows):
        return 0
    identity = _media_identities(index)
    digests = np.frombuffer(index.digest, dtype="<u8")
    everything = len(rows) == len(index.group)  # rows is 0..n-1: index the columns directly
    keys = identity[index.group_of(None if everything else rows)]  # text and media identity in one key ...
    keys *= _MIX
    keys ^= digests[0::2] if everything else digests[0::2][rows]
    second = digests[1::2]  # ... checked on all 128 bits
    first = np.ones(len(rows), dtype=bool)
    top = keys.view(np.uint8)[7::8] >> 4  # little-endian: the top byte
    for bucket in range(16):
        positions = np.flatnonzero(top == bucket)
        if len(positions):
            _duplicates_in(positions, keys, _Second(second, rows), first)
    del keys, top
    kept = rows[first]
    index.keep(kept)
    return len(rows) - len(kept)


class _Second:
    """The second 64 bits of the digest of the record at a position of ``rows``."""

    def __init__(self, second: np.ndarray, rows: np.ndarray) -> None:
        self.second, self.rows = second, rows

    def __getitem__(self, position: int) -> int:
        return self.second[self.rows[position]]


def id_conflicts(index: PoolIndex, limit: int = 20) -> tuple[int, list[str]]:
    """Ids that more than one kept record carries (exact duplicates are gone, so their content
    differs): the count, and up to ``limit`` of them as "id: file:line and file:line". Candidates
    share a 32-bit id hash (found a sixteenth of the pool at a time), then their ids are compared."""
    rows = index.rows
    if len(rows) < 2:
        return 0, []
    hashes = np.frombuffer(index.id_hash, dtype=np.uint32)
    hashes = hashes if len(rows) == len(index.group) else hashes[rows]
    top = (hashes >> 28).astype(np.uint8)
    involved: list[int] = []
    for bucket in range(16):
        positions = np.flatnonzero(top == bucket)
        sub = hashes[positions]
        ordered = np.sort(sub)
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        if len(repeated):
            involved += positions[np.isin(sub, repeated)].tolist()
    del top
    first: dict[str, int] = {}
    count, examples = 0, []
    groups, sources = index.groups, index.sources
    for position in sorted(involved):  # in reading order
        n = int(rows[position])
        record_id = index.record_id(n)
        other = first.setdefault(record_id, n)
        if other != n:
            count += 1
            if len(examples) < limit:
                where = [f"{sources[groups[index.group[m]].source]}:{index.line[m]}" for m in (other, n)]
                examples.append(f"{record_id!r}: {where[0]} and {where[1]}")
    return count, examples
