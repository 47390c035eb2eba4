"""The demo pool: coverage of the taxonomy, valid records, media that decode, true answers, determinism."""

from __future__ import annotations

import json
import re
import wave
from collections import Counter
from pathlib import Path

import av
import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from quantkit.cli import app
from quantkit.errors import InputError
from quantkit.synthetic.media import COLOR_RGB
from quantkit.zoo.demo_pool import TAXONOMY_PATH, DemoPoolSummary, write_demo_pool

PER_TASK = 12


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoPoolSummary, list[dict]]:
    output = tmp_path_factory.mktemp("demo") / "pool"
    summary = write_demo_pool(output, per_task=PER_TASK, seed=0)
    records = [json.loads(line) for line in summary.jsonl.read_text(encoding="utf-8").splitlines()]
    return summary, records


def taxonomy() -> dict:
    return yaml.safe_load(TAXONOMY_PATH.read_text(encoding="utf-8"))


def has_audio_track(path: Path) -> bool:
    with av.open(str(path)) as container:
        return len(container.streams.audio) > 0


def modality_combo(record: dict, root: Path) -> str:
    """Named from the media themselves, as POOL_FORMAT.md says (an MP4 with sound is video+audio)."""
    parts = []
    if record["images"]:
        parts.append("multi-image" if len(record["images"]) >= 2 else "image")
    if record["videos"]:
        parts.append("video")
    if record["audios"] or any(has_audio_track(root / v) for v in record["videos"]):
        parts.append("audio")
    return "+".join(parts) or "text"


def vision_tokens(width: int, height: int) -> int:
    """Qwen2-VL smart_resize with the taxonomy's defaults (patch 14, merge 2; no clamping needed here)."""
    rule = taxonomy()["buckets"]["image_rule"]
    factor = rule["patch_size"] * rule["merge_size"]
    return (max(factor, round(height / factor) * factor) // factor) * (
        max(factor, round(width / factor) * factor) // factor
    )


def bucket(value: float, edges: list[float]) -> int:
    return sum(value >= edge for edge in edges)


def video_seconds(path: Path) -> float:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return float(stream.duration * stream.time_base)


def wav_seconds(path: Path) -> float:
    with wave.open(str(path), "rb") as handle:
        assert (handle.getnchannels(), handle.getsampwidth(), handle.getframerate()) == (1, 2, 16_000)
        frames = handle.readframes(handle.getnframes())
        assert len(frames) == handle.getnframes() * 2
        return handle.getnframes() / handle.getframerate()


def test_covers_every_task_and_modality_combination(pool) -> None:
    summary, records = pool
    root = summary.jsonl.parent
    found: dict[tuple[str, str], int] = {}
    for record in records:
        key = (record["task"], modality_combo(record, root))
        found[key] = found.get(key, 0) + 1
    for task in taxonomy()["tasks"]:
        for combo in task["modalities"]:
            assert found.get((task["name"], combo)) == PER_TASK, (task["name"], combo)
    assert summary.records == len(records) == sum(found.values())
    assert summary.by_task == dict(Counter(r["task"] for r in records))
    assert sum(summary.by_modality.values()) == summary.records


def test_placeholders_match_lists_and_paths_are_relative(pool) -> None:
    summary, records = pool
    root = summary.jsonl.parent
    assert len({r["id"] for r in records}) == len(records)
    listed = set()
    for record in records:
        text = "".join(m["content"] for m in record["messages"])
        assert [m["role"] for m in record["messages"]][-2:] == ["user", "assistant"]
        for placeholder, field in (("<image>", "images"), ("<video>", "videos"), ("<audio>", "audios")):
            assert text.count(placeholder) == len(record[field]), (record["id"], field)
            for relative in record[field]:
                assert not Path(relative).is_absolute() and ".." not in Path(relative).parts
                assert (root / relative).is_file(), relative
                listed.add(relative)
    on_disk = {p.relative_to(root).as_posix() for p in (root / "media").rglob("*") if p.is_file()}
    assert on_disk == listed and summary.media_files == len(listed)


