"""Read a big JSONL file or JSON array in parts, one process a part, into the index one process
would build.

A JSONL file is cut at line starts into parts of about equal bytes. A JSON array is cut where a
record seems to start: at the bytes that separate its first two records (``,\n  {\n    "id"``,
``, {"messages"``: the comma, the indentation, the brace and the first key), which a JSON string
cannot hold (its quotes are escaped) and which nested objects rarely share. A cut is checked
before it is used: the part before it must end exactly there (its last record's end, then a
comma, then the cut). Where one does not, the cut was inside a record (a nested object that
starts as records do): the rest of the file is then read here, as one process reads it.

This process reads the first part while forked children read the others, each with a copy of the source's parser (taxonomy,
rules, caches: nothing to rebuild or send) and of str's hash key, so the duplicate digests and id
hashes they compute are the ones this process would. Each child sends back what its part added:
the index columns, its new groups keyed by the media spelling and task that made them, its errors,
counters, the task assigner's counts and its media probes. Merged in file order, with lines and
groups renumbered, they give the PoolIndex, groups (numbered by first appearance), errors and
counts of a single reader, so every output is the same whatever the number of parts.

A child that fails in any way, or a system that refuses a process, costs time and adds a note to
the result (and so to the set's report): the parts are then read here. Children run with SIGINT
blocked and are killed by this process when it stops for any reason, Ctrl-C included; threads
running at fork (rich's progress refresh) are never touched in a child. A child orphaned by a
SIGKILL of this process reads to the end of its part, then exits on the closed pipe.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import select
import signal
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantkit.pool.jsonfile import OnError, PartRead, read_json_array, read_jsonl
from quantkit.pool.parse import ParseContext, RecordParser
from quantkit.pool.record import RecordError

# Below this many bytes a part costs more (fork, merge, its own media probes) than it saves.
MIN_PART_BYTES = 8 << 20
_SLOT = struct.Struct("q")  # a child's bytes read so far, in the shared progress map


def part_count(size: int, workers: int | None) -> int:
    """How many parts to read a ``size``-byte file in: ``workers`` when given (1: no
    children), else one per CPU this process may run on, each part at least MIN_PART_BYTES."""
    if not hasattr(os, "fork"):
        return 1
    if workers is not None:
        return max(1, workers)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, size // MIN_PART_BYTES))


def part_bounds(path: Path, parts: int) -> list[tuple[int, int]]:
    """(start, stop) byte ranges covering the file, each from a line's first byte to the next
    range's: ``parts`` of them, fewer when lines are longer than a part."""
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as handle:
        for k in range(1, parts):
            target = size * k // parts
            if target <= cuts[-1]:
                continue
            handle.seek(target - 1)
            handle.readline()  # to the end of the line holding byte target - 1
            cut = handle.tell()
            if cuts[-1] < cut < size:
                cuts.append(cut)
    cuts.append(size)
    return list(zip(cuts, cuts[1:], strict=False))


_SEARCH_BLOCK = 1 << 20  # bytes read at a time looking for an array's record separator


