"""Tasks for unlabelled records: precedence (field > --task > rules > --default-task), mappings by
file, glob, folder and dataset name, first-match-wins rules, the shipped rules on realistic
prompts in English and Chinese, the error for records left without a task, and the taxonomy's
rule schema."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from fixtures_pool import TWO_TIER_HEADER

from quantkit.errors import InputError
from quantkit.taskassign import TaskAssigner, TaskEvidence, UnknownTaskError, source_matches
from quantkit.taxonomy import load_taxonomy

IMAGE, VIDEO, AUDIO = frozenset({"image"}), frozenset({"video"}), frozenset({"audio"})
VIDEO_AUDIO, IMAGE_AUDIO, TEXT = frozenset({"video", "audio"}), frozenset({"image", "audio"}), frozenset()


def evidence(user: str, answer: str = "", media: frozenset[str] = TEXT, *, source: str = "pool/train.jsonl",
             dataset: str | None = None, task: str | None = None) -> TaskEvidence:  # fmt: skip
    return TaskEvidence(source, dataset, task, user, answer, media)


@pytest.fixture(scope="module")
def taxonomy():
    return load_taxonomy()


TWO_RULES = TWO_TIER_HEADER + """\
  - name: precise
    aliases: [exact]
    family: text
    modalities: [text]
    tier: high
    match:
      - {user: 'digit'}
      - {answer: '^\\d+$'}
  - name: casual
    family: text
    modalities: [text]
    tier: low
    match:
      - {user: 'digit|hello'}
  - name: looking
    family: image
    modalities: [image]
    tier: low
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "taxonomy.yaml"
    path.write_text(TWO_RULES)
    return load_taxonomy(path)


# --- precedence ---------------------------------------------------------------------------------


def test_precedence_field_then_mapping_then_rule_then_default(small):
    assigner = TaskAssigner(small, ["pool/mapped.jsonl=casual"], default_task="looking")
    # The field wins over a mapping and a rule that would both say otherwise.
    got = assigner.assign(evidence("Read digit 3.", source="pool/mapped.jsonl", task="exact"))
    assert (got.task, got.origin, got.detail) == ("precise", "field", "exact")
    # The mapping wins over a rule (which would say precise).
    got = assigner.assign(evidence("Read digit 3.", source="pool/mapped.jsonl"))
    assert (got.task, got.origin, got.detail) == ("casual", "mapping", "pool/mapped.jsonl")
    # The rule wins over the default.
    got = assigner.assign(evidence("Read digit 3."))
    assert (got.task, got.origin, got.detail) == ("precise", "rule", "precise.match[0]")
    # Nothing else: the default.
    got = assigner.assign(evidence("What is this?", media=IMAGE))
    assert (got.task, got.origin, got.detail) == ("looking", "default", "image")
    assert assigner.unassigned_error() is None
    summary = assigner.summary()
    assert summary["records"] == 4
    assert summary["tasks"]["precise"] == {"field": 1, "mapping": 0, "rule": 1, "default": 0, "total": 2}
    assert summary["tasks"]["casual"]["mapping"] == 1 and summary["tasks"]["looking"]["default"] == 1
    assert summary["default_tasks"] == [{"flag": "looking", "modality": "image", "task": "looking", "count": 1}]
    assert summary["mappings"] == [{"source": "pool/mapped.jsonl", "task": "casual", "count": 1}]


def test_rules_are_not_consulted_when_the_field_or_a_mapping_decides(small):
    assigner = TaskAssigner(small, ["mapped.jsonl=casual"])
    for i in range(1000):
        assigner.assign(evidence(f"digit {i}", task="precise"))
        assigner.assign(evidence(f"digit {i}", source="mapped.jsonl"))
    rules = assigner.summary()["rules"]
    assert [r["count"] for r in rules] == [0, 0, 0] and all(r["examples"] == [] for r in rules)


