"""JSONL pools (one record a line) and JSON arrays (``[{...}, {...}]``, the format of every
LLaMA-Factory and Qwen-VL demo file); a record's line is where it starts in the file."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from quantkit.pool.record import RecordError, not_unicode, not_utf8

_decoder = json.JSONDecoder()
_decode_json = _decoder.decode  # json.loads(str) with default settings
_scan_json = _decoder.scan_once  # what decode runs at the text's first value
_WHITESPACE = " \t\n\r"
# on_bytes is called once every this many + 1 lines (a power of two less one, as a mask) rather than per line
_BYTES_STEP = 255

Parse = Callable[[object, int, int], None]  # (record, line, where to read it again)
OnError = Callable[[int, RecordError], None]


def first_char(path: Path) -> str:
    """The file's first non-whitespace character ('' for an empty file): '[' for a JSON array."""
    with open(path, "rb") as handle:
        while block := handle.read(4096):
            stripped = block.lstrip(b" \t\r\n\xef\xbb\xbf")
            if stripped:
                return chr(stripped[0])
    return ""


def read_jsonl(
    path: Path,
    parse: Parse,
    on_error: OnError,
    on_bytes: Callable[[int], None] | None,
    *,
    start: int = 0,
    stop: int | None = None,
    first_line: int = 1,
) -> int:
    """Parse and validate every line of a JSONL pool; ``on_error(line, error)`` for a malformed or
    invalid record (it raises, or records the skip). One loop, no generator: this runs once per
    record of a big pool.

    ``start`` / ``stop``: a part of the file, from a line's first byte to another's (see
    quantkit.pool.split), whose first line is numbered ``first_line``. Returns the number of lines
    read."""
    decode, scan, loads, decode_error = _decode_json, _scan_json, json.loads, json.JSONDecodeError
    offset = start  # of the line: where the record is read again if selected
    reported = start  # bytes given to on_bytes: every _BYTES_STEP lines, and the rest at the end
    end_of_part = sys.maxsize if stop is None else stop
    number = first_line - 1
    with open(path, "rb") as handle:
        handle.seek(start)
        for number, raw in enumerate(handle, start=first_line):
            if offset >= end_of_part:
                number -= 1
                break
            line_start = offset
            offset += len(raw)
            if not number & _BYTES_STEP and on_bytes is not None:
                on_bytes(offset - reported)
                reported = offset
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
            except decode_error as err:
                on_error(number, RecordError(f"malformed JSON: {err}"))
                continue
            except UnicodeDecodeError as err:
                on_error(number, not_utf8(raw, err.start))
                continue
            except RecursionError:
                on_error(number, too_deep())
                continue
            try:
                parse(row, number, line_start)
            except RecordError as err:
                on_error(number, err)
            except UnicodeEncodeError as err:
                on_error(number, not_unicode(err))
            except RecursionError:
                on_error(number, too_deep())
    if on_bytes is not None and offset > reported:
        on_bytes(offset - reported)
    return number - first_line + 1


def too_deep() -> RecordError:
    """A record nested deeper than Python's JSON parser goes (its recursion limit)."""
    return RecordError(
        f"the record is nested more than {sys.getrecursionlimit()} levels deep, deeper than the "
        "JSON parser goes; flatten it"
    )


def jsonl_at(path: Path, places: list[tuple[int, int]], parse: Parse) -> None:
    """Parse again the records at (line, byte offset) ``places`` of a JSONL file, in that order."""
    with open(path, "rb") as handle:
        for line, offset in places:
            handle.seek(offset)
            parse(json.loads(handle.readline()), line, offset)


def json_array_at(path: Path, places: list[tuple[int, int]], parse: Parse) -> None:
    """Parse again the records at (line, character index) ``places`` of a JSON array."""
    text = path.read_bytes().decode("utf-8-sig")
    for line, index in places:
        parse(_scan_json(text, index)[0], line, index)


def read_json_array(
    path: Path, parse: Parse, on_error: OnError, on_bytes: Callable[[int], None] | None
) -> None:
    """Every element of a JSON array, each validated with the line it starts on. A malformed
    array stops at the first error (its position in the message): nothing after it can be read."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        bad = err.start + (3 if raw.startswith(b"\xef\xbb\xbf") else 0)  # (after a byte-order mark)
        line_start, line_end = raw.rfind(b"\n", 0, bad) + 1, raw.find(b"\n", bad)
        line = raw[line_start : line_end if line_end >= 0 else len(raw)]
        on_error(1 + raw.count(b"\n", 0, bad), not_utf8(line, bad - line_start))
        return
    if on_bytes is not None:
        on_bytes(len(text))
    scan, n = _scan_json, len(text)
    index = text.index("[") + 1
    line, counted = 1 + text.count("\n", 0, index), index

    def skip(i: int) -> int:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        return i

    index = skip(index)
    if index < n and text[index] == "]":
        return
    while True:
        line += text.count("\n", counted, index)
        counted = index
        try:
            row, end = scan(text, index)
        except json.JSONDecodeError as err:
            raise_malformed(
                on_error, line, f"malformed JSON: {err.msg} (line {err.lineno} column {err.colno})"
            )
            return
        except StopIteration:
            raise_malformed(on_error, line, "malformed JSON: expected a value")
            return
        except RecursionError:
            on_error(line, too_deep())
            return  # where the record ends is unknown: nothing after it can be read
        try:
            parse(row, line, index)
        except RecordError as err:
            on_error(line, err)
        except UnicodeEncodeError as err:
            on_error(line, not_unicode(err))
        except RecursionError:
            on_error(line, too_deep())
        index = skip(end)
        if index < n and text[index] == ",":
            index = skip(index + 1)
            continue
        if index < n and text[index] == "]":
            if skip(index + 1) != n:
                line += text.count("\n", counted, index)
                raise_malformed(on_error, line, "malformed JSON: extra data after the array")
            return
        line += text.count("\n", counted, index)
        raise_malformed(on_error, line, "malformed JSON: expected ',' or ']' after a record")
        return


def raise_malformed(on_error: OnError, line: int, message: str) -> None:
    on_error(line, RecordError(message))
