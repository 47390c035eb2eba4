"""Bad input is exit 2 with a message that names the file, line or option and says what to do, never
a traceback and never silently accepted (issue 34, "tracebacks and silent acceptance").

Every case runs the command line as a user would (typer's runner, in process) on a tiny model,
pools and calibration sets written on the spot.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
from pathlib import Path

import pytest
from fixtures_pool import TWO_TIER_TAXONOMY
from typer.testing import CliRunner

from quantkit.calibset import CalibrateOptions, build_calibration_set

runner = CliRunner()


def refused(*args, says: tuple[str, ...] = ()) -> str:
    """Run ``quantkit ARGS``; assert exit 2, no traceback, and each of ``says`` in the output."""
    result = runner.invoke(_app(), [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args])
    output = result.output
    assert "Traceback" not in output, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, output
    said = " ".join(output.replace("│", " ").split())  # rich's boxes and wrapping undone
    for text in says:
        assert text in said, f"{text!r} not in:\n{output}"
    return output


def _app():
    from quantkit.cli import app

    return app


@pytest.fixture(scope="module")
def model(zoo_model, tmp_path_factory) -> Path:
    """A private copy of the tiny text model; each damaging test copies it again."""
    copy = tmp_path_factory.mktemp("inputs-model") / "qwen3"
    shutil.copytree(zoo_model("tiny-qwen3"), copy)
    return copy


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> tuple[Path, Path]:
    """A text pool of 80 records over two tasks, and its taxonomy."""
    root = tmp_path_factory.mktemp("inputs-pool")
    taxonomy = root / "taxonomy.yaml"
    taxonomy.write_text(TWO_TIER_TAXONOMY)
    lines = []
    for i in range(40):
        for task, prompt in (
            ("precise", f"Read the digit {i} aloud."),
            ("casual", f"Say hello, número {i}."),
        ):
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": f"{task} {i}"}]
            lines.append(json.dumps({"task": task, "messages": messages}, ensure_ascii=False))
    path = root / "pool.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, taxonomy


@pytest.fixture(scope="module")
def calib(pool, tmp_path_factory) -> Path:
    path, taxonomy = pool
    out = tmp_path_factory.mktemp("inputs-calib") / "set"
    build_calibration_set([path], out, CalibrateOptions(size=64, taxonomy=taxonomy))
    return out


def damaged_copy(model: Path, where: Path) -> Path:
    copy = where / "model"
    shutil.copytree(model, copy)
    return copy


def dry_run(model: Path, tmp_path: Path, *extra) -> list:
    return ["quantize", model, "--recipe", "fp8-dynamic", "-o", tmp_path / "out", "--dry-run", *extra]


# --------------------------------------------------------------------------- model files


def _safetensors_with_header(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize(
    ("file", "content", "says"),
    [
        (
            "model.safetensors.index.json",
            b"[1, 2]",
            "model.safetensors.index.json: not a readable index (a JSON array",
        ),
        (
            "model.safetensors.index.json",
            b'{"weight_map": {"lm_head.weight": 5}}',
            "the shard of 'lm_head.weight' is 5, not a file name",
        ),
        (
            "model.safetensors.index.json",
            b'{"weight_map": ["model.safetensors"]}',
            "'weight_map' is a JSON array, not an object",
        ),
        (
            "model.safetensors",
            _safetensors_with_header(b"[1, 2, 3]"),
            "its header is a JSON array, not an object",
        ),
        ("config.json", b"[1]", "config.json holds a JSON array, not an object"),
    ],
    ids=[
        "index-not-object",
        "shard-not-string",
        "weight-map-not-object",
        "header-not-object",
        "config-not-object",
    ],
)
def test_malformed_model_files_are_named(model, tmp_path, file, content, says):
    copy = damaged_copy(model, tmp_path)
    (copy / file).write_bytes(content)
    output = refused(*dry_run(copy, tmp_path), says=(says,))
    assert "download or copy the model again" in output


def test_verify_names_a_config_that_is_not_an_object(model, tmp_path):
    copy = damaged_copy(model, tmp_path)
    (copy / "config.json").write_text('"a string"')
    refused(
        "verify", copy, "--report", tmp_path / "v.json", says=(str(copy / "config.json"), "not an object")
    )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("num_hidden_layers", "two", "config.json field 'num_hidden_layers'"),
        ("hidden_size", [64], "config.json field 'hidden_size'"),
        ("architectures", "Qwen3ForCausalLM", "field 'architectures' is 'Qwen3ForCausalLM', not a list"),
    ],
)
def test_config_field_of_the_wrong_type_is_named(model, tmp_path, field, value, says):
    copy = damaged_copy(model, tmp_path)
    config = json.loads((copy / "config.json").read_text())
    config[field] = value
    (copy / "config.json").write_text(json.dumps(config))
    refused(*dry_run(copy, tmp_path), says=(str(copy / "config.json"), says))


# --------------------------------------------------------------------------- sensitivity table, calibration set


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        (5, "field 'rows'"),
        ([1], "field 'rows.0'"),
        (
            [{"name": "a", "layers": ["a"], "params": 5, "kl": "x", "top1": None, "rel_logit_mse": None}],
            "'rows.0.kl'",
        ),
    ],
    ids=["rows-a-number", "row-a-number", "kl-a-string"],
)
def test_sensitivity_table_of_the_wrong_shape(model, calib, tmp_path, rows, says):
    table = {
        "version": 1, "model": "m", "architecture": "a", "scheme": {}, "granularity": "layer",
        "mode": "replay", "samples": 1, "sample_ids": [], "tokens": 1, "positions": 1, "rows": rows,
    }  # fmt: skip
    path = tmp_path / "sens.json"
    path.write_text(json.dumps(table))
    args = ["quantize", model, "--recipe", "w4a16", "--calib", calib, "-o", tmp_path / "out", "--dry-run"]
    refused(
        *args,
        "--avg-bits",
        "4.5",
        "--sensitivity",
        path,
        says=(str(path), "malformed sensitivity table", says),
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("images", 5), ("messages", "hello"), ("stratum", 3), ("messages", [{"role": "user", "content": 7}])],
)
def test_calibration_set_line_of_the_wrong_type_names_the_line(model, calib, tmp_path, field, value):
    copy = tmp_path / "set"
    shutil.copytree(calib, copy)
    samples = copy / "samples.jsonl"
    lines = samples.read_text().splitlines()
    row = json.loads(lines[2])
    row[field] = value
    lines[2] = json.dumps(row)
    samples.write_text("\n".join(lines) + "\n")
    report = json.loads((copy / "report.json").read_text())  # as a hand edit that also fixed the hash
    report["samples_sha256"] = hashlib.sha256(samples.read_bytes()).hexdigest()
    (copy / "report.json").write_text(json.dumps(report))
    args = ["quantize", model, "--recipe", "w4a16", "--calib", copy, "-o", tmp_path / "out", "--dry-run"]
    refused(*args, says=(f"{samples}:3", f"field {field!r}", "quantkit calibrate"))


# --------------------------------------------------------------------------- pools


def calibrate(pool_path: Path, taxonomy: Path, tmp_path: Path, *extra) -> list:
    return ["calibrate", pool_path, "--taxonomy", taxonomy, "-o", tmp_path / "set", "--size", 64, *extra]


@pytest.mark.parametrize("skip_invalid", [False, True])
@pytest.mark.parametrize("form", ["jsonl", "json"])
def test_record_nested_deeper_than_the_parser_goes(pool, tmp_path, skip_invalid, form):
    path, taxonomy = pool
    records = [json.loads(line) for line in path.read_text().splitlines()]
    deep = '{"task": "casual", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    if form == "jsonl":
        pool_file = tmp_path / "deep.jsonl"
        pool_file.write_text(path.read_text() + deep + "\n")
    else:  # a JSON array: nothing after the deep record can be read
        pool_file = tmp_path / "deep.json"
        pool_file.write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + ",\n" + deep + "\n]\n")
    line = 81 if form == "jsonl" else 82
    if not skip_invalid:
        refused(*calibrate(pool_file, taxonomy, tmp_path), says=(f"{pool_file}:{line}", "nested more than"))
        return
    result = runner.invoke(
        _app(), [str(a) for a in calibrate(pool_file, taxonomy, tmp_path, "--skip-invalid")]
    )
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    report = json.loads((tmp_path / "set" / "report.json").read_text())
    assert report["skipped"]["count"] == 1
    assert "nested more than" in report["skipped"]["records"][0]["reason"]


@pytest.mark.parametrize("skip_invalid", [False, True])
@pytest.mark.parametrize(
    ("encoding", "says"),
    [
        ("utf-16", ("UTF-16 text, not UTF-8", "iconv -f UTF-16 -t UTF-8")),
        ("latin-1", ("looks like Latin-1", "iconv -f LATIN1 -t UTF-8")),
    ],
)
def test_pool_in_another_encoding_says_which_and_how_to_convert(pool, tmp_path, encoding, says, skip_invalid):
    path, taxonomy = pool
    converted = tmp_path / f"pool-{encoding}.jsonl"
    converted.write_bytes(path.read_text(encoding="utf-8").encode(encoding))
    extra = ["--skip-invalid"] if skip_invalid else []
    # --skip-invalid must not keep the lines that happen to be ASCII (78 of 80 here for Latin-1).
    refused(*calibrate(converted, taxonomy, tmp_path, *extra), says=(str(converted), *says))
    assert not (tmp_path / "set").exists()


def test_latin1_json_array_names_the_line(pool, tmp_path):
    path, taxonomy = pool
    records = [json.loads(line) for line in path.read_text().splitlines()]
    array = tmp_path / "pool.json"
    array.write_bytes(json.dumps(records, ensure_ascii=False, indent=1).encode("latin-1"))
    first = next(n for n, line in enumerate(array.read_bytes().split(b"\n"), 1) if not line.isascii())
    refused(
        *calibrate(array, taxonomy, tmp_path, "--skip-invalid"),
        says=(f"{array}:{first}", "looks like Latin-1"),
    )


def test_latin1_line_read_by_a_second_process_is_not_skipped(pool, tmp_path):
    """The parts of a pool read in other processes (--workers) bring back the error's kind too."""
    path, taxonomy = pool
    ascii_lines = [line for line in path.read_text().splitlines() if line.isascii()]
    converted = tmp_path / "late-latin1.jsonl"
    last = json.dumps(
        {"task": "casual", "messages": [{"role": "user", "content": "Grüße"}]}, ensure_ascii=False
    )
    converted.write_bytes(("\n".join(ascii_lines) + "\n" + last + "\n").encode("latin-1"))
    line = len(ascii_lines) + 1
    refused(
        *calibrate(converted, taxonomy, tmp_path, "--workers", 2, "--skip-invalid", "--dry-run"),
        says=(f"{converted}:{line}", "looks like Latin-1"),
    )


