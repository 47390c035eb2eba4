"""The taxonomy's `match` rules on the requests users write (tests/data/task_rules.yaml), read as
pool records through the real reader: precision and recall per task, printed, with floors; the
everyday words that once sent records to precision tasks ("table", "detect", a tool schema's
"X-coordinate") take none; `--default-task MODALITY=TASK` gives a task only the modalities it
lists; a record whose videos carry sound in any of them is video+audio."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from fixtures_pool import Media, write_jsonl

from quantkit.errors import InputError
from quantkit.pool import read_pool
from quantkit.taskassign import TaskAssigner
from quantkit.taxonomy import load_taxonomy

CASES = yaml.safe_load((Path(__file__).parent / "data" / "task_rules.yaml").read_text(encoding="utf-8"))
PRECISION_FLOOR = 0.9  # per task: of the records a task's rules took, the share that are that task
RECALL_FLOOR = 0.85  # per task: of the records of a task, the share its rules took
NONE = "none"


def _media_fields(media: Media, modality: str) -> tuple[str, dict]:
    """The placeholders and media lists of a record of ``modality``, with files written here."""
    if modality == "text":
        return "", {}
    if modality == "image":
        return "<image>", {"images": [media.image()]}
    if modality == "multi-image":
        return "<image><image>", {"images": [media.image(), media.image()]}
    if modality == "video":
        return "<video>", {"videos": [media.video()]}
    if modality == "video+audio":
        return "<video>", {"videos": [media.video(sound=True)]}
    if modality == "audio":
        return "<audio>", {"audios": [media.audio()]}
    if modality == "image+audio":
        return "<image><audio>", {"images": [media.image()], "audios": [media.audio()]}
    raise ValueError(modality)


def _record(number: int, case: dict, media: Media) -> dict:
    placeholders, fields = _media_fields(media, case["media"])
    messages = [{"role": "system", "content": case["system"]}] if "system" in case else []
    messages += [
        {"role": "user", "content": placeholders + case["prompt"]},
        {"role": "assistant", "content": case.get("answer", "Sure.")},
    ]
    return {"id": f"case-{number}", "messages": messages, **fields}


def _assigned(tmp_path: Path, records: list[dict], **assigner_options) -> tuple[dict[str, str], object]:
    """Each record's task as the pool reader gives it (NONE where nothing assigns one)."""
    taxonomy = load_taxonomy()
    pool = write_jsonl(tmp_path / "pool.jsonl", records)
    assigner = TaskAssigner(taxonomy, **assigner_options)
    result = read_pool([pool], taxonomy, media_roots=(tmp_path / "media",), assigner=assigner, workers=1)
    index = result.index
    got = {index.record_id(n): index.groups[index.group[n]].task for n in range(len(index.group))}
    return {r["id"]: got.get(r["id"], NONE) for r in records}, (result, assigner)


