"""The record formats of the fine-tuning frameworks, mapped onto the one internal record:
``{"messages": [{"role", "content"}], "images": [...], "videos": [...], "audios": [...]}`` with
one ``<image>`` / ``<video>`` / ``<audio>`` placeholder per media item in the text.

Formats (calibration/POOL_FORMAT.md has an example of each):

- chat turns: ``messages`` with ``role`` / ``content`` (ms-swift, OpenAI, LLaMA-Factory's OpenAI
  style), ``conversations`` / ``conversation`` with ``from`` / ``value`` (ShareGPT); ``content``
  may be a string or a content list (OpenAI and Qwen spellings);
- alpaca: ``instruction`` / ``input`` / ``output``, ``system``, ``history``;
- ms-swift query-response: ``query`` / ``response`` / ``history`` / ``system``;
- tool use: ``function_call`` / ``observation`` (LLaMA-Factory), ``tool_call`` / ``tool_response``
  (ms-swift), ``tool`` turns and ``tool_calls`` (OpenAI), ``tools`` definitions;
- media as ``images`` / ``videos`` / ``audios`` lists or the singular ``image`` / ``video`` /
  ``audio``, each item a path, a ``file://`` or ``data:`` URI, or ``{"bytes", "path"}``;
- ms-swift grounding ``objects`` (``ref`` / ``bbox``) substituted for ``<ref-object>`` / ``<bbox>``.

A LLaMA-Factory ``dataset_info.json`` entry gives its ``formatting``, ``columns`` and ``tags``
(:class:`FormatSpec`); without one, the format is recognised by the record's fields.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from quantkit.chat import ROLE_ALIASES
from quantkit.pool.record import RecordError

KINDS = ("image", "video", "audio")
LIST_FIELDS = {"image": "images", "video": "videos", "audio": "audios"}

# LLaMA-Factory's defaults for a dataset_info.json entry (its data/README.md).
ALPACA_COLUMNS = {
    "prompt": "instruction",
    "query": "input",
    "response": "output",
    "history": None,
    "system": None,
}
SHAREGPT_COLUMNS = {"messages": "conversations", "system": None, "tools": None}
SHAREGPT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
MISSING_TEXT = (
    "missing field 'messages' (or ShareGPT 'conversations', alpaca 'instruction' / 'output', "
    "ms-swift 'query' / 'response', TRL 'prompt' / 'completion', The Cauldron 'texts')"
)
_QWEN_IMG = re.compile(r"<img>(.*?)</img>", re.S)  # Qwen-VL's inline image paths


@dataclass(frozen=True)
class FormatSpec:
    """How a source spells its records: LLaMA-Factory's ``formatting``, ``columns`` and ``tags``."""

    formatting: str = "auto"  # auto | alpaca | sharegpt
    columns: Mapping[str, str | None] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)

    def column(self, name: str) -> str | None:
        if name in self.columns:
            return self.columns[name]
        defaults = ALPACA_COLUMNS if self.formatting == "alpaca" else SHAREGPT_COLUMNS
        if name in defaults:
            return defaults[name]
        return LIST_FIELDS.get(name[:-1]) if name.endswith("s") and name[:-1] in LIST_FIELDS else name

    def roles(self) -> dict[str, str]:
        tags = {**SHAREGPT_TAGS, **self.tags}
        return {
            tags["user_tag"]: "user",
            tags["assistant_tag"]: "assistant",
            tags["observation_tag"]: "tool",
            tags["function_tag"]: "assistant",
            tags["system_tag"]: "system",
        }

    def describe(self) -> str:
        return self.formatting if self.formatting != "auto" else "auto"


