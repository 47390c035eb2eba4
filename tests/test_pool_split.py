"""A JSONL pool read in parts (forked processes, quantkit.pool.split) gives what one process gives:
the same index, groups, lines, errors, counts and task assignments, and the same calibration set
byte for byte, however many parts; a failing part costs time, never a wrong result."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from quantkit.calibset import CalibrateOptions, build_calibration_set
from quantkit.errors import InputError
from quantkit.mediasources import MediaStore
from quantkit.pool import read_pool, split
from quantkit.taskassign import TaskAssigner
from quantkit.taxonomy import load_taxonomy
from tests.fixtures_pool import Media

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="reading in parts needs os.fork")


def _demo_records(demo_pool: Path) -> list[dict]:
    return [json.loads(line) for line in demo_pool.read_text(encoding="utf-8").splitlines() if line.strip()]


def _mixed_lines(demo_pool: Path, media: Media, *, invalid: bool = True) -> list[str]:
    """The demo pool's records three times over, varied the ways user pools vary: no id, no task
    (the taxonomy's rules or nothing assign one), ShareGPT turns, embedded images, the same
    conversation again (duplicates) and an id reused with other content, in every part; blank
    lines, and, with ``invalid``, records each rule refuses."""
    records = _demo_records(demo_pool)
    lines: list[str] = []
    for copy in range(3):
        for i, record in enumerate(records):
            record = json.loads(json.dumps(record))
            n = copy * len(records) + i
            if copy:
                record["messages"][-1]["content"] += f" (copy {copy})"
            if n % 5 == 0:
                record.pop("id", None)
            if n % 7 == 0:
                record.pop("task", None)
            if (
                n % 11 == 0
                and not record.get("images")
                and not record.get("videos")
                and not record.get("audios")
            ):
                turns = record.pop("messages")
                back = {"system": "system", "user": "human", "assistant": "gpt"}
                record["conversations"] = [{"from": back[t["role"]], "value": t["content"]} for t in turns]
            if n % 13 == 0 and record.get("images") and not record.get("videos"):
                record["images"] = [media.data_uri() for _ in record["images"]]
            lines.append(json.dumps(record, ensure_ascii=False))
            if n % 17 == 0:
                lines.append("")
            if n % 19 == 3:  # the same conversation again, later in the pool: a duplicate
                lines.append(json.dumps(records[(n * 7) % len(records)], ensure_ascii=False))
            if n % 23 == 4:  # an id already used, with other content
                other = json.loads(json.dumps(records[(n * 3) % len(records)]))
                other["id"] = records[n % len(records)].get("id", "x")
                other["messages"][-1]["content"] += " (reused id)"
                lines.append(json.dumps(other, ensure_ascii=False))
            if n % 31 == 8:  # no task field, and nothing in the taxonomy's rules fits: left out
                lines.append(
                    json.dumps(
                        {
                            "images": [records[0]["images"][0]] if records[0].get("images") else [],
                            "messages": [
                                {
                                    "role": "user",
                                    "content": "<image>" * bool(records[0].get("images")) + f"zq {n}",
                                },
                                {"role": "assistant", "content": "xv"},
                            ],
                        }
                    )
                )
            if invalid and n % 29 == 6:
                lines.append(_invalid_line(n, records))
    return lines


def _invalid_line(n: int, records: list[dict]) -> str:
    record = json.loads(json.dumps(records[n % len(records)]))
    kind = (n // 29) % 5
    if kind == 0:
        return '{"task": "ocr", "messages": ['  # malformed JSON
    if kind == 1:
        record["task"] = "optical_caracter_recognition"
    elif kind == 2:
        record["images"] = ["no/such/image.png"]
        record["messages"][0]["content"] = "<image>" + record["messages"][0]["content"].replace("<image>", "")
    elif kind == 3:
        record["messages"][0]["content"] += " <image><image><image>"
    else:
        return json.dumps(record)[:-1] + ', "x": "\\ud800"}'  # a lone surrogate
    return json.dumps(record, ensure_ascii=False)


def _write(path: Path, lines: list[str], *, newline: str = "\n", final_newline: bool = True) -> Path:
    path.write_bytes(
        (newline.join(lines) + (newline if final_newline else "")).encode("utf-8", "surrogatepass")
    )
    return path


def _read(pool: Path, media_root: Path, tmp_path: Path, workers: int, **options):
    taxonomy = load_taxonomy()
    store = MediaStore(tmp_path / "store")  # the same folder: embedded media get the same paths
    result = read_pool(
        [pool], taxonomy, media_roots=(media_root,), store=store, workers=workers,
        assigner=TaskAssigner(taxonomy), **options,
    )  # fmt: skip
    return result


def _snapshot(result) -> dict:
    """Everything a read gives that later stages or the report use, comparable with ==."""
    index = result.index
    return {
        "columns": [
            bytes(getattr(index, name))
            for name in ("group", "line", "locator", "id_hash", "id_end", "digest")
        ]
        + [bytes(index.ids), index.rows.tobytes()],
        "groups": [dataclasses.astuple(g) for g in index.groups],
        "sources": [s.as_dict() for s in result.sources],
        "skipped": [(s.source, s.line, s.reason) for s in result.skipped],
        "mismatches": list(result.modality_mismatches.items()),
        "duplicates": result.duplicates,
        "id_conflicts": result.id_conflicts,
        "assignment": result.task_assignment,
        "inputs": result.inputs,
        "notes": result.notes,
        "records": [r.payload for r in result.records],
    }


@pytest.mark.parametrize("workers", [2, 3, 5])
def test_a_pool_read_in_parts_gives_what_one_process_gives(demo_pool, tmp_path, workers):
    media = Media(tmp_path / "media")
    pool = _write(tmp_path / "pool.jsonl", _mixed_lines(demo_pool, media))
    one = _snapshot(_read(pool, demo_pool.parent, tmp_path, 1, skip_invalid=True))
    parts = split.part_bounds(pool, workers)
    assert len(parts) == workers  # the parts really are read apart
    assert _snapshot(_read(pool, demo_pool.parent, tmp_path, workers, skip_invalid=True)) == one
    # the fixture has what it is meant to have, in more than one part
    assert one["duplicates"] and one["id_conflicts"] and len(one["skipped"]) >= 5
    assert one["assignment"]["unassigned"]["count"] and one["assignment"]["tasks"]
    assert max(line for _, line, _ in one["skipped"]) > pool.read_bytes().count(b"\n") // 2


def test_crlf_lines_and_a_last_line_without_newline_read_the_same_in_parts(demo_pool, tmp_path):
    media = Media(tmp_path / "media")
    lines = _mixed_lines(demo_pool, media, invalid=False)
    pool = _write(tmp_path / "pool.jsonl", lines, newline="\r\n", final_newline=False)
    one = _snapshot(_read(pool, demo_pool.parent, tmp_path, 1))
    assert _snapshot(_read(pool, demo_pool.parent, tmp_path, 4)) == one
    assert one["sources"][0]["records"] == len([line for line in lines if line])


@pytest.mark.parametrize("where", ["first part", "later parts"])
def test_the_first_invalid_record_of_the_file_is_the_error_whatever_the_parts(demo_pool, tmp_path, where):
    records = _demo_records(demo_pool)
    lines = [json.dumps(r) for r in records * 4]
    bad = {"first part": [3, len(lines) - 2], "later parts": [len(lines) // 2 + 5, len(lines) - 2]}[where]
    for number in bad:
        lines[number] = (
            '{"task": "ocr", "messages": ['
            if number == bad[-1]
            else lines[number].replace('"task": "', '"task": "no_such_')
        )
    pool = _write(tmp_path / "pool.jsonl", lines)
    errors = []
    for workers in (1, 3):
        with pytest.raises(InputError) as caught:
            _read(pool, demo_pool.parent, tmp_path, workers)
        errors.append(caught.value)
    assert [(e.line, str(e)) for e in errors[1:]] == [(errors[0].line, str(errors[0]))]
    assert errors[0].line == bad[0] + 1 and "unknown task" in str(errors[0])
    assert _children() == []  # none left running or unreaped


def test_a_part_that_fails_is_read_here_and_says_so(demo_pool, tmp_path, monkeypatch):
    media = Media(tmp_path / "media")
    pool = _write(tmp_path / "pool.jsonl", _mixed_lines(demo_pool, media))
    one = _snapshot(_read(pool, demo_pool.parent, tmp_path, 1, skip_invalid=True))

    def broken(self, *args):
        raise MemoryError("out of memory in the child")

    monkeypatch.setattr(split.SplitRead, "_read_part", broken)
    seen: list[int] = []
    got = _snapshot(_read(pool, demo_pool.parent, tmp_path, 3, skip_invalid=True, on_bytes=seen.append))
    failed = "pool.jsonl: a process reading part of it failed (MemoryError: out of memory in the child); read in one process"
    assert got.pop("notes") == [failed, *one.pop("notes")]
    assert got == one
    assert sum(seen) == pool.stat().st_size


def test_progress_counts_every_byte_once_across_parts(demo_pool, tmp_path):
    pool = _write(tmp_path / "pool.jsonl", [json.dumps(r) for r in _demo_records(demo_pool) * 30])
    seen: list[int] = []
    _read(pool, demo_pool.parent, tmp_path, 3, on_bytes=seen.append)
    assert sum(seen) == pool.stat().st_size


def test_parts_start_at_line_starts_and_cover_the_file(tmp_path):
    lines = ["x" * (i % 37) for i in range(500)] + ["y" * 5000]  # a long last line
    pool = _write(tmp_path / "pool.jsonl", lines)
    data = pool.read_bytes()
    for parts in (1, 2, 7, 50):
        bounds = split.part_bounds(pool, parts)
        assert bounds[0][0] == 0 and bounds[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        assert all(data[start - 1 : start] == b"\n" for start, _ in bounds[1:])
        assert len(bounds) <= parts
    one_line = _write(tmp_path / "one.jsonl", ["z" * 1000])
    assert split.part_bounds(one_line, 4) == [(0, 1001)]


def test_part_count_by_default_is_one_per_cpu_for_big_files_only():
    cpus = len(os.sched_getaffinity(0))
    assert split.part_count(split.MIN_PART_BYTES - 1, None) == 1
    assert split.part_count(100 * split.MIN_PART_BYTES, None) == min(cpus, 100)
    assert split.part_count(10, 3) == 3  # asked for: a test or a user's choice


def _calibration_sets(pool: Path, demo_pool: Path, tmp_path: Path, workers: tuple[int, ...]) -> list[dict]:
    """The files of the calibration set built from ``pool`` read in each number of parts."""
    outputs = []
    out = tmp_path / "set"  # one folder (the samples name their media by absolute path), built again
    for count in workers:
        if out.exists():
            shutil.rmtree(out)
        build_calibration_set(
            [pool], out,
            CalibrateOptions(size=60, skip_invalid=True, media_roots=(demo_pool.parent,), workers=count,
                             allow_missing_tasks=True),
        )  # fmt: skip
        outputs.append(
            {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
        )
    return outputs


def test_calibration_sets_built_in_parts_are_the_same_bytes(demo_pool, tmp_path):
    media = Media(tmp_path / "media")
    lines = [line for line in _mixed_lines(demo_pool, media) if '"task"' in line]
    pool = _write(tmp_path / "pool.jsonl", lines)
    outputs = _calibration_sets(pool, demo_pool, tmp_path, (1, 3))
    assert outputs[0] == outputs[1]
    assert any(name.startswith("media/") for name in outputs[0])  # embedded images carried along


def test_the_cli_takes_workers_and_refuses_zero(demo_pool, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "quantkit", "calibrate", str(demo_pool), "--size", "60"]
    bad = subprocess.run(
        [*command, "--output", str(tmp_path / "a"), "--workers", "0"], capture_output=True, text=True, env=env
    )
    said = " ".join(bad.stderr.replace("│", " ").split())  # the option error's box, unwrapped
    assert bad.returncode == 2 and "'--workers': Input should be greater than or equal to 1" in said
    ok = subprocess.run(
        [*command, "--output", str(tmp_path / "b"), "--workers", "2"], capture_output=True, text=True, env=env
    )
    assert ok.returncode == 0, ok.stderr


def _children() -> list[int]:
    """This process's child processes (running or not yet reaped), but multiprocessing's resource
    tracker: once a test of the session has run a spawn-context pool in this process (the skills
    experiment's --workers), the tracker lives as long as the process; a fork-based split never
    starts it, so it is no child the split left behind."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == me and int(entry.name) != tracker:
                found.append(int(entry.name))
    return found


def _open_fds() -> int:
    """This process's open descriptors, once the pool's hash thread has ended: it reads the file
    on its own (daemonic, so an interrupted read never waits for it) and holds it open until done;
    on a slow machine it can outlive the read it belongs to."""
    for thread in threading.enumerate():
        if thread.name == "quantkit-pool-hash":
            thread.join(timeout=60)
    return len(os.listdir("/proc/self/fd"))


def test_ctrl_c_while_waiting_for_the_children_leaves_none_behind(demo_pool, tmp_path, monkeypatch):
    pool = _write(tmp_path / "pool.jsonl", [json.dumps(r) for r in _demo_records(demo_pool) * 20])
    fds = _open_fds()
    real_fdopen = os.fdopen

    class Interrupted:  # the read of a child's result, interrupted; the descriptor closed on exit
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def read(self):
            raise KeyboardInterrupt

    def fdopen(fd, mode="r", *args, **kwargs):
        handle = real_fdopen(fd, mode, *args, **kwargs)
        return Interrupted(handle) if "r" in mode else handle

    monkeypatch.setattr(split.os, "fdopen", fdopen)
    with pytest.raises(KeyboardInterrupt):
        _read(pool, demo_pool.parent, tmp_path, 4)
    assert _children() == [] and _open_fds() == fds


def test_a_refused_fork_reads_in_one_process_and_says_so(demo_pool, tmp_path, monkeypatch):
    media = Media(tmp_path / "media")
    pool = _write(tmp_path / "pool.jsonl", _mixed_lines(demo_pool, media))
    one = _snapshot(_read(pool, demo_pool.parent, tmp_path, 1, skip_invalid=True))
    real_fork, forks = os.fork, []

    def fork():
        forks.append(1)
        if len(forks) > 1:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real_fork()

    monkeypatch.setattr(split.os, "fork", fork)
    fds = _open_fds()
    got = _snapshot(_read(pool, demo_pool.parent, tmp_path, 3, skip_invalid=True))
    refused = (
        "pool.jsonl: could not start a process to read part of it "
        "([Errno 11] Resource temporarily unavailable); read in one process"
    )
    assert got.pop("notes") == [refused, *one.pop("notes")]
    assert got == one
    assert _children() == [] and _open_fds() == fds


def test_an_error_after_the_fork_leaves_no_child(demo_pool, tmp_path, monkeypatch):
    from quantkit.pool import read as pool_read

    pool = _write(tmp_path / "pool.jsonl", [json.dumps(r) for r in _demo_records(demo_pool) * 20])

    def no_thread(*args):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(pool_read, "_in_background", no_thread)
    with pytest.raises(RuntimeError, match="new thread"):
        _read(pool, demo_pool.parent, tmp_path, 3)
    assert _children() == []


def test_children_run_with_ctrl_c_blocked_and_this_process_without(demo_pool, tmp_path, monkeypatch):
    # A child's SIGINT would unwind into the caller's code (the calibrate command's cleanup
    # removes the media store the parent still uses); it is blocked there, never here.
    pool = _write(tmp_path / "pool.jsonl", [json.dumps(r) for r in _demo_records(demo_pool) * 20])

    def report_mask(self, *args):
        raise RuntimeError(f"SIGINT blocked: {signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])}")

    monkeypatch.setattr(split.SplitRead, "_read_part", report_mask)
    result = _read(pool, demo_pool.parent, tmp_path, 2)
    assert "(RuntimeError: SIGINT blocked: True)" in result.notes[0]
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


# --- JSON arrays (LLaMA-Factory's and LLaVA's files) ------------------------------------------------


def _array(path: Path, lines: list[str], style: str) -> Path:
    """The records of JSONL ``lines`` as a JSON array: indented as LLaMA-Factory's demo files
    (``json.dump(indent=2)``) or on one line as LLaVA's (``[{...}, {...}]``)."""
    records = [line for line in lines if line.strip() and not line.endswith("[")]  # no malformed JSON
    if style == "indented":
        text = json.dumps([json.loads(r) for r in records], indent=2)
    else:
        text = "[" + ", ".join(records) + "]"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


@pytest.mark.parametrize("style", ["indented", "one line"])
@pytest.mark.parametrize("workers", [2, 3])
def test_a_json_array_read_in_parts_gives_what_one_process_gives(demo_pool, tmp_path, style, workers):
    media = Media(tmp_path / "media")
    pool = _array(tmp_path / "pool.json", _mixed_lines(demo_pool, media), style)
    one = _snapshot(_read(pool, demo_pool.parent, tmp_path, 1, skip_invalid=True))
    assert len(split.array_part_bounds(pool, workers)) == workers  # the parts really are read apart
    assert _snapshot(_read(pool, demo_pool.parent, tmp_path, workers, skip_invalid=True)) == one
    assert one["duplicates"] and one["id_conflicts"] and len(one["skipped"]) >= 4
    lines = pool.read_bytes().count(b"\n")
    assert style == "one line" or max(line for _, line, _ in one["skipped"]) > lines // 2


def _tricky_records(demo_pool: Path, copies: int) -> list[dict]:
    """The demo pool's records, their texts full of what an array's parts are cut by: brackets,
    braces, commas, escaped quotes and backslashes, the separator of records itself; and nested
    objects that start as the records do (a cut there is inside a record)."""
    tricky = ['}, {"id": "x"}', '"]', "\\", ',\n  {\n    "id"', "[{", 'é中文 \\"q\\" ', '\\"}]']
    records = []
    for copy in range(copies):
        for i, record in enumerate(_demo_records(demo_pool)):
            record = {"id": f"{copy}-{i}", **{k: v for k, v in record.items() if k != "id"}}
            record["messages"][-1]["content"] += tricky[(copy + i) % len(tricky)] * (1 + i % 3)
            if i % 4 == 0:
                record["objects"] = [{"id": n, "note": tricky[n % len(tricky)]} for n in range(3)]
            records.append(record)
    return records


@pytest.mark.parametrize("chunk", [7, None])
def test_strings_with_brackets_and_cuts_inside_records_in_parts(demo_pool, tmp_path, monkeypatch, chunk):
    from quantkit.pool import jsonfile

    if chunk is not None:  # the decoding window's edges fall everywhere, strings included
        monkeypatch.setattr(jsonfile, "_CHUNK", chunk)
    records = _tricky_records(demo_pool, 4)
    for style in ("indented", "one line"):
        pool = tmp_path / f"{style}.json"
        pool.write_text(json.dumps(records, indent=2 if style == "indented" else None, ensure_ascii=False))
        # "objects" (ignored by the reader) hold {"id": ...} after ", ": cuts land inside records too
        one = _snapshot(_read(pool, demo_pool.parent, tmp_path, 1))
        assert one["sources"][0]["records"] == len(records)
        for workers in (2, 7):
            assert _snapshot(_read(pool, demo_pool.parent, tmp_path, workers)) == one, (style, workers)
        texts = [r.payload for r in _read(pool, demo_pool.parent, tmp_path, 3).records]
        assert sorted(json.loads(t)["messages"][-1]["content"] for t in texts) == sorted(
            r["messages"][-1]["content"] for r in records
        )


def test_a_cut_inside_a_record_is_read_here(demo_pool, tmp_path):
    records = _tricky_records(demo_pool, 6)
    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps(records, ensure_ascii=False))
    data = pool.read_bytes()
    starts = set()
    decoder, at = json.JSONDecoder(), 1
    text = data.decode()
    assert text.isascii() is False
    for _ in records:  # the records' byte offsets
        while text[at] in ", ":
            at += 1
        starts.add(len(text[:at].encode()))
        at = decoder.raw_decode(text, at)[1]
    cuts = [start for start, _ in split.array_part_bounds(pool, 12)[1:]]
    assert any(cut not in starts for cut in cuts) and any(cut in starts for cut in cuts)
    one = _snapshot(_read(pool, demo_pool.parent, tmp_path, 1))
    assert _snapshot(_read(pool, demo_pool.parent, tmp_path, 12)) == one


@pytest.mark.parametrize("where", ["first part", "last part"])
def test_a_malformed_array_names_the_line_whatever_the_parts(demo_pool, tmp_path, where):
    records = [json.dumps(r, indent=2) for r in _demo_records(demo_pool) * 4]
    bad = 3 if where == "first part" else len(records) - 3
    records[bad] = records[bad].replace('"messages": [', '"messages": [oops', 1)
    pool = tmp_path / "pool.json"
    pool.write_text("[\n" + ",\n".join(records) + "\n]\n")
    line = next(n for n, text in enumerate(pool.read_text().splitlines(), start=1) if "[oops" in text)
    for workers in (1, 3):
        for skip in (False, True):
            if skip:  # nothing after malformed JSON can be read: the records before it are kept
                result = _read(pool, demo_pool.parent, tmp_path, workers, skip_invalid=True)
                assert [(s.line, s.reason.split(" (byte")[0]) for s in result.skipped] == [
                    (line, "malformed JSON: expected a value")
                ]
                assert result.sources[0].records == bad
                continue
            with pytest.raises(InputError) as caught:
                _read(pool, demo_pool.parent, tmp_path, workers)
            assert caught.value.line == line and "malformed JSON" in str(caught.value)
    assert _children() == []


def test_a_json_array_reader_holds_a_window_not_the_file(tmp_path, monkeypatch):
    import tracemalloc

    from quantkit.pool import jsonfile

    monkeypatch.setattr(jsonfile, "_CHUNK", 64 << 10)
    turns = [{"role": "user", "content": "x" * 400}, {"role": "assistant", "content": "é" * 200}]
    record = {"messages": turns}
    pool = tmp_path / "big.json"
    pool.write_text(json.dumps([record] * 8000, indent=2, ensure_ascii=False))  # ~ 5 MB
    count = []
    tracemalloc.start()
    try:
        jsonfile.read_json_array(pool, lambda row, line, at: count.append(at), lambda *a: None, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(count) == 8000
    assert peak < pool.stat().st_size // 8, peak  # the whole file's text would be 1-2x its size


def test_calibration_sets_built_from_an_array_in_parts_are_the_same_bytes(demo_pool, tmp_path):
    media = Media(tmp_path / "media")
    lines = [line for line in _mixed_lines(demo_pool, media) if '"task"' in line]
    pool = _array(tmp_path / "pool.json", lines, "indented")
    outputs = _calibration_sets(pool, demo_pool, tmp_path, (1, 2, 3))
    assert outputs[0] == outputs[1] == outputs[2]
