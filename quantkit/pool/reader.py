"""Read a pool (ms-swift / LLaMA-Factory multimodal JSONL, a saved `datasets` folder or Parquet),
validate every record, and describe each by task, modality combination and size bucket.

Media are probed from their headers only, once per file, so memory stays bounded on big pools.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from quantkit.chat import PLACEHOLDER, ROLE_ALIASES
from quantkit.errors import InputError
from quantkit.fsutil import sha256_file
from quantkit.media import (
    AudioInfo,
    ImageInfo,
    MediaError,
    VideoInfo,
    check_extension,
    probe_audio,
    probe_image,
    probe_video,
)
from quantkit.taxonomy import Buckets, ImageRule, Taxonomy

MEDIA_FIELDS = {"image": "images", "video": "videos", "audio": "audios"}
BUCKET_NAMES = {"image": ("small", "medium", "large"), "video": ("short", "medium", "long")}
BUCKET_NAMES["audio"] = BUCKET_NAMES["video"]


@dataclass(frozen=True, slots=True)
class PoolRecord:
    """One valid pool record, normalised: media paths absolute, task canonical."""

    record_id: str
    task: str
    modality: str
    bucket: str
    source: str  # the pool file
    line: int
    payload: str  # JSON of {id, task, messages, images, videos, audios} to write if selected
    media: tuple[str, ...]  # absolute media paths, for the duplicate check
    text_key: str  # hash of the messages' text
    image_tokens: int = 0
    video_seconds: float = 0.0
    audio_seconds: float = 0.0

    @property
    def stratum(self) -> str:
        return f"{self.task}|{self.modality}|{self.bucket}"


@dataclass(frozen=True)
class SkippedRecord:
    source: str
    line: int
    reason: str


@dataclass
class PoolReadResult:
    records: list[PoolRecord]
    skipped: list[SkippedRecord] = field(default_factory=list)
    duplicates: int = 0
    inputs: dict[str, str] = field(default_factory=dict)  # pool file -> sha256
    modality_mismatches: Counter = field(default_factory=Counter)  # task|modality not listed for the task


class RecordError(ValueError):
    """A record that fails validation; the message is the reason shown to the user."""


# --- size rules ---------------------------------------------------------------------------------


def image_tokens(width: int, height: int, rule: ImageRule) -> int:
    """Vision tokens of an image under the dynamic-resolution rule (Qwen2-VL's smart resize):
    scale into [min_pixels, max_pixels] keeping the aspect ratio, round each side to
    patch_size * merge_size, then one token per merge_size x merge_size patches."""
    factor = rule.patch_size * rule.merge_size
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > rule.max_pixels:
        beta = math.sqrt((height * width) / rule.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < rule.min_pixels:
        beta = math.sqrt(rule.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return (h_bar // rule.patch_size) * (w_bar // rule.patch_size) // (rule.merge_size**2)


def bucket_label(kind: str, value: float, edges: list[float]) -> str:
    index = sum(1 for edge in edges if value >= edge)
    names = BUCKET_NAMES[kind]
    name = names[index] if len(edges) == len(names) - 1 else f"b{index}"
    return f"{kind}:{name}"


def modality_name(n_images: int, n_videos: int, n_audios: int, video_has_sound: bool) -> str:
    parts = []
    if n_images:
        parts.append("multi-image" if n_images > 1 else "image")
    if n_videos:
        parts.append("video")
    if n_audios or video_has_sound:
        parts.append("audio")
    return "+".join(parts) if parts else "text"


# --- reading ------------------------------------------------------------------------------------


class _MediaProbe:
    """Probe each media file once; remember failures too so a bad file is reported consistently."""

    def __init__(self) -> None:
        self._cache: dict[str, ImageInfo | VideoInfo | AudioInfo | MediaError] = {}

    def __call__(self, kind: str, path: Path) -> ImageInfo | VideoInfo | AudioInfo:
        key = f"{kind}:{path}"
        if key not in self._cache:
            try:
                check_extension(path, kind)
                probe = {"image": probe_image, "video": probe_video, "audio": probe_audio}[kind]
                self._cache[key] = probe(path)
            except MediaError as err:
                self._cache[key] = err
        result = self._cache[key]
        if isinstance(result, MediaError):
            raise RecordError(f"{path.name}: {result}")
        return result


def _messages(record: dict) -> list[dict]:
    if "messages" in record:
        raw, role_key, text_key = record["messages"], "role", "content"
    elif "conversations" in record:
        raw, role_key, text_key = record["conversations"], "from", "value"
    else:
        raise RecordError("missing field 'messages' (or ShareGPT 'conversations')")
    if not isinstance(raw, list) or not raw:
        raise RecordError("'messages' must be a non-empty list of chat turns")
    turns = []
    for i, turn in enumerate(raw):
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise RecordError(f"turn {i} must be an object with '{role_key}' and '{text_key}'")
        role, text = turn[role_key], turn[text_key]
        if role not in ROLE_ALIASES:
            raise RecordError(f"turn {i} has unknown role {role!r}; use system, user or assistant")
        if not isinstance(text, str):
            raise RecordError(f"turn {i} content must be a string with <image>/<video>/<audio> placeholders")
        turns.append({"role": ROLE_ALIASES[role], "content": text})
    return turns


def _media_paths(record: dict, kind: str, base: Path) -> list[Path]:
    name = MEDIA_FIELDS[kind]
    value = record.get(name) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RecordError(f"'{name}' must be a list of file paths")
    paths = []
    for text in value:
        path = Path(text)
        full = Path(os.path.normpath(path if path.is_absolute() else base / path))
        if base not in full.parents:
            raise RecordError(f"path {text!r} escapes the pool folder {base}")
        if not full.is_file():
            raise RecordError(f"{kind} file not found: {text}")
        paths.append(full)
    return paths


def _suggest(name: str, taxonomy: Taxonomy) -> str:
    known = [n for task in taxonomy.tasks for n in (task.name, *task.aliases)]
    close = difflib.get_close_matches(name, known, n=1)
    return (
        f"did you mean {close[0]!r}?"
        if close
        else f"known tasks: {', '.join(t.name for t in taxonomy.tasks)}"
    )


def parse_record(
    record: object,
    *,
    base: Path,
    source: str,
    line: int,
    taxonomy: Taxonomy,
    buckets: Buckets,
    image_rule: ImageRule,
    task_field: str,
    probe: _MediaProbe,
) -> tuple[PoolRecord, bool]:
    """Validate one record; returns it and whether its modality is one its task lists."""
    if not isinstance(record, dict):
        raise RecordError("a record must be a JSON object")
    messages = _messages(record)
    task_name = record.get(task_field)
    if not isinstance(task_name, str) or not task_name:
        raise RecordError(f"missing field '{task_field}' (the task name)")
    task = taxonomy.resolve(task_name)
    if task is None:
        raise RecordError(f"unknown task {task_name!r}; {_suggest(task_name, taxonomy)}")

    media = {kind: _media_paths(record, kind, base) for kind in MEDIA_FIELDS}
    counts = Counter(m.group(1) for turn in messages for m in PLACEHOLDER.finditer(turn["content"]))
    for kind, paths in media.items():
        if counts[kind] != len(paths):
            raise RecordError(
                f"{counts[kind]} <{kind}> placeholder(s) in the messages but {len(paths)} "
                f"path(s) in '{MEDIA_FIELDS[kind]}'"
            )

    infos = {kind: [probe(kind, path) for path in paths] for kind, paths in media.items()}
    tokens = sum(image_tokens(i.width, i.height, image_rule) for i in infos["image"])
    video_s = sum(v.duration_s for v in infos["video"])
    audio_s = sum(a.duration_s for a in infos["audio"])
    has_sound = bool(infos["video"]) and all(v.has_audio for v in infos["video"])
    modality = modality_name(len(media["image"]), len(media["video"]), len(media["audio"]), has_sound)
    if media["video"]:
        bucket = bucket_label("video", video_s, buckets.video_seconds)
    elif media["image"]:
        bucket = bucket_label("image", tokens, buckets.image_tokens)
    elif media["audio"]:
        bucket = bucket_label("audio", audio_s, buckets.audio_seconds)
    else:
        bucket = "text"

    relative = {MEDIA_FIELDS[k]: [str(p.relative_to(base)) for p in v] for k, v in media.items()}
    canonical = json.dumps(
        {"messages": messages, "task": task.name, **relative}, sort_keys=True, ensure_ascii=False
    )
    record_id = record.get("id")
    record_id = (
        str(record_id) if record_id not in (None, "") else hashlib.sha256(canonical.encode()).hexdigest()[:16]
    )
    absolute = {MEDIA_FIELDS[k]: [str(p) for p in v] for k, v in media.items()}
    payload = json.dumps(
        {"id": record_id, "task": task.name, "messages": messages, **absolute},
        ensure_ascii=False,
        sort_keys=True,
    )
    text_key = hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    pool_record = PoolRecord(
        record_id=record_id,
        task=task.name,
        modality=modality,
        bucket=bucket,
        source=source,
        line=line,
        payload=payload,
        media=tuple(str(p) for kind in MEDIA_FIELDS for p in media[kind]),
        text_key=text_key,
        image_tokens=tokens,
        video_seconds=round(video_s, 3),
        audio_seconds=round(audio_s, 3),
    )
    return pool_record, modality in task.modalities


def _iter_jsonl(
    path: Path, on_bytes: Callable[[int], None] | None
) -> Iterator[tuple[int, object | RecordError]]:
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if on_bytes is not None:
                on_bytes(len(raw))
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                yield number, RecordError(f"malformed JSON: {err}")


def _iter_table(path: Path) -> Iterator[tuple[int, object]]:
    """Rows of a saved `datasets` folder or a Parquet file; 'line' is the 1-based row number."""
    import datasets

    if path.is_dir():
        table = datasets.load_from_disk(str(path))
        if isinstance(table, datasets.DatasetDict):
            raise InputError("a DatasetDict is not a pool; pass one split's folder", path=path)
    else:
        table = datasets.Dataset.from_parquet(str(path))
    yield from enumerate(table, start=1)


def pool_files(paths: list[Path]) -> list[Path]:
    if not paths:
        raise InputError("no pool given", hint="pass one or more pool JSONL files")
    resolved = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise InputError("pool not found", path=path)
        if path.is_dir() and not (path / "dataset_info.json").exists() and not (path / "state.json").exists():
            raise InputError("a folder pool must be a `datasets` folder saved with save_to_disk", path=path)
        if path.is_file() and path.suffix.lower() not in (".jsonl", ".json", ".parquet"):
            raise InputError(
                f"unsupported pool file type {path.suffix!r}", path=path, hint="use .jsonl or .parquet"
            )
        resolved.append(path.resolve())
    return resolved


def read_pool(
    paths: list[Path],
    taxonomy: Taxonomy,
    *,
    image_rule: ImageRule | None = None,
    task_field: str = "task",
    skip_invalid: bool = False,
    on_bytes: Callable[[int], None] | None = None,
) -> PoolReadResult:
    """Read and validate every record of every pool; drop exact duplicates (same text, same media bytes).

    The first invalid record raises InputError naming file and line, unless ``skip_invalid``.
    """
    files = pool_files(paths)
    probe = _MediaProbe()
    rule = image_rule or taxonomy.buckets.image_rule
    result = PoolReadResult(records=[])
    for path in files:
        result.inputs[str(path)] = sha256_file(path) if path.is_file() else _folder_hash(path)
        base = path.parent if path.is_file() else path
        rows = (
            _iter_jsonl(path, on_bytes) if path.suffix.lower() in (".jsonl", ".json") else _iter_table(path)
        )
        for number, row in rows:
            try:
                if isinstance(row, RecordError):
                    raise row
                record, expected = parse_record(
                    row,
                    base=base,
                    source=str(path),
                    line=number,
                    taxonomy=taxonomy,
                    buckets=taxonomy.buckets,
                    image_rule=rule,
                    task_field=task_field,
                    probe=probe,
                )
            except RecordError as err:
                if not skip_invalid:
                    raise InputError(
                        str(err),
                        path=path,
                        line=number,
                        hint="fix the record, or pass --skip-invalid to skip it",
                    ) from None
                result.skipped.append(SkippedRecord(str(path), number, str(err)))
                continue
            if not expected:
                result.modality_mismatches[f"{record.task}|{record.modality}"] += 1
            result.records.append(record)
    if not result.records:
        raise InputError("the pool has no valid records", path=files[0] if len(files) == 1 else None)
    result.records, result.duplicates = drop_duplicates(result.records)
    return result


def _folder_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(file.relative_to(folder).as_posix().encode())
        digest.update(sha256_file(file).encode())
    return digest.hexdigest()


def drop_duplicates(records: list[PoolRecord]) -> tuple[list[PoolRecord], int]:
    """Keep the first of records with the same text and the same media bytes.

    Exact without hashing every file: a file whose size no other file has cannot equal another
    file, so only files that share a size are read and hashed.
    """
    real = {path: os.path.realpath(path) for record in records for path in record.media}
    sizes = {p: os.path.getsize(p) for p in set(real.values())}
    size_counts = Counter(sizes.values())
    identity: dict[str, str] = {}
    for path in set(real.values()):
        size = sizes[path]
        identity[path] = sha256_file(Path(path)) if size_counts[size] > 1 else f"size:{size}"
    kept, seen, dropped = [], set(), 0
    for record in records:
        key = (record.text_key, tuple(identity[real[p]] for p in record.media))
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        kept.append(record)
    return kept, dropped
