"""Read a pool (ms-swift / LLaMA-Factory multimodal JSONL, a saved `datasets` folder or Parquet),
validate every record, and describe each by task, modality combination and size bucket.

Media are probed from their headers only, once per file, so memory stays bounded on big pools.
"""

from __future__ import annotations

import difflib
import functools
import gc
import hashlib
import json
import math
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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
from quantkit.taxonomy import Buckets, ImageRule, Taxonomy, task_lookup

MEDIA_FIELDS = {"image": "images", "video": "videos", "audio": "audios"}
BUCKET_NAMES = {"image": ("small", "medium", "large"), "video": ("short", "medium", "long")}
BUCKET_NAMES["audio"] = BUCKET_NAMES["video"]


@dataclass(slots=True)
class PoolRecord:
    """One valid pool record, normalised: media paths absolute, task canonical."""

    record_id: str
    task: str
    modality: str
    bucket: str
    source: str  # the pool file
    line: int
    # The payload's JSON around the id and the messages (head, middle, tail), then the JSON of its
    # audios, images, task and videos; shared by the records of a media combination and task.
    frame: tuple[str, str, str, str, str, str, str]
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
        head, middle, tail = self.frame[:3]
        return head + _json_str(self.record_id) + middle + self.text_key + tail


def stratum_name(task: str, modality: str, bucket: str) -> str:
    """A record's stratum: task x modality x size bucket."""
    return f"{task}|{modality}|{bucket}"


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


# What json.dumps(..., ensure_ascii=False) writes for a string: records' JSON (payload, id hash,
# text key) is assembled from pieces with it, byte-identical to dumping the dicts with sort_keys.
_json_str = json.encoder.encode_basestring
_dumps = functools.partial(json.dumps, ensure_ascii=False)
_decoder = json.JSONDecoder()
_decode_json = _decoder.decode  # json.loads(str) with default settings
_scan_json = _decoder.scan_once  # what decode runs at the text's first value
_ROLE_JSON = {alias: _json_str(role) for alias, role in ROLE_ALIASES.items()}
_ROLE_TAIL = {alias: ', "role": ' + role + "}" for alias, role in _ROLE_JSON.items()}  # a turn's JSON end
if PLACEHOLDER.pattern != "<(image|video|audio)>":  # _messages_json counts these literals
    raise RuntimeError(f"quantkit.chat.PLACEHOLDER changed ({PLACEHOLDER.pattern}): update _messages_json")


def _turn_json(turn: object, i: int, role_key: str, text_key: str) -> tuple[str, str]:
    """One turn checked in the order of the format's rules: (its JSON, its text)."""
    if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
        raise RecordError(f"turn {i} must be an object with '{role_key}' and '{text_key}'")
    role, text = turn[role_key], turn[text_key]
    if not isinstance(role, str) or role not in ROLE_ALIASES:  # a list or object is not a role either
        raise RecordError(f"turn {i} has unknown role {role!r}; use system, user or assistant")
    if not isinstance(text, str):
        raise RecordError(f"turn {i} content must be a string with <image>/<video>/<audio> placeholders")
    return '{"content": ' + _json_str(text) + ', "role": ' + _ROLE_JSON[role] + "}", text


def _messages_json(record: dict) -> tuple[str, tuple[int, int, int]]:
    """The normalised turns as JSON (``[{"content": ..., "role": ...}, ...]``, what
    ``json.dumps(turns, sort_keys=True, ensure_ascii=False)`` gives) and the placeholder counts
    (image, video, audio)."""
    if "messages" in record:
        raw, role_key, text_key = record["messages"], "role", "content"
    elif "conversations" in record:
        raw, role_key, text_key = record["conversations"], "from", "value"
    else:
        raise RecordError("missing field 'messages' (or ShareGPT 'conversations')")
    if not isinstance(raw, list) or not raw:
        raise RecordError("'messages' must be a non-empty list of chat turns")
    parts = []
    images = videos = audios = 0
    role_json, json_str = _ROLE_JSON, _json_str
    try:
        for turn in raw:
            role = role_json[turn[role_key]]
            text = turn[text_key]
            if type(text) is not str:
                raise TypeError
            if "<" in text:  # placeholders never overlap: counting each literal equals PLACEHOLDER's matches
                images += text.count("<image>")
                videos += text.count("<video>")
                audios += text.count("<audio>")
            parts.append('{"content": ' + json_str(text) + ', "role": ' + role + "}")
    except (KeyError, TypeError):  # not a dict, a missing key, an unknown role, content not a string
        parts, images, videos, audios = [], 0, 0, 0
        for i, turn in enumerate(raw):  # again, checked: raises the first problem
            part, text = _turn_json(turn, i, role_key, text_key)
            images += text.count("<image>")
            videos += text.count("<video>")
            audios += text.count("<audio>")
            parts.append(part)
    return "[" + ", ".join(parts) + "]", (images, videos, audios)


