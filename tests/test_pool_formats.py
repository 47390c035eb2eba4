"""Real training data in, as the fine-tuning frameworks store it: each format `calibrate` accepts
unchanged, and the set holds the right text, media and task (issue 15)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import numpy as np
import pytest
from fixtures_pool import Media, llamafactory_data, write_json, write_jsonl
from PIL import Image
from typer.testing import CliRunner

from quantkit.calibset import CalibrateOptions, build_calibration_set
from quantkit.cli import app

runner = CliRunner()


def calibrate(*args: object, size: int = 40):
    """Run `quantkit calibrate ARGS --size N --allow-missing-tasks`; (result, rows or None)."""
    argv = ["calibrate", *map(str, args), "--size", str(size), "--allow-missing-tasks"]
    result = runner.invoke(app, argv)
    out = Path(str(args[args.index("--output") + 1])) if "--output" in args else None
    rows = None
    if result.exit_code == 0 and out is not None:
        rows = [json.loads(line) for line in (out / "samples.jsonl").read_text(encoding="utf-8").splitlines()]
    return result, rows


def by_text(rows: list[dict], needle: str) -> dict:
    found = [r for r in rows if any(needle in m["content"] for m in r["messages"])]
    assert len(found) == 1, (needle, [r["messages"] for r in rows])
    return found[0]


# --- LLaMA-Factory data folders ---------------------------------------------------------------


def test_llamafactory_folder_with_dataset_names_and_task_mappings(tmp_path):
    data = llamafactory_data(tmp_path)
    out = tmp_path / "set"
    result, rows = calibrate(
        data, "--dataset", "mllm_demo,alpaca_en_demo", "--dataset", "mllm_audio_demo",
        "--task", "mllm_demo=short_caption", "--task", "alpaca_en_demo=text_chat", "--task", "mllm_audio_demo=asr",
        "--output", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert {r["task"] for r in rows} == {"short_caption", "text_chat", "asr"}
    assert len(rows) == 3 + 5 + 2
    image_row = by_text(rows, "They are players 1.")
    assert [m["role"] for m in image_row["messages"]] == ["user", "assistant", "user", "assistant"]
    assert image_row["messages"][0]["content"] == "<image>Who are they?"
    assert all(Path(p).is_file() and Path(p).parent == data / "mllm_demo_data" for p in image_row["images"])
    assert len(image_row["images"]) == 2 and image_row["modality"] == "multi-image"
    alpaca = by_text(rows, "Translate to French.")
    # LLaMA-Factory's alpaca: instruction + "\n" + input; `system` and `history` only when declared
    assert alpaca["messages"] == [
        {"role": "user", "content": "Translate to French.\nGood morning"},
        {"role": "assistant", "content": "Bonjour"},
    ]
    assert by_text(rows, "A tone 1.")["audios"][0].startswith(str(data / "mllm_demo_data"))
    report = json.loads((out / "report.json").read_text())
    sources = {s["name"]: s for s in report["sources"]}
    assert set(sources) == {"mllm_demo", "alpaca_en_demo", "mllm_audio_demo"}
    assert sources["mllm_demo"]["format"] == "JSON array sharegpt"
    assert sources["alpaca_en_demo"]["task_origins"] == {"mapping": 5}


def test_llamafactory_folder_without_dataset_reads_local_entries_and_rules_assign(tmp_path):
    data = llamafactory_data(tmp_path)
    out = tmp_path / "set"
    mapped = ("--task", "mllm_demo=short_caption", "--task", "mllm_video_demo=video_caption", "--task", "mllm_audio*=asr")
    result, rows = calibrate(data, *mapped, "--output", out, size=60)
    assert result.exit_code == 0, result.output
    assert "alpaca_gpt4_en" in result.output and "hub" in result.output  # the note of what was not read
    datasets = {r["source"].split("/")[-1].split(":")[0] for r in rows}
    assert datasets == {
        "identity.json", "alpaca_en_demo.json", "glaive_toolcall_en_demo.json", "mllm_demo.json",
        "mllm_video_demo.json", "mllm_audio_demo.json",
    }  # fmt: skip
    tool = by_text(rows, "What does the kettle 2 cost?")
    roles = [m["role"] for m in tool["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]  # tool turns kept
    assert tool["messages"][0]["content"].startswith("# Tools") and "get_price" in tool["messages"][0]["content"]
    assert json.loads(tool["messages"][2]["content"]) == {"name": "get_price", "arguments": {"item": "kettle"}}
    assert tool["task"] == "text_chat"  # the taxonomy's rules: no media -> text_chat
    assert by_text(rows, "Because of the cat 0.")["task"] == "video_caption"
    assert by_text(rows, "A tone 0.")["task"] == "asr"  # a glob of dataset names
    report = json.loads((out / "report.json").read_text())
    assert any("alpaca_gpt4_en" in note for note in report["notes"])
    assert {s["name"] for s in report["sources"]} >= {"identity", "glaive_toolcall_en_demo"}


def test_unknown_dataset_name_lists_close_matches(tmp_path):
    data = llamafactory_data(tmp_path)
    result, _ = calibrate(data, "--dataset", "mllm_dem", "--output", tmp_path / "o")
    assert result.exit_code == 2
    assert "mllm_dem" in result.output and "did you mean 'mllm_demo'" in result.output
    assert "Traceback" not in result.output
    hub, _ = calibrate(data, "--dataset", "alpaca_gpt4_en", "--output", tmp_path / "o")
    assert hub.exit_code == 2 and "offline" in hub.output


def test_json_array_errors_name_the_line(tmp_path):
    media = Media(tmp_path)
    good = {"messages": [{"role": "user", "content": "<image>Read it."}, {"role": "assistant", "content": "OK"}],
            "images": [media.image()]}  # fmt: skip
    pool = write_json(tmp_path / "pool.json", [good, {"messages": [{"role": "robot", "content": "hi"}]}])
    result, _ = calibrate(pool, "--output", tmp_path / "o")
    assert result.exit_code == 2
    starts = [i + 1 for i, text in enumerate(pool.read_text().splitlines()) if text == "  {"]
    line = starts[1]  # where the second record starts
    assert f"{pool}:{line}" in result.output and "unknown role 'robot'" in result.output
    broken = tmp_path / "broken.json"
    broken.write_text('[\n  {"query": "hi", "response": "hello"},\n  {"messages": oops}\n]\n')
    result, _ = calibrate(broken, "--output", tmp_path / "o")
    assert result.exit_code == 2 and f"{broken}:3" in result.output and "malformed JSON" in result.output


# --- ms-swift ---------------------------------------------------------------------------------


def test_ms_swift_formats_with_absolute_media_under_a_media_root(tmp_path):
    shared = tmp_path / "shared_media"
    media = Media(shared)
    image = str(shared / media.image())
    audio = str(shared / media.audio())
    pool = write_jsonl(
        tmp_path / "pool" / "swift.jsonl",
        [
            {"messages": [{"role": "system", "content": "You read shop signs."},
                          {"role": "user", "content": "<image>Read all the text in the image."},
                          {"role": "assistant", "content": "SUMMER SALE"}], "images": [image]},
            {"system": "You are terse.", "query": "What is 2+2?", "response": "4",
             "history": [["Hi", "Hello."]]},
            {"messages": [{"role": "user", "content": "<audio>Transcribe the speech."},
                          {"role": "assistant", "content": "hello there"}], "audios": [audio]},
            {"tools": [{"name": "weather", "parameters": {}}],
             "messages": [{"role": "user", "content": "Weather in Paris?"},
                          {"role": "tool_call", "content": '{"name": "weather", "arguments": {"city": "Paris"}}'},
                          {"role": "tool_response", "content": '{"temp": 21}'},
                          {"role": "assistant", "content": "21 degrees."}]},
            {"messages": [{"role": "user", "content": "<image>Find the <ref-object>"},
                          {"role": "assistant", "content": "<bbox>"}],
             "images": [image], "objects": {"ref": ["red mug"], "bbox": [[10, 20.5, 30, 40]]}},
        ],
    )  # fmt: skip
    refused, _ = calibrate(pool, "--output", tmp_path / "o")
    assert refused.exit_code == 2 and f"{pool}:1" in refused.output
    assert "escapes" in refused.output and "--media-root" in refused.output
    out = tmp_path / "set"
    result, rows = calibrate(pool, "--media-root", shared, "--output", out)
    assert result.exit_code == 0, result.output
    ocr = by_text(rows, "SUMMER SALE")
    assert ocr["task"] == "ocr" and ocr["images"] == [image] and ocr["messages"][0]["role"] == "system"
    assert by_text(rows, "What is 2+2?")["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert by_text(rows, "Transcribe the speech.")["task"] == "asr"
    agent = by_text(rows, "Weather in Paris?")
    assert [m["role"] for m in agent["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    grounding = by_text(rows, "Find the")
    assert grounding["messages"][0]["content"] == "<image>Find the <|object_ref_start|>red mug<|object_ref_end|>"
    assert grounding["messages"][1]["content"] == "<|box_start|>(10,20.5),(30,40)<|box_end|>"
    assert grounding["task"] == "visual_grounding"  # the boxes are in the text the rules and tokens see


# --- content lists, URIs, Qwen-VL -------------------------------------------------------------


def test_content_lists_file_uris_and_data_uris_go_into_the_set(tmp_path):
    root = tmp_path / "pool"
    media = Media(root)
    jpg = media.image()
    uri = media.data_uri()
    wav = (root / media.audio()).read_bytes()
    pool = write_jsonl(
        root / "openai.jsonl",
        [
            {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": uri}},
                {"type": "text", "text": "Transcribe the text in this image."}]},
                {"role": "assistant", "content": "OPEN 9-5"}]},
            {"messages": [{"role": "user", "content": [
                {"type": "image", "image": f"file://{root / jpg}"},
                {"type": "text", "text": "Describe this image in one sentence."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A plain square."}]}]},
            {"messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}},
                {"type": "text", "text": "Transcribe the audio."}]},
                {"role": "assistant", "content": "a tone"}]},
        ],
    )  # fmt: skip
    out = tmp_path / "set"
    result, rows = calibrate(pool, "--output", out)
    assert result.exit_code == 0, result.output
    embedded = by_text(rows, "OPEN 9-5")
    assert embedded["messages"][0]["content"] == "<image>Transcribe the text in this image."
    [path] = embedded["images"]
    assert Path(path).parent == out.absolute() / "media" and Path(path).is_file()  # carried by the set
    assert Path(path).read_bytes() == base64.b64decode(uri.split(",", 1)[1])
    assert by_text(rows, "A plain square.")["images"] == [str(root / jpg)]
    [audio] = by_text(rows, "a tone")["audios"]
    assert Path(audio).read_bytes() == wav and audio.endswith(".wav")
    assert not any(p.name.startswith(".set.media") for p in tmp_path.iterdir())  # the store is gone
    again = tmp_path / "again"
    assert calibrate(pool, "--output", again)[0].exit_code == 0
    assert (again / "samples.jsonl").read_text().replace(str(again), "X") == (out / "samples.jsonl").read_text().replace(
        str(out), "X"
    )  # content-addressed names: the same set


def test_qwen_vl_finetune_files(tmp_path):
    root = tmp_path / "qwen"
    media = Media(root)
    one, two = media.image("assets"), media.image("assets")
    v1 = write_json(
        root / "qwen_vl.json",
        [{"id": "identity_0", "conversations": [
            {"from": "user", "value": f"Picture 1: <img>{one}</img>\nWhat does the sign say?"},
            {"from": "assistant", "value": "SALE"}]}],
    )  # fmt: skip
    v25 = write_json(
        root / "qwen25_vl.json",
        [{"image": two, "conversations": [
            {"from": "human", "value": "<image>\nDescribe the colour."}, {"from": "gpt", "value": "Teal."}]},
         {"image": [one, two], "conversations": [
            {"from": "human", "value": "Compare the two pictures."}, {"from": "gpt", "value": "Both plain."}]}],
    )  # fmt: skip
    out = tmp_path / "set"
    result, rows = calibrate(v1, v25, "--task", f"{v25}=short_caption", "--output", out)
    assert result.exit_code == 0, result.output
    sign = by_text(rows, "SALE")
    assert sign["messages"][0]["content"] == "Picture 1: <image>\nWhat does the sign say?"
    assert sign["images"] == [str(root / one)] and sign["id"] == "identity_0"
    assert by_text(rows, "Teal.")["images"] == [str(root / two)]
    compare = by_text(rows, "Both plain.")  # no placeholder: ms-swift's rule puts them first
    assert compare["messages"][0]["content"] == "<image><image>Compare the two pictures."
    assert compare["task"] == "short_caption" and compare["modality"] == "multi-image"


# --- Hugging Face datasets --------------------------------------------------------------------


def _hf_rows(media: Media, n: int) -> dict:
    return {
        "messages": [
            [{"role": "user", "content": "<image>Read the label."}, {"role": "assistant", "content": f"LABEL {i}"}]
            for i in range(n)
        ],
        "images": [[{"bytes": media.png_bytes(), "path": None}] for _ in range(n)],
    }


def _hf_dataset(media: Media, n: int):
    import datasets

    features = datasets.Features(
        {
            "messages": datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")}),
            "images": datasets.List(datasets.Image()),
        }
    )
    return datasets.Dataset.from_dict(_hf_rows(media, n), features=features)


@pytest.mark.parametrize("layout", ["save_to_disk", "dataset_dict", "hub", "parquet"])
def test_hf_datasets_with_embedded_images(tmp_path, layout):
    import datasets

    media = Media(tmp_path)
    table = _hf_dataset(media, 3)
    path = tmp_path / "hf"
    extra: list[str] = []
    if layout == "save_to_disk":
        table.save_to_disk(str(path))
    elif layout == "dataset_dict":
        datasets.DatasetDict({"train": _hf_dataset(media, 2), "validation": table}).save_to_disk(str(path))
        extra = ["--split", "validation"]
    elif layout == "hub":
        (path / "data").mkdir(parents=True)
        table.to_parquet(str(path / "data" / "train-00000-of-00001.parquet"))
        _hf_dataset(media, 1).to_parquet(str(path / "data" / "test-00000-of-00001.parquet"))
    else:
        path = tmp_path / "hf.parquet"
        table.to_parquet(str(path))
    out = tmp_path / "set"
    result, rows = calibrate(path, *extra, "--task", f"{path}=ocr", "--output", out)
    assert result.exit_code == 0, result.output
    assert len(rows) == 3 and {r["task"] for r in rows} == {"ocr"}
    for i in range(3):
        row = by_text(rows, f"LABEL {i}")
        [image] = row["images"]
        assert Path(image).parent == out.absolute() / "media" and image.endswith(".png")
        assert row["source"].endswith(f":{i + 1}")  # the row number


def test_hf_dataset_with_embedded_audio(tmp_path):
    """An ``Audio`` feature holding WAV bytes (the Hub's layout for speech data), read undecoded."""
    import datasets
    import pyarrow as pa

    media = Media(tmp_path)
    wavs = [(tmp_path / media.audio(seconds=1.0 + i)).read_bytes() for i in range(2)]
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "query": pa.array([f"<audio>Transcribe clip {i}." for i in range(2)]),
            "response": pa.array([f"clip {i}" for i in range(2)]),
            "audio": pa.array([{"bytes": b, "path": None} for b in wavs], type=struct),
        }
    )
    folder = tmp_path / "speech"
    datasets.Dataset(table).cast_column("audio", datasets.Audio(decode=False)).save_to_disk(str(folder))
    info = folder / "dataset_info.json"  # as the Hub stores it: a decoding Audio feature
    info.write_text(info.read_text().replace('"decode": false', '"decode": true'))
    assert datasets.load_from_disk(str(folder)).features["audio"].decode
    out = tmp_path / "set"
    result, rows = calibrate(folder, "--output", out)
    assert result.exit_code == 0, result.output
    for i in range(2):
        row = by_text(rows, f"Transcribe clip {i}.")
        [audio] = row["audios"]
        assert Path(audio).read_bytes() == wavs[i] and row["task"] == "asr" and row["modality"] == "audio"


