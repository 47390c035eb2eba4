"""What the pool reader's shortcuts must leave as it was: progress counts every byte, repeated
turn texts give the same JSON, duplicates are found across spellings, records read again equal
the records read first."""

from __future__ import annotations

import json

from quantkit.pool import parse, read_pool
from quantkit.taxonomy import load_taxonomy

SYSTEM = "You are a helpful shop assistant. Answer in one sentence: «short»."


def _record(i: int, *, sharegpt: bool = False, system: str = SYSTEM) -> dict:
    turns = [("system", system), ("user", f"Question {i % 50}?"), ("assistant", f"Answer {i % 50}.")]
    if sharegpt:
        back = {"system": "system", "user": "human", "assistant": "gpt"}
        return {"task": "text_chat", "conversations": [{"from": back[r], "value": t} for r, t in turns]}
    return {"task": "text_chat", "messages": [{"role": r, "content": t} for r, t in turns]}


def _write(path, records, blank_every: int = 0) -> None:
    lines = []
    for i, record in enumerate(records):
        lines.append(json.dumps(record, ensure_ascii=False))
        if blank_every and i % blank_every == 0:
            lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_progress_counts_every_byte_of_a_pool_longer_than_one_step(tmp_path):
    pool = tmp_path / "pool.jsonl"
    _write(pool, [_record(i) for i in range(1000)], blank_every=7)
    seen: list[int] = []
    read_pool([pool], load_taxonomy(), on_bytes=seen.append)
    assert sum(seen) == pool.stat().st_size
    assert all(n > 0 for n in seen)


def test_repeated_turn_texts_give_the_json_json_dumps_gives(tmp_path, monkeypatch):
    # A kept-texts table far smaller than the pool's distinct texts: it empties and fills again.
    monkeypatch.setattr(parse, "_TEXTS_KEPT", 8)
    records = [
        _record(i, sharegpt=i % 3 == 0, system=SYSTEM if i % 2 else f"{SYSTEM} {i}") for i in range(300)
    ]
    pool = tmp_path / "pool.jsonl"
    _write(pool, records)
    result = read_pool([pool], load_taxonomy())
    read = list(result.records)
    assert len(read) == len(records) - result.duplicates
    for record in read:
        original = records[record.line - 1]
        turns = original.get("messages") or [
            {"role": {"human": "user", "gpt": "assistant"}.get(t["from"], t["from"]), "content": t["value"]}
            for t in original["conversations"]
        ]
        assert record.text_key == json.dumps(turns, sort_keys=True, ensure_ascii=False)


def test_duplicates_are_found_across_spellings_and_records_read_again_are_equal(tmp_path):
    # The same 50 conversations, each in both spellings: every second copy is a duplicate.
    records = [_record(i, sharegpt=i >= 50) for i in range(100)]
    pool = tmp_path / "pool.jsonl"
    _write(pool, records)
    result = read_pool([pool], load_taxonomy())
    assert result.duplicates == 50
    first = list(result.records)
    again = list(result.records)  # read again through the shared caches
    assert [r.payload for r in again] == [r.payload for r in first]
    assert len({r.text_key for r in first}) == 50


def test_texts_holding_a_nul_are_told_apart_from_the_turns_they_spell(tmp_path):
    # The text digest's input joins turn marks and texts with NULs: a text holding NULs and marks
    # spells the same input as more turns, so such a record is digested by its JSON instead.
    mark = parse._ROLE_MARK
    three = _record(1)
    two = {
        "task": "text_chat",
        "messages": [
            {"role": "system", "content": f"{SYSTEM}\x00{mark['user']}\x00Question 1?"},
            {"role": "assistant", "content": "Answer 1."},
        ],
    }
    two_sharegpt = {
        "task": "text_chat",
        "conversations": [{"from": {"assistant": "gpt"}.get(t["role"], t["role"]), "value": t["content"]}
                          for t in two["messages"]],
    }  # fmt: skip
    # The same turns again through normalize(): a field the fast path does not take.
    three_mapped = {**_record(1), "meta": {"origin": "elsewhere"}}
    pool = tmp_path / "pool.jsonl"
    _write(pool, [three, two, two_sharegpt, three_mapped])
    result = read_pool([pool], load_taxonomy())
    assert result.duplicates == 2
    assert sorted(r.line for r in result.records) == [1, 2]


def _labelled_sources(tmp_path, sources: int) -> list:
    """Sources mixing records whose task field names a task (by name or alias) with records that
    have none (the rules or --default-task decide those)."""
    chat = next(task for task in load_taxonomy().tasks if task.name == "text_chat")
    spellings = ["text_chat", *chat.aliases]
    paths = []
    for s in range(sources):
        records = []
        for i in range(6):
            record = _record(s * 6 + i)
            if i % 3 == 2:
                del record["task"]
            else:
                record["task"] = spellings[(s + i) % len(spellings)]
            records.append(record)
        path = tmp_path / f"part{s:03d}.jsonl"
        _write(path, records)
        paths.append(path)
    return paths


def test_task_summary_equals_assigning_each_record_over_several_sources(tmp_path):
    # The reader counts records whose field names a task in the assigner's tally rather than
    # calling assign(); the summary must be what assign() per record gives.
    from quantkit.taskassign import TaskAssigner, TaskEvidence

    taxonomy = load_taxonomy()
    paths = _labelled_sources(tmp_path, 5)
    read_assigner = TaskAssigner(taxonomy, (), "text_chat")
    read_pool([str(p) for p in paths], taxonomy, assigner=read_assigner)
    expected = TaskAssigner(taxonomy, (), "text_chat")
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            turns = record["messages"]
            # the request the rules see: the user's turns (not the system turn), joined by newlines
            prompt = "\n".join(turn["content"] for turn in turns if turn["role"] == "user")
            expected.assign(TaskEvidence(str(path), None, record.get("task"), prompt, turns[-1]["content"], frozenset()))
    summary = read_assigner.summary()
    assert summary == expected.summary()
    chat = summary["tasks"]["text_chat"]
    assert 0 < chat["field"] < chat["total"] == summary["records"]  # both paths were taken


def test_summary_folds_one_tally_however_many_sources(tmp_path):
    from quantkit.taskassign import TaskAssigner

    taxonomy = load_taxonomy()
    folded = []
    for sources in (1, 12):
        assigner = TaskAssigner(taxonomy, (), "text_chat")
        (tmp_path / str(sources)).mkdir()
        paths = _labelled_sources(tmp_path / str(sources), sources)
        read_pool([str(p) for p in paths], taxonomy, assigner=assigner)
        assigner.summary()
        folded.append(assigner.tallies_folded)
    assert folded[0] == folded[1]