def array_part_bounds(path: Path, parts: int) -> list[tuple[int, int]]:
    """(start, stop) byte ranges covering a JSON array, each later one from where a record seems
    to start (see the module: the SplitRead checks each), ``parts`` of them or fewer (one when the
    array has fewer than two records, or records that are not objects)."""
    size = path.stat().st_size
    separator = _record_separator(path) if parts > 1 else None
    if separator is None:
        return [(0, size)]
    brace = separator.index(b"{")
    cuts = [0]
    with open(path, "rb") as handle:
        for k in range(1, parts):
            target, limit = max(size * k // parts, cuts[-1] + 1), size * (k + 1) // parts
            found = _find(handle, separator, target, limit)
            if found is not None and cuts[-1] < found + brace < size:
                cuts.append(found + brace)
    cuts.append(size)
    return list(zip(cuts, cuts[1:], strict=False))


def _record_separator(path: Path) -> bytes | None:
    """The bytes from the comma after an array's first record to the end of the second record's
    first key, as the file writes them; None where there is no such thing."""
    seen: list[int] = []

    def note(row: object, line: int, at: int) -> None:
        seen.append(at)
        if len(seen) == 2:
            raise _FirstError

    with contextlib.suppress(_FirstError):
        read_json_array(path, note, _stop_reading, None)
    if len(seen) < 2:
        return None
    with open(path, "rb") as handle:
        handle.seek(seen[0])
        head = handle.read(seen[1] - seen[0] + 4096)
    second = head[seen[1] - seen[0] :]
    comma = head.rfind(b",", 0, seen[1] - seen[0])
    if comma < 0 or not second.startswith(b"{"):
        return None
    quote = second.find(b'"')
    end = second.find(b'"', quote + 1) if quote > 0 and not second[1:quote].strip() else -1
    if end < 0 or b"\\" in second[quote:end]:
        return None
    return head[comma : seen[1] - seen[0]] + second[: end + 1]


def _stop_reading(line: int, err: RecordError) -> None:
    raise _FirstError


def _find(handle, needle: bytes, start: int, limit: int) -> int | None:
    """The first offset of ``needle`` at ``start`` or after, before ``limit`` (read a block at a time)."""
    position = start
    while position < limit:
        handle.seek(position)
        block = handle.read(_SEARCH_BLOCK + len(needle) - 1)
        found = block.find(needle)
        if found >= 0:
            return position + found if position + found < limit else None
        if len(block) < _SEARCH_BLOCK:
            return None
        position += _SEARCH_BLOCK
    return None


class _FirstError(Exception):
    """Stops a child at its part's first invalid record when invalid records are not skipped."""


@dataclass
class _Child:
    pid: int
    pipe: int  # the read end
    start: int
    stop: int


class SplitRead:
    """The children reading parts 2..N of one source, started by :meth:`start` before this
    process reads part 1 (so they fork before the source's hashing thread starts)."""

    def __init__(
        self,
        path: Path,
        bounds: list[tuple[int, int]],
        context: ParseContext,
        parser: RecordParser,
        skip_invalid: bool,
        kind: str = "jsonl",
    ) -> None:
        """``kind``: "jsonl" (bounds from part_bounds) or "json" (an array, array_part_bounds)."""
        self.path, self.bounds, self.context, self.parser = path, bounds, context, parser
        self.skip_invalid, self.kind = skip_invalid, kind
        self.children: list[_Child] = []
        self._parent = os.getpid()
        self.progress = mmap.mmap(-1, _SLOT.size * len(bounds))
        self.counted = [0] * len(bounds)  # children's bytes given to on_bytes so far

    def start(self) -> SplitRead | None:
        """Fork the children; None (none left running, a note in the result) where the system
        refuses a process or a pipe: the caller then reads the source in this process."""
        index = self.context.result.index
        marks = (len(index.groups), len(index.group), len(index.ids), len(self.context.probe.entries()))
        try:
            for slot, (start, stop) in enumerate(self.bounds[1:], start=1):
                read_end, write_end = os.pipe()
                # SIGINT (Ctrl-C reaches the whole process group) stays blocked in the child for
                # its life: it never unwinds into this process's code (whose cleanup would remove
                # the media store); this process kills it instead. Here it waits until after fork.
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
                try:
                    pid = os.fork()
                except OSError:
                    os.close(read_end)
                    os.close(write_end)
                    raise
                finally:
                    if os.getpid() == self._parent:
                        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                if pid == 0:  # the child: never returns
                    self._child_main(slot, start, stop, marks, read_end, write_end)
                os.close(write_end)
                self.children.append(_Child(pid, read_end, start, stop))
        except OSError as err:  # EAGAIN (a process limit), EMFILE (descriptors)
            self.close()
            self.context.result.notes.append(
                f"{self.path.name}: could not start a process to read part of it ({err}); read in one process"
            )
            return None
        return self

    def _read_range(
        self,
        start: int,
        stop: int,
        on_error: OnError,
        on_bytes: Callable[[int], None] | None,
        first_line: int,
    ) -> PartRead:
        """Read the records from byte ``start`` (a record's first byte, or 0) to ``stop`` (the
        file's size: to its end) with this process's parser: what it covered (for JSONL, every
        line to ``stop``)."""
        parse = self.parser.parse
        if self.kind == "json":
            last = stop >= self.bounds[-1][1]
            return read_json_array(self.path, parse, on_error, on_bytes, start=start,
                                   stop=None if last else stop, first_line=first_line)  # fmt: skip
        lines = read_jsonl(
            self.path, parse, on_error, on_bytes, start=start, stop=stop, first_line=first_line
        )
        return PartRead(lines, stop, False)

    # -- in a child ----------------------------------------------------------------------------

    def _child_main(
        self, slot: int, start: int, stop: int, marks: tuple[int, ...], read_end: int, out: int
    ) -> None:
        try:
            os.close(read_end)
            for child in self.children:  # the earlier children's pipes: not ours to hold open
                os.close(child.pipe)
            try:
                payload = self._read_part(slot, start, stop, marks)
            except BaseException as err:  # anything: this process reads the part itself
                payload = {"failed": f"{type(err).__name__}: {err}"}
            with os.fdopen(out, "wb") as handle:
                pickle.dump(payload, handle, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            os._exit(0)  # no atexit handlers, no flushing of the parent's buffers, no unwinding

    def _read_part(self, slot: int, start: int, stop: int, marks: tuple[int, ...]) -> dict:
        context, parser = self.context, self.parser
        result, assigner = context.result, context.assigner
        index = result.index
        groups_before, records_before, ids_before, probes_before = marks
        # Counters the parser adds to, emptied: what the part adds is then all they hold.
        result.modality_mismatches.clear()
        context.stats.modalities.clear()
        context.stats.formats.clear()
        context.stats.ignored.clear()
        if assigner is not None:
            assigner.start_part()
        errors: list[tuple[int, RecordError]] = []
        skip_invalid = self.skip_invalid

        def on_error(number: int, err: RecordError) -> None:
            errors.append((number, err))  # the error itself: its kind decides whether it may be skipped
            if not skip_invalid:
                raise _FirstError

        progress, offset = self.progress, _SLOT.size * slot
        done = [0]

        def on_bytes(n: int) -> None:
            done[0] += n
            _SLOT.pack_into(progress, offset, done[0])

        try:
            covered = self._read_range(start, stop, on_error, on_bytes, 1)
        except _FirstError:
            covered = PartRead(-1, stop, True)  # stopped at errors[-1]: nothing after it is used
        group_keys = {}  # a new group (numbered from 0 in this part) -> (media spelling, task)
        for key, combo in parser.combos.items():
            for name, shared in (combo.derived.tails if combo.derived else {}).items():
                if shared[5] >= groups_before:
                    group_keys[shared[5] - groups_before] = (key, name)
        return {
            "lines": covered.lines,
            "end": covered.end,
            "stopped": covered.stopped,
            "errors": errors,
            "groups": index.groups[groups_before:],
            "group_keys": group_keys,
            "groups_before": groups_before,
            "group": index.group[records_before:].tobytes(),
            "line": index.line[records_before:].tobytes(),
            "locator": index.locator[records_before:].tobytes(),
            "id_hash": index.id_hash[records_before:].tobytes(),
            "id_end": index.id_end[records_before:].tobytes(),
            "ids_before": ids_before,
            "ids": bytes(index.ids[ids_before:]),
            "digest": index.digest[2 * records_before :].tobytes(),
            "mismatches": dict(result.modality_mismatches),
            "modalities": dict(context.stats.modalities),
            "formats": dict(context.stats.formats),
            "ignored": dict(context.stats.ignored),
            "assigner": assigner.part_state() if assigner is not None else None,
            "probes": context.probe.entries(since=probes_before),
        }

    # -- in this process -----------------------------------------------------------------------

    def children_bytes(self) -> int:
        """Bytes the children have read since the last call."""
        new = 0
        for slot in range(1, len(self.bounds)):
            (done,) = _SLOT.unpack_from(self.progress, _SLOT.size * slot)
            new += done - self.counted[slot]
            self.counted[slot] = done
        return new

    def read(self, on_error: OnError, on_bytes: Callable[[int], None] | None) -> None:
        """Read the first part here, then merge the children's parts in order; ``on_error`` gets
        every invalid record with its line in the file, in file order."""
        try:
            self._read(on_error, on_bytes)
        finally:
            self.close()

    def _read(self, on_error: OnError, on_bytes: Callable[[int], None] | None) -> None:
        report = None if on_bytes is None else (lambda n: on_bytes(n + self.children_bytes()))
        start, stop = self.bounds[0]
        covered = self._read_range(start, stop, on_error, report, 1)
        payloads = []
        for child in self.children:
            fd, child.pipe = child.pipe, -1  # the file object below owns (and closes) it
            with os.fdopen(fd, "rb") as handle:
                if on_bytes is not None:  # the bar moves while the children finish
                    while not select.select([fd], [], [], 0.2)[0]:
                        if new := self.children_bytes():
                            on_bytes(new)
                data = handle.read()
            with contextlib.suppress(ChildProcessError):  # (a host that ignores SIGCHLD reaps it)
                os.waitpid(child.pid, 0)
            child.pid = 0
            try:
                payload = pickle.loads(data)
            except Exception as err:  # the child died before it wrote all of it
                payload = {"failed": f"no result ({type(err).__name__})"}
            payloads.append(payload)
        size = self.bounds[-1][1]
        failed = next((p["failed"] for p in payloads if "failed" in p), None)
        if failed is not None:
            self.context.result.notes.append(
                f"{self.path.name}: a process reading part of it failed ({failed}); read in one process"
            )
        if failed is not None or not self._cuts_hold(covered, payloads):
            # Read the rest here: this process's parser then numbers every group it meets, as alone.
            rest = size - covered.end - sum(self.counted)  # not reported yet
            if not covered.stopped:
                self._read_range(covered.end, size, on_error, None, covered.lines + 1)
            if on_bytes is not None and rest > 0:
                on_bytes(rest)
            return
        keys = self._group_keys()
        line = covered.lines + 1  # of the first byte of the next part
        for payload in payloads:
            if covered.stopped:  # malformed JSON: nothing after it is read, as in one process
                break
            self._merge(payload, line - 1, keys, on_error)
            if payload["lines"] < 0:  # (on_error raised for its last error, when not skipping)
                raise RuntimeError("a part stopped at an invalid record that was not reported")
            covered = PartRead(payload["lines"], payload["end"], payload["stopped"])
            line += covered.lines
        if on_bytes is not None:
            rest = self.children_bytes()
            if rest:
                on_bytes(rest)

    def _cuts_hold(self, covered: PartRead, payloads: list[dict]) -> bool:
        """Whether each part used starts where the part before it ended (always, for JSONL; for
        an array, unless a cut fell inside a record)."""
        for child, payload in zip(self.children, payloads, strict=True):
            if covered.stopped:
                return True  # nothing after it is used
            if child.start != covered.end:
                return False
            covered = PartRead(payload["lines"], payload["end"], payload["stopped"])
        return True

    def _group_keys(self) -> dict:
        """(media spelling, task) -> group, for the groups this process's parser made."""
        keys = {}
        for key, combo in self.parser.combos.items():
            for name, shared in (combo.derived.tails if combo.derived else {}).items():
                keys[(key, name)] = shared[5]
        return keys

    def _merge(self, payload: dict, line_offset: int, keys: dict, on_error: OnError) -> None:
        context = self.context
        result, index = context.result, context.result.index
        for number, error in payload["errors"]:
            on_error(line_offset + number, error)
        # The part's groups: one already made here (the same spelling and task) is that group;
        # the others are new, numbered in the order the part met them.
        renumber = np.empty(len(payload["groups"]), dtype=np.uint32)
        for g, group in enumerate(payload["groups"]):
            key = payload["group_keys"].get(g)
            number = keys.get(key) if key is not None else None
            if number is None:
                number = len(index.groups)
                index.groups.append(group)
                if key is not None:
                    keys[key] = number
            renumber[g] = number
        part_groups = np.frombuffer(payload["group"], dtype=np.uint32) - np.uint32(payload["groups_before"])
        index.group.frombytes(renumber[part_groups].tobytes())
        lines = np.frombuffer(payload["line"], dtype=np.uint32).astype(np.int64) + line_offset
        index.line.frombytes(lines.astype(np.uint32).tobytes())
        index.locator.frombytes(payload["locator"])
        index.id_hash.frombytes(payload["id_hash"])
        ends = np.frombuffer(payload["id_end"], dtype=np.uint32).astype(np.int64)
        index.id_end.frombytes((ends + (len(index.ids) - payload["ids_before"])).astype(np.uint32).tobytes())
        index.ids.extend(payload["ids"])
        index.digest.frombytes(payload["digest"])
        for key, count in payload["mismatches"].items():
            result.modality_mismatches[key] += count
        for counter in ("modalities", "formats", "ignored"):
            for key, count in payload[counter].items():
                getattr(context.stats, counter)[key] += count
        if payload["assigner"] is not None:
            context.assigner.merge_part(payload["assigner"])
        context.probe.add_entries(payload["probes"])

    def close(self) -> None:
        """Stop and reap the children still running (this process failed or was interrupted).
        Safe to call again."""
        for child in self.children:
            if child.pipe >= 0:
                os.close(child.pipe)
                child.pipe = -1
            if child.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child.pid, 0)
                child.pid = 0
        self.progress.close()
