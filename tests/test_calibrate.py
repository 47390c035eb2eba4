"""`quantkit calibrate`: exact size, determinism, coverage, tier weighting, and every bad input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fixtures_pool import TWO_TIER_TAXONOMY
from PIL import Image
from typer.testing import CliRunner

from quantkit.calibset import (
    CalibrateOptions,
    build_calibration_set,
    load_calibration_report,
    load_calibration_set,
    stratified_subsample,
)
from quantkit.calibset.allocate import allocate
from quantkit.cli import app
from quantkit.errors import InputError
from quantkit.media import write_mp4
from quantkit.synthetic.media import write_wav

runner = CliRunner()


def folder_bytes(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


class PoolBuilder:
    """Writes small pools with real media for tests that need a particular shape."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "media").mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []
        self.count = 0

    def image(self, size=(64, 48), color=(200, 30, 30), ext="png") -> str:
        self.count += 1
        name = f"media/img{self.count}.{ext}"
        Image.new("RGB", size, color).save(self.root / name)
        return name

    def audio(self, seconds=1.0) -> str:
        self.count += 1
        name = f"media/aud{self.count}.wav"
        t = np.arange(int(16000 * seconds)) / 16000
        write_wav(self.root / name, 0.2 * np.sin(2 * np.pi * (200 + self.count) * t))
        return name

    def video(self, seconds=2, sound=False) -> str:
        self.count += 1
        name = f"media/vid{self.count}.mp4"
        frames = (np.full((48, 64, 3), (i * 37) % 255, np.uint8) for i in range(seconds * 2))
        sound_track = (
            (0.2 * np.sin(np.arange(16000 * seconds) / 16000 * 2 * np.pi * 300)).astype(np.float32)
            if sound
            else None
        )
        write_mp4(self.root / name, frames, (64, 48), 2, audio=sound_track)
        return name

    def record(self, task: str, prompt: str = "Describe.", answer: str = "ok", **media) -> dict:
        record = {
            "task": task,
            "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
            "images": media.get("images", []),
            "videos": media.get("videos", []),
            "audios": media.get("audios", []),
        }
        self.lines.append(json.dumps(record))
        return record

    def raw(self, line: str) -> None:
        self.lines.append(line)

    def write(self, name="pool.jsonl") -> Path:
        path = self.root / name
        path.write_text("\n".join(self.lines) + "\n")
        return path


@pytest.fixture
def two_tier(tmp_path) -> tuple[Path, Path]:
    """A text pool with 300 samples each of a high-tier and a low-tier task."""
    taxonomy = tmp_path / "taxonomy.yaml"
    taxonomy.write_text(TWO_TIER_TAXONOMY)
    pool = PoolBuilder(tmp_path / "pool")
    for i in range(300):
        pool.record("precise", prompt=f"Read digit {i}.", answer=str(i))
        pool.record("casual", prompt=f"Say hi {i}.", answer="hi")
    return pool.write(), taxonomy


# --- the demo pool --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_set(demo_pool, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("calib") / "set"
    build_calibration_set([demo_pool], out, CalibrateOptions(size=60, seed=3))
    return out


def test_exact_size_and_every_stratum_covered(demo_set, demo_pool):
    report = load_calibration_report(demo_set)
    rows = load_calibration_set(demo_set)
    assert report["size"] == len(rows) == 60
    assert report["coverage"]["strata_missing"] == []
    assert report["coverage"]["strata_selected"] == report["coverage"]["strata_in_pool"]
    pool_strata = {row["name"] for row in report["strata"]}
    assert set(rows["stratum"]) == pool_strata
    # Every taxonomy task is present.
    assert report["coverage"]["tasks_selected"] == report["coverage"]["tasks_in_taxonomy"] == 12


def test_rows_carry_stratum_fields_and_absolute_media(demo_set):
    rows = load_calibration_set(demo_set)
    assert {"id", "task", "tier", "modality", "bucket", "stratum", "messages", "images"} <= set(
        rows.column_names
    )
    for row in rows:
        assert row["stratum"] == f"{row['task']}|{row['modality']}|{row['bucket']}"
        for path in row["images"] + row["videos"] + row["audios"]:
            assert Path(path).is_absolute() and Path(path).is_file()