def test_pool_file_name_that_is_not_utf8(pool, tmp_path):
    path, taxonomy = pool
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/p\xe4ol"))
    folder.mkdir()
    renamed = folder / "pool.jsonl"
    shutil.copy(path, renamed)
    refused(*calibrate(renamed, taxonomy, tmp_path), says=("not valid UTF-8", "rename", "convmv"))


@pytest.fixture
def media_pool(tmp_path) -> Path:
    """A folder with one image, and a record writer: ``write(name, path)`` -> a one-record pool."""
    from PIL import Image

    (tmp_path / "media").mkdir()
    Image.new("RGB", (32, 32), "white").save(tmp_path / "media" / "ok.png")
    return tmp_path


def one_image_pool(folder: Path, image: str) -> Path:
    record = {
        "task": "ocr",
        "messages": [{"role": "user", "content": "<image>Read it."}, {"role": "assistant", "content": "X"}],
        "images": [image],
    }
    path = folder / "pool.jsonl"
    path.write_text(json.dumps(record) + "\n")  # ensure_ascii: a non-UTF-8 name goes in as \udcXX
    return path


def test_media_that_is_not_a_file_says_what_it_is(media_pool):
    folder = media_pool
    (folder / "media" / "a-folder.png").mkdir()
    os.mkfifo(folder / "media" / "fifo.png")
    for name, what in (("media/a-folder.png", "is a folder, not a file"), ("media/fifo.png", "is a FIFO")):
        output = refused(
            "calibrate", one_image_pool(folder, name), "-o", folder / "set", "--dry-run", says=(what,)
        )
        assert "not found" not in output
    device = refused(
        "calibrate", one_image_pool(folder, "/dev/null"), "--media-root", "/dev", "-o", folder / "set", "--dry-run",
        says=("is a character device",),
    )  # fmt: skip
    assert "not found" not in device