class _Turns:
    """The turns being built, with the media their content lists carry."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.media: dict[str, list] = {kind: [] for kind in KINDS}
        self.inline = False  # whether any media came inside the turns (content lists, <img>)
        self.unused: set[str] = set()  # turn fields the mapping does not read ("turn.name")
        self.labels: list[str] = []  # what the record's spelling showed, beyond its base format

    def add(self, role: str, text: str) -> None:
        self.messages.append({"role": role, "content": text})


def _part_value(part: dict, kind: str) -> object:
    """The media a content-list part points at (a path, a URI, bytes), or None (placeholder only)."""
    for key in (kind, f"{kind}_url", f"input_{kind}", "value", "url", "path", "data", "base64"):
        if key in part and part[key] not in (None, ""):
            value = part[key]
            if key == "base64" and isinstance(value, str):  # axolotl: bare base64, the type sniffed
                return f"data:;base64,{value}"
            if isinstance(value, dict):
                if "url" in value:
                    return value["url"]
                if "data" in value and kind == "audio":  # OpenAI input_audio {"data": b64, "format": "wav"}
                    return f"data:audio/{value.get('format') or 'wav'};base64,{value['data']}"
                return value  # {"bytes", "path"}
            return value
    return None


def _content_text(content: object, turns: _Turns, where: str) -> str:
    """A turn's content as text with placeholders; content-list media go to ``turns.media``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        raise RecordError(f"{where} content must be a string or a list of content parts")
    pieces = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            pieces.append(part)
            continue
        if not isinstance(part, dict):
            raise RecordError(f"{where} content part {j} must be an object with a 'type'")
        kind = part.get("type")
        if kind is None:  # Qwen's {"image": ...} / {"text": ...} without a type
            kind = next(
                (k for k in ("text", *KINDS, "image_url", "video_url", "audio_url") if k in part), None
            )
        if kind in ("text", "input_text", "output_text"):
            text = part.get("text", part.get("value"))  # LLaMA-Factory v1 blocks: {"type": "text", "value"}
            if not isinstance(text, str):
                raise RecordError(f"{where} content part {j} of type text has no string 'text'")
            pieces.append(text)
            continue
        base = str(kind or "").removeprefix("input_").removesuffix("_url")
        if base not in KINDS:
            raise RecordError(
                f"{where} content part {j} has unknown type {kind!r}; use text, image, image_url, video, "
                "video_url, audio, audio_url or input_audio"
            )
        pieces.append(f"<{base}>")
        value = _part_value(part, base)
        if value is not None:
            turns.media[base].append(value)
            turns.inline = True
    return "".join(pieces)


def _tool_calls_text(calls: object) -> str:
    """OpenAI's ``tool_calls`` as the JSON of each call ``{"name", "arguments"}``, one per line."""
    if not isinstance(calls, list):
        return ""
    lines = []
    for call in calls:
        function = call.get("function", call) if isinstance(call, dict) else {}
        if not isinstance(function, dict):
            continue
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments)
        lines.append(json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False))
    return "\n".join(lines)


def _chat_turns(raw: object, turns: _Turns, roles: Mapping[str, str] | None, role_tag: str | None,
                content_tag: str | None) -> None:  # fmt: skip
    if not isinstance(raw, list) or not raw:
        raise RecordError("'messages' must be a non-empty list of chat turns")
    for i, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise RecordError(f"turn {i} must be an object with 'role' and 'content'")
        rkey = role_tag or ("role" if "role" in turn else "from")
        ckey = content_tag or ("content" if rkey == "role" else "value")
        if rkey not in turn or (ckey not in turn and "tool_calls" not in turn):
            raise RecordError(f"turn {i} must be an object with '{rkey}' and '{ckey}'")
        role_raw = turn[rkey]
        table = roles if roles is not None else ROLE_ALIASES
        role = table.get(role_raw) if isinstance(role_raw, str) else None
        if role is None and roles is not None and isinstance(role_raw, str):
            role = ROLE_ALIASES.get(role_raw)
        if role is None:
            raise RecordError(
                f"turn {i} has unknown role {role_raw!r}; use system, user, assistant or tool "
                "(ShareGPT: human, gpt, function_call, observation)"
            )
        text = _content_text(turn.get(ckey), turns, f"turn {i}")
        if turn.get("tool_calls"):
            calls = _tool_calls_text(turn["tool_calls"])
            text = f"{text}\n{calls}" if text else calls
        if len(turn) > 2:
            text = _turn_fields(turn, (rkey, ckey, "tool_calls"), text, turns)
        turns.add(role, text)


