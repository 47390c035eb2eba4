"""More of the layouts people fine-tune omni models with, read unchanged, and nothing dropped in
silence (issue 37): each framework's media-folder convention, videos given as frames, preference
data, TRL, The Cauldron, axolotl, MiniCPM-V, GLM-4V, lmms-finetune, CSV through dataset_info.json,
grounding points; fields no reader uses are listed per source, and media in one are an error.

Records are written from each format's documentation, media generated here."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from fixtures_pool import Media, write_json, write_jsonl
from test_pool_formats import by_text, calibrate

from quantkit.calibset import CalibrateOptions, build_calibration_set


def dry_run(*pools: Path, **options) -> dict:
    """The dry run's per-source rows by name (its verdict must be a pass)."""
    result = build_calibration_set(list(pools), None, CalibrateOptions(dry_run=True, **options))
    assert result.error is None, result.error
    return {row["name"]: row for row in result.report["sources"]}


def read(pool: Path, task: str, out: Path) -> tuple[list[dict], dict]:
    """The set's rows of ``pool`` (every record given ``task``) and the dry run's row for it."""
    result, rows = calibrate(pool, "--task", f"*={task}", "--output", out)
    assert result.exit_code == 0, result.output
    return rows, dry_run(pool, task_mappings=(f"*={task}",))[str(pool)]


def turns(user: str, answer: str, *, sharegpt: bool = False) -> list[dict]:
    if sharegpt:
        return [{"from": "human", "value": user}, {"from": "gpt", "value": answer}]
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


# --- media beside the annotation, by each framework's convention -------------------------------