def test_media_names_too_long_or_not_utf8(media_pool):
    folder = media_pool
    long_name = "media/" + "x" * 300 + ".png"
    refused("calibrate", one_image_pool(folder, long_name), "-o", folder / "set", "--dry-run",
            says=("pool.jsonl:1", "longer than the file system allows"))  # fmt: skip
    latin1 = os.fsdecode(b"media/caf\xe9.png")  # the file's bytes as Python names them
    shutil.copy(folder / "media" / "ok.png", folder / latin1)
    refused("calibrate", one_image_pool(folder, latin1), "-o", folder / "set", "--dry-run",
            says=("pool.jsonl:1", "not valid UTF-8", "rename"))  # fmt: skip


def test_a_huge_value_is_not_echoed_whole(pool, tmp_path):
    _, taxonomy = pool
    pool_file = tmp_path / "huge.jsonl"
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    pool_file.write_text(json.dumps({"task": "T" * 5_000_000, "messages": messages}) + "\n")
    output = refused(*calibrate(pool_file, taxonomy, tmp_path), says=("unknown task", "characters left out"))
    assert len(output) < 3000


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        ("calibrate", "--max-seq-len", "0"),
        ("calibrate", "--min-per-stratum", "-1"),
        ("quantize", "--max-seq-len", "-3"),
        ("quantize", "--num-samples", "0"),
        ("sensitivity", "--num-samples", "0"),
        ("sensitivity", "--positions", "0"),
        ("sensitivity", "--max-seq-len", "0"),
        ("verify", "--max-kl", "-1"),
        ("verify", "--num-samples", "0"),
    ],
)
def test_numeric_option_out_of_range_is_named(model, calib, pool, tmp_path, command, option, value):
    path, taxonomy = pool
    base = {
        "calibrate": ["calibrate", path, "--taxonomy", taxonomy, "--model", model, "-o", tmp_path / "set"],
        "quantize": [
            "quantize",
            model,
            "--recipe",
            "w4a16",
            "--calib",
            calib,
            "-o",
            tmp_path / "q",
            "--dry-run",
        ],
        "sensitivity": ["sensitivity", model, "--calib", calib, "-o", tmp_path / "s.json"],
        "verify": ["verify", model],
    }[command]
    refused(*base, option, value, says=(option, "greater than or equal"))
    assert not (tmp_path / "set").exists() and not (tmp_path / "s.json").exists()