def _turn_fields(turn: dict, read: tuple[str, ...], text: str, turns: _Turns) -> str:
    """A turn's fields besides its role and content: media there (GLM-4V's ``image`` in the user
    turn) belong to the turn, their placeholders put before its text where it has none; any
    other field is noted as unused."""
    for key, value in turn.items():
        if key in read:
            continue
        kind = key[:-1] if key in LIST_FIELDS.values() else key
        if kind not in KINDS:
            turns.unused.add(f"turn.{key}")
            continue
        if value in (None, "", []):
            continue
        items = list(value) if isinstance(value, list | tuple) else [value]
        turns.media[kind].extend(items)
        turns.inline = True
        if f"<{kind}>" not in text:
            text = f"<{kind}>" * len(items) + text
        if "turn media" not in turns.labels:
            turns.labels.append("turn media")
    return text


def _history_turns(history: object, turns: _Turns) -> None:
    if history in (None, ""):
        return
    if not isinstance(history, list):
        raise RecordError("'history' must be a list of [query, response] pairs")
    for i, pair in enumerate(history):
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise RecordError(f"history item {i} must be a [query, response] pair")
        turns.add("user", _content_text(pair[0], turns, f"history item {i}"))
        turns.add("assistant", _content_text(pair[1], turns, f"history item {i}"))


def _answer(value: object, name: str) -> str:
    if isinstance(value, list) and value and isinstance(value[0], str):  # ranking data: the chosen one
        value = value[0]
    if not isinstance(value, str):
        raise RecordError(f"'{name}' must be a string (the answer)")
    return value


def _media_list(record: Mapping, name: str | None, kind: str) -> tuple[list, str | None]:
    """The media of one kind the record lists, and the field they came from."""
    keys = [name] if name else []
    keys += [k for k in (LIST_FIELDS[kind], kind) if k not in keys]
    for key in keys:
        value = record.get(key)
        if value is None or value == "" or value == []:
            continue
        if isinstance(value, str | dict | bytes):
            return [value], key
        if isinstance(value, list | tuple):
            return list(value), key
        raise RecordError(f"'{key}' must be a list of file paths")
    return [], None


