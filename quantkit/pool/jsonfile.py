"""JSONL pools (one record a line) and JSON arrays (``[{...}, {...}]``, the format of every
LLaMA-Factory and Qwen-VL demo file); a record's line is where it starts in the file."""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
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
    """Parse again the records at (line, byte offset) ``places`` of a JSON array, in that order."""
    with open(path, "rb") as handle:
        for line, offset in places:
            window = _Window(handle, offset, _REREAD_CHUNK)
            while True:
                try:
                    row = _scan_json(window.text, 0)[0]
                    break
                except (json.JSONDecodeError, StopIteration):
                    if not window.more(0):
                        raise
            parse(row, line, offset)


_CHUNK = 1 << 20  # bytes of a JSON array decoded at a time: the reader's memory is flat in the file's size
_REREAD_CHUNK = 64 << 10
_BOM = b"\xef\xbb\xbf"
_NOT_SPACE = re.compile(r"[^ \t\n\r]")
# An error this close to the text's end may be the chunk's cut (a literal, a \uXXXX escape, a
# number): read on before calling it malformed.
_CUT = 12


class _Window:
    """A JSON array's text from a byte offset on, decoded a chunk at a time (strict UTF-8): what
    the scanner reads. ``byte_at`` gives the file offset of a character of it."""

    __slots__ = ("handle", "decoder", "chunk", "text", "base", "eof", "ascii", "_char", "_byte", "read")

    def __init__(self, handle, start: int, chunk: int | None = None) -> None:
        handle.seek(start)
        if start == 0 and handle.read(3) != _BOM:
            handle.seek(0)
        self.handle, self.chunk = handle, chunk or _CHUNK
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text, self.base, self.eof, self.ascii = "", handle.tell(), False, True
        self._char, self._byte = 0, self.base  # a character of text and its file offset (moves forward)
        self.read = 0  # bytes read from the file
        self.more(0)

    def more(self, keep: int) -> bool:
        """Drop the text before character ``keep`` and decode the next chunk after the rest;
        False at the end of the file. Raises UnicodeDecodeError for bytes that are not UTF-8."""
        if self.eof:
            return False
        data = self.handle.read(self.chunk)
        self.read += len(data)
        if keep:
            self.base = self.byte_at(keep)
            self.text = self.text[keep:]
            self._char, self._byte = 0, self.base
        pending = self.decoder.getstate()[0]  # the bytes of a character the last chunk cut
        try:
            self.text += self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as err:
            before = (pending + data)[: err.start]
            raise _NotUtf8(
                self.handle.tell() - len(data) - len(pending) + err.start, before.count(b"\n"), err.reason
            ) from None
        self.ascii = self.text.isascii()
        self.eof = not data
        return bool(data)

    def byte_at(self, i: int) -> int:
        """The file offset of ``text[i]``; ``i`` no less than at the last call since ``more``."""
        if self.ascii:
            return self.base + i
        self._byte += len(self.text[self._char : i].encode("utf-8"))
        self._char = i
        return self._byte


class _NotUtf8(Exception):
    def __init__(self, byte: int, newlines: int, reason: str) -> None:
        self.byte, self.newlines, self.reason = byte, newlines, reason  # newlines: in the new bytes before it


@dataclass(frozen=True, slots=True)
class PartRead:
    """What reading (a part of) a JSON array, or of a JSONL file (quantkit.pool.split), covered."""

    lines: int  # newlines from its first byte to ``end``
    # the first record not read (at ``stop`` or after), or where the array (or a malformed spot) ends
    end: int
    stopped: bool  # malformed JSON ended the read: nothing after it can be read


def read_json_array(
    path: Path,
    parse: Parse,
    on_error: OnError,
    on_bytes: Callable[[int], None] | None,
    *,
    start: int = 0,
    stop: int | None = None,
    first_line: int = 1,
) -> PartRead:
    """Every element of a JSON array, each validated with the line it starts on and its byte
    offset, the text decoded a chunk at a time (memory stays flat however big the file). A
    malformed array stops at the first error, named by its line and byte: nothing after it can be
    read.

    ``start`` / ``stop`` (quantkit.pool.split): from a record's first byte (0: the file's start,
    then its '['), the records that start before ``stop`` (None: to the array's end, which is
    checked), the first numbered ``first_line``."""
    with open(path, "rb") as handle:
        reader = _ArrayReader(handle, path, parse, on_error, on_bytes, start, first_line)
        return reader.run(stop)


