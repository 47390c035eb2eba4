"""The one internal record every source format maps onto, and what reading a pool returns."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import InitVar, dataclass, field

from quantkit.errors import shorten

# What json.dumps(..., ensure_ascii=False) writes for a string: records' JSON (payload, id hash,
# text key) is assembled from pieces with it, byte-identical to dumping the dicts with sort_keys.
json_str = json.encoder.encode_basestring


class RecordError(ValueError):
    """A record that fails validation; the message is the reason shown to the user (shortened: it
    may quote a field of any length, and skipped records' reasons go into the report)."""

    def __init__(self, message: str) -> None:
        super().__init__(shorten(message))


class FileEncodingError(RecordError):
    """Text that is not UTF-8: the file is in another encoding, so every record is in doubt and
    --skip-invalid does not skip it (it would keep the lines that happen to be ASCII)."""

    def __init__(self, message: str, encoding: str) -> None:
        super().__init__(message)
        self.encoding = encoding  # iconv's name for it

    def __reduce__(self):  # (pickled by the processes that read parts of a pool)
        return type(self), (str(self), self.encoding)

    def hint(self, path) -> str:
        return (
            f"convert it: iconv -f {self.encoding} -t UTF-8 '{path}' > '{path}.utf8' and read that; "
            "--skip-invalid does not skip a file in another encoding"
        )


def not_utf8(line: bytes, column: int) -> FileEncodingError:
    """A ``line`` holding a byte that is not UTF-8 at (0-based) ``column``, with the encoding the
    file most likely is in (Windows-1252 when it uses bytes 0x80-0x9F, which Latin-1 leaves to
    control characters)."""
    cp1252 = any(0x80 <= b <= 0x9F for b in line)
    guess = "Windows-1252" if cp1252 else "Latin-1 (ISO-8859-1)"
    return FileEncodingError(
        f"not UTF-8 text: byte 0x{line[column : column + 1].hex()} at column {column + 1}; the file looks like {guess}",
        "CP1252" if cp1252 else "LATIN1",
    )


# Byte-order marks of the encodings a JSON file may not be in (RFC 8259: UTF-8 only), longest first.
_BOMS = (
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\xfe\xff", "UTF-16"),
    (b"\xff\xfe", "UTF-16"),
)


def wide_encoding(head: bytes) -> str | None:
    """UTF-16 / UTF-32 from a file's first bytes (its byte-order mark, else the NUL bytes ASCII
    text has in them), or None."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    sample = head[:4096]
    if len(sample) >= 4 and sample.count(0) * 4 >= len(sample):
        return "UTF-32" if sample[:4].count(0) == 3 else "UTF-16"
    return None


def check_text_encoding(path) -> None:
    """Raise FileEncodingError for a UTF-16 / UTF-32 text file (JSON, JSONL)."""
    with open(path, "rb") as handle:
        encoding = wide_encoding(handle.read(4096))
    if encoding is not None:
        raise FileEncodingError(f"the file is {encoding} text, not UTF-8", encoding)


def not_unicode(err: UnicodeEncodeError) -> RecordError:
    """A text holding a lone UTF-16 surrogate (JSON allows ``"\\ud800"``; UTF-8 has no such
    character, so the record could be neither hashed nor written)."""
    bad = err.object[err.start : err.end]
    return RecordError(
        f"text holds {bad!r}, half of a UTF-16 surrogate pair: not valid Unicode; fix or drop that \\u escape"
    )


@dataclass(frozen=True, slots=True)
class RecordJson:
    """The JSON of a record's fields other than its id and messages, shared by every record of one
    media combination and task (a big pool has a few thousand of them): the media lists (absolute
    paths) and the task, each as ``json.dumps(..., ensure_ascii=False)`` writes it, and the
    payload's pieces around the id and the messages, in ``sort_keys`` order."""

    audios: str
    images: str
    task: str
    videos: str

    @property
    def head(self) -> str:  # before the id
        return '{"audios": ' + self.audios + ', "id": '

    @property
    def middle(self) -> str:  # between the id and the messages
        return ', "images": ' + self.images + ', "messages": '

    @property
    def tail(self) -> str:  # after the messages
        return ', "task": ' + self.task + ', "videos": ' + self.videos + "}"


@dataclass(slots=True)
class PoolRecord:
    """One valid pool record, normalised: media paths absolute, task canonical."""

    record_id: str
    task: str
    modality: str
    bucket: str
    source: str  # the pool file
    line: int  # its line (JSONL, JSON array) or row (tables), 1-based
    json: RecordJson  # its media and task as JSON, shared with the records of its combination
    media: tuple[str, ...]  # absolute media paths, for the duplicate check
    text_key: str  # the messages' normalised JSON: their text, for the duplicate check
    stratum: str  # stratum_name(task, modality, bucket), shared by the records of a combination
    image_tokens: int = 0
    video_seconds: float = 0.0
    audio_seconds: float = 0.0

    @property
    def payload(self) -> str:
        """JSON of {id, task, messages, images, videos, audios} to write if selected: what
        ``json.dumps(..., sort_keys=True, ensure_ascii=False)`` gives. Assembled on demand, since
        only the selected records need it."""
        parts = self.json
        return parts.head + json_str(self.record_id) + parts.middle + self.text_key + parts.tail


def stratum_name(task: str, modality: str, bucket: str) -> str:
    """A record's stratum: task x modality x size bucket."""
    return f"{task}|{modality}|{bucket}"


@dataclass(frozen=True)
class SkippedRecord:
    source: str
    line: int
    reason: str


@dataclass
class SourceStats:
    """What one source gave, for the --dry-run table and the report."""

    name: str  # as the user named it (a dataset name through dataset_info.json)
    format: str  # the format detected
    records: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason (its first words) -> count
    task_origins: Counter = field(default_factory=Counter)  # field / mapping / rule / default / none
    modalities: Counter = field(default_factory=Counter)
    # Of the records mapped from another spelling than plain chat turns: spelling -> records
    # (folded into ``format`` once the source is read), and field left unused -> records.
    formats: Counter = field(default_factory=Counter)
    ignored: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "format": self.format,
            "records": self.records,
            "skipped": dict(sorted(self.skipped.items())),
            "task_origins": dict(sorted(self.task_origins.items())),
            "modalities": dict(sorted(self.modalities.items())),
            "ignored": dict(sorted(self.ignored.items())),
        }