def test_same_seed_is_byte_identical_other_seed_differs(demo_pool, demo_set, tmp_path):
    again = tmp_path / "again"
    build_calibration_set([demo_pool], again, CalibrateOptions(size=60, seed=3))
    assert folder_bytes(again) == folder_bytes(demo_set)
    other = tmp_path / "other"
    build_calibration_set([demo_pool], other, CalibrateOptions(size=60, seed=4))
    assert (other / "samples.jsonl").read_bytes() != (demo_set / "samples.jsonl").read_bytes()


def test_high_tier_share_follows_weights(two_tier, tmp_path):
    pool, taxonomy = two_tier
    result = build_calibration_set([pool], tmp_path / "s", CalibrateOptions(size=200, taxonomy=taxonomy))
    by_task = {row["name"]: row["selected"] for row in result.report["tasks"]}
    assert by_task["precise"] + by_task["casual"] == 200
    # Equal availability, weights 3:1 -> 150:50 (floors of 2 each shift it by at most one).
    assert by_task["precise"] == pytest.approx(150, abs=1)
    assert by_task["precise"] / by_task["casual"] == pytest.approx(3.0, rel=0.05)


def test_capped_stratum_gives_its_share_to_others(tmp_path):
    counts = allocate({"rare": 5, "common": 1000}, {"rare": 10.0, "common": 1.0}, 100, floor=2)
    assert counts == {"rare": 5, "common": 95}


def test_small_pool_uses_everything_or_fails_strict(two_tier, tmp_path):
    pool, taxonomy = two_tier
    result = build_calibration_set([pool], tmp_path / "all", CalibrateOptions(size=5000, taxonomy=taxonomy))
    assert result.report["size"] == 600
    assert any("fewer than --size 5000" in note for note in result.notes)
    with pytest.raises(InputError, match="fewer than --size"):
        build_calibration_set(
            [pool], tmp_path / "strict", CalibrateOptions(size=5000, taxonomy=taxonomy, strict=True)
        )
    assert not (tmp_path / "strict").exists()


def test_missing_task_fails_unless_allowed(tmp_path):
    pool = PoolBuilder(tmp_path / "pool")
    for i in range(5):
        pool.record("ocr", prompt="<image>Read it.", answer=str(i), images=[pool.image(color=(i, 0, 0))])
    path = pool.write()
    with pytest.raises(InputError, match="have no sample in the pool") as err:
        build_calibration_set([path], tmp_path / "out", CalibrateOptions(size=3))
    assert "visual_grounding" in err.value.message and "asr" in err.value.message
    assert not (tmp_path / "out").exists()
    result = build_calibration_set(
        [path], tmp_path / "out", CalibrateOptions(size=3, allow_missing_tasks=True)
    )
    assert result.report["size"] == 3


def test_exact_duplicates_count_once(tmp_path):
    pool = PoolBuilder(tmp_path / "pool")
    first = pool.image(color=(1, 2, 3))
    copy = "media/copy.png"
    (pool.root / copy).write_bytes((pool.root / first).read_bytes())
    pool.record("ocr", prompt="<image>Read.", answer="A", images=[first])
    pool.record("ocr", prompt="<image>Read.", answer="A", images=[copy])  # same bytes, other path
    pool.record("ocr", prompt="<image>Read.", answer="B", images=[first])  # other text
    result = build_calibration_set(
        [pool.write()], tmp_path / "s", CalibrateOptions(size=10, allow_missing_tasks=True)
    )
    assert result.report["duplicates_dropped"] == 1
    assert result.report["size"] == 2


def test_modalities_and_buckets_from_headers(tmp_path):
    pool = PoolBuilder(tmp_path / "pool")
    pool.record("ocr", prompt="<image>Read.", images=[pool.image(size=(1600, 1200))])
    pool.record("ocr", prompt="<image><image>Read both.", images=[pool.image(), pool.image(color=(9, 9, 9))])
    pool.record("selling_points", prompt="<video>Points?", videos=[pool.video(seconds=2, sound=True)])
    pool.record("temporal_grounding", prompt="<video>When?", videos=[pool.video(seconds=12)])
    pool.record("asr", prompt="<audio>Transcribe.", audios=[pool.audio(seconds=1)])
    pool.record(
        "audio_image_qa", prompt="<image><audio>Answer.", images=[pool.image()], audios=[pool.audio()]
    )
    pool.record("text_chat", prompt="Hello")
    result = build_calibration_set(
        [pool.write()], tmp_path / "s", CalibrateOptions(size=7, allow_missing_tasks=True)
    )
    strata = set(load_calibration_set(tmp_path / "s")["stratum"])
    assert strata == {
        "ocr|image|image:large",
        "ocr|multi-image|image:small",
        "selling_points|video+audio|video:short",
        "temporal_grounding|video|video:medium",
        "asr|audio|audio:short",
        "audio_image_qa|image+audio|image:small",
        "text_chat|text|text",
    }
    assert result.report["modality_not_listed_for_task"] == {}