class _ArrayReader:
    def __init__(self, handle, path, parse, on_error, on_bytes, start, first_line) -> None:
        self.path, self.parse, self.on_error, self.on_bytes = path, parse, on_error, on_bytes
        self.start, self.first_line = start, first_line
        self.line, self.counted = first_line, 0  # the line of text[counted]
        self.reported = start  # bytes given to on_bytes
        self.window: _Window | None = None
        self.handle = handle

    def _refill(self, keep: int) -> bool:
        """More text, the text before ``keep`` dropped (its lines counted first)."""
        window = self.window
        self.line += window.text.count("\n", self.counted, keep)
        self.counted = 0
        return window.more(keep)

    def _malformed(self, at: int, message: str) -> PartRead:
        """Report malformed JSON at character ``at`` of the text (its line and byte)."""
        window = self.window
        line = self.line + window.text.count("\n", self.counted, at)
        byte = window.byte_at(at)
        self.on_error(line, RecordError(f"malformed JSON: {message} (byte {byte})"))
        return self._done(line, byte, stopped=True)

    def _done(self, line: int, end: int, *, stopped: bool = False) -> PartRead:
        if self.on_bytes is not None and end > self.reported:
            self.on_bytes(end - self.reported)
        return PartRead(line - self.first_line, end, stopped)

    def run(self, stop: int | None) -> PartRead:
        try:
            return self._run(stop)
        except _NotUtf8 as err:
            window = self.window
            line = (
                self.line
                + err.newlines
                + (window.text.count("\n", self.counted) if window is not None else 0)
            )
            self.on_error(line, self._not_utf8_at(err.byte))
            return self._done(line, err.byte, stopped=True)

    def _not_utf8_at(self, byte: int) -> RecordError:
        """The encoding error of the line holding ``byte`` (what the file likely is, and iconv)."""
        self.handle.seek(max(0, byte - 4096))
        before = self.handle.read(byte - max(0, byte - 4096))
        line_start = before.rfind(b"\n") + 1
        rest = self.handle.read(4096)
        line = before[line_start:] + rest.split(b"\n", 1)[0]
        return not_utf8(line, len(before) - line_start)

    def _run(self, stop: int | None) -> PartRead:
        window = self.window = _Window(self.handle, self.start)
        scan, search, parse, on_error, on_bytes = (
            _scan_json,
            _NOT_SPACE.search,
            self.parse,
            self.on_error,
            self.on_bytes,
        )
        i, first = 0, self.start == 0
        if first:  # the '[' (the source was read as an array because its first character is one)
            while (found := search(window.text, 0)) is None and self._refill(len(window.text)):
                pass
            if found is None or window.text[found.start()] != "[":
                return self._malformed(found.start() if found else len(window.text), "expected '['")
            i = found.start() + 1
        while True:
            # the next value: skip whitespace, reading on where the text ends
            while (found := search(window.text, i)) is None:
                if not self._refill(len(window.text)):
                    return self._malformed(len(window.text), "the array is not closed (expected ']')")
                i = 0
            i = found.start()
            self.line += window.text.count("\n", self.counted, i)
            self.counted = i
            if first and window.text[i] == "]":
                return self._closed(i)
            first = False
            at = window.byte_at(i)
            if stop is not None and at >= stop:
                return self._done(self.line, at)
            if on_bytes is not None and at - self.reported >= _CHUNK:
                on_bytes(at - self.reported)
                self.reported = at
            while True:  # the record, and the character after it, within the text
                text = window.text
                try:
                    row, end = scan(text, i)
                    after = search(text, end)
                    if after is not None or window.eof:
                        break
                except json.JSONDecodeError as err:
                    if window.eof or not (
                        err.msg.startswith("Unterminated string") or err.pos >= len(text) - _CUT
                    ):
                        return self._malformed(err.pos, err.msg)
                except StopIteration as err:  # no value where one must be (err.value: there)
                    if window.eof or err.value < len(text) - _CUT:
                        return self._malformed(err.value, "expected a value")
                except RecursionError:  # where the record ends is unknown: nothing after it can be read
                    on_error(self.line, too_deep())
                    return self._done(self.line, at, stopped=True)
                self._refill(i)  # a record cut by the chunk's end: read on
                i = 0
            try:
                parse(row, self.line, at)
            except RecordError as err:
                on_error(self.line, err)
            except UnicodeEncodeError as err:
                on_error(self.line, not_unicode(err))
            except RecursionError:
                on_error(self.line, too_deep())
            if after is None:
                return self._malformed(len(text), "the array is not closed (expected ']')")
            i = after.start()
            if text[i] == ",":
                i += 1
                continue
            if text[i] == "]":
                return self._closed(i)
            return self._malformed(i, "expected ',' or ']' after a record")

    def _closed(self, i: int) -> PartRead:
        """The array's ']' at character ``i``: only whitespace may follow, to the end of the file."""
        window = self.window
        i += 1
        while (found := _NOT_SPACE.search(window.text, i)) is None:
            if not self._refill(len(window.text)):
                line = self.line + window.text.count("\n", self.counted)
                return self._done(line, window.byte_at(len(window.text)))
            i = 0
        return self._malformed(found.start(), "extra data after the array")