def ignored_text(ignored: dict) -> str:
    """A source's unused fields as the reports print them: ``rejected (203 records), ...``."""
    return ", ".join(f"{name} ({count} records)" for name, count in sorted(ignored.items()))


@dataclass
class PoolReadResult:
    index: object = None  # quantkit.pool.index.PoolIndex: the usable records, compact
    skipped: list[SkippedRecord] = field(default_factory=list)
    duplicates: int = 0
    inputs: dict[str, str] = field(default_factory=dict)  # pool file -> sha256
    modality_mismatches: Counter = field(default_factory=Counter)  # task|modality not listed for the task
    sources: list[SourceStats] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. dataset_info entries not read
    id_conflicts: list[str] = field(default_factory=list)  # "id: file:line and file:line"
    task_assignment: dict | None = None  # TaskAssigner.summary() when tasks were assigned
    records: InitVar[list[PoolRecord] | None] = None  # a result made by hand (tests): its records

    def __post_init__(self, records: list[PoolRecord] | None) -> None:
        self._given = records


def _records(self: PoolReadResult):
    """The usable records as PoolRecords (a sequence read again from the sources on access)."""
    if self._given is not None or self.index is None:
        return list(self._given or [])
    from quantkit.pool.index import RecordsView

    return RecordsView(self.index)


PoolReadResult.records = property(_records)  # type: ignore[assignment,method-assign]