def test_output_names_too_long_are_bad_input(model, pool, tmp_path):
    path, taxonomy = pool
    long_name = "x" * 250  # fits alone; not with its staging copy's ".NAME.partial-PID"
    refused(*calibrate(path, taxonomy, tmp_path)[:-4], "-o", tmp_path / long_name, "--size", 64,
            says=("--output", "250 bytes", "shorter name"))  # fmt: skip
    refused(*dry_run(model, tmp_path)[:-3], "-o", tmp_path / ("y" * 250), "--dry-run", says=("shorter name",))


def test_output_root_that_is_a_file(model, tmp_path):
    root = tmp_path / "a-file"
    root.write_text("mine")
    refused("build", "--target", "cpu-portable", "--model", model, "--output-root", root,
            says=("--output-root is a file, not a folder",))  # fmt: skip
    assert root.read_text() == "mine"


def test_folder_given_for_a_file_output_leaves_no_staging(model, calib, tmp_path):
    folder = tmp_path / "taken"
    folder.mkdir()
    refused(*dry_run(model, tmp_path), "--plan-json", folder, says=("--plan-json is a folder",))
    refused("sensitivity", model, "--calib", calib, "-o", folder, says=("--output is a folder",))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert list(folder.iterdir()) == []


def test_recipe_group_size_that_fits_no_layer_is_refused(model, calib, tmp_path):
    recipe = tmp_path / "g12.yaml"
    recipe.write_text(
        (Path(__file__).parents[1] / "recipes" / "w4a16.yaml")
        .read_text()
        .replace("name: w4a16", "name: w4a16-g12")
        .replace("group_size: null", "group_size: 12")
    )
    args = ["quantize", model, "--recipe", recipe, "--calib", calib, "-o", tmp_path / "q", "--dry-run"]
    refused(*args, says=("group size 12 divides none", "group_size"))


