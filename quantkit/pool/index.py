"""The records of a pool, kept compact: what selection needs and no more.

Per record: its group (the source x media combination x task it shares with others: task,
modality, bucket, stratum, media, JSON pieces), its id, its line and where to read it again
(a byte offset or a row), a 16-byte digest of its text for the duplicate check
and a hash of its id — about 64 bytes, in arrays, whatever the pool's size. The text of a record is
read again only when it is selected (``materialize``), so a 10M-record pool stays well under 1 GB.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from quantkit.pool.record import PoolRecord, RecordJson

ROW = np.uint32  # record numbers: up to 4 billion records a pool


@dataclass(slots=True, eq=False)
class Group:
    """What the records of one source, media combination and task share."""

    task: str
    modality: str
    bucket: str
    stratum: str
    json: RecordJson
    media: tuple[str, ...]
    image_tokens: int
    video_seconds: float
    audio_seconds: float
    source: int  # index into PoolIndex.sources


class PoolIndex:
    """Columns of per-record facts; ``rows`` are the record numbers still usable (after the
    duplicate check), in reading order."""

    def __init__(self) -> None:
        self.groups: list[Group] = []
        self.sources: list[str] = []  # the pool files, as PoolRecord.source gives them
        # Re-reads a source's records at given (line, locator) pairs: the records, in that order.
        self.readers: list[Callable[[list[tuple[int, int]]], list[PoolRecord]]] = []
        self.group = array("I")
        self.line = array("I")
        self.locator = array("q")
        self.id_hash = array("I")  # 32 bits: conflicts found by it are checked on the ids
        self.id_end = array("I")  # ids blob up to 4 GiB
        self.ids = bytearray()
        self.digest = array("q")  # two 64-bit hashes a record: see quantkit.pool.parse
        self._rows: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.group) if self._rows is None else len(self._rows)

    @property
    def rows(self) -> np.ndarray:
        if self._rows is None:
            return np.arange(len(self.group), dtype=ROW)
        return self._rows

    def keep(self, rows: np.ndarray) -> None:
        self._rows = np.asarray(rows, dtype=ROW)

    def record_id(self, n: int) -> str:
        start = self.id_end[n - 1] if n else 0
        return self.ids[start : self.id_end[n]].decode("utf-8", "surrogatepass")

    def group_of(self, rows: np.ndarray | None = None) -> np.ndarray:
        column = np.frombuffer(self.group, dtype=np.uint32) if len(self.group) else np.zeros(0, np.uint32)
        return column[self.rows if rows is None else rows]

    def groups_of(self, rows: np.ndarray | None = None) -> Iterator[Group]:
        """The group of each row, in order (one shared object per group: cheap to count by)."""
        groups = self.groups
        for g in self.group_of(rows).tolist():
            yield groups[g]

    def materialize(self, rows: Iterable[int]) -> list[PoolRecord]:
        """The full records of ``rows`` (record numbers), in that order, read again from their sources."""
        rows = [int(n) for n in rows]
        by_source: dict[int, list[int]] = {}
        groups, group = self.groups, self.group
        for n in rows:
            by_source.setdefault(groups[group[n]].source, []).append(n)
        found: dict[int, PoolRecord] = {}
        for source, members in by_source.items():
            members.sort(key=self.locator.__getitem__)
            records = self.readers[source]([(self.line[n], self.locator[n]) for n in members])
            for n, record in zip(members, records, strict=True):
                found[n] = record
        return [found[n] for n in rows]


class RecordsView(Sequence):
    """``PoolReadResult.records``: the usable records as PoolRecords, read again on access (a list
    of a big pool's records would hold every text; iterate it only on small pools)."""

    def __init__(self, index: PoolIndex) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):  # type: ignore[override]
        rows = self.index.rows
        if isinstance(i, slice):
            return self.index.materialize(rows[i])
        return self.index.materialize([rows[i]])[0]

    def __iter__(self) -> Iterator[PoolRecord]:
        rows = self.index.rows
        for start in range(0, len(rows), 4096):
            yield from self.index.materialize(rows[start : start + 4096])