def test_media_decode_and_span_size_buckets(pool) -> None:
    summary, records = pool
    root = summary.jsonl.parent
    edges = taxonomy()["buckets"]
    image_buckets, video_buckets, audio_buckets, formats = set(), set(), set(), set()
    for record in records:
        for relative in record["images"]:
            with Image.open(root / relative) as image:
                image.load()
                formats.add(image.format)
                image_buckets.add(bucket(vision_tokens(*image.size), edges["image_tokens"]))
        for relative in record["videos"]:
            with av.open(str(root / relative)) as container:
                assert next(container.decode(video=0)).width > 0
                if container.streams.audio:
                    assert next(container.decode(audio=0)).samples > 0
            video_buckets.add(bucket(video_seconds(root / relative), edges["video_seconds"]))
        for relative in record["audios"]:
            audio_buckets.add(bucket(wav_seconds(root / relative), edges["audio_seconds"]))
    assert formats == {"PNG", "JPEG"}
    assert image_buckets == video_buckets == audio_buckets == {0, 1, 2}


def test_grounding_boxes_are_where_the_product_was_drawn(pool) -> None:
    summary, records = pool
    checked = 0
    for record in records:
        if (
            record["task"] != "visual_grounding"
            or len(record["images"]) != 1
            or not record["images"][0].endswith(".png")
        ):
            continue
        color = re.search(r"bounding box of the (\w+) ", record["messages"][-2]["content"]).group(1)
        x1, y1, x2, y2 = json.loads(record["messages"][-1]["content"])
        pixels = np.asarray(Image.open(summary.jsonl.parent / record["images"][0]).convert("RGB"))
        for x, y in ((x1, y1), (x2, y1), (x1, y2), (x2, y2)):
            assert tuple(pixels[y, x]) == COLOR_RGB[color]
        if x2 + 1 < pixels.shape[1]:
            assert tuple(pixels[y1, x2 + 1]) != COLOR_RGB[color]
        checked += 1
    assert checked > 0


def test_temporal_grounding_times_match_the_frames(pool) -> None:
    summary, records = pool
    for record in (r for r in records if r["task"] == "temporal_grounding"):
        answer = record["messages"][-1]["content"]
        color, start, end = re.search(r"The (\w+) .* from ([\d.]+) s to ([\d.]+) s", answer).groups()
        target = np.array(COLOR_RGB[color], dtype=np.int32)
        with av.open(str(summary.jsonl.parent / record["videos"][0])) as container:
            for frame in container.decode(video=0):
                pixels = frame.to_ndarray(format="rgb24").astype(np.int32)
                near = (np.abs(pixels - target).sum(axis=2) < 90).sum()
                visible = float(start) <= float(frame.time) < float(end)
                assert (near > 50) == visible, (record["id"], frame.time, near)


def _all_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_bytes(pool, tmp_path: Path) -> None:
    summary, _ = pool
    again = write_demo_pool(tmp_path / "again", per_task=PER_TASK, seed=0)
    assert _all_bytes(again.jsonl.parent) == _all_bytes(summary.jsonl.parent)


def test_other_seed_gives_other_content(tmp_path: Path) -> None:
    first = _all_bytes(write_demo_pool(tmp_path / "a", per_task=2, seed=0).jsonl.parent)
    second = _all_bytes(write_demo_pool(tmp_path / "b", per_task=2, seed=1).jsonl.parent)
    assert first.keys() == second.keys()  # same ids and file names, so pools can be diffed
    assert first["pool.jsonl"] != second["pool.jsonl"]
    changed = sum(first[name] != second[name] for name in first)
    assert changed >= 0.9 * len(first)


def test_existing_output_needs_force(tmp_path: Path) -> None:
    output = tmp_path / "pool"
    output.mkdir()
    (output / "stale.txt").write_text("old")
    with pytest.raises(InputError):
        write_demo_pool(output, per_task=1)
    assert (output / "stale.txt").exists()
    write_demo_pool(output, per_task=1, force=True)
    assert not (output / "stale.txt").exists() and (output / "pool.jsonl").is_file()


def test_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        write_demo_pool(tmp_path / "a", per_task=0)
    with pytest.raises(InputError):
        write_demo_pool(tmp_path / "b", seed=-1)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_cli_demo_pool(tmp_path: Path) -> None:
    output = tmp_path / "pool"
    result = CliRunner().invoke(app, ["demo-pool", "--output", str(output), "--per-task", "2"])
    assert result.exit_code == 0, result.output
    assert (output / "pool.jsonl").is_file() and "records" in result.output
    again = CliRunner().invoke(app, ["demo-pool", "--output", str(output), "--per-task", "2"])
    assert again.exit_code == 2
