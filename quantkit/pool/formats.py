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
    "ms-swift 'query' / 'response')"
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

    def add(self, role: str, text: str) -> None:
        self.messages.append({"role": role, "content": text})


def _part_value(part: dict, kind: str) -> object:
    """The media a content-list part points at (a path, a URI, bytes), or None (placeholder only)."""
    for key in (kind, f"{kind}_url", f"input_{kind}", "value", "url", "path", "data"):
        if key in part and part[key] not in (None, ""):
            value = part[key]
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
        turns.add(role, text)


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


def _media_list(record: Mapping, name: str | None, kind: str) -> list:
    keys = [name] if name else []
    keys += [k for k in (LIST_FIELDS[kind], kind) if k not in keys]
    for key in keys:
        value = record.get(key)
        if value is None or value == "" or value == []:
            continue
        if isinstance(value, str | dict | bytes):
            return [value]
        if isinstance(value, list | tuple):
            return list(value)
        raise RecordError(f"'{key}' must be a list of file paths")
    return []


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
        if not isinstance(value, list | tuple) or len(value) != 4:
            raise RecordError(f"a bbox must be [x1, y1, x2, y2], not {value!r}")
        x1, y1, x2, y2 = map(_number, value)
        return f"<|box_start|>({x1},{y1}),({x2},{y2})<|box_end|>"

    def ref(_match: re.Match) -> str:
        return f"<|object_ref_start|>{next(ref_iter)}<|object_ref_end|>"

    for message in turns.messages:
        text = message["content"]
        if "<ref-object>" in text or "<bbox>" in text:
            text = re.sub(r"<ref-object>", ref, text)
            message["content"] = re.sub(r"<bbox>", box, text)


def normalize(record: Mapping, spec: FormatSpec | None = None) -> dict:
    """The record as the internal shape (messages, images, videos, audios), or RecordError with
    what is wrong. Fields the mapping does not use (id, the task field) are left to the caller."""
    spec = spec or FormatSpec()
    turns = _Turns()
    formatting = spec.formatting
    if formatting == "auto":
        if "messages" in record or "conversations" in record or "conversation" in record:
            formatting = "sharegpt"
        elif "instruction" in record or "query" in record:
            formatting = "alpaca"
        else:
            raise RecordError(MISSING_TEXT)

    def declared(name: str) -> object:  # a dataset_info entry reads only the columns it declares
        key = spec.column(name) if spec.formatting != "auto" else name
        return record.get(key) if key else None

    system = declared("system")
    if formatting == "sharegpt":
        if spec.formatting == "auto":
            key = next(k for k in ("messages", "conversations", "conversation") if k in record)
            _chat_turns(record[key], turns, None, None, None)
        else:
            key = spec.column("messages") or "conversations"
            if key not in record:
                raise RecordError(f"missing field {key!r} (the dataset's 'messages' column)")
            tags = {**SHAREGPT_TAGS, **spec.tags}
            _chat_turns(record[key], turns, spec.roles(), tags["role_tag"], tags["content_tag"])
    else:
        if spec.formatting == "auto":  # alpaca or ms-swift's query / response
            prompt_key, query_key, response_key = (
                ("instruction", "input", "output") if "instruction" in record else ("query", None, "response")
            )
            history_key = "history"
        else:
            prompt_key, query_key = spec.column("prompt"), spec.column("query")
            response_key, history_key = spec.column("response"), spec.column("history")
        _history_turns(record.get(history_key) if history_key else None, turns)
        prompt = record.get(prompt_key) if prompt_key else None
        if not isinstance(prompt, str):
            raise RecordError(f"missing field {prompt_key!r} (the prompt)" if prompt is None else
                              f"'{prompt_key}' must be a string")  # fmt: skip
        query = record.get(query_key) if query_key else None
        if query not in (None, "") and not isinstance(query, str):
            raise RecordError(f"'{query_key}' must be a string")
        prompt_text = _content_text(prompt, turns, f"'{prompt_key}'")
        turns.add("user", f"{prompt_text}\n{query}" if query else prompt_text)
        if response_key not in record:
            raise RecordError(f"missing field {response_key!r} (the answer)")
        turns.add("assistant", _answer(record[response_key], response_key))

    tools = declared("tools")
    if system not in (None, "") or tools not in (None, "", []):
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

    for message in turns.messages:  # Qwen-VL's <img>path</img>
        if "<img>" in message["content"]:
            turns.media["image"].extend(m.strip() for m in _QWEN_IMG.findall(message["content"]))
            message["content"] = _QWEN_IMG.sub("<image>", message["content"])
            turns.inline = True

    objects = record.get("objects")
    if objects not in (None, "", [], {}):
        _substitute_objects(turns, objects)

    result: dict = {"messages": turns.messages}
    for kind in KINDS:
        listed = _media_list(record, spec.column(LIST_FIELDS[kind]), kind)
        inline = turns.media[kind]
        if listed and inline:
            raise RecordError(
                f"{kind}s given both inside the turns and in '{LIST_FIELDS[kind]}'; keep one of the two"
            )
        media = inline or listed
        placeholders = sum(m["content"].count(f"<{kind}>") for m in turns.messages)
        if media and placeholders == 0:  # ms-swift's rule: missing tags go before the first user text
            first = next((m for m in turns.messages if m["role"] == "user"), turns.messages[0])
            first["content"] = f"<{kind}>" * len(media) + first["content"]
        result[LIST_FIELDS[kind]] = media
    return result