def _suggest(name: str, taxonomy: Taxonomy) -> str:
    known = [n for task in taxonomy.tasks for n in (task.name, *task.aliases)]
    close = difflib.get_close_matches(name, known, n=1)
    return (
        f"did you mean {close[0]!r}?"
        if close
        else f"known tasks: {', '.join(t.name for t in taxonomy.tasks)}"
    )


class _Media:
    """One combination of media lists (images, videos, audios) as records spell it, resolved.

    Records of a big pool reuse a few thousand media files: paths are resolved and checked once
    per spelling, probes and the derived fields (modality, bucket, JSON pieces) once per
    combination."""

    __slots__ = ("paths", "counts", "derived")

    def __init__(self, paths: tuple[list[Path], list[Path], list[Path]]) -> None:
        self.paths = paths
        self.counts = tuple(len(p) for p in paths)
        self.derived: _Derived | None = None


@dataclass(slots=True)
class _Derived:
    media: tuple[str, ...]
    modality: str
    bucket: str
    image_tokens: int
    video_seconds: float
    audio_seconds: float
    audios_json: str  # absolute paths
    images_json: str
    videos_json: str
    relative_json: tuple[str, str, str]  # images, videos, audios: for the derived id
    # task -> (PoolRecord.frame, PoolRecord.stratum, whether the task lists the modality, the
    # canonical JSON before and after the messages for a derived id)
    tails: dict[str, tuple[tuple[str, ...], str, bool, str, str]] = field(default_factory=dict)