def test_unknown_field_value_names_the_close_matches(small, taxonomy):
    assigner = TaskAssigner(taxonomy)
    with pytest.raises(UnknownTaskError, match="unknown task 'orc'; did you mean 'ocr'"):
        assigner.assign(evidence("x", media=IMAGE, task="orc"))
    with pytest.raises(UnknownTaskError, match="did you mean 'ocr'"):
        assigner.assign(evidence("x", media=IMAGE, task="OCR"))
    with pytest.raises(UnknownTaskError, match="'asr'"):
        assigner.assign(evidence("x", media=AUDIO, task="asr_task"))
    with pytest.raises(UnknownTaskError, match="known tasks: precise, casual, looking"):
        TaskAssigner(small).assign(evidence("x", task="zzzzzz"))
    # An alias is accepted and reported under the task's name, with the spelling kept as detail.
    got = assigner.assign(evidence("x", media=IMAGE, task="fine_grained_ocr"))
    assert (got.task, got.origin, got.detail) == ("ocr", "field", "fine_grained_ocr")


# --- --task SOURCE=TASK -------------------------------------------------------------------------


def test_mapping_by_file_glob_folder_and_dataset_name(tmp_path, small, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ocr = "data/ocr_receipts.jsonl"
    assert source_matches("data/ocr_receipts.jsonl", ocr, None)
    assert source_matches("./data/ocr_receipts.jsonl", ocr, None)
    assert source_matches(str(tmp_path / ocr), ocr, None)  # absolute for a relative source
    assert source_matches("data/ocr_receipts.jsonl", str(tmp_path / ocr), None)  # and the other way
    assert source_matches("data/ocr_*.jsonl", ocr, None)
    assert source_matches("ocr_*.jsonl", ocr, None)  # a glob without "/" matches the file name
    assert source_matches("*.jsonl", ocr, None)
    assert source_matches("data", ocr, None) and source_matches("data/", ocr, None)  # a folder above
    assert not source_matches("dat", ocr, None)
    assert not source_matches("other/ocr_*.jsonl", ocr, None)
    assert not source_matches("ocr_*.json", ocr, None)
    # LLaMA-Factory dataset names, as `dataset: mllm_demo,identity` names them, and their globs.
    lf = "lf/data/mllm_demo.json"
    assert source_matches("mllm_demo", lf, "mllm_demo")
    assert source_matches("mllm_*", lf, "mllm_demo")
    assert not source_matches("identity", lf, "mllm_demo")

    assigner = TaskAssigner(small, ["mllm_*=looking", "data/ocr_*.jsonl=precise", "casual.jsonl=casual"])
    assert assigner.assign(evidence("x", source=lf, dataset="mllm_demo")).task == "looking"
    assert assigner.assign(evidence("x", source=ocr)).task == "precise"
    assert assigner.assign(evidence("x", source="more/casual.jsonl")).task == "casual"


def test_first_mapping_that_matches_wins(small):
    assigner = TaskAssigner(small, ["data/special.jsonl=casual", "data/*.jsonl=precise"])
    special = assigner.assign(evidence("x", source="data/special.jsonl"))
    other = assigner.assign(evidence("x", source="data/other.jsonl"))
    assert (special.task, special.detail) == ("casual", "data/special.jsonl")
    assert (other.task, other.detail) == ("precise", "data/*.jsonl")
    # The other order: the glob takes both.
    assigner = TaskAssigner(small, ["data/*.jsonl=precise", "data/special.jsonl=casual"])
    assert assigner.assign(evidence("x", source="data/special.jsonl")).task == "precise"


def test_bad_mappings_and_default_task_are_input_errors(small):
    with pytest.raises(InputError, match="--task 'ocr.jsonl': expected SOURCE=TASK") as err:
        TaskAssigner(small, ["ocr.jsonl"])
    assert "--task 'data/receipts_*.jsonl=ocr'" in err.value.hint
    for bad in ("=precise", "a.jsonl=", "a.jsonl= "):
        with pytest.raises(InputError, match="expected SOURCE=TASK"):
            TaskAssigner(small, [bad])
    with pytest.raises(InputError, match="unknown task 'precize'; did you mean 'precise'") as err:
        TaskAssigner(small, ["a.jsonl=precize"])
    assert err.value.exit_code == 2
    with pytest.raises(InputError, match="already mapped to 'precise'"):
        TaskAssigner(small, ["a.jsonl=precise", "a.jsonl=casual"])
    with pytest.raises(InputError, match="--default-task 'casul': unknown task; did you mean 'casual'"):
        TaskAssigner(small, default_task="casul")
    # A SOURCE may itself hold "=": the task is what follows the last one.
    assert (
        TaskAssigner(small, ["a=b.jsonl=casual"]).assign(evidence("x", source="a=b.jsonl")).task == "casual"
    )


# --- match rules --------------------------------------------------------------------------------


def test_first_rule_in_file_order_wins(small):
    assigner = TaskAssigner(small)
    # "digit" is matched by precise.match[0] and casual.match[0]: the first in the file wins.
    assert assigner.assign(evidence("one digit")).detail == "precise.match[0]"
    # Within a task, the rules are tried in order too.
    assert assigner.assign(evidence("say", "42")).detail == "precise.match[1]"
    assert assigner.assign(evidence("hello")).detail == "casual.match[0]"
    # Patterns ignore case.
    assert assigner.assign(evidence("HELLO")).task == "casual"


# Realistic unlabelled records: (user text, answer, media, the task they are).
MIXED = [
    # OCR, English and Chinese
    ("<image>Please read all the text on this product label.", "ORGANIC OAT MILK 1L", IMAGE, "ocr"),
    ("<image>What does the sign say?", "Closed on Mondays", IMAGE, "ocr"),
    ("<image>OCR this receipt.", "TOTAL 23.50", IMAGE, "ocr"),
    ("<image>What is the price shown on the tag?", "$19.99", IMAGE, "ocr"),
    ("<image>请识别图中的文字。", "限时特价 39.9元", IMAGE, "ocr"),
    ("<image>图片里写了什么？", "新品上市", IMAGE, "ocr"),
    ("<image>这件商品的价格是多少？", "价格是 129 元。", IMAGE, "ocr"),
    ("<image>提取图片中的所有文本", "买一送一", IMAGE, "ocr"),
    ("You are a careful reader.\n<image>Transcribe the text on the package.", "Net wt. 500 g", IMAGE, "ocr"),
    # Markdown tables: asked for, or given in the answer
    (
        "<image>Convert this table to Markdown.",
        "| item | price |\n|---|---|\n| tea | 3 |",
        IMAGE,
        "ocr_markdown",
    ),
    ("<image>OCR this document.", "Name | Qty\n--- | ---\nPen | 2", IMAGE, "ocr_markdown"),
    (
        "<image>把这张表格转换成Markdown格式",
        "| 商品 | 价格 |\n| :---: | ---: |\n| 茶 | 3 |",
        IMAGE,
        "ocr_markdown",
    ),
    ("<image>请将图中的文字整理成 markdown", "# 说明书\n- 每日一次", IMAGE, "ocr_markdown"),
    ("<image>Extract the document content.", "<table><tr><td>a</td></tr></table>", IMAGE, "ocr_markdown"),
    # Grounding, with each spelling of a box
    (
        "<image>Locate the red handbag.",
        "<|object_ref_start|>red handbag<|object_ref_end|><|box_start|>(120,45),(380,400)<|box_end|>",
        IMAGE,
        "visual_grounding",
    ),
    ("<image>Find the <ref-object>", "<bbox>", IMAGE, "visual_grounding"),
    (
        "<image>Where is the lipstick? Answer as [x1, y1, x2, y2].",
        "[112, 40, 250, 310]",
        IMAGE,
        "visual_grounding",
    ),
    (
        "<image>Detect the bottle.",
        '[{"bbox_2d": [10, 20, 200, 300], "label": "bottle"}]',
        IMAGE,
        "visual_grounding",
    ),
    ("<image>框出图中的口红", "<box>(10,20),(200,300)</box>", IMAGE, "visual_grounding"),
    ("<image>标注出商品在图中的位置", "[15, 30, 400, 500]", IMAGE, "visual_grounding"),
    (
        "<image>Read the text on the price tag and give its box.",
        "$9.99 at [10, 10, 50, 20]",
        IMAGE,
        "visual_grounding",
    ),
    # Captions
    ("<image>Describe this image in one sentence.", "A woman holds a bag.", IMAGE, "short_caption"),
    ("<image>Write a short caption for the photo.", "Shoes on a shelf.", IMAGE, "short_caption"),
    ("<image>What is in this picture?", "A cup of coffee.", IMAGE, "short_caption"),
    ("<image>用一句话描述这张图片。", "桌上有一杯咖啡。", IMAGE, "short_caption"),
    ("<image>这张图片里有什么？", "一只猫。", IMAGE, "short_caption"),
    # Temporal grounding
    (
        "<video>When does the host first show the blue dress?",
        "From 12.5s to 30s.",
        VIDEO,
        "temporal_grounding",
    ),
    (
        "<video>Give the start and end time of the unboxing.",
        "00:01:02 - 00:01:45",
        VIDEO,
        "temporal_grounding",
    ),
    ("<video>主播什么时候展示了口红？", "3秒到8秒", VIDEO, "temporal_grounding"),
    (
        "<video>At what time does the host mention the discount?",
        "At 00:02:10.",
        VIDEO_AUDIO,
        "temporal_grounding",
    ),
    ("<video>The moment the price appears?", "12.5s - 30s", VIDEO, "temporal_grounding"),
    # Product segmentation
    (
        "<video>Split this live stream into segments, one per product.",
        "0s-45s: lipstick\n45s-120s: blush",
        VIDEO,
        "product_segmentation",
    ),
    (
        "<video>请按商品对直播视频分段，并给出每个商品的起止时间。",
        "00:00-01:10 口红；01:10-03:00 腮红",
        VIDEO_AUDIO,
        "product_segmentation",
    ),
    # Selling points
    (
        "<video>What selling points does the host mention for this blender?",
        "Quiet motor, 5 speeds.",
        VIDEO_AUDIO,
        "selling_points",
    ),
    ("<video>总结主播介绍的这款面霜的卖点。", "保湿、不油腻。", VIDEO_AUDIO, "selling_points"),
    # Video captions
    ("<video>Describe the video briefly.", "A host unboxes a phone.", VIDEO, "video_caption"),
    ("<video>这个视频讲了什么？", "主播在试穿外套。", VIDEO, "video_caption"),
    # ASR, speakers
    ("<audio>Transcribe the audio.", "hello and welcome", AUDIO, "asr"),
    ("<audio>请将这段语音转写成文字。", "大家好", AUDIO, "asr"),
    (
        "Context: a live stream selling cosmetics.\n<audio>What does the speaker say?",
        "this serum",
        AUDIO,
        "asr",
    ),
    ("<audio>语音识别：", "欢迎来到直播间", AUDIO, "asr"),
    (
        "<audio>Separate the speakers and transcribe what each one says.",
        "A: hi\nB: hello",
        AUDIO,
        "speaker_separation",
    ),
    ("<audio>区分说话人，并写出每个人说的话。", "甲：你好\n乙：你好", AUDIO, "speaker_separation"),
    # A spoken question about a picture
    ("<image><audio>", "It costs 99 yuan.", IMAGE_AUDIO, "audio_image_qa"),
    # Text chat, tool calls included
    ("Write a haiku about autumn.", "Leaves fall...", TEXT, "text_chat"),
    (
        "You are a helpful assistant.\nWhat's the weather in Paris?",
        '{"name": "get_weather"}',
        TEXT,
        "text_chat",
    ),
    ("你好，请介绍一下你自己。", "我是一个助手。", TEXT, "text_chat"),
]


@pytest.mark.parametrize(
    ("user", "answer", "media", "task"), MIXED, ids=[f"{row[3]}-{i}" for i, row in enumerate(MIXED)]
)
def test_shipped_rules_recognise_realistic_prompts(taxonomy, user, answer, media, task):
    got = TaskAssigner(taxonomy).assign(evidence(user, answer, media))
    assert got.task == task, (got, user)
    assert got.origin == "rule" and got.detail.startswith(f"{task}.match[")


def test_mixed_unlabelled_pool_summary_names_each_rule_with_examples(taxonomy):
    assigner = TaskAssigner(taxonomy)
    for user, answer, media, _ in MIXED:
        assigner.assign(evidence(user, answer, media))
    assigner.assign(evidence("<image>What colour is the bag? " + "very " * 60, "red", IMAGE))
    summary = json.loads(json.dumps(assigner.summary()))  # JSON-able
    assert summary["records"] == len(MIXED) + 1
    expected = {}
    for *_, task in MIXED:
        expected[task] = expected.get(task, 0) + 1
    assert {name: row["rule"] for name, row in summary["tasks"].items()} == expected
    rules = {rule["rule"]: rule for rule in summary["rules"]}
    assert {r.split(".")[0] for r, rule in rules.items() if rule["count"]} == set(expected)
    ocr = rules["ocr.match[0]"]
    assert ocr["count"] == 9 and ocr["examples"] == [
        "<image>Please read all the text on this product label.",
        "<image>What does the sign say?",
    ]
    assert ocr["description"] and "media image" in ocr["conditions"]
    assert summary["unassigned"]["count"] == 1
    (row,) = summary["unassigned"]["by_source"]
    assert row["source"] == "pool/train.jsonl" and row["count"] == 1 and len(row["example"]) <= 125


def test_every_shipped_task_has_a_rule(taxonomy):
    assert all(task.match for task in taxonomy.tasks)


# --- records left without a task ----------------------------------------------------------------


def test_unassigned_error_lists_each_source_with_the_flag(small):
    assigner = TaskAssigner(small)
    for _ in range(3):
        assigner.assign(evidence("<image>what?", media=IMAGE, source="data/photos.jsonl"))
    assigner.assign(evidence("nothing", source="lf/data/chat_demo.json", dataset="chat_demo"))
    assigner.assign(evidence("one digit", source="data/photos.jsonl"))  # a rule takes this one
    err = assigner.unassigned_error()
    assert isinstance(err, InputError) and err.exit_code == 2
    text = str(err)
    assert "4 record(s) have no task" in text
    # Only one task fits image records here: the flag is complete.
    assert "data/photos.jsonl: 3 record(s) (image)" in text and "--task 'data/photos.jsonl=looking'" in text
    # A dataset read through dataset_info.json is named by its dataset name.
    assert "dataset chat_demo (lf/data/chat_demo.json): 1 record(s) (text)" in text
    assert "--task 'chat_demo=TASK' with TASK one of precise, casual" in text
    assert "--default-task 'MODALITY=TASK'" in err.hint
    assert "image: --default-task 'image=looking'" in text
    unassigned = assigner.summary()["unassigned"]
    assert [(r["source"], r["count"]) for r in unassigned["by_source"]] == [
        ("data/photos.jsonl", 3),
        ("lf/data/chat_demo.json", 1),
    ]
    # With a default task, nothing is left.
    assigner = TaskAssigner(small, default_task="casual")
    assigner.assign(evidence("nothing"))
    assert assigner.unassigned_error() is None


def test_flag_is_quoted_for_the_shell(small):
    assigner = TaskAssigner(small)
    assigner.assign(evidence("<image>?", media=IMAGE, source="my data/it's.jsonl"))
    assert "--task 'my data/it'\"'\"'s.jsonl=looking'" in str(assigner.unassigned_error())


# --- the taxonomy's schema ----------------------------------------------------------------------


def _taxonomy_file(tmp_path: Path, task_yaml: str) -> Path:
    head = TWO_RULES.split("tasks:")[0]
    path = tmp_path / "custom_taxonomy.yaml"
    path.write_text(head + "tasks:\n" + textwrap.indent(textwrap.dedent(task_yaml), "  "))
    return path


@pytest.mark.parametrize(
    ("task_yaml", "line", "message"),
    [
        (  # issue 19: a misspelled key is named, with the closest valid one; not "Field required"
            "- name: a\n  family: text\n  modalities: [text]\n  teir: high\n",
            12,
            "field 'tasks.0.teir': unknown key 'teir'; did you mean 'tier'?",
        ),
        (
            "- name: a\n  family: text\n  modalities: [text]\n  tier: high\n  match:\n    - {usr: hi}\n",
            14,
            "field 'tasks.0.match.0.usr': unknown key 'usr'; did you mean 'user'?",
        ),
        (
            "- name: a\n  family: text\n  modalities: [text]\n  tier: high\n  match:\n    - {user: '(unclosed'}\n",
            14,
            "not a valid regular expression: '(unclosed'",
        ),
        (
            "- name: a\n  family: text\n  modalities: [text]\n  tier: high\n  match:\n    - {description: x}\n",
            14,
            "a match rule needs at least one condition",
        ),
        (
            "- name: a\n  family: text\n  modalities: [text]\n  tier: high\n  match:\n    - {media: [image]}\n",
            9,
            "match[0] of task 'a' requires media ['image']",
        ),
        (
            "- name: a\n  family: image\n  modalities: [image]\n  tier: high\n  match:\n"
            "    - {media: [image], unless_media: [image]}\n",
            14,
            "both required and excluded",
        ),
        (
            "- name: a\n  family: image\n  modalities: [image]\n  tier: high\n  match:\n    - {media: [picture]}\n",
            14,
            "field 'tasks.0.match.0.media.0'",
        ),
    ],
    ids=["teir", "usr", "regex", "empty-rule", "media-vs-modalities", "media-excluded", "media-kind"],
)
def test_taxonomy_rule_errors_name_the_file_line_and_key(tmp_path, task_yaml, line, message):
    path = _taxonomy_file(tmp_path, task_yaml)
    with pytest.raises(InputError) as err:
        load_taxonomy(path)
    text = str(err.value)
    assert message in text and "Field required" not in text
    assert err.value.location() == f"{path}:{line}", text


def test_top_level_key_misspelled(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(TWO_RULES.replace("tiers:", "teirs:"))
    with pytest.raises(InputError, match="unknown key 'teirs'; did you mean 'tiers'") as err:
        load_taxonomy(path)
    assert err.value.location() == f"{path}:2" and "Field required" not in str(err.value)


def test_pattern_lists_combine_through_yaml_anchors(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        TWO_RULES.split("tasks:")[0]
        + "patterns:\n  greet: &greet ['hello', 'bonjour']\n"
        + "tasks:\n  - name: a\n    family: text\n    modalities: [text]\n    tier: high\n"
        + "    match: [{user: [*greet, 'salut'], unless_user: 'bye'}]\n"
    )
    assigner = TaskAssigner(load_taxonomy(path))
    assert [assigner.assign(evidence(u)).task for u in ("Bonjour!", "salut", "hello, bye", "hey")] == [
        "a", "a", None, None,
    ]  # fmt: skip


def test_patterns_ignore_case_however_they_are_written(tmp_path):
    """Patterns are joined and searched in the lowered text for speed; capitals, (?-i:...), a global
    flag or a backreference keep their meaning."""
    path = tmp_path / "t.yaml"
    rule = "{user: ['OCR[0-9]', '(?-i:Hello)', '(ab)\\1', 'plain'], answer: ['(?m)^done$']}"
    path.write_text(
        TWO_RULES.split("tasks:")[0]
        + f"tasks:\n  - {{name: a, family: text, modalities: [text], tier: high, match: [{rule}]}}\n"
    )
    assigner = TaskAssigner(load_taxonomy(path))
    cases = {
        ("see ocr7", "x\ndone"): "a",
        ("say Hello", "DONE"): "a",
        ("say hello", "done"): None,  # (?-i:...) is case-sensitive
        ("ABAB", "done"): "a",
        ("abba", "done"): None,
        ("PLAIN", "done"): "a",
        ("plain", "not done"): None,
    }
    assert {key: assigner.assign(evidence(*key)).task for key in cases} == cases


def test_assigner_gives_what_the_rules_say_one_by_one(taxonomy):
    """The assigner shares searches between rules; the plain reading of the rules agrees."""
    assigner = TaskAssigner(taxonomy)
    for user, answer, media, _ in MIXED:
        plain = next(
            (
                f"{task.name}.match[{i}]"
                for task in taxonomy.tasks
                for i, rule in enumerate(task.match)
                if rule.fits_media(media) and rule.text_matches(user, answer)
            ),
            "",
        )
        assert assigner.assign(evidence(user, answer, media)).detail == plain


# --- the report ---------------------------------------------------------------------------------


def test_report_says_how_each_task_was_assigned(tmp_path, taxonomy):
    from quantkit.calibset.report import summarize, write_report_markdown
    from quantkit.pool import PoolReadResult

    assigner = TaskAssigner(taxonomy, ["pool/labelled_*.jsonl=ocr"], default_task="short_caption")
    for user, answer, media, _ in MIXED:
        assigner.assign(evidence(user, answer, media))
    assigner.assign(evidence("<image>What colour is the bag?", "red", IMAGE))  # -> the default
    assigner.assign(evidence("<image>x", "y", IMAGE, source="pool/labelled_1.jsonl"))  # -> the mapping
    assigner.assign(evidence("<audio>x", "y", AUDIO, task="contextual_asr"))  # -> the field
    summary = assigner.summary()
    report = summarize(
        taxonomy=taxonomy,
        pool=PoolReadResult(records=[], skipped=[], duplicates=0, inputs={}, modality_mismatches={}),
        usable=[],
        selected=[],
        tokens=None,
        too_long=[],
        task_assignment=summary,
    )
    assert json.loads(json.dumps(report))["task_assignment"] == summary
    report.update(
        size=0, size_requested=0, seed=0, samples_file="samples.jsonl", samples_sha256="0" * 64, notes=[]
    )
    write_report_markdown(report, tmp_path / "report.md")
    text = (tmp_path / "report.md").read_text()
    section = text.split("## How tasks were assigned")[1].split("\n## ")[0]
    assert "| ocr | 0 | 1 | 9 | 0 | 10 |" in section
    assert "| asr | 1 | 0 | 4 | 0 | 5 |" in section
    assert "| short_caption | 0 | 0 | 5 | 1 | 6 |" in section
    assert "- `pool/labelled_*.jsonl=ocr`: 1 record(s)" in section
    assert "- image -> short_caption: 1 record(s) (`--default-task short_caption`)" in section
    # Every rule that took records is named, with two of their prompts (placeholders visible).
    for rule in summary["rules"]:
        if rule["count"]:
            assert f"**{rule['rule']}** -> {rule['task']}, {rule['count']} record(s)" in section
            assert len(rule["examples"]) == min(2, rule["count"])
            for example in rule["examples"]:
                assert f"  - `{example}`" in section
    assert "- **ocr.match[0]** -> ocr, 9 record(s): a request to read the text" in section
    assert "  - `<image>Please read all the text on this product label.`" in section
    assert "Rules that matched no record: " in section
    # Without the summary (a set built before this existed) there is no section.
    report["task_assignment"] = None
    write_report_markdown(report, tmp_path / "old.md")
    assert "How tasks were assigned" not in (tmp_path / "old.md").read_text()


# --- through `calibrate`, once the pool reader calls the assigner (branch pool-formats) ------------


def _wired() -> bool:
    import dataclasses

    from quantkit.calibset import CalibrateOptions

    return "task_mappings" in {f.name for f in dataclasses.fields(CalibrateOptions)}


@pytest.fixture
def unlabelled_pool(tmp_path) -> Path:
    """MIXED as a JSONL pool without task fields, each record with real media of its kinds."""
    import numpy as np
    from PIL import Image

    from quantkit.media import write_mp4
    from quantkit.synthetic.media import write_wav

    root = tmp_path / "pool"
    (root / "media").mkdir(parents=True)
    lines = []
    for i, (user, answer, media, _) in enumerate(MIXED):
        record = {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}
        if "image" in media:
            Image.new("RGB", (64 + i, 48), (i * 5 % 255, 90, 30)).save(root / f"media/i{i}.png")
            record["images"] = [f"media/i{i}.png"]
        if "video" in media:
            frames = (np.full((48, 64, 3), (i * 11 + k * 37) % 255, np.uint8) for k in range(4))
            write_mp4(root / f"media/v{i}.mp4", frames, (64, 48), 2)
            record["videos"] = [f"media/v{i}.mp4"]
        if "audio" in media and "video" not in media:
            t = np.arange(16000) / 16000
            write_wav(root / f"media/a{i}.wav", 0.2 * np.sin(2 * np.pi * (200 + i) * t))
            record["audios"] = [f"media/a{i}.wav"]
        lines.append(json.dumps(record, ensure_ascii=False))
    path = root / "unlabelled.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_calibrate_stratifies_an_unlabelled_pool_by_the_rules(tmp_path, unlabelled_pool):
    if not _wired():
        pytest.skip("the pool reader does not call TaskAssigner yet (CalibrateOptions.task_mappings comes "
                    "with branch pool-formats)")  # fmt: skip
    from quantkit.calibset import CalibrateOptions, build_calibration_set, load_calibration_set

    out = tmp_path / "set"
    result = build_calibration_set(
        [unlabelled_pool], out, CalibrateOptions(size=len(MIXED), min_per_stratum=1)
    )
    expected = {user: task for user, _, _, task in MIXED}
    rows = load_calibration_set(out)
    assert len(rows) > 0
    for row in rows:
        user = next(m["content"] for m in row["messages"] if m["role"] == "user")
        assert row["task"] == expected[user], user
    assignment = result.report["task_assignment"]
    assert {t: r["rule"] for t, r in assignment["tasks"].items()} == {
        task: sum(1 for *_, t in MIXED if t == task) for task in expected.values()
    }
    text = (out / "report.md").read_text()
    for rule in assignment["rules"]:
        if rule["count"]:
            assert f"**{rule['rule']}** -> {rule['task']}" in text


def test_cli_names_a_misspelled_taxonomy_key(tmp_path):
    """Issue 19: `teir` is reported by name with the closest key and the file, exit 2, no traceback."""
    from typer.testing import CliRunner

    from quantkit.cli import app

    bad = _taxonomy_file(tmp_path, "- name: a\n  family: text\n  modalities: [text]\n  teir: high\n")
    pool = tmp_path / "pool.jsonl"
    pool.write_text(json.dumps({"task": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    result = CliRunner().invoke(
        app, ["calibrate", str(pool), "--output", str(tmp_path / "o"), "--taxonomy", str(bad)]
    )
    assert result.exit_code == 2, result.output
    assert f"{bad}:12" in result.output and "unknown key 'teir'; did you mean 'tier'?" in result.output
    assert "Field required" not in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()