def test_model_token_counts_and_max_seq_len(demo_pool, zoo_model, tmp_path):
    model = zoo_model("tiny-qwen2.5-omni")
    result = build_calibration_set(
        [demo_pool], tmp_path / "s", CalibrateOptions(size=40, model=model, max_seq_len=400)
    )
    rows = load_calibration_set(tmp_path / "s")
    assert all(0 < t <= 400 for t in rows["tokens"])
    assert result.report["too_long"]["count"] > 0  # the demo pool's long videos do not fit in 400
    assert result.report["tokens"]["max"] <= 400


def test_max_seq_len_stops_tokenising_a_huge_record_early(zoo_model, tmp_path):
    """A record far over --max-seq-len is left out from a prefix of its text: the count the
    counter gives under the limit is over it and below the full count (issue 19.7)."""
    from transformers import AutoProcessor

    from quantkit.calibset.tokens import TokenCounter

    model = zoo_model("tiny-qwen2.5-omni")
    counter = TokenCounter(AutoProcessor.from_pretrained(model))
    words = " ".join(f"word{i}" for i in range(40_000))
    payload = {"messages": [{"role": "user", "content": words}, {"role": "assistant", "content": "ok"}],
               "images": [], "videos": [], "audios": []}  # fmt: skip
    capped, full = counter(payload, limit=64), counter(payload)
    assert 64 < capped < full
    assert counter({**payload, "messages": [{"role": "user", "content": "hi"}]}, limit=64) == counter(
        {**payload, "messages": [{"role": "user", "content": "hi"}]}
    )  # short texts: the exact count
    pool = PoolBuilder(tmp_path / "pool")
    pool.record("precise", prompt=words, answer="ok")
    for i in range(3):
        pool.record("precise", prompt=f"short {i}", answer="ok")
    taxonomy = tmp_path / "taxonomy.yaml"
    taxonomy.write_text(TWO_TIER_TAXONOMY)
    result = build_calibration_set(
        [pool.write()], tmp_path / "s",
        CalibrateOptions(size=4, model=model, max_seq_len=64, taxonomy=taxonomy, allow_missing_tasks=True),
    )  # fmt: skip
    assert result.report["size"] == 3 and result.report["too_long"]["count"] == 1


def test_token_count_matches_processor_for_images_and_audio(zoo_model, tmp_path):
    """Header-based counts equal the processor's real output length (no pixels decoded)."""
    from transformers import AutoProcessor

    from quantkit.calibset.tokens import TokenCounter
    from quantkit.models.inputs import Sample, processor_inputs

    processor = AutoProcessor.from_pretrained(zoo_model("tiny-qwen2.5-omni"))
    pool = PoolBuilder(tmp_path / "pool")
    image, audio = pool.root / pool.image(size=(300, 200)), pool.root / pool.audio(seconds=3)
    messages = [
        {"role": "user", "content": "<image><audio>What?"},
        {"role": "assistant", "content": "A thing."},
    ]
    expected = processor_inputs(processor, Sample(messages, images=[image], audios=[audio]))[
        "input_ids"
    ].shape[1]
    counted = TokenCounter(processor)(
        {"messages": messages, "images": [str(image)], "videos": [], "audios": [str(audio)]}
    )
    assert counted == expected


def test_stratified_subsample_keeps_proportions():
    strata = ["a"] * 60 + ["b"] * 30 + ["c"] * 10
    picked = stratified_subsample(strata, 10, seed=1)
    assert len(picked) == 10
    assert Counter(strata[i] for i in picked) == {"a": 6, "b": 3, "c": 1}
    assert picked != list(range(10))


# --- bad input: file, line, reason; exit 2; nothing written ---------------------------------------


