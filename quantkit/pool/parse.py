"""Validate the records of one source and turn each into a :class:`PoolRecord`.

``RecordParser.parse(record, line)`` checks exactly what the pool format's rules say, in their
order (text, task, media lists and paths, placeholder counts, media headers). Records already in
the internal shape (``messages`` of role / content strings and media lists) take a fast path that
shares the work records repeat; every other format goes through :func:`normalize` first. The JSON
a record stores is what ``json.dumps(..., sort_keys=True, ensure_ascii=False)`` writes,
assembled from cached pieces.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from quantkit.chat import PLACEHOLDER, ROLE_ALIASES
from quantkit.media import (
    EXTENSIONS,
    VERIFIERS,
    AudioInfo,
    ImageInfo,
    MediaError,
    VideoInfo,
    check_extension,
    frames_to_mp4,
    probe_audio,
    probe_image,
    probe_video,
)
from quantkit.mediasources import MediaRoots, MediaStore, decode_data_uri
from quantkit.pool.formats import MISSING_TEXT, FormatSpec, normalize
from quantkit.pool.index import Group
from quantkit.pool.record import (
    PoolReadResult,
    PoolRecord,
    RecordError,
    RecordJson,
    SourceStats,
    json_str,
    stratum_name,
)
from quantkit.pool.sizes import bucket_label, image_tokens, modality_name
from quantkit.taxonomy import Buckets, ImageRule, Taxonomy, task_lookup

MEDIA_FIELDS = {"image": "images", "video": "videos", "audio": "audios"}
_MEDIA_SUFFIXES = frozenset(ext for kind in EXTENSIONS.values() for ext in kind)
# Frames per second of a video given as its frame files: the rate LLaMA-Factory (video_fps) and
# Qwen2.5-VL's qwen-vl-utils (FPS) sample videos at, so the frames play back as they were taken.
FRAME_LIST_FPS = 2

_dumps = functools.partial(json.dumps, ensure_ascii=False)
_ROLE_JSON = {alias: json_str(role) for alias, role in ROLE_ALIASES.items()}
_ROLE_TAIL = {alias: ', "role": ' + role + "}" for alias, role in _ROLE_JSON.items()}  # a turn's JSON end
# A turn's role (its canonical one) as one control character, for the text digest's input: mark,
# NUL, text, NUL, mark, ... names the turns exactly while no text holds a NUL (then the messages'
# JSON is the input; it starts with '[', which no mark is). Cheaper than the JSON, which only the
# records without an id (their derived id) and the selected ones need.
_ROLE_MARK = {
    alias: chr(1 + sorted(set(ROLE_ALIASES.values())).index(role)) for alias, role in ROLE_ALIASES.items()
}
_TEXTS_KEPT = 4096  # turn texts whose JSON is kept (emptied when full: memory stays bounded)
# The request the taxonomy's rules read: the user's turns (system text and tool definitions describe
# how to answer, not what was asked: a tool schema's "X-coordinate" is no grounding request).
_REQUEST_ROLES = {alias for alias, role in ROLE_ALIASES.items() if role == "user"}
_ANSWER_ROLES = {alias for alias, role in ROLE_ALIASES.items() if role == "assistant"}
if PLACEHOLDER.pattern != "<(image|video|audio)>":  # _messages_json counts these literals
    raise RuntimeError(f"quantkit.chat.PLACEHOLDER changed ({PLACEHOLDER.pattern}): update _messages_json")


class MediaProbe:
    """Probe each media file once (and, for the kinds in ``verify``, check it decodes to its end);
    remember failures too so a bad file is reported consistently."""

    def __init__(self, verify: frozenset[str] = frozenset()) -> None:
        self.verify = verify
        self._cache: dict[str, ImageInfo | VideoInfo | AudioInfo | MediaError] = {}

    def __call__(self, kind: str, path: Path) -> ImageInfo | VideoInfo | AudioInfo:
        key = f"{kind}:{path}"
        if key not in self._cache:
            try:
                check_extension(path, kind)
                probe = {"image": probe_image, "video": probe_video, "audio": probe_audio}[kind]
                info = probe(path)
                if kind in self.verify:
                    VERIFIERS[kind](path)
                self._cache[key] = info
            except MediaError as err:
                self._cache[key] = err
        result = self._cache[key]
        if isinstance(result, MediaError):
            raise RecordError(f"{path.name}: {result}")
        return result

    def entries(self, since: int = 0) -> dict:
        """What was probed, by kind and path, from the ``since``-th file on (in probing order): for
        another probe (a part read in another process)."""
        return dict(list(self._cache.items())[since:])

    def add_entries(self, entries: dict) -> None:
        """Take another probe's results for the files this one has not probed."""
        for key, value in entries.items():
            self._cache.setdefault(key, value)