def test_unwritable_cache_names_the_cache_and_the_option(model, calib, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = blocker / "cache"
    args = [
        "quantize",
        model,
        "--recipe",
        "w4a16",
        "--calib",
        calib,
        "-o",
        tmp_path / "q",
        "--cache-dir",
        cache,
    ]
    refused(*args, says=("feature cache cannot be written", "--cache-dir"))
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize(
    "content", [b"{ not json", b"[1, 2]", b"\xff\xfe{}"], ids=["not-json", "array", "not-utf8"]
)
def test_unreadable_build_file_is_kept_aside_with_a_note(tmp_path, caplog, content):
    """An earlier build.json that cannot be read is moved aside (said in a note), never
    overwritten: the build then starts a new one. (The reader itself: a CLI build runs quantize.)"""
    from quantkit.build.record import BUILD_FILE, _read_build_file

    (tmp_path / BUILD_FILE).write_bytes(content)
    (tmp_path / f"{BUILD_FILE}.unreadable-1").write_text("an earlier copy")
    logger = logging.getLogger("quantkit")  # (the CLI's note handler stops it propagating)
    logger.addHandler(caplog.handler)
    try:
        assert _read_build_file(tmp_path) == {}
    finally:
        logger.removeHandler(caplog.handler)
    assert not (tmp_path / BUILD_FILE).exists()
    assert (tmp_path / f"{BUILD_FILE}.unreadable-2").read_bytes() == content
    assert (tmp_path / f"{BUILD_FILE}.unreadable-1").read_text() == "an earlier copy"
    assert any(
        f"{BUILD_FILE}.unreadable-2" in r.getMessage() and str(tmp_path) in r.getMessage()
        for r in caplog.records
    )


def test_as_a_separate_process_stderr_has_the_message_and_no_traceback(pool, tmp_path):
    """The same refusals from `python -m quantkit` itself: exit 2, the message on stderr, nothing else."""
    import subprocess
    import sys

    path, taxonomy = pool
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_bytes(path.read_text(encoding="utf-8").encode("utf-16"))
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"task": "casual", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for pool_file, says in ((utf16, "iconv -f UTF-16 -t UTF-8"), (deep, f"{deep}:1")):
        command = [sys.executable, "-m", "quantkit", "calibrate", str(pool_file), "--taxonomy", str(taxonomy)]
        done = subprocess.run(
            [*command, "-o", str(tmp_path / "set")], capture_output=True, text=True, env=env
        )
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and not (tmp_path / "set").exists()