def test_llava_image_folder_error_names_the_media_root_then_reads(tmp_path):
    """LLaVA's paths are relative to --image_folder, which the file does not name: the error says
    where it looked and which --media-root finds the file, and offers no --skip-invalid (every
    record would go)."""
    media = Media(tmp_path / "playground" / "data" / "coco")
    records = [
        {"id": f"{i}", "image": media.image(f"part-00000{i}"),
         "conversations": turns("<image>\nWrite a prompt for this image.", f"a red square {i}", sharegpt=True)}
        for i in range(3)
    ]  # fmt: skip
    pool = write_json(tmp_path / "playground" / "llava_mix.json", records)
    result, _ = calibrate(pool, "--task", "*=short_caption", "--output", tmp_path / "o")
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert f"image file not found: part-000000/1.jpg (looked in {pool.parent})" in output
    assert f"pass --media-root {tmp_path / 'playground' / 'data' / 'coco'}" in output
    assert "--skip-invalid" not in output
    skipped, _ = calibrate(pool, "--task", "*=short_caption", "--skip-invalid", "--output", tmp_path / "o")
    assert skipped.exit_code == 2 and "all 3 record(s) were invalid" in skipped.output
    assert "--media-root" in skipped.output  # the reason, whole
    result, rows = calibrate(
        pool, "--task", "*=short_caption", "--media-root", tmp_path / "playground" / "data" / "coco",
        "--output", tmp_path / "o",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(rows) == 3 and all(r["modality"] == "image" for r in rows)


def test_internvl_meta_file_root(tmp_path):
    """InternVL's meta file names each annotation file and the `root` its media paths are
    relative to, both from the folder InternVL runs in (above shell/data/, where the meta lies)."""
    chat = tmp_path / "internvl_chat"
    media = Media(chat / "playground" / "data" / "coco")
    records = [
        {"id": i, "image": media.image("train2017"), "width": 64, "height": 48,
         "conversations": turns("<image>\nDescribe the picture briefly.", f"A square {i}.", sharegpt=True)}
        for i in range(3)
    ]  # fmt: skip
    write_jsonl(chat / "playground" / "opensource" / "coco_cap.jsonl", records)
    meta = chat / "shell" / "data" / "finetune.json"
    meta.parent.mkdir(parents=True)
    entry = {"root": "playground/data/coco/", "annotation": "playground/opensource/coco_cap.jsonl",
             "data_augment": False, "repeat_time": 1, "length": 3}  # fmt: skip
    meta.write_text(json.dumps({"coco_cap": entry, "gone": {**entry, "annotation": "missing.jsonl"}}))
    result, rows = calibrate(meta, "--task", "coco_cap=short_caption", "--output", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert len(rows) == 3 and all(Path(r["images"][0]).is_file() for r in rows)
    assert "'gone' not read: annotation file missing.jsonl not found" in " ".join(result.output.split())
    row = dry_run(meta, task_mappings=("coco_cap=short_caption",))["coco_cap"]
    assert row["format"] == "JSONL (via InternVL meta): ShareGPT"
    assert row["ignored"] == {"height": 3, "width": 3}


def test_llamafactory_file_named_alone_resolves_media_against_its_data_folder(tmp_path):
    """A file inside a LLaMA-Factory data folder, named on its own: its media resolve against the
    folder holding dataset_info.json (LLaMA-Factory's media_dir defaults to dataset_dir)."""
    data = tmp_path / "data"
    media = Media(data)
    records = [
        {"messages": turns("<image>What is shown?", f"Item {i}."), "images": [media.image("mllm_demo_data")]}
        for i in range(2)
    ]
    pool = write_json(data / "vision" / "mine.json", records)
    (data / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "vision/mine.json"}}))
    result, rows = calibrate(pool, "--task", "*=short_caption", "--output", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert all(Path(r["images"][0]).parent == data / "mllm_demo_data" for r in rows)


def test_llamafactory_training_config_with_media_dir(tmp_path):
    """A LLaMA-Factory training config names its datasets, dataset_dir and media_dir, relative to
    the folder LLaMA-Factory runs in: the config is the pool."""
    repo = tmp_path / "LLaMA-Factory"
    media = Media(repo / "assets")
    records = [
        {"messages": turns("<image>What is shown?", f"Item {i}."), "images": [media.image("shots")]}
        for i in range(2)
    ]
    write_json(repo / "data" / "mine.json", records)
    write_json(repo / "data" / "other.json", [{"instruction": "hi", "output": "hello"}])
    info = {"mine": {"file_name": "mine.json", "formatting": "sharegpt",
                     "columns": {"messages": "messages", "images": "images"},
                     "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                              "assistant_tag": "assistant"}},
            "other": {"file_name": "other.json"}}  # fmt: skip
    (repo / "data" / "dataset_info.json").write_text(json.dumps(info))
    config = repo / "examples" / "train_lora" / "qwen2_5vl_lora_sft.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("model_name_or_path: Qwen/Qwen2.5-VL-7B-Instruct\nstage: sft\ndataset: mine\n"
                      "dataset_dir: data\nmedia_dir: assets\ntemplate: qwen2_vl\n")  # fmt: skip
    result, rows = calibrate(config, "--task", "mine=short_caption", "--output", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert len(rows) == 2 and all(Path(r["images"][0]).parent == repo / "assets" / "shots" for r in rows)


# --- videos --------------------------------------------------------------------------------------


def test_videos_given_as_frame_lists(tmp_path):
    """Qwen2.5-VL's {"type": "video", "video": [frames]} and LLaMA-Factory's videos: [[frames]]:
    one video each, made into an MP4 the set carries."""
    media = Media(tmp_path)
    frames = [[media.image("frames/a") for _ in range(4)], [media.image("frames/b") for _ in range(3)]]
    qwen = [
        {"messages": [
            {"role": "user", "content": [{"type": "video", "video": [f"file://{tmp_path / f}" for f in frames[0]]},
                                         {"type": "text", "text": "What happens in the clip?"}]},
            {"role": "assistant", "content": "The colour changes."}]}
    ]  # fmt: skip
    lf = [{"messages": turns("<video>Describe the video.", "Squares."), "videos": [frames[1]]},
          {"video": frames[0], "conversations": turns("<video>\nAnd this one?", "Grey.", sharegpt=True)}]
    pools = [write_jsonl(tmp_path / "qwen_frames.jsonl", qwen), write_json(tmp_path / "lf_frames.json", lf)]
    result, rows = calibrate(*pools, "--task", "*=video_caption", "--output", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert len(rows) == 3 and all(r["modality"] == "video" and len(r["videos"]) == 1 for r in rows)
    assert by_text(rows, "And this one?")["videos"] == by_text(rows, "What happens in the clip?")["videos"]  # the same frames
    from quantkit.media import probe_video

    clip = by_text(rows, "What happens in the clip?")
    assert clip["messages"][0]["content"] == "<video>What happens in the clip?"
    info = probe_video(Path(clip["videos"][0]))
    assert (info.width, info.height) == (64, 48) and info.duration_s == pytest.approx(2.0, abs=0.6)
    table = dry_run(*pools, task_mappings=("*=video_caption",))
    assert table[str(pools[0])]["format"] == "JSONL: messages + video frames"
    assert table[str(pools[1])]["format"] == "JSON array: ShareGPT + video frames, chat turns"


def test_llava_video_annotations_with_an_image_token(tmp_path):
    """LLaVA-Video-178K / LLaVA-OneVision: a `video` key, its placeholder written <image>; paths
    relative to --video_folder (here the pool's folder)."""
    media = Media(tmp_path)
    records = [
        {"id": f"v{i}", "video": media.video("academic_source/youtube"), "data_source": "academic",
         "conversations": turns("<image>\nWhat is the man doing?", f"Cooking {i}.", sharegpt=True)}
        for i in range(2)
    ]  # fmt: skip
    rows, row = read(write_json(tmp_path / "0_30_s_academic_v0_1_cap.json", records), "video_caption", tmp_path / "o")
    assert all(r["modality"] == "video" and r["messages"][0]["content"].startswith("<video>\n") for r in rows)
    assert row["format"] == "JSON array: ShareGPT + <image> for video"
    assert row["ignored"] == {"data_source": 2}


def test_lmms_finetune_system_prompt_and_videos(tmp_path):
    """lmms-finetune: `system_prompt`, `video` as a list, `num_frames` (a sampling setting)."""
    media = Media(tmp_path)
    records = [
        {"system_prompt": "Answer about the videos.", "num_frames": [8, 10],
         "video": [media.video("videos"), media.video("videos")],
         "conversations": turns("<video><video>What are these videos about?", f"Squares {i}.", sharegpt=True)}
        for i in range(2)
    ]  # fmt: skip
    rows, row = read(write_json(tmp_path / "lmms.json", records), "video_caption", tmp_path / "o")
    assert row["format"] == "JSON array: ShareGPT"
    assert all(r["messages"][0] == {"role": "system", "content": "Answer about the videos."} for r in rows)
    assert all(len(r["videos"]) == 2 for r in rows)
    assert row["ignored"] == {"num_frames": 2}


# --- other record spellings ---------------------------------------------------------------------


def test_trl_conversational_prompt_completion_with_images(tmp_path):
    media = Media(tmp_path)
    records = [
        {"images": [media.image()],
         "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"What colour is it? {i}"}]}],
         "completion": [{"role": "assistant", "content": [{"type": "text", "text": "Red."}]}]}
        for i in range(2)
    ] + [{"prompt": "The sky is", "completion": " blue."}]  # fmt: skip
    rows, source = read(write_jsonl(tmp_path / "trl.jsonl", records), "short_caption", tmp_path / "o")
    row = by_text(rows, "What colour is it? 0")
    assert row["messages"] == [
        {"role": "user", "content": "<image>What colour is it? 0"},
        {"role": "assistant", "content": "Red."},
    ]
    assert by_text(rows, "The sky is")["messages"][1] == {"role": "assistant", "content": " blue."}
    assert source["format"] == "JSONL: TRL prompt/completion"


def test_the_cauldron_parquet(tmp_path):
    """The Cauldron: `images` (datasets Image features, embedded bytes) and `texts`, a list of
    {user, assistant, source} exchanges."""
    datasets = pytest.importorskip("datasets")
    media = Media(tmp_path)
    features = datasets.Features({
        "images": datasets.Sequence(datasets.Image()),
        "texts": [{"user": datasets.Value("string"), "assistant": datasets.Value("string"),
                   "source": datasets.Value("string")}],
    })  # fmt: skip
    table = datasets.Dataset.from_dict(
        {"images": [[{"bytes": media.png_bytes(), "path": None}] for _ in range(2)],
         "texts": [[{"user": f"Question: what is drawn? {i}", "assistant": "A box.", "source": "VQAv2"}]
                   for i in range(2)]},
        features=features,
    )  # fmt: skip
    pool = tmp_path / "vqav2" / "train-00000-of-00001.parquet"
    pool.parent.mkdir()
    table.to_parquet(str(pool))
    rows, source = read(pool, "short_caption", tmp_path / "o")
    row = by_text(rows, "what is drawn? 1")
    assert row["messages"][0]["content"] == "<image>Question: what is drawn? 1" and len(row["images"]) == 1
    assert source["format"] == "Parquet: The Cauldron"


def test_axolotl_content_parts_with_base64(tmp_path):
    media = Media(tmp_path)
    records = [
        {"messages": [
            {"role": "user", "content": [{"type": "image", "base64": base64.b64encode(media.png_bytes()).decode()},
                                         {"type": "text", "text": f"Describe the image. {i}"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A blue rectangle."}]}]}
        for i in range(2)
    ] + [{"messages": [
            {"role": "user", "content": [{"type": "image", "path": str(tmp_path / media.image())},
                                         {"type": "text", "text": "Describe the other image."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A square."}]}]}]  # fmt: skip
    rows, source = read(write_jsonl(tmp_path / "axolotl.jsonl", records), "short_caption", tmp_path / "o")
    assert source["format"] == "JSONL: messages"
    assert len(rows) == 3 and all(Path(r["images"][0]).is_file() for r in rows)
    assert Path(by_text(rows, "Describe the image. 0")["images"][0]).suffix == ".png"


def test_minicpm_v_image_placeholder_map(tmp_path):
    media = Media(tmp_path)
    first, second = media.image(), media.image()
    records = [
        {"id": "0", "image": {"<image_00>": first, "<image_01>": second},
         "conversations": [{"role": "user", "content": "Compare <image_01> with\n<image_00>\n"},
                           {"role": "assistant", "content": "The second is greener."}]},
        {"id": "1", "image": first, "conversations": turns("How many boxes?", "One.")},
    ]  # fmt: skip
    rows, source = read(write_json(tmp_path / "minicpm.json", records), "ocr", tmp_path / "o")
    assert source["format"] == "JSON array: messages + image map, messages"
    pair = by_text(rows, "Compare")
    assert pair["messages"][0]["content"] == "Compare <image> with\n<image>\n"
    assert [Path(p).name for p in pair["images"]] == [Path(second).name, Path(first).name]  # in text order
    assert by_text(rows, "How many boxes?")["messages"][0]["content"] == "<image>How many boxes?"


def test_glm4v_image_inside_the_user_turn(tmp_path):
    """GLM-4V: the image is a field of the user turn; it was dropped in silence (a text record)."""
    media = Media(tmp_path)
    records = [
        {"messages": [{"role": "user", "content": f"图片中是什么？{i}", "image": str(tmp_path / media.image())},
                      {"role": "assistant", "content": "一个方块。"}]}
        for i in range(2)
    ]  # fmt: skip
    rows, source = read(write_jsonl(tmp_path / "glm4v.jsonl", records), "short_caption", tmp_path / "o")
    row = by_text(rows, "图片中是什么？0")
    assert row["modality"] == "image" and row["messages"][0]["content"] == "<image>图片中是什么？0"
    assert source["format"] == "JSONL: messages + turn media"


def test_json_array_of_bare_message_lists(tmp_path):
    pool = write_json(tmp_path / "bare.json", [turns(f"Hello {i}", "Hi!") for i in range(3)])
    rows, source = read(pool, "text_chat", tmp_path / "o")
    assert len(rows) == 3 and by_text(rows, "Hello 2")["messages"][1]["content"] == "Hi!"
    assert source["format"] == "JSON array: message list"


def test_ms_swift_grounding_point(tmp_path):
    """ms-swift's GUI-agent records: a bbox that is a point [x, y], written as Qwen writes points."""
    media = Media(tmp_path)
    records = [
        {"messages": turns("<image>Open the settings.", "click(start_box='<bbox>')"),
         "images": [media.image()], "objects": {"ref": [], "bbox": [[919, 112 + i]]}}
        for i in range(2)
    ]  # fmt: skip
    rows, source = read(write_jsonl(tmp_path / "gui.jsonl", records), "visual_grounding", tmp_path / "o")
    assert source["format"] == "JSONL: messages + grounding objects"
    answers = sorted(r["messages"][1]["content"] for r in rows)
    assert answers[0] == "click(start_box='<|box_start|>(919,112)<|box_end|>')"


def test_llamafactory_preference_and_csv_entries(tmp_path):
    """Ranking entries (sharegpt chosen / rejected turns, alpaca chosen / rejected strings)
    calibrate on prompt + chosen, `rejected` listed as ignored; a CSV entry is read."""
    data = tmp_path / "data"
    media = Media(data)
    write_json(data / "dpo_mllm.json", [
        {"conversations": [{"from": "human", "value": f"<image>What is it? {i}"}],
         "chosen": {"from": "gpt", "value": "A red box."}, "rejected": {"from": "gpt", "value": "A cat."},
         "images": [media.image("dpo_data")]}
        for i in range(2)
    ])  # fmt: skip
    write_json(data / "dpo_en.json", [
        {"instruction": f"Say hi {i}.", "input": "", "chosen": "Hi!", "rejected": "No."} for i in range(2)
    ])  # fmt: skip
    (data / "sft.csv").write_text('instruction,input,output\n"Add 2 and 3.",,5\n"Name a colour, please.",,"Red, of course."\n')
    info = {
        "dpo_mllm": {"file_name": "dpo_mllm.json", "formatting": "sharegpt", "ranking": True,
                     "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected",
                                 "images": "images"}},
        "dpo_en": {"file_name": "dpo_en.json", "ranking": True,
                   "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}},
        "sft_csv": {"file_name": "sft.csv"},
    }  # fmt: skip
    (data / "dataset_info.json").write_text(json.dumps(info))
    mapped = ("--task", "dpo_mllm=short_caption", "--task", "dpo_en=text_chat", "--task", "sft_csv=text_chat")
    result, rows = calibrate(data, *mapped, "--output", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert by_text(rows, "What is it? 1")["messages"] == [
        {"role": "user", "content": "<image>What is it? 1"}, {"role": "assistant", "content": "A red box."}
    ]  # fmt: skip
    assert by_text(rows, "Say hi 0.")["messages"][1] == {"role": "assistant", "content": "Hi!"}
    assert by_text(rows, "Name a colour")["messages"][1]["content"] == "Red, of course."
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    sources = {s["name"]: s for s in report["sources"]}
    assert sources["dpo_mllm"]["ignored"] == {"rejected": 2}
    assert sources["dpo_mllm"]["format"] == "JSON array sharegpt: sharegpt preference (chosen)"
    assert sources["sft_csv"]["format"] == "CSV alpaca" and sources["sft_csv"]["records"] == 2
    assert "rejected (2 records)" in (tmp_path / "o" / "report.md").read_text()


def test_no_valid_records_says_what_was_not_read(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("hello\n")
    (data / "dataset_info.json").write_text(json.dumps({"notes": {"file_name": "notes.txt"}}))
    result, _ = calibrate(data, "--output", tmp_path / "o")
    assert result.exit_code == 2
    assert "the pool has no valid records" in result.output and "notes.txt: calibrate reads" in result.output


# --- nothing dropped in silence -----------------------------------------------------------------


def test_media_in_an_unused_field_is_an_error_unless_ignored(tmp_path):
    media = Media(tmp_path)
    records = [
        {"messages": turns("<image>What is it?", f"A box {i}."), "images": [media.image()],
         "thumbnail": media.image("thumbs"), "source_url": "https://example.com/page"}
        for i in range(2)
    ]  # fmt: skip
    pool = write_jsonl(tmp_path / "pool.jsonl", records)
    result, _ = calibrate(pool, "--task", "*=short_caption", "--output", tmp_path / "o")
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert "field 'thumbnail' holds a path to a media file (thumbs/2.jpg)" in output
    assert "--ignore-field thumbnail" in output
    data_url = [{**records[0], "thumbnail": media.data_uri()}]
    result, _ = calibrate(write_jsonl(tmp_path / "uri.jsonl", data_url), "--task", "*=short_caption",
                          "--output", tmp_path / "o")  # fmt: skip
    assert result.exit_code == 2 and "field 'thumbnail' holds a data URL" in result.output
    result, rows = calibrate(pool, "--task", "*=short_caption", "--ignore-field", "thumbnail", "--output", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert all(len(r["images"]) == 1 for r in rows)
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["sources"][0]["ignored"] == {"source_url": 2, "thumbnail": 2}
    assert "source_url (2 records), thumbnail (2 records)" in (tmp_path / "o" / "report.md").read_text()
    dry, _ = calibrate(pool, "--task", "*=short_caption", "--ignore-field", "thumbnail", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"{pool}: ignored: source_url (2 records), thumbnail (2 records)" in dry.output


def test_plain_chat_records_report_their_format_and_nothing_ignored(tmp_path):
    pool = write_jsonl(tmp_path / "chat.jsonl", [{"messages": turns(f"hi {i}", "hello")} for i in range(2)])
    row = dry_run(pool, task_mappings=("*=text_chat",))[str(pool)]
    assert row["format"] == "JSONL: chat turns" and row["ignored"] == {}


@pytest.mark.parametrize("spelling", ["system", "system_prompt", "system_message", "sys_prompt", "developer"])
def test_system_prompts_in_every_spelling_are_kept(tmp_path, spelling):
    chat = turns("Hello", "Hi!")
    record = (
        {"messages": [{"role": "developer", "content": "Be brief."}, *chat]}
        if spelling == "developer"
        else {spelling: "Be brief.", "messages": chat}
    )
    rows, source = read(write_jsonl(tmp_path / "pool.jsonl", [record]), "text_chat", tmp_path / "o")
    assert rows[0]["messages"][0] == {"role": "system", "content": "Be brief."} and source["ignored"] == {}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="reading in parts needs os.fork")
def test_formats_and_ignored_fields_are_the_same_read_in_parts(demo_pool, tmp_path):
    from test_pool_split import _demo_records, _read, _write

    lines = []
    for copy in range(3):
        for i, record in enumerate(_demo_records(demo_pool)):
            record["messages"][-1]["content"] += f" (copy {copy})"
            if i % 3 == 0:
                record["data_source"] = "web"
            lines.append(json.dumps(record, ensure_ascii=False))
    pool = _write(tmp_path / "pool.jsonl", lines)
    one = _read(pool, demo_pool.parent, tmp_path, 1).sources[0].as_dict()
    assert one["ignored"] == {"data_source": sum('"data_source"' in line for line in lines)}
    assert one["format"] == "JSONL: chat turns, messages"
    assert _read(pool, demo_pool.parent, tmp_path, 3).sources[0].as_dict() == one


def test_the_search_for_a_media_root_never_walks_the_whole_file_system():
    from quantkit.mediasources import MediaRoots

    assert MediaRoots(Path("/no-such-pool-folder/data")).find_root("part-000001/a.jpg") is None