def _number(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise RecordError(f"a bbox coordinate must be a number, not {value!r}")
    return str(value)


def _objects(objects: object) -> tuple[list[str], list[list]]:
    """ms-swift's ``objects``: ``{"ref": [...], "bbox": [[x1, y1, x2, y2], ...]}`` (or a list of
    ``{"caption" | "ref", "bbox"}``)."""
    if isinstance(objects, str):
        try:
            objects = json.loads(objects)
        except ValueError:
            raise RecordError("'objects' must be an object with 'ref' and 'bbox' lists") from None
    if isinstance(objects, list):
        refs = [o.get("ref", o.get("caption")) for o in objects if isinstance(o, dict)]
        boxes = [o.get("bbox") for o in objects if isinstance(o, dict)]
        return [r for r in refs if r is not None], [b for b in boxes if b is not None]
    if not isinstance(objects, dict):
        raise RecordError("'objects' must be an object with 'ref' and 'bbox' lists")
    return list(objects.get("ref") or []), list(objects.get("bbox") or [])


def _substitute_objects(turns: _Turns, objects: object) -> None:
    """``<ref-object>`` -> ``<|object_ref_start|>ref<|object_ref_end|>``, ``<bbox>`` ->
    ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``: the Qwen-VL grounding spelling ms-swift writes
    for the Qwen families, so the boxes are in the tokens (coordinates as the record gives them)."""
    refs, boxes = _objects(objects)
    n_refs = sum(m["content"].count("<ref-object>") for m in turns.messages)
    n_boxes = sum(m["content"].count("<bbox>") for m in turns.messages)
    if n_refs > len(refs) or n_boxes > len(boxes):
        raise RecordError(
            f"{n_refs} <ref-object> and {n_boxes} <bbox> tag(s) in the messages but {len(refs)} ref(s) "
            f"and {len(boxes)} bbox(es) in 'objects'"
        )
    ref_iter, box_iter = iter(refs), iter(boxes)

    def box(_match: re.Match) -> str:
        value = next(box_iter)
        if not isinstance(value, list | tuple) or len(value) not in (2, 4):
            raise RecordError(f"a bbox must be [x1, y1, x2, y2] (or a point [x, y]), not {value!r}")
        numbers = list(map(_number, value))  # a point is one pair, as ms-swift writes it for Qwen
        pairs = ",".join(f"({numbers[i]},{numbers[i + 1]})" for i in range(0, len(numbers), 2))
        return f"<|box_start|>{pairs}<|box_end|>"

    def ref(_match: re.Match) -> str:
        return f"<|object_ref_start|>{next(ref_iter)}<|object_ref_end|>"

    for message in turns.messages:
        text = message["content"]
        if "<ref-object>" in text or "<bbox>" in text:
            text = re.sub(r"<ref-object>", ref, text)
            message["content"] = re.sub(r"<bbox>", box, text)


def _answer_turns(value: object, name: str, turns: _Turns, roles: Mapping[str, str] | None) -> None:
    """A preference record's chosen answer as the last turn(s): a string (alpaca, TRL standard), a
    turn (LLaMA-Factory's sharegpt ``{"from": "gpt", "value"}``) or a list of turns (TRL)."""
    if isinstance(value, str):
        turns.add("assistant", value)
    elif isinstance(value, dict):
        _chat_turns([value], turns, roles, None, None)
    elif isinstance(value, list) and value and all(isinstance(t, dict) for t in value):
        _chat_turns(value, turns, roles, None, None)
    else:
        raise RecordError(f"'{name}' must be a string, a turn or a list of turns (the chosen answer)")


def _prompt_turns(value: object, name: str, turns: _Turns) -> None:
    """TRL's ``prompt``: a string (standard) or a list of turns (conversational)."""
    if isinstance(value, str):
        turns.add("user", value)
    elif isinstance(value, list) and value:
        _chat_turns(value, turns, None, None, None)
    else:
        raise RecordError(f"'{name}' must be a string or a non-empty list of chat turns")


def _cauldron_turns(texts: object, turns: _Turns) -> None:
    """The Cauldron's ``texts``: ``[{"user", "assistant", "source"}, ...]``, one exchange each."""
    if not isinstance(texts, list) or not texts:
        raise RecordError("'texts' must be a non-empty list of {'user', 'assistant'} exchanges")
    for i, pair in enumerate(texts):
        if not isinstance(pair, dict) or not isinstance(pair.get("user"), str):
            raise RecordError(f"texts item {i} must be an object with 'user' and 'assistant' strings")
        if not isinstance(pair.get("assistant"), str):
            raise RecordError(f"texts item {i} must be an object with 'user' and 'assistant' strings")
        turns.add("user", pair["user"])
        turns.add("assistant", pair["assistant"])
        turns.unused.update(f"texts.{k}" for k in pair if k not in ("user", "assistant"))


def _placeholder_map(mapping: dict, turns: _Turns) -> list:
    """MiniCPM-V's ``image`` as ``{"<image_00>": path, ...}``: each named placeholder becomes
    ``<image>``, the paths in the order the placeholders appear (those never written go before the
    first user text, as MiniCPM-V places them)."""
    order = {}
    for message in turns.messages:
        for key in sorted(mapping, key=lambda k: message["content"].find(k)):
            if key in message["content"] and key not in order:
                order[key] = len(order)
    for message in turns.messages:
        for key in order:
            message["content"] = message["content"].replace(key, "<image>")
    unplaced = [key for key in mapping if key not in order]
    if unplaced:
        first = next((m for m in turns.messages if m["role"] == "user"), turns.messages[0])
        first["content"] = "<image>" * len(unplaced) + first["content"]
    return [mapping[key] for key in unplaced] + [mapping[key] for key in order]


def _is_placeholder_map(value: object) -> bool:
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(k, str) and k.startswith("<") and k.endswith(">") for k in value)
    )


def _is_frame_list(items: list) -> bool:
    """A ``videos`` list that is one video given as its frames (image files), not several videos."""
    return len(items) > 1 and all(
        isinstance(item, str) and item.rsplit(".", 1)[-1].lower() in _IMAGE_SUFFIXES for item in items
    )


_EMPTY = (None, "", [], {})
_IMAGE_SUFFIXES = {"jpg", "jpeg", "png", "webp", "bmp", "gif"}
# Where a record may give its system prompt, in the frameworks' spellings (LLaMA-Factory / ms-swift
# / alpaca: system; lmms-finetune: system_prompt; others: system_message, sys_prompt).
SYSTEM_KEYS = ("system", "system_prompt", "system_message", "sys_prompt")