def _turn_json(turn: object, i: int, role_key: str, text_key: str) -> tuple[str, str]:
    """One turn checked in the order of the format's rules: (its JSON, its text)."""
    if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
        raise RecordError(f"turn {i} must be an object with '{role_key}' and '{text_key}'")
    role, text = turn[role_key], turn[text_key]
    if not isinstance(role, str) or role not in ROLE_ALIASES:  # a list or object is not a role either
        raise RecordError(f"turn {i} has unknown role {role!r}; use system, user, assistant or tool")
    if not isinstance(text, str):
        raise RecordError(f"turn {i} content must be a string with <image>/<video>/<audio> placeholders")
    return '{"content": ' + json_str(text) + ', "role": ' + _ROLE_JSON[role] + "}", text


def messages_json(messages: list) -> tuple[str, tuple[int, int, int]]:
    """Normalised turns (role / content strings) as JSON (``[{"content": ..., "role": ...}, ...]``,
    what ``json.dumps(turns, sort_keys=True, ensure_ascii=False)`` gives) and the placeholder
    counts (image, video, audio)."""
    parts = []
    images = videos = audios = 0
    for i, turn in enumerate(messages):
        part, text = _turn_json(turn, i, "role", "content")
        images += text.count("<image>")
        videos += text.count("<video>")
        audios += text.count("<audio>")
        parts.append(part)
    return "[" + ", ".join(parts) + "]", (images, videos, audios)


def _digest_text(turns: list) -> str:
    """The text digest's input for normalised turns (role / content strings), as the fast path
    builds it for the records it reads."""
    parts = []
    for turn in turns:
        parts.append(_ROLE_MARK[turn["role"]])
        parts.append(turn["content"])
    return "\x00".join(parts)


def _texts(turns: list, role_key: str, text_key: str) -> tuple[str, str]:
    """(user text, assistant text) of the turns, each joined with newlines."""
    prompt = "\n".join(t[text_key] for t in turns if t[role_key] in _REQUEST_ROLES)
    answer = "\n".join(t[text_key] for t in turns if t[role_key] in _ANSWER_ROLES)
    return prompt, answer


def suggest_task(name: str, taxonomy: Taxonomy) -> str:
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
    kinds: frozenset[str]  # the media kinds present
    # task -> (RecordJson, stratum, whether the task lists the modality, the canonical JSON before
    # and after the messages for a derived id)
    tails: dict[str, tuple[RecordJson, str, bool, str, str, int]] = field(default_factory=dict)


@dataclass
class ParseContext:
    """What the records of one source share: where media may come from, the taxonomy and rules,
    the task assigner, and where the results go."""

    roots: MediaRoots
    store: MediaStore | None
    source: str  # the file, resolved: PoolRecord.source
    named: str  # as the user named it: TaskEvidence.source
    dataset: str | None
    spec: FormatSpec | None
    taxonomy: Taxonomy
    buckets: Buckets
    image_rule: ImageRule
    task_field: str
    probe: MediaProbe
    result: PoolReadResult
    stats: SourceStats
    assigner: object | None = None  # quantkit.taskassign.TaskAssigner
    source_index: int = 0  # in result.index.sources
    emit: list | None = None  # materialize: the full PoolRecords go here, nothing is counted
    ignore_fields: frozenset[str] = frozenset()  # --ignore-field: unused fields that may hold media