BAD_RECORDS = [
    ("{not json", "malformed JSON"),
    ('{"task": "ocr", "messages": [{"role": "user", "content": "hi \\ud800"}]}', "UTF-16 surrogate"),
    ('["a list"]', "must be a JSON object"),
    ('{"task": "ocr", "images": []}', "missing field 'messages'"),
    ('{"task": "ocrr", "messages": [{"role": "user", "content": "hi"}]}', "did you mean 'ocr'"),
    (
        '{"task": "ocr", "messages": [{"role": "user", "content": "<image>hi"}], "images": ["media/nope.png"]}',
        "image file not found",
    ),
    (
        '{"task": "ocr", "messages": [{"role": "user", "content": "<image>hi"}], "images": ["../outside.png"]}',
        "escapes the pool folder",
    ),
    (
        '{"task": "ocr", "messages": [{"role": "user", "content": "<image>hi"}], "images": ["media/bad.txt"]}',
        "unsupported image extension",
    ),
    (
        '{"task": "ocr", "messages": [{"role": "user", "content": "<image>hi"}], "images": ["media/truncated.png"]}',
        "unreadable image",
    ),
    (
        '{"task": "asr", "messages": [{"role": "user", "content": "<audio>hi"}], "audios": ["media/garbage.wav"]}',
        "unreadable audio",
    ),
    (
        '{"task": "asr", "messages": [{"role": "user", "content": "<audio>hi"}], "audios": ["media/cut.wav"]}',
        "truncated WAV",
    ),
    (
        '{"task": "temporal_grounding", "messages": [{"role": "user", "content": "<video>hi"}], "videos": ["media/garbage.mp4"]}',
        "unreadable video",
    ),
    (
        '{"task": "ocr", "messages": [{"role": "user", "content": "<image><image>hi"}], "images": ["media/good.png"]}',
        "2 <image> placeholder",
    ),
    ('{"task": "ocr", "messages": [{"role": "robot", "content": "hi"}]}', "unknown role"),
    ('{"task": "ocr", "messages": [{"role": ["user"], "content": "hi"}]}', "unknown role ['user']"),
]