def normalize(record: Mapping | list, spec: FormatSpec | None = None) -> dict:
    """The record as the internal shape (messages, images, videos, audios), or RecordError with
    what is wrong; also ``format`` (the spelling recognised, for the source table) and ``unused``
    (the record's fields the mapping did not read: the caller reports them)."""
    spec = spec or FormatSpec()
    turns = _Turns()
    if isinstance(record, list):  # a JSON array of bare message lists
        if not record or not all(isinstance(turn, dict) for turn in record):
            raise RecordError("a record must be a JSON object (or a list of chat turns)")
        _chat_turns(record, turns, None, None, None)
        return _finish({}, spec, turns, "message list", set())
    used: set[str] = set()

    def take(key: str | None) -> object:
        if not key or key not in record:
            return None
        used.add(key)
        return record[key]

    formatting = spec.formatting
    label = formatting
    if formatting == "auto":
        if "messages" in record or "conversations" in record or "conversation" in record:
            formatting = "sharegpt"
        elif "instruction" in record or "query" in record:
            formatting = label = "alpaca"
        elif "prompt" in record or "chosen" in record:
            formatting = "trl"
        elif "texts" in record:
            formatting = label = "The Cauldron"
        else:
            raise RecordError(MISSING_TEXT)

    def declared(name: str) -> object:  # a dataset_info entry reads only the columns it declares
        return take(spec.column(name) if spec.formatting != "auto" else name)

    system = declared("system")
    if spec.formatting == "auto" and system in (None, ""):
        system = next((take(k) for k in SYSTEM_KEYS if record.get(k) not in (None, "")), system)
    roles = spec.roles() if spec.formatting != "auto" else None
    chosen_key = spec.column("chosen") if spec.formatting != "auto" else "chosen"
    answered = False
    if formatting == "sharegpt":
        if spec.formatting == "auto":
            key = next(k for k in ("messages", "conversations", "conversation") if k in record)
            raw = take(key)
            label = (
                "ShareGPT"
                if isinstance(raw, list) and raw and isinstance(raw[0], dict) and "from" in raw[0]
                else "messages"
            )
            _chat_turns(raw, turns, None, None, None)
        else:
            key = spec.column("messages") or "conversations"
            if key not in record:
                raise RecordError(f"missing field {key!r} (the dataset's 'messages' column)")
            tags = {**SHAREGPT_TAGS, **spec.tags}
            _chat_turns(take(key), turns, roles, tags["role_tag"], tags["content_tag"])
    elif formatting == "trl":
        label = "TRL prompt/completion"
        if "prompt" in record:
            _prompt_turns(take("prompt"), "prompt", turns)
        if "completion" in record:
            _answer_turns(take("completion"), "completion", turns, None)
            answered = True
    elif formatting == "The Cauldron":
        _cauldron_turns(take("texts"), turns)
    else:
        if spec.formatting == "auto":  # alpaca or ms-swift's query / response
            prompt_key, query_key, response_key = (
                ("instruction", "input", "output") if "instruction" in record else ("query", None, "response")
            )
            if prompt_key == "query":
                label = "ms-swift query/response"
            history_key = "history"
        else:
            prompt_key, query_key = spec.column("prompt"), spec.column("query")
            response_key, history_key = spec.column("response"), spec.column("history")
        _history_turns(take(history_key), turns)
        prompt = take(prompt_key)
        if not isinstance(prompt, str):
            raise RecordError(f"missing field {prompt_key!r} (the prompt)" if prompt is None else
                              f"'{prompt_key}' must be a string")  # fmt: skip
        query = take(query_key)
        if query not in (None, "") and not isinstance(query, str):
            raise RecordError(f"'{query_key}' must be a string")
        prompt_text = _content_text(prompt, turns, f"'{prompt_key}'")
        turns.add("user", f"{prompt_text}\n{query}" if query else prompt_text)
        if response_key in record and record[response_key] not in (None, "", []):
            turns.add("assistant", _answer(take(response_key), response_key))
            answered = True
        elif chosen_key not in record:
            raise RecordError(f"missing field {response_key!r} (the answer)")
    if not answered and chosen_key and chosen_key in record:  # preference data: the chosen answer
        value = take(chosen_key)
        if formatting == "trl" and "prompt" not in record:  # TRL's implicit prompt: the whole dialogue
            _prompt_turns(value, chosen_key, turns)
        else:
            _answer_turns(value, chosen_key, turns, roles)
        label = f"{label} preference (chosen)"
    if not turns.messages:
        raise RecordError(MISSING_TEXT)

    tools = declared("tools")
    if system not in (None, "") or tools not in (None, "", []):
        _system_turn(turns, system, tools)
    _qwen_images(turns)
    objects = take("objects")
    if objects not in (None, "", [], {}):
        _substitute_objects(turns, objects)
        turns.labels.append("grounding objects")
    return _finish(record, spec, turns, label, used)