@pytest.fixture(scope="module")
def rule_results(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("rules")
    media = Media(tmp_path / "media")
    records = [_record(n, case, media) for n, case in enumerate(CASES)]
    got, _ = _assigned(tmp_path, records)
    return [(case, got[f"case-{n}"]) for n, case in enumerate(CASES)]


def _scores(results) -> dict[str, tuple[int, int, int]]:
    """task -> (true positives, records the rules gave it, records of it)."""
    tasks = sorted({case["task"] for case, _ in results} | {got for _, got in results})
    hits = Counter(case["task"] for case, got in results if got == case["task"])
    given = Counter(got for _, got in results)
    expected = Counter(case["task"] for case, _ in results)
    return {task: (hits[task], given[task], expected[task]) for task in tasks}


def test_the_rule_set_is_big_and_covers_every_task_and_modality():
    taxonomy = load_taxonomy()
    assert len(CASES) >= 150
    assert {case["task"] for case in CASES} == {task.name for task in taxonomy.tasks} | {NONE}
    assert {case["media"] for case in CASES} >= {
        "image",
        "multi-image",
        "video",
        "video+audio",
        "audio",
        "image+audio",
        "text",
    }
    chinese = [case for case in CASES if any("\u4e00" <= ch <= "\u9fff" for ch in case["prompt"])]
    assert len(chinese) >= 30


def test_precision_and_recall_per_task(rule_results, capsys):
    scores = _scores(rule_results)
    lines = [f"{'task':<22} {'precision':>9} {'recall':>7} {'taken':>6} {'cases':>6}"]
    for task, (hits, given, expected) in scores.items():
        precision = hits / given if given else 1.0
        recall = hits / expected if expected else 1.0
        lines.append(f"{task:<22} {precision:>9.2f} {recall:>7.2f} {given:>6} {expected:>6}")
    wrong = [f"  {case['prompt']!r} ({case['media']}): expected {case['task']}, got {got}"
             for case, got in rule_results if got != case["task"]]  # fmt: skip
    with capsys.disabled():
        print("\n" + "\n".join(lines + ["wrong:", *wrong] if wrong else lines))
    low = [
        f"{task}: precision {hits}/{given}, recall {hits}/{expected}"
        for task, (hits, given, expected) in scores.items()
        if (given and hits / given < PRECISION_FLOOR) or (expected and hits / expected < RECALL_FLOOR)
    ]
    assert not low, "\n".join(low + wrong)


@pytest.mark.parametrize(
    "prompt",
    [
        "What is on the table?",
        "Is there a dining table in the picture?",
        "Can you detect any damage on the car?",
    ],
)
def test_everyday_words_take_no_precision_task(rule_results, prompt):
    (got,) = [got for case, got in rule_results if case["prompt"] == prompt]
    assert got == NONE


def test_a_tool_schema_in_the_system_turn_is_not_the_request(rule_results):
    (got,) = [got for case, got in rule_results if "X-coordinate" in case.get("system", "")]
    assert got == NONE  # it was visual_grounding when the system text was searched


def test_tool_definitions_of_a_tools_field_are_not_the_request(tmp_path):
    media = Media(tmp_path / "media")
    tools = [
        {
            "name": "tap",
            "description": "Tap the screen",
            "parameters": {"x": {"description": "X-coordinate in pixels"}},
        }
    ]
    record = {
        "id": "agent",
        "tools": json.dumps(tools),
        "messages": [
            {"role": "user", "content": "<image>Turn on dark mode."},
            {"role": "assistant", "content": '{"name": "tap", "arguments": {"x": 80, "y": 300}}'},
        ],
        "images": [media.image()],
    }
    got, _ = _assigned(tmp_path, [record])
    assert got == {"agent": NONE}


# --- --default-task MODALITY=TASK -------------------------------------------------------------------


def _unlabelled(media: Media) -> list[dict]:
    """Records no rule takes, one per modality."""
    records = []
    for n, modality in enumerate(["image", "image", "video", "video+audio", "audio", "text", "multi-image"]):
        placeholders, fields = _media_fields(media, modality)
        content = placeholders + ("zq?" if modality != "text" else "")
        if modality == "text":
            continue  # the text rule takes every text record
        records.append({"id": f"{modality}-{n}", "messages": [
            {"role": "user", "content": content}, {"role": "assistant", "content": "ok"}], **fields})  # fmt: skip
    return records


def test_a_plain_default_task_takes_only_the_modalities_it_lists(tmp_path):
    records = _unlabelled(Media(tmp_path / "media"))
    got, (_, assigner) = _assigned(tmp_path, records, default_task="short_caption")
    assert got == {
        "image-0": "short_caption", "image-1": "short_caption", "video-2": NONE, "video+audio-3": NONE,
        "audio-4": NONE, "multi-image-6": NONE,
    }  # fmt: skip
    # video, audio and multi-image records are left, and the error says how to give them a task
    text = str(assigner.unassigned_error())
    assert (
        "video: --default-task 'video=TASK' with TASK one of temporal_grounding, product_segmentation" in text
    )
    assert "audio: --default-task 'audio=TASK' with TASK one of asr, speaker_separation" in text
    assert "video+audio: --default-task 'video+audio=TASK' with TASK one of" in text
    assert "multi-image: --default-task 'multi-image=TASK' with TASK one of ocr, visual_grounding" in text
    assert "\n  image:" not in text.split("per modality")[1]


def test_default_tasks_per_modality_and_the_report_counts_each(tmp_path):
    records = _unlabelled(Media(tmp_path / "media"))
    defaults = [
        "short_caption",
        "video=video_caption",
        "video+audio=selling_points",
        "audio=asr",
        "multi-image=ocr",
    ]
    got, (result, assigner) = _assigned(tmp_path, records, default_task=defaults)
    assert got == {
        "image-0": "short_caption", "image-1": "short_caption", "video-2": "video_caption",
        "video+audio-3": "selling_points", "audio-4": "asr", "multi-image-6": "ocr",
    }  # fmt: skip
    rows = result.task_assignment["default_tasks"]
    assert {(r["flag"], r["modality"], r["task"], r["count"]) for r in rows} == {
        ("short_caption", "image", "short_caption", 2),
        ("video=video_caption", "video", "video_caption", 1),
        ("video+audio=selling_points", "video+audio", "selling_points", 1),
        ("audio=asr", "audio", "asr", 1),
        ("multi-image=ocr", "multi-image", "ocr", 1),
    }
    section = _report_text(tmp_path, result)
    assert "- image -> short_caption: 2 record(s) (`--default-task short_caption`)" in section
    assert (
        "- video+audio -> selling_points: 1 record(s) (`--default-task video+audio=selling_points`)"
        in section
    )


def _report_text(tmp_path: Path, result) -> str:
    from quantkit.calibset.report import summarize, write_report_markdown

    taxonomy = load_taxonomy()
    report = summarize(taxonomy=taxonomy, pool=result, usable=[], selected=[], tokens=None, too_long=[],
                       task_assignment=result.task_assignment)  # fmt: skip
    report.update(
        size=0, size_requested=0, seed=0, samples_file="samples.jsonl", samples_sha256="0" * 64, notes=[]
    )
    write_report_markdown(report, tmp_path / "report.md")
    return (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["video=short_caption"], "task 'short_caption' takes image records, not video"),
        (["sound=asr"], "unknown modality 'sound'"),
        (["image=no_such_task"], "unknown task 'no_such_task'"),
        (["ocr", "visual_grounding"], "image records already go to 'ocr'"),
        (["image=ocr", "image=short_caption"], "image records already go to 'ocr'"),
        (["=ocr"], "expected MODALITY=TASK or TASK"),
    ],
)
def test_bad_default_tasks_are_input_errors(values, message):
    with pytest.raises(InputError, match=message):
        TaskAssigner(load_taxonomy(), default_task=values)


def test_an_explicit_modality_wins_over_a_plain_default():
    assigner = TaskAssigner(load_taxonomy(), default_task=["ocr", "image=short_caption"])
    rows = {(r["modality"], r["task"]) for r in assigner.summary()["default_tasks"]}
    assert rows == {("image", "short_caption"), ("multi-image", "ocr")}


def test_sound_in_any_video_makes_the_record_video_and_audio(tmp_path):
    media = Media(tmp_path / "media")
    record = {
        "id": "two-videos", "task": "selling_points", "videos": [media.video(), media.video(sound=True)],
        "messages": [{"role": "user", "content": "<video><video>Compare."}, {"role": "assistant", "content": "ok"}],
    }  # fmt: skip
    pool = write_jsonl(tmp_path / "pool.jsonl", [record])
    result = read_pool([pool], load_taxonomy(), media_roots=(tmp_path / "media",), workers=1)
    assert [g.modality for g in result.index.groups] == ["video+audio"]