def test_dataset_dict_without_split_lists_the_splits(tmp_path):
    import datasets

    media = Media(tmp_path)
    datasets.DatasetDict({"dev": _hf_dataset(media, 1), "test": _hf_dataset(media, 1)}).save_to_disk(
        str(tmp_path / "dd")
    )
    result, _ = calibrate(tmp_path / "dd", "--output", tmp_path / "o")
    assert result.exit_code == 2 and "dev, test" in result.output and "--split" in result.output


# --- media rules ------------------------------------------------------------------------------


def _one_image_pool(root: Path, image: str) -> Path:
    return write_jsonl(
        root / "pool.jsonl",
        [{"messages": [{"role": "user", "content": "<image>Read the text."}, {"role": "assistant", "content": "A"}],
          "images": [image]}],
    )  # fmt: skip


def test_symlink_leaving_the_roots_is_refused(tmp_path):
    outside = Media(tmp_path / "elsewhere")
    target = tmp_path / "elsewhere" / outside.image()
    root = tmp_path / "pool"
    root.mkdir()
    os.symlink(target, root / "link.jpg")
    pool = _one_image_pool(root, "link.jpg")
    result, _ = calibrate(pool, "--output", tmp_path / "o")
    assert result.exit_code == 2 and "symbolic link" in result.output and "--media-root" in result.output
    allowed, rows = calibrate(pool, "--media-root", tmp_path / "elsewhere", "--output", tmp_path / "o")
    assert allowed.exit_code == 0, allowed.output
    assert rows[0]["images"] == [str(root / "link.jpg")]