def _system_turn(turns: _Turns, system: object, tools: object) -> None:
    """The record's system prompt and its tool list (as a "# Tools" section) in the first turn."""
    if system not in (None, "") and not isinstance(system, str):
        raise RecordError("'system' must be a string")
    has_system = turns.messages[0]["role"] == "system"
    text = turns.messages[0]["content"] if has_system else (system or "")
    if tools not in (None, "", []):
        listed = tools if isinstance(tools, str) else json.dumps(tools, ensure_ascii=False)
        text = f"{text}\n\n# Tools\n\n{listed}" if text else f"# Tools\n\n{listed}"
    if has_system:
        turns.messages[0]["content"] = text
    else:
        turns.messages.insert(0, {"role": "system", "content": text})


def _qwen_images(turns: _Turns) -> None:
    """Qwen-VL's inline ``<img>path</img>`` become <image> placeholders and the turn's images."""
    for message in turns.messages:
        if "<img>" in message["content"]:
            turns.media["image"].extend(m.strip() for m in _QWEN_IMG.findall(message["content"]))
            message["content"] = _QWEN_IMG.sub("<image>", message["content"])
            turns.inline = True

def _finish(record: Mapping, spec: FormatSpec, turns: _Turns, label: str, used: set[str]) -> dict:
    """The media lists (from the record's fields or the turns) with one placeholder per item."""
    result: dict = {"messages": turns.messages}
    labels = [label, *turns.labels]
    for kind in KINDS:
        name = spec.column(LIST_FIELDS[kind])
        image_map = record.get("image") if kind == "image" else None
        if _is_placeholder_map(image_map):
            listed = _placeholder_map(image_map, turns)
            used.add("image")
            labels.append("image map")
        else:
            listed, key = _media_list(record, name, kind)
            used.update(
                k for k in (key, name, LIST_FIELDS[kind], kind) if k in record and (k == key or not record[k])
            )
        inline = turns.media[kind]
        if listed and inline:
            raise RecordError(
                f"{kind}s given both inside the turns and in '{LIST_FIELDS[kind]}'; keep one of the two"
            )
        media = inline or listed
        if kind == "video" and _is_frame_list(media) and _count(turns, "video") <= 1:
            media = [media]  # ["f1.jpg", "f2.jpg", ...] under videos: one video, as frames
        if kind == "video" and any(isinstance(m, list | tuple) for m in media):
            labels.append("video frames")
        placeholders = _count(turns, kind)
        # LLaVA-Video-178K / LLaVA-OneVision: the video's placeholder is written <image>
        if (
            kind == "video"
            and media
            and not placeholders
            and not result["images"]
            and _count(turns, "image") == len(media)
        ):
            for message in turns.messages:
                message["content"] = message["content"].replace("<image>", "<video>")
            placeholders = len(media)
            labels.append("<image> for video")
        if media and placeholders == 0:  # ms-swift's rule: missing tags go before the first user text
            first = next((m for m in turns.messages if m["role"] == "user"), turns.messages[0])
            first["content"] = f"<{kind}>" * len(media) + first["content"]
        result[LIST_FIELDS[kind]] = media
    result["format"] = " + ".join(dict.fromkeys(labels))
    # (a table's column without a value in this row is not a field left out)
    result["unused"] = sorted(
        turns.unused.union(k for k in record if k not in used and record[k] not in _EMPTY)
    )
    return result


def _count(turns: _Turns, kind: str) -> int:
    return sum(m["content"].count(f"<{kind}>") for m in turns.messages)