class _RecordParser:
    """Validates the records of one pool file (``parse``), sharing the work records repeat.

    ``parse(record, line)`` gives exactly what the format's rules say, in their order (messages,
    task, media lists and paths, placeholder counts, media headers); the JSON it stores is what
    ``json.dumps(..., sort_keys=True, ensure_ascii=False)`` writes, assembled from cached pieces.
    """

    def __init__(
        self,
        *,
        base: Path,
        source: str,
        taxonomy: Taxonomy,
        buckets: Buckets,
        image_rule: ImageRule,
        task_field: str,
        probe: _MediaProbe,
    ) -> None:
        self.base, self.source, self.taxonomy = base, source, taxonomy
        self.buckets, self.image_rule, self.task_field, self.probe = buckets, image_rule, task_field, probe
        self.tasks = task_lookup(taxonomy)
        self.combos: dict[tuple, _Media] = {}
        self.paths: dict[str, Path | str] = {}  # as written -> absolute path, or "escapes" / "missing"
        self.parse = self._make_parse()

    # -- media paths -----------------------------------------------------------------------

    def _path(self, kind: str, text: str) -> Path:
        full = self.paths.get(text)
        if full is None:
            path = Path(text)
            full = Path(os.path.normpath(path if path.is_absolute() else self.base / path))
            if self.base not in full.parents:
                full = "escapes"
            elif not full.is_file():
                full = "missing"
            self.paths[text] = full
        if isinstance(full, str):
            if full == "escapes":
                raise RecordError(f"path {text!r} escapes the pool folder {self.base}")
            raise RecordError(f"{kind} file not found: {text}")
        return full

    def _media_lists(self, record: dict) -> _Media:
        """The record's media lists, validated and resolved: list errors and path errors in field
        order, as ``parse`` would meet them. Remembered by the lists' content."""
        resolved = []
        for kind, name in MEDIA_FIELDS.items():
            value = record.get(name) or []
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise RecordError(f"'{name}' must be a list of file paths")
            resolved.append((tuple(value), [self._path(kind, text) for text in value]))
        combo = _Media((resolved[0][1], resolved[1][1], resolved[2][1]))
        self.combos[(resolved[0][0], resolved[1][0], resolved[2][0])] = combo
        return combo

    def _derive(self, combo: _Media) -> _Derived:
        """Probe the combination's media (first failure raises) and derive what records store."""
        images, videos, audios = combo.paths
        probe, rule, buckets = self.probe, self.image_rule, self.buckets
        image_infos = [probe("image", path) for path in images]
        video_infos = [probe("video", path) for path in videos]
        audio_infos = [probe("audio", path) for path in audios]
        tokens = sum(image_tokens(i.width, i.height, rule) for i in image_infos)
        video_s = sum(v.duration_s for v in video_infos)
        audio_s = sum(a.duration_s for a in audio_infos)
        has_sound = bool(video_infos) and all(v.has_audio for v in video_infos)
        modality = modality_name(len(images), len(videos), len(audios), has_sound)
        if videos:
            bucket = bucket_label("video", video_s, buckets.video_seconds)
        elif images:
            bucket = bucket_label("image", tokens, buckets.image_tokens)
        elif audios:
            bucket = bucket_label("audio", audio_s, buckets.audio_seconds)
        else:
            bucket = "text"
        absolute = [[str(p) for p in paths] for paths in combo.paths]
        relative = tuple(_dumps([str(p.relative_to(self.base)) for p in paths]) for paths in combo.paths)
        derived = _Derived(
            media=tuple(p for paths in absolute for p in paths),
            modality=modality,
            bucket=bucket,
            image_tokens=tokens,
            video_seconds=round(video_s, 3),
            audio_seconds=round(audio_s, 3),
            audios_json=_dumps(absolute[2]),
            images_json=_dumps(absolute[0]),
            videos_json=_dumps(absolute[1]),
            relative_json=relative,
        )
        combo.derived = derived
        return derived

    def _count_error(self, counts: tuple[int, int, int], combo: _Media) -> RecordError:
        kind, count, paths = next(
            (k, c, p) for k, c, p in zip(MEDIA_FIELDS, counts, combo.paths, strict=True) if c != len(p)
        )
        return RecordError(
            f"{count} <{kind}> placeholder(s) in the messages but {len(paths)} "
            f"path(s) in '{MEDIA_FIELDS[kind]}'"
        )

    # -- a record (the hot loop: locals, no attribute lookups) -----------------------------

    def _make_parse(self) -> Callable[[object, int], tuple[PoolRecord, bool]]:
        tasks, combos, task_field, source, taxonomy = (
            self.tasks, self.combos, self.task_field, self.source, self.taxonomy
        )  # fmt: skip
        media_lists, derive, count_error = self._media_lists, self._derive, self._count_error
        task_json = {task.name: _json_str(task.name) for task in taxonomy.tasks}
        messages_json_of, json_str, sha256, new_record = (
            _messages_json,
            _json_str,
            hashlib.sha256,
            _new_record,
        )
        media_key = _media_key

        role_tail = _ROLE_TAIL

        def parse(record: object, line: int) -> tuple[PoolRecord, bool]:
            if record.__class__ is not dict and not isinstance(record, dict):
                raise RecordError("a record must be a JSON object")
            # The messages: _messages_json's fast path, inline; anything unusual (an error
            # included) goes through _messages_json itself.
            get = record.get
            raw = get("messages")
            if raw.__class__ is list and raw:
                role_key, text_key = "role", "content"
            elif raw is None and "messages" not in record:
                raw = get("conversations")
                role_key, text_key = "from", "value"
            else:
                raw = None
            messages_json = None
            if raw.__class__ is list and raw:
                parts = []
                images = videos = audios = 0
                try:
                    for turn in raw:
                        tail = role_tail[turn[role_key]]
                        text = turn[text_key]
                        if text.__class__ is not str:
                            raise TypeError
                        if "<" in text:  # see _messages_json
                            images += text.count("<image>")
                            videos += text.count("<video>")
                            audios += text.count("<audio>")
                        parts.append(f'{{"content": {json_str(text)}{tail}')
                    messages_json = f"[{', '.join(parts)}]"
                    counts = (images, videos, audios)
                except (KeyError, TypeError):
                    pass
            if messages_json is None:
                messages_json, counts = messages_json_of(record)
            task_name = get(task_field)
            task = tasks.get(task_name) if task_name.__class__ is str and task_name else None
            if task is None:  # the checks, in order
                if not isinstance(task_name, str) or not task_name:
                    raise RecordError(f"missing field '{task_field}' (the task name)")
                task = tasks.get(task_name)
                if task is None:
                    raise RecordError(f"unknown task {task_name!r}; {_suggest(task_name, taxonomy)}")

            # Media lists: by their content from the cache; anything unusual takes the checked path.
            try:
                images, videos, audios = get("images"), get("videos"), get("audios")
                if images.__class__ is list and videos.__class__ is list and audios.__class__ is list:
                    key = (tuple(images), tuple(videos), tuple(audios))  # what _media_key gives
                else:
                    key = (media_key(images), media_key(videos), media_key(audios))
                combo = combos.get(key)
            except TypeError:  # an unhashable item: the checked path says what is wrong
                combo = None
            if combo is None:
                combo = media_lists(record)
            if counts != combo.counts:
                raise count_error(counts, combo)
            derived = combo.derived or derive(combo)

            name = task.name
            shared = derived.tails.get(name)
            if shared is None:  # (frame, stratum, whether the task lists the modality, id JSON ends)
                audios_json, images_json, videos_json = (
                    derived.audios_json, derived.images_json, derived.videos_json
                )  # fmt: skip
                rel_images, rel_videos, rel_audios = derived.relative_json
                shared = derived.tails[name] = (
                    (
                        '{"audios": ' + audios_json + ', "id": ',
                        ', "images": ' + images_json + ', "messages": ',
                        ', "task": ' + task_json[name] + ', "videos": ' + videos_json + "}",
                        audios_json,
                        images_json,
                        task_json[name],
                        videos_json,
                    ),
                    stratum_name(name, derived.modality, derived.bucket),
                    derived.modality in task.modalities,
                    '{"audios": ' + rel_audios + ', "images": ' + rel_images + ', "messages": ',
                    ', "task": ' + task_json[name] + ', "videos": ' + rel_videos + "}",
                )
            record_id = get("id")
            if record_id.__class__ is str and record_id:
                pass
            elif record_id not in (None, ""):
                record_id = str(record_id)
            else:  # sha256 of the canonical JSON {audios, images, messages, task, videos}, relative paths
                canonical = f"{shared[3]}{messages_json}{shared[4]}"
                record_id = sha256(canonical.encode()).hexdigest()[:16]
            if not messages_json.isascii():  # O(1) flag check; the text key was once a sha256 of
                messages_json.encode()  # the UTF-8: a lone surrogate still raises UnicodeEncodeError
            return new_record(
                record_id,
                name,
                derived.modality,
                derived.bucket,
                source,
                line,
                shared[0],
                derived.media,
                messages_json,
                shared[1],
                derived.image_tokens,
                derived.video_seconds,
                derived.audio_seconds,
            ), shared[2]

        return parse