class RecordParser:
    """Validates the records of one source (``parse``), appending each valid one to the result."""

    def __init__(self, context: ParseContext, *, reuse: RecordParser | None = None) -> None:
        """``reuse``: the parser that read the source first; reading its records again (selected
        ones, token counts a batch at a time) shares its resolved paths and media combinations
        rather than resolving and deriving them once more per batch."""
        self.c = context
        self.tasks = task_lookup(context.taxonomy)
        self.combos: dict[tuple, _Media] = {} if reuse is None else reuse.combos
        # as written -> absolute path, or an error word
        self.paths: dict[str, Path | str] = {} if reuse is None else reuse.paths
        # the assigner's tally of records whose field names a task (one per assigner)
        self.field_tally: dict[str, int] | None = None if reuse is None else reuse.field_tally
        # a video given as its frames (their paths as written) -> the MP4 made of them
        self.frame_videos: dict[tuple, Path] = {} if reuse is None else reuse.frame_videos
        self.parse = self._make_parse()

    # -- media paths -----------------------------------------------------------------------

    def _embedded(self, kind: str, data: bytes, *, name: str | None = None, mime: str | None = None) -> Path:
        if self.c.store is None:
            raise RecordError(f"embedded {kind} bytes need a media store (calibrate provides one)")
        return self.c.store.put(data, kind, name_hint=name, mime=mime)

    def _frames_video(self, frames: list | tuple) -> Path:
        """A video given as the paths of its frames (Qwen2.5-VL's ``{"type": "video", "video":
        [...]}``, LLaMA-Factory's ``videos: [[...]]``) as an MP4 in the media store, at
        FRAME_LIST_FPS, frames resized to the first one's size: what every later stage reads."""
        key = tuple(frames) if all(isinstance(f, str) for f in frames) else None
        made = self.frame_videos.get(key) if key is not None else None
        if made is not None:
            return made
        if not frames:
            raise RecordError("a video given as frames has no frame")
        paths = [self._path("image", frame) for frame in frames]
        try:
            data = frames_to_mp4(paths, FRAME_LIST_FPS)
        except MediaError as err:
            raise RecordError(str(err)) from None
        made = self._embedded("video", data, name="frames.mp4")
        if key is not None:
            self.frame_videos[key] = made
        return made

    def _not_found(self, kind: str, item: str) -> str:
        """The error for a media path that is in none of the places looked in: those places, and
        the --media-root that would find it when a folder near the pool holds it."""
        roots = self.c.roots
        if os.path.isabs(item):
            return f"{kind} file not found: {item}"
        looked = ", ".join(str(root) for root in roots.roots)
        message = f"{kind} file not found: {item} (looked in {looked})"
        found = roots.find_root(item)
        if found is not None:
            return f"{message}; the file is under {found}: pass --media-root {found}"
        return f"{message}; name the folder the paths are relative to with --media-root DIR"

    def _path(self, kind: str, item: object) -> Path:
        if isinstance(item, list | tuple) and kind == "video":
            return self._frames_video(item)
        if isinstance(item, dict):  # a datasets Image / Audio feature left undecoded: {bytes, path}
            data, name = item.get("bytes"), item.get("path")
            if data:
                return self._embedded(kind, bytes(data), name=name if isinstance(name, str) else None)
            if not isinstance(name, str) or not name:
                raise RecordError(f"an embedded {kind} has neither bytes nor a path")
            item = name
        elif isinstance(item, bytes | bytearray):
            return self._embedded(kind, bytes(item))
        if not isinstance(item, str) or not item:
            raise RecordError(f"'{MEDIA_FIELDS[kind]}' must be a list of file paths")
        if item.startswith("data:"):
            try:
                data, mime = decode_data_uri(item)
            except MediaError as err:
                raise RecordError(f"{kind}: {err}") from None
            return self._embedded(kind, data, mime=mime)
        full = self.paths.get(item)
        if full is None:
            full = self.paths[item] = self.c.roots.resolve(item)
        if isinstance(full, str):
            where = self.c.roots.describe()
            if full == "escapes":
                raise RecordError(f"path {item!r} escapes {where}; name its folder with --media-root DIR")
            if full == "link-escapes":
                raise RecordError(
                    f"{item!r} is a symbolic link to {os.path.realpath(item if os.path.isabs(item) else self.c.roots.base / item)}, "
                    f"outside {where}; name the folder it points into with --media-root DIR"
                )
            if full == "not-utf8":
                raise RecordError(
                    f"{kind} path {ascii(item)} is not valid UTF-8 (a file name in another encoding); rename "
                    "the file to a UTF-8 name (e.g. convmv -f latin1 -t utf-8 --notest FILE) and the record"
                )
            if full == "too-long":
                raise RecordError(
                    f"{kind} path {item!r} has a name longer than the file system allows (255 bytes); "
                    "rename the file and the record"
                )
            if full not in ("missing", "remote"):
                raise RecordError(f"{kind} path {item!r} is {full}, not a file; point the record at the {kind} file itself")
            if full == "remote":
                raise RecordError(
                    f"{kind} {item!r} is a URL: quantkit works offline and downloads nothing; download the "
                    "files, point the records at the local copies and name their folder with --media-root DIR"
                )
            raise RecordError(self._not_found(kind, item))
        return full

    def _media_lists(self, get: Callable[[str], object]) -> _Media:
        """The record's media lists, validated and resolved, remembered by the lists' content
        (when it is plain paths)."""
        resolved = []
        cacheable = True
        for kind, name in MEDIA_FIELDS.items():
            value = get(name) or []
            if isinstance(value, str | dict | bytes):
                value = [value]
            if not isinstance(value, list | tuple):
                raise RecordError(f"'{name}' must be a list of file paths")
            cacheable = cacheable and all(isinstance(v, str) and not v.startswith("data:") for v in value)
            resolved.append((tuple(value) if cacheable else None, [self._path(kind, item) for item in value]))
        combo = _Media((resolved[0][1], resolved[1][1], resolved[2][1]))
        if cacheable:
            self.combos[(resolved[0][0], resolved[1][0], resolved[2][0])] = combo
        return combo

    def _relative(self, path: Path) -> str:
        store = self.c.store
        if store is not None and path.parent == store.folder:
            return path.name  # content-addressed: the same bytes, the same name
        return self.c.roots.relative(path)

    def _derive(self, combo: _Media) -> _Derived:
        """Probe the combination's media (first failure raises) and derive what records store."""
        images, videos, audios = combo.paths
        probe, rule, buckets = self.c.probe, self.c.image_rule, self.c.buckets
        image_infos = [probe("image", path) for path in images]
        video_infos = [probe("video", path) for path in videos]
        audio_infos = [probe("audio", path) for path in audios]
        tokens = sum(image_tokens(i.width, i.height, rule) for i in image_infos)
        video_s = sum(v.duration_s for v in video_infos)
        audio_s = sum(a.duration_s for a in audio_infos)
        has_sound = any(v.has_audio for v in video_infos)  # sound in any video: the record has audio
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
        relative = tuple(_dumps([self._relative(p) for p in paths]) for paths in combo.paths)
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
            kinds=frozenset(k for k, paths in zip(MEDIA_FIELDS, combo.paths, strict=True) if paths),
        )
        combo.derived = derived
        return derived

    @staticmethod
    def _count_error(counts: tuple[int, int, int], combo: _Media) -> RecordError:
        kind, count, paths = next(
            (k, c, p) for k, c, p in zip(MEDIA_FIELDS, counts, combo.paths, strict=True) if c != len(p)
        )
        return RecordError(
            f"{count} <{kind}> placeholder(s) in the messages but {len(paths)} path(s) in '{MEDIA_FIELDS[kind]}'"
        )

    def _normalized(self, record: dict | list) -> dict:
        """``normalize(record)``, with what it tells counted for the source: the spelling, and
        the fields it left unused (one holding media is an error unless --ignore-field names it).
        Only records off the fast path come here: theirs are the only unusual fields."""
        mapped = normalize(record, self.c.spec)
        if self.c.emit is not None:  # read again (selected records): counted when first read
            return mapped
        unused = mapped["unused"]
        if unused:
            stats, skip = self.c.stats, (self.c.task_field, "id")
            for name in unused:
                if name in skip:
                    continue
                if name not in self.c.ignore_fields and "." not in name:
                    what = self._media_like(record.get(name))
                    if what is not None:
                        raise RecordError(
                            f"field {name!r} holds {what}, and {mapped['format']} records take no media "
                            f"from it: move the media to 'images' / 'videos' / 'audios', or pass "
                            f"--ignore-field {name} to leave the field out"
                        )
                stats.ignored[name] += 1
        self.c.stats.formats[mapped["format"]] += 1
        return mapped

    def _media_like(self, value: object, depth: int = 0) -> str | None:
        """What in ``value`` looks like media (a data URL, a path to an existing media file,
        embedded bytes), or None."""
        if isinstance(value, str):
            if value.startswith("data:") and value[5:].split("/", 1)[0] in MEDIA_FIELDS:
                return "a data URL"
            suffix = os.path.splitext(value)[1].lower() if len(value) < 4096 else ""
            if suffix in _MEDIA_SUFFIXES and isinstance(self.c.roots.resolve(value), Path):
                return f"a path to a media file ({value})"
            return None
        if depth > 2:
            return None
        if isinstance(value, dict):
            if isinstance(value.get("bytes"), bytes | bytearray) and value["bytes"]:
                return "embedded media bytes"
            value = list(value.values())
        if isinstance(value, list | tuple):
            for item in value[:16]:
                found = self._media_like(item, depth + 1)
                if found is not None:
                    return found
        return None

    def _task_of_field(self, record: dict) -> object:
        """The record's task from its own field, checked (no assigner): the TaskSpec."""
        task_field = self.c.task_field
        task_name = record.get(task_field)
        if not isinstance(task_name, str) or not task_name:
            raise RecordError(f"missing field '{task_field}' (the task name)")
        task = self.tasks.get(task_name)
        if task is None:
            raise RecordError(f"unknown task {task_name!r}; {suggest_task(task_name, self.c.taxonomy)}")
        return task

    # -- a record (the hot loop: locals, no attribute lookups) -----------------------------

    def _make_parse(self) -> Callable[[object, int], None]:
        c = self.c
        tasks, combos, task_field, source, taxonomy = (
            self.tasks,
            self.combos,
            c.task_field,
            c.source,
            c.taxonomy,
        )
        media_lists, derive, count_error = self._media_lists, self._derive, self._count_error
        normalized = self._normalized
        task_json = {task.name: json_str(task.name) for task in taxonomy.tasks}
        json_of, sha256, new_record = json_str, hashlib.sha256, PoolRecord
        mismatches, emit, index, source_index = c.result.modality_mismatches, c.emit, c.result.index, c.source_index
        groups = index.groups
        add_group, add_line, add_locator = index.group.append, index.line.append, index.locator.append
        add_id_hash, add_id, add_id_end, ids = index.id_hash.append, index.ids.extend, index.id_end.append, index.ids
        add_digest = index.digest.append
        modalities = c.stats.modalities
        spec = c.spec
        fast_keys = frozenset({"id", task_field, "messages", "conversations", "images", "videos", "audios"})
        role_tail, role_mark = _ROLE_TAIL, _ROLE_MARK
        quoted_texts: dict[str, str] = {}  # a turn's text -> its JSON string, for the texts records repeat

        def turns_json(raw: list, role_key: str, text_key: str) -> str:
            """The JSON of turns the fast path has checked: what messages_json() gives for them."""
            parts = []
            last = raw[-1]
            for turn in raw:
                text = turn[text_key]
                if turn is last:  # the answer: rarely repeated
                    quoted = json_of(text)
                else:  # system prompts and templated questions repeat across records
                    quoted = quoted_texts.get(text)
                    if quoted is None:
                        if len(quoted_texts) >= _TEXTS_KEPT:
                            quoted_texts.clear()
                        quoted = quoted_texts[text] = json_of(text)
                parts.append(f'{{"content": {quoted}{role_tail[turn[role_key]]}')
            return f"[{', '.join(parts)}]"
        assigner = c.assigner
        if assigner is not None:
            from quantkit.taskassign import TaskEvidence, UnknownTaskError

            assign, named, dataset = assigner.assign, c.named, c.dataset
            # Records whose field names a task are counted here rather than given to assign().
            if self.field_tally is None:
                self.field_tally = assigner.field_tally()
            field_tally = self.field_tally

        def parse(record: object, line: int, locator: int) -> None:
            bare = None  # a bare list of turns (a JSON array of them), mapped by normalize()
            if record.__class__ is not dict and not isinstance(record, dict):
                if not isinstance(record, list):
                    raise RecordError("a record must be a JSON object (or a list of chat turns)")
                bare, record = record, {}
            get = record.get
            messages_json = digest_text = None  # the JSON is built only where it is needed
            # The internal shape, fast: messages of role / content strings (or ShareGPT from /
            # value), no other fields to map. Anything unusual goes through normalize().
            if spec is None and bare is None and record.keys() <= fast_keys:
                raw = get("messages")
                if raw.__class__ is list and raw:
                    role_key, text_key = "role", "content"
                elif raw is None and "messages" not in record:
                    raw = get("conversations")
                    role_key, text_key = "from", "value"
                else:
                    raw = None
                if raw.__class__ is list and raw:
                    parts = []
                    images = videos = audios = 0
                    try:
                        for turn in raw:
                            if len(turn) != 2:  # other turn fields (GLM-4V's image, a name): mapped
                                raise TypeError
                            mark = role_mark[turn[role_key]]
                            text = turn[text_key]
                            if text.__class__ is not str:
                                raise TypeError
                            # Placeholders never overlap: counting each literal equals PLACEHOLDER's matches.
                            if "<" in text:
                                if "<img>" in text:  # Qwen-VL's inline image paths: normalize() maps them
                                    raise TypeError
                                images += text.count("<image>")
                                videos += text.count("<video>")
                                audios += text.count("<audio>")
                            parts.append(mark)
                            parts.append(text)
                        digest_text = "\x00".join(parts)
                        counts = (images, videos, audios)
                    except (KeyError, TypeError):
                        pass
            if digest_text is None:
                mapped = normalized(bare if bare is not None else record)
                messages_json, counts = _checked_messages(mapped["messages"])
                raw, role_key, text_key, get_media = mapped["messages"], "role", "content", mapped.get
                digest_text = _digest_text(raw)
            else:
                get_media = get

            if assigner is None:  # the task from the record's field, checked before the media
                task_name = get(task_field)
                task = tasks.get(task_name) if task_name.__class__ is str and task_name else None
                if task is None:
                    task = self._task_of_field(record)

            # Media lists: by their content from the cache; anything unusual takes the checked path.
            try:
                images, videos, audios = get_media("images"), get_media("videos"), get_media("audios")
                if images.__class__ is list and videos.__class__ is list and audios.__class__ is list:
                    key = (tuple(images), tuple(videos), tuple(audios))
                else:
                    key = (_media_key(images), _media_key(videos), _media_key(audios))
                combo = combos.get(key)
            except TypeError:  # an unhashable item: the checked path says what is wrong
                combo = None
            if combo is None:
                combo = media_lists(get_media)
            if counts != combo.counts:
                if get_media is get and 0 in counts:  # missing placeholders: normalize() adds them
                    mapped = normalized(record)
                    messages_json, counts = _checked_messages(mapped["messages"])
                    raw, role_key, text_key = mapped["messages"], "role", "content"
                    digest_text = _digest_text(raw)
                if counts != combo.counts:
                    raise count_error(counts, combo)
            derived = combo.derived or derive(combo)

            if assigner is not None:
                task_name = get(task_field)
                if task_name.__class__ is not str or not task_name:
                    task_name = None if task_name in (None, "") else str(task_name)
                if task_name is not None and task_name in tasks:
                    # The field decides (what assign() would give): no texts needed.
                    field_tally[task_name] += 1
                    task = tasks[task_name]
                else:
                    prompt, answer = _texts(raw, role_key, text_key)
                    evidence = TaskEvidence(named, dataset, task_name, prompt, answer, derived.kinds, derived.modality)
                    try:
                        assignment = assign(evidence)
                    except UnknownTaskError as err:
                        raise RecordError(str(err)) from None
                    if assignment.task is None:  # (the others' origins and modalities: read.py, per source)
                        if emit is None:
                            modalities[derived.modality] += 1
                        return  # counted by the assigner; calibrate lists them once the pool is read
                    task = tasks[assignment.task]

            name = task.name
            shared = derived.tails.get(name)
            if shared is None:  # (RecordJson, stratum, whether the task lists the modality, id JSON ends)
                rel_images, rel_videos, rel_audios = derived.relative_json
                shared = derived.tails[name] = (
                    RecordJson(
                        derived.audios_json, derived.images_json, task_json[name], derived.videos_json
                    ),
                    stratum_name(name, derived.modality, derived.bucket),
                    derived.modality in task.modalities,
                    '{"audios": ' + rel_audios + ', "images": ' + rel_images + ', "messages": ',
                    ', "task": ' + task_json[name] + ', "videos": ' + rel_videos + "}",
                    len(groups) if emit is None else -1,
                )
                if emit is None:
                    groups.append(
                        Group(
                            name, derived.modality, derived.bucket, shared[1], shared[0], derived.media,
                            derived.image_tokens, derived.video_seconds, derived.audio_seconds, source_index,
                        )  # fmt: skip
                    )
            record_id = get("id")
            if record_id.__class__ is str and record_id:
                pass
            elif record_id not in (None, ""):
                record_id = str(record_id)
            else:  # sha256 of the canonical JSON {audios, images, messages, task, videos}, relative paths
                if messages_json is None:
                    messages_json = turns_json(raw, role_key, text_key)
                canonical = f"{shared[3]}{messages_json}{shared[4]}"
                record_id = sha256(canonical.encode()).hexdigest()[:16]
            if emit is None:  # the compact index: see quantkit.pool.index
                if digest_text.count("\x00") != 2 * len(raw) - 1:  # a text holds a NUL: its JSON
                    digest_text = messages_json or turns_json(raw, role_key, text_key)
                if not digest_text.isascii():  # (isascii reads a flag: no scan)
                    digest_text.encode()  # UTF-8, strict: a lone surrogate raises UnicodeEncodeError
                # 128 bits: two SipHashes (str's hash, keyed per process), on the text and on it
                # plus a NUL. Only equality within this run is used; a blake2b of the UTF-8 cost
                # twice as much.
                add_digest(hash(digest_text))
                add_digest(hash(digest_text + "\x00"))
                add_group(shared[5])
                add_line(line)
                add_locator(locator)
                add_id_hash(hash(record_id) & 0xFFFFFFFF)
                add_id(record_id.encode("utf-8", "surrogatepass"))
                add_id_end(len(ids))
                if not shared[2]:
                    mismatches[f"{name}|{derived.modality}"] += 1
                return
            emit.append(
                new_record(
                    record_id,
                    name,
                    derived.modality,
                    derived.bucket,
                    source,
                    line,
                    shared[0],
                    derived.media,
                    messages_json if messages_json is not None else turns_json(raw, role_key, text_key),
                    shared[1],
                    derived.image_tokens,
                    derived.video_seconds,
                    derived.audio_seconds,
                )
            )

        return parse


def _checked_messages(messages: list) -> tuple[str, tuple[int, int, int]]:
    try:
        return messages_json(messages)
    except UnicodeEncodeError:
        raise RecordError("the text holds a lone surrogate (invalid UTF-16 escape)") from None


def _media_key(value: object) -> tuple | int:
    """A media field as the key of the resolved-lists cache: a list or a lone path as a tuple;
    anything else is 0, which no resolved combination has (the checked path reports it)."""
    if not value:
        return ()
    kind = type(value)
    if kind is list:
        return tuple(value)  # type: ignore[arg-type]
    return (value,) if kind is str else 0


__all__ = ["MISSING_TEXT", "MediaProbe", "ParseContext", "RecordParser", "messages_json", "suggest_task"]