@pytest.fixture
def bad_pool_dir(tmp_path) -> Path:
    root = tmp_path / "pool"
    (root / "media").mkdir(parents=True)
    Image.new("RGB", (32, 32), (1, 2, 3)).save(root / "media" / "good.png")
    good = (root / "media" / "good.png").read_bytes()
    (root / "media" / "truncated.png").write_bytes(good[: len(good) // 2])
    (root / "media" / "bad.txt").write_text("not an image")
    (root / "media" / "garbage.wav").write_bytes(b"RIFF\x00\x00garbage" * 10)
    write_wav(root / "media" / "whole.wav", np.zeros(16000))
    whole = (root / "media" / "whole.wav").read_bytes()
    (root / "media" / "cut.wav").write_bytes(whole[: len(whole) // 2])
    (root / "media" / "garbage.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x01" * 200)
    Image.new("RGB", (8, 8)).save(tmp_path / "outside.png")
    return root


@pytest.mark.parametrize(("line", "reason"), BAD_RECORDS, ids=[r for _, r in BAD_RECORDS])
def test_bad_record_names_file_line_reason(bad_pool_dir, tmp_path, line, reason):
    good = json.dumps(
        {"task": "ocr", "messages": [{"role": "user", "content": "<image>hi"}], "images": ["media/good.png"]}
    )
    pool = bad_pool_dir / "pool.jsonl"
    pool.write_text(f"{good}\n\n{line}\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["calibrate", str(pool), "--output", str(out), "--size", "1"])
    assert result.exit_code == 2, result.output
    assert f"{pool}:3" in result.output
    assert reason in result.output
    assert "Traceback" not in result.output
    assert not out.exists()
    assert not any(p.name.startswith(".out") for p in tmp_path.iterdir())


def test_skip_invalid_counts_skipped_records(bad_pool_dir, tmp_path):
    lines = [
        json.dumps(
            {
                "task": "ocr",
                "messages": [{"role": "user", "content": "<image>hi"}],
                "images": ["media/good.png"],
            }
        ),
        *[line for line, _ in BAD_RECORDS],
    ]
    pool = bad_pool_dir / "pool.jsonl"
    pool.write_text("\n".join(lines) + "\n")
    result = build_calibration_set(
        [pool], tmp_path / "s", CalibrateOptions(size=5, skip_invalid=True, allow_missing_tasks=True)
    )
    assert result.report["size"] == 1
    assert result.report["skipped"]["count"] == len(BAD_RECORDS)
    assert {r["line"] for r in result.report["skipped"]["records"]} == set(range(2, len(BAD_RECORDS) + 2))


def test_records_without_task_and_no_rule_name_source_and_flag(tmp_path):
    """A taxonomy without match rules: records with no task field fail once the pool is read, with
    the source, the count and the flag that would assign them; --task or --default-task fixes it."""
    taxonomy = tmp_path / "taxonomy.yaml"
    taxonomy.write_text(TWO_TIER_TAXONOMY)
    pool = PoolBuilder(tmp_path / "pool")
    pool.record("precise", prompt="Read 1.", answer="1")
    for i in range(3):
        pool.raw(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "hi"}]}))
    path = pool.write()
    args = ["calibrate", str(path), "--output", str(tmp_path / "o"), "--size", "4", "--taxonomy", str(taxonomy)]
    result = runner.invoke(app, [*args, "--allow-missing-tasks"])
    assert result.exit_code == 2, result.output
    assert "3 record(s)" in result.output and str(path) in result.output and "--task" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()
    fixed = runner.invoke(app, [*args, "--task", f"{path}=casual"])
    assert fixed.exit_code == 0, fixed.output
    rows = [json.loads(line) for line in (tmp_path / "o" / "samples.jsonl").read_text().splitlines()]
    assert Counter(r["task"] for r in rows) == {"precise": 1, "casual": 3}
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["sources"][0]["task_origins"] == {"field": 1, "mapping": 3}


def test_empty_pool_and_missing_pool(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = runner.invoke(app, ["calibrate", str(empty), "--output", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no valid records" in result.output
    result = runner.invoke(app, ["calibrate", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "o")])
    assert result.exit_code == 2 and "pool not found" in result.output


def test_existing_output_needs_force(two_tier, tmp_path):
    pool, taxonomy = two_tier
    out = tmp_path / "set"
    args = ["calibrate", str(pool), "--output", str(out), "--size", "10", "--taxonomy", str(taxonomy)]
    assert runner.invoke(app, args).exit_code == 0
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "already exists" in again.output
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0


def test_invalid_taxonomy_names_field_and_line(tmp_path, two_tier):
    pool, _ = two_tier
    bad = tmp_path / "bad.yaml"
    bad.write_text(TWO_TIER_TAXONOMY.replace("tier: low}", "tier: low, colour: red}"))
    result = runner.invoke(
        app, ["calibrate", str(pool), "--output", str(tmp_path / "o"), "--taxonomy", str(bad)]
    )
    assert result.exit_code == 2
    assert f"{bad}:10" in result.output and "colour" in result.output


def test_cli_prints_table_and_writes_reports(two_tier, tmp_path):
    pool, taxonomy = two_tier
    out = tmp_path / "set"
    result = runner.invoke(
        app, ["calibrate", str(pool), "--output", str(out), "--size", "40", "--taxonomy", str(taxonomy)]
    )
    assert result.exit_code == 0, result.output
    assert "precise" in result.output and "casual" in result.output
    report = json.loads((out / "report.json").read_text())
    assert report["size"] == 40 and report["seed"] == 0
    assert "| precise | high |" in (out / "report.md").read_text()
    assert set(report["inputs"]) == {str(pool.resolve())}


def test_load_rejects_folder_that_is_not_a_set(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(InputError, match="not a quantkit calibration set"):
        load_calibration_set(tmp_path / "x")


def test_sample_lines_are_exactly_the_json_of_their_rows(demo_pool):
    """samples.jsonl lines are assembled from JSON pieces for speed; each must equal the plain
    json.dumps of the row that _row describes (sorted keys, non-ASCII kept)."""
    from quantkit.calibset.build import _dumps, _row, _RowJson
    from quantkit.pool import read_pool
    from quantkit.taxonomy import load_taxonomy

    taxonomy = load_taxonomy()
    pool = read_pool([demo_pool], taxonomy)
    assemble = _RowJson(taxonomy)
    assert pool.records
    for index, record in enumerate(pool.records):
        tokens = None if index % 3 == 0 else 100 + index  # with and without a token count
        assert assemble(record, tokens) == _dumps(_row(record, taxonomy, tokens))