def _media_key(value: object) -> tuple | int:
    """A media field as the key of the resolved-lists cache: a list or a lone path as a tuple;
    anything else is 0, which no resolved combination has (the checked path reports it)."""
    if not value:
        return ()
    kind = type(value)
    if kind is list:
        return tuple(value)  # type: ignore[arg-type]
    return (value,) if kind is str else 0


# Records are built positionally in the hot loop; PoolRecord is not frozen because a frozen
# dataclass sets each field through object.__setattr__, half the cost of a record at 100k.
_new_record = PoolRecord


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
    parser = _RecordParser(
        base=base,
        source=source,
        taxonomy=taxonomy,
        buckets=buckets,
        image_rule=image_rule,
        task_field=task_field,
        probe=probe,
    )
    return parser.parse(record, line)


def _read_jsonl(
    path: Path,
    parse: Callable[[object, int], tuple[PoolRecord, bool]],
    on_error: Callable[[int, RecordError], None],
    result: PoolReadResult,
    on_bytes: Callable[[int], None] | None,
) -> None:
    """Parse and validate every line of a JSONL pool into ``result``; ``on_error(line, error)``
    for a malformed or invalid record (it raises, or records the skip). One loop, no generator:
    this runs once per record of a big pool."""
    decode, scan, loads, decode_error = _decode_json, _scan_json, json.loads, json.JSONDecodeError
    append, mismatches = result.records.append, result.modality_mismatches
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if on_bytes is not None:
                on_bytes(len(raw))
            try:
                if raw[0] == 0x7B and (len(raw) < 2 or raw[1]):
                    # '{' then a non-zero byte: what json.loads(bytes) detects as UTF-8 and decodes
                    # so; doing it here skips its per-line encoding detection.
                    text = raw.decode("utf-8", "surrogatepass")
                    # decode(text) is scan(text, 0) (no leading whitespace before '{') and a check
                    # that only whitespace follows; a line that is one object and its newline needs
                    # no more. Anything else (an error included) goes through decode itself.
                    try:
                        row, end = scan(text, 0)
                    except Exception:
                        end = -1
                    # Neither the object then '\n' nor the object alone (a last line):
                    if (end != len(text) - 1 or raw[-1] != 0x0A) and end != len(text):
                        row = decode(text)
                elif not raw.strip():
                    continue
                else:
                    row = loads(raw)
            except (decode_error, UnicodeDecodeError) as err:
                on_error(number, RecordError(f"malformed JSON: {err}"))
                continue
            try:
                record, expected = parse(row, number)
            except RecordError as err:
                on_error(number, err)
                continue
            if not expected:
                mismatches[f"{record.task}|{record.modality}"] += 1
            append(record)


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
    with gc_paused():
        return _read_pool(files, taxonomy, image_rule, task_field, skip_invalid, on_bytes)


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while records pile up: they form no cycles (the parsed JSON
    is freed by reference counting), and collections that walk 100k live records cost more than a
    quarter of the parsing."""
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


def _read_pool(
    files: list[Path],
    taxonomy: Taxonomy,
    image_rule: ImageRule | None,
    task_field: str,
    skip_invalid: bool,
    on_bytes: Callable[[int], None] | None,
) -> PoolReadResult:
    probe = _MediaProbe()
    rule = image_rule or taxonomy.buckets.image_rule
    result = PoolReadResult(records=[])
    for path in files:
        # The file's hash is computed beside the parsing: hashlib and file reads release the GIL.
        digest = _in_background(sha256_file if path.is_file() else _folder_hash, path)
        result.inputs[str(path)] = ""  # keeps the files' order
        base = path.parent if path.is_file() else path
        parse = _RecordParser(
            base=base,
            source=str(path),
            taxonomy=taxonomy,
            buckets=taxonomy.buckets,
            image_rule=rule,
            task_field=task_field,
            probe=probe,
        ).parse

        def on_error(number: int, err: RecordError, path: Path = path) -> None:
            if not skip_invalid:
                raise InputError(
                    str(err),
                    path=path,
                    line=number,
                    hint="fix the record, or pass --skip-invalid to skip it",
                ) from None
            result.skipped.append(SkippedRecord(str(path), number, str(err)))

        if path.suffix.lower() in (".jsonl", ".json"):
            _read_jsonl(path, parse, on_error, result, on_bytes)
        else:
            records = result.records
            # The same per-row handling as _read_jsonl, which inlines it in its hot loop.
            for number, row in _iter_table(path):
                try:
                    record, expected = parse(row, number)
                except RecordError as err:
                    on_error(number, err)
                    continue
                if not expected:
                    result.modality_mismatches[f"{record.task}|{record.modality}"] += 1
                records.append(record)
        result.inputs[str(path)] = digest()
    if not result.records:
        raise InputError("the pool has no valid records", path=files[0] if len(files) == 1 else None)
    result.records, result.duplicates = drop_duplicates(result.records)
    return result


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