def test_remote_and_malformed_media_are_clear_errors(tmp_path):
    root = tmp_path / "pool"
    pool = _one_image_pool(root, "https://example.com/a.jpg")
    result, _ = calibrate(pool, "--output", tmp_path / "o")
    assert result.exit_code == 2 and f"{pool}:1" in result.output
    assert "offline" in result.output and "--media-root" in result.output
    bad = write_jsonl(
        root / "bad.jsonl",
        [{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 5000}},
                                                     {"type": "text", "text": "Read."}]}, {"role": "assistant", "content": "x"}]},
         {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]}],
    )  # fmt: skip
    result, rows = calibrate(bad, "--skip-invalid", "--output", tmp_path / "s")
    assert result.exit_code == 0, result.output  # no 'File name too long': the record is skipped
    assert len(rows) == 1
    report = json.loads((tmp_path / "s" / "report.json").read_text())
    assert report["skipped"]["records"][0]["line"] == 1
    assert "image" in report["skipped"]["records"][0]["reason"]


def test_truncated_jpeg_is_caught_at_calibrate_time(tmp_path):
    root = tmp_path / "pool"
    root.mkdir()
    name = "photo.jpg"
    noise = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)
    Image.fromarray(noise).save(root / name, quality=90)
    whole = (root / name).read_bytes()
    (root / name).write_bytes(whole[: len(whole) * 9 // 10])  # cut well after its header
    pool = _one_image_pool(root, name)
    result, _ = calibrate(pool, "--output", tmp_path / "o")
    assert result.exit_code == 2 and "truncated JPEG" in result.output and f"{pool}:1" in result.output
    unchecked, _ = calibrate(pool, "--verify-media", "none", "--output", tmp_path / "o")
    assert unchecked.exit_code == 0, unchecked.output
    lines = pool.read_text() + json.dumps({"messages": [{"role": "user", "content": "Say hi."},
                                                        {"role": "assistant", "content": "hi"}]}) + "\n"  # fmt: skip
    pool.write_text(lines)
    skipped, rows = calibrate(pool, "--skip-invalid", "--output", tmp_path / "s")
    assert skipped.exit_code == 0, skipped.output
    assert len(rows) == 1 and rows[0]["images"] == []
    report = json.loads((tmp_path / "s" / "report.json").read_text())
    assert report["skipped"]["records"][0]["line"] == 1 and "truncated JPEG" in report["skipped"]["records"][0]["reason"]


def _faststart_copy(source: Path, target: Path) -> None:
    """Remux with the index first (as streaming MP4s are): a cut file then keeps a whole header."""
    import av

    with av.open(str(source)) as src, av.open(str(target), "w", options={"movflags": "faststart"}) as dst:
        stream = src.streams.video[0]
        out = dst.add_stream_from_template(stream)
        for packet in src.demux(stream):
            if packet.dts is not None:
                packet.stream = out
                dst.mux(packet)


def test_truncated_video_is_caught_with_verify_media_all(tmp_path):
    root = tmp_path / "pool"
    media = Media(root)
    clip = root / "clip.mp4"
    _faststart_copy(root / media.video(seconds=4), clip)
    whole = clip.read_bytes()
    clip.write_bytes(whole[: len(whole) * 6 // 10])  # its header (duration, frames) still whole
    pool = write_jsonl(
        root / "pool.jsonl",
        [{"messages": [{"role": "user", "content": "<video>Describe the video."},
                       {"role": "assistant", "content": "A grey screen."}],
          "videos": ["clip.mp4"], "task": "video_caption"}],
    )  # fmt: skip
    default, _ = calibrate(pool, "--output", tmp_path / "o")  # video is not decoded by default
    assert default.exit_code == 0, default.output
    checked, _ = calibrate(pool, "--verify-media", "all", "--output", tmp_path / "o2")
    assert checked.exit_code == 2 and f"{pool}:1" in checked.output, checked.output
    assert "does not decode to its end" in checked.output
    assert not (tmp_path / "o2").exists()


def test_truncated_flac_is_caught_by_default(tmp_path):
    import av

    root = tmp_path / "pool"
    root.mkdir()
    clip = root / "speech.flac"
    with av.open(str(clip), "w") as container:
        stream = container.add_stream("flac", rate=16000, layout="mono")
        tone = 0.3 * np.sin(2 * np.pi * 440 * np.arange(16000 * 4) / 16000)
        frame = av.AudioFrame.from_ndarray((tone * 32767).astype(np.int16)[None, :], format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    whole = clip.read_bytes()
    clip.write_bytes(whole[: len(whole) // 2])  # the header still says 4 s
    pool = write_jsonl(
        root / "pool.jsonl",
        [{"messages": [{"role": "user", "content": "<audio>Transcribe the speech."},
                       {"role": "assistant", "content": "a tone"}], "audios": ["speech.flac"]}],
    )  # fmt: skip
    result, _ = calibrate(pool, "--output", tmp_path / "o")
    assert result.exit_code == 2 and f"{pool}:1" in result.output, result.output
    assert "does not decode to its end" in result.output
    unchecked, _ = calibrate(pool, "--verify-media", "none", "--output", tmp_path / "o")
    assert unchecked.exit_code == 0, unchecked.output


# --- see before you build ---------------------------------------------------------------------


def test_dry_run_prints_the_source_table_and_writes_nothing(tmp_path, monkeypatch):
    data = llamafactory_data(tmp_path)
    extra = write_jsonl(
        tmp_path / "extra.jsonl",
        [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
         {"messages": [{"role": "robot", "content": "hi"}]}],
    )  # fmt: skip
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["calibrate", "data", "extra.jsonl", "--dry-run", "--skip-invalid"])
    # The table first, then what a real run would fail on: the demo prompts match no rule.
    assert result.exit_code == 2, result.output
    assert "7 record(s) have no task" in result.output and "--task 'mllm_demo=TASK'" in result.output
    for name in ("mllm_demo", "glaive_toolcall_en_demo", "extra.jsonl", "rule", "none 3", "text 5", "Skipped records (1)",
                 "extra.jsonl:2", "unknown role"):  # fmt: skip
        assert name in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    dry = build_calibration_set(
        [data, extra], None, CalibrateOptions(dry_run=True, skip_invalid=True, task_mappings=("mllm_*=ocr",))
    )
    assert dry.error is None and dry.output is None
    assert dry.report["skipped"]["records"] == [
        {"source": str(extra), "line": 2, "reason": "turn 0 has unknown role 'robot'; use system, user, assistant "
         "or tool (ShareGPT: human, gpt, function_call, observation)"}
    ]  # fmt: skip
    table = {row["name"]: row for row in dry.report["sources"]}
    assert table["mllm_demo"]["format"] == "JSON array sharegpt"
    assert table["mllm_demo"]["task_origins"] == {"mapping": 3} and table["mllm_demo"]["modalities"] == {"multi-image": 3}
    assert table["alpaca_en_demo"]["format"] == "JSON array alpaca"
    assert table[str(extra)] == {
        "name": str(extra), "format": "JSONL: chat turns", "records": 1, "skipped": {"turn … has unknown role …": 1},
        "task_origins": {"rule": 1}, "modalities": {"text": 1}, "ignored": {},
    }  # fmt: skip


def test_same_id_on_different_content_is_named(tmp_path):
    pool = write_jsonl(
        tmp_path / "pool.jsonl",
        [{"id": "a1", "messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "x"}]}
         for i in range(2)],
    )  # fmt: skip
    result, rows = calibrate(pool, "--output", tmp_path / "o")
    assert result.exit_code == 0
    assert "'a1'" in result.output and f"{pool}:1 and {pool}:2" in result.output
