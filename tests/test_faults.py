"""File-system faults and damaged files: inputs are never written, failures come before the work,
and every one is a message and an exit code, never a traceback (issue 19).

Read-only folders and full disks are real mounts (a tmpfs, a read-only bind mount): the tests
run as root, whom chmod does not stop. Where mounting is not allowed they are skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_pool import TWO_TIER_TAXONOMY
from typer.testing import CliRunner

from quantkit.calibset import CalibrateOptions, build_calibration_set
from quantkit.cli import app
from quantkit.errors import CheckFailed
from quantkit.fsutil import atomic_output_dir, default_mode
from quantkit.recipes import get_recipe

runner = CliRunner()


def tree_hash(root: Path) -> str:
    """Names, bytes and link targets of everything under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(Path(root).rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def leftovers(folder: Path, name: str) -> list[str]:
    """What a run left in ``folder`` that belongs to output ``name``: the output or a staging folder."""
    return sorted(p.name for p in Path(folder).iterdir() if p.name == name or p.name.startswith(f".{name}."))


def invoke(*args) -> object:
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.fixture
def mount(tmp_path):
    """``mount(path, size=..., read_only=..., bind=...)``: a tmpfs (or a bind mount of ``bind``) at
    ``path``, unmounted after the test; skips the test where mounting is not allowed."""
    mounted: list[Path] = []

    def do(path: Path, *, size: str = "1m", read_only: bool = False, bind: Path | None = None) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        if bind is not None:
            commands = [["mount", "--bind", str(bind), str(path)]]
            if read_only:
                commands.append(["mount", "-o", "remount,bind,ro", str(path)])
        else:
            options = f"size={size}" + (",ro" if read_only else "")
            commands = [["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]]
        for command in commands:
            if shutil.which("mount") is None:
                pytest.skip("no mount command: cannot make a read-only or full file system here")
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(
                    f"cannot mount here ({done.stderr.strip()}): needs root in a namespace that allows it"
                )
            if not mounted or mounted[-1] != path:
                mounted.append(path)
        return path

    yield do
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture(scope="module")
def text_model(zoo_model, tmp_path_factory) -> Path:
    """A private copy of the tiny text model (a failing refusal must not damage the shared one)."""
    copy = tmp_path_factory.mktemp("faults-model") / "qwen3"
    shutil.copytree(zoo_model("tiny-qwen3"), copy)
    return copy


@pytest.fixture(scope="module")
def text_pool(tmp_path_factory) -> tuple[Path, Path]:
    """A text-only pool of 80 records over two tasks, and its taxonomy."""
    root = tmp_path_factory.mktemp("faults-pool")
    taxonomy = root / "taxonomy.yaml"
    taxonomy.write_text(TWO_TIER_TAXONOMY)
    folder = root / "pool"
    folder.mkdir()
    lines = []
    for i in range(40):
        for task, prompt in (
            ("precise", f"Read the digit {i} aloud."),
            ("casual", f"Say hello, number {i}."),
        ):
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": f"{task} {i}"}]
            lines.append(json.dumps({"task": task, "messages": messages}))
    pool = folder / "pool.jsonl"
    pool.write_text("\n".join(lines) + "\n")
    return pool, taxonomy


@pytest.fixture(scope="module")
def text_calib(text_pool, tmp_path_factory) -> Path:
    pool, taxonomy = text_pool
    calib = tmp_path_factory.mktemp("faults-calib") / "set64"
    build_calibration_set([pool], calib, CalibrateOptions(size=64, taxonomy=taxonomy))
    return calib


@pytest.fixture(scope="module")
def checkpoint(text_model, tmp_path_factory) -> Path:
    from quantkit.quantize import quantize

    out = tmp_path_factory.mktemp("faults-ckpt") / "qwen3-fp8"
    quantize(text_model, out, get_recipe("fp8-dynamic"), [], progress=False)
    return out


# --------------------------------------------------------------------------- 1. inputs never destroyed


def test_calibrate_refuses_an_output_over_its_pool(text_pool, tmp_path):
    pool, taxonomy = text_pool
    folder = pool.parent
    link = tmp_path / "link-to-pool"
    link.symlink_to(folder, target_is_directory=True)
    media = folder / "images"  # an existing folder beside the pool may hold its media
    media.mkdir(exist_ok=True)
    (media / "a.png").write_bytes(b"not really a png")
    before = tree_hash(folder.parent)
    for output, says in (
        (folder, "contains the pool"),  # the pool's folder, --force
        (folder.parent, "contains the pool"),  # a folder above it
        (pool, "is the pool"),
        (link, "contains the pool"),  # a symlink resolves to the pool's folder
        (media, "sits inside the pool's media folder"),
    ):
        result = invoke(
            "calibrate", pool, "--output", output, "--taxonomy", taxonomy, "--size", 10, "--force"
        )
        assert result.exit_code == 2, result.output
        assert says in result.output, result.output
        assert tree_hash(folder.parent) == before
        assert not list(folder.parent.rglob(".*.partial-*"))


def test_calibrate_refuses_an_output_over_a_media_root(text_pool, tmp_path):
    pool, taxonomy = text_pool
    root = tmp_path / "shared_media"
    (root / "images").mkdir(parents=True)
    (root / "images" / "a.png").write_bytes(b"media the user named with --media-root")
    before = tree_hash(root)
    for output, says in ((root, "is the media root"), (root / "images", "sits inside the media root")):
        result = invoke(
            "calibrate", pool, "--media-root", root, "--output", output,
            "--taxonomy", taxonomy, "--size", 10, "--force",
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        assert says in result.output, result.output
        assert tree_hash(root) == before


def test_quantize_refuses_an_output_over_its_model(text_model, tmp_path):
    before = tree_hash(text_model)
    link = tmp_path / "model-link"
    link.symlink_to(text_model, target_is_directory=True)
    for output, says in (
        (text_model, "is the model folder"),
        (text_model.parent, "contains the model folder"),
        (link, "is the model folder"),
        (text_model / "out", "sits inside the model folder"),
    ):
        result = invoke("quantize", text_model, "--recipe", "fp8-dynamic", "--output", output, "--force")
        assert result.exit_code == 2, result.output
        assert says in result.output, result.output
        assert tree_hash(text_model) == before
    cache_inside = invoke(
        "quantize",
        text_model,
        "--recipe",
        "fp8-dynamic",
        "--output",
        tmp_path / "q",
        "--cache-dir",
        text_model / "c",
    )
    assert cache_inside.exit_code == 2 and "--cache-dir sits inside the model folder" in cache_inside.output
    assert tree_hash(text_model) == before and leftovers(tmp_path, "q") == []


def test_other_commands_refuse_outputs_over_their_inputs(text_model, text_calib, tmp_path):
    model_before, calib_before = tree_hash(text_model), tree_hash(text_calib)
    cases = [
        (
            ["build", "--target", "h20", "--model", text_model, "--output-root", text_model.parent],
            "contains the model",
        ),
        (
            [
                "build",
                "--target",
                "h20",
                "--model",
                text_model,
                "--calib",
                text_calib,
                "--output-root",
                text_calib,
            ],
            "is the calibration set",
        ),
        (
            [
                "verify",
                text_model,
                "--reference",
                text_model,
                "--calib",
                text_calib,
                "--report",
                text_calib / "v.json",
            ],
            "sits inside the calibration set",
        ),
        (["verify", text_model, "--report", text_model / "config.json"], "sits inside the checkpoint"),
        (
            ["sensitivity", text_model, "--calib", text_calib, "-o", text_model / "s.json"],
            "sits inside the model",
        ),
        (
            ["sensitivity", text_model, "--calib", text_calib, "--cache-dir", text_calib],
            "is the calibration set",
        ),
        (
            [
                "eval",
                text_model,
                text_model,
                "--tasks",
                "quantkit_prose_ppl",
                "--cache-dir",
                text_model / "e",
            ],
            "sits inside the original model",
        ),
    ]
    for args, says in cases:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert says in result.output, (args, result.output)
    assert tree_hash(text_model) == model_before and tree_hash(text_calib) == calib_before


# --------------------------------------------------------------------------- 2. unwritable or full output


def test_quantize_on_a_read_only_output_fails_before_loading(text_model, tmp_path, mount):
    read_only = mount(tmp_path / "ro", read_only=True)
    before = tree_hash(text_model)
    result = invoke("quantize", text_model, "--recipe", "fp8-dynamic", "--output", read_only / "q")
    assert result.exit_code == 2, result.output
    assert "Read-only file system" in result.output and "--output" in result.output
    assert "calibrating" not in result.output and "wrote" not in result.output
    assert tree_hash(text_model) == before and list(read_only.iterdir()) == []


def test_output_under_a_file_or_in_proc_is_a_message(text_model, tmp_path):
    plain = tmp_path / "notes.txt"
    plain.write_text("not a folder")
    under_file = invoke("quantize", text_model, "--recipe", "fp8-dynamic", "--output", plain / "q")
    assert under_file.exit_code == 2 and "which is a file, not a folder" in under_file.output
    proc = invoke("quantize", text_model, "--recipe", "fp8-dynamic", "--output", "/proc/quantkit-test")
    assert proc.exit_code == 2 and "cannot write --output here" in proc.output
    assert plain.read_text() == "not a folder"


def test_quantize_refuses_a_disk_too_small_for_the_checkpoint(text_model, tmp_path, mount):
    small = mount(tmp_path / "small", size="1m")
    result = invoke("quantize", text_model, "--recipe", "fp8-dynamic", "--output", small / "q")
    assert result.exit_code == 2, result.output
    assert "not enough free space" in result.output and "MiB free" in result.output
    assert list(small.iterdir()) == []


def test_a_disk_that_fills_up_is_exit_1_and_leaves_nothing(text_pool, tmp_path, mount):
    pool, taxonomy = text_pool
    tiny = mount(tmp_path / "tiny", size="8k")
    before = tree_hash(pool.parent)
    result = invoke("calibrate", pool, "--taxonomy", taxonomy, "--output", tiny / "set", "--size", 64)
    assert result.exit_code == 1, result.output
    assert "the disk filled up while writing the output" in result.output
    assert list(tiny.iterdir()) == []  # no set, no staging folder
    assert tree_hash(pool.parent) == before


def test_safetensors_writer_on_a_full_disk_is_a_check_failure(tmp_path, mount):
    import torch
    from safetensors.torch import save_file

    tiny = mount(tmp_path / "tiny", size="64k")
    with (
        pytest.raises(CheckFailed, match="the disk filled up") as err,
        atomic_output_dir(tiny / "ckpt") as staging,
    ):
        save_file({"w": torch.zeros(1 << 16)}, str(staging / "model.safetensors"))
    assert err.value.exit_code == 1
    assert list(tiny.iterdir()) == []


# --------------------------------------------------------------------------- 3. damaged model files


def _truncated_copy(folder: Path, where: Path) -> Path:
    shutil.copytree(folder, where)
    weights = where / "model.safetensors"
    os.truncate(weights, weights.stat().st_size * 2 // 3)
    return where


def test_truncated_model_fails_the_plan(text_model, tmp_path):
    broken = _truncated_copy(text_model, tmp_path / "broken")
    before = tree_hash(broken)
    for extra in (["--dry-run"], []):
        result = invoke("quantize", broken, "--recipe", "fp8-dynamic", "--output", tmp_path / "q", *extra)
        assert result.exit_code == 2, result.output
        assert (
            "model.safetensors: truncated" in result.output
            and "download or copy the model again" in result.output
        )
    assert tree_hash(broken) == before and leftovers(tmp_path, "q") == []


def test_verify_reports_a_truncated_checkpoint_in_verify_json(checkpoint, tmp_path):
    broken = _truncated_copy(checkpoint, tmp_path / "broken-ckpt")
    result = invoke("verify", broken)
    assert result.exit_code == 1, result.output
    report = json.loads((broken / "verify.json").read_text())
    assert report["passed"] is False
    failed = [c for c in report["audit"]["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["weight files complete (safetensors headers and sizes)"]
    assert "truncated" in failed[0]["detail"]


# --------------------------------------------------------------------------- 4. read-only checkpoint in verify


def test_verify_on_a_read_only_checkpoint_prints_and_says_why(checkpoint, tmp_path, mount):
    view = mount(tmp_path / "ro-ckpt", bind=checkpoint, read_only=True)
    before = tree_hash(checkpoint)
    result = invoke("verify", view)
    assert result.exit_code == 1, result.output
    assert "every scale is finite and positive" in result.output  # the audit table is there
    flat = " ".join(result.output.split())  # the console wraps at the path's length
    assert "the report could not be saved" in flat and "Read-only file system" in flat
    assert "--report PATH" in flat
    elsewhere = tmp_path / "reports" / "verify.json"
    saved = invoke("verify", view, "--report", elsewhere)
    assert saved.exit_code == 0, saved.output
    assert json.loads(elsewhere.read_text())["passed"] is True
    unwritable = invoke("verify", view, "--report", view / "sub" / "verify.json")
    assert unwritable.exit_code == 2 and "cannot write --report here" in unwritable.output
    assert tree_hash(checkpoint) == before


# --------------------------------------------------------------------------- 5. stale staging folders


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_staging_of_a_killed_run_is_removed_with_a_message(text_pool, tmp_path):
    pool, taxonomy = text_pool
    stale = tmp_path / f".set.partial-{_dead_pid()}"
    (stale / "big").mkdir(parents=True)
    (stale / "big" / "model.safetensors").write_bytes(b"\0" * 4096)
    alive = tmp_path / f".set.partial-{os.getppid()}"  # a live process's: not ours to remove
    alive.mkdir()
    other = tmp_path / f".other.partial-{_dead_pid()}"  # another output's
    other.mkdir()
    result = invoke("calibrate", pool, "--taxonomy", taxonomy, "--output", tmp_path / "set", "--size", 20)
    assert result.exit_code == 0, result.output
    assert f"removed {stale}, left by a killed run" in result.output
    assert not stale.exists() and alive.is_dir() and other.is_dir()
    assert (tmp_path / "set" / "samples.jsonl").is_file()


# --------------------------------------------------------------------------- 7. messages


def test_group_size_messages(text_model, text_calib, tmp_path):
    base = ["quantize", text_model, "--output", tmp_path / "q", "--dry-run"]
    seven = invoke(*base, "--recipe", "w4a16", "--calib", text_calib, "--group-size", 7)
    assert seven.exit_code == 2 and "a group size is at least 8 weights" in seven.output
    assert "validation error" not in seven.output and "pydantic" not in seven.output
    fp8 = invoke(*base, "--recipe", "fp8-dynamic", "--group-size", 64)
    assert fp8.exit_code == 2 and "--group-size applies to 4-bit weight recipes" in fp8.output
    assert "GPTQ settings" not in fp8.output and "pydantic" not in fp8.output
    # 12 divides none of the tiny model's widths: every layer would be 8-bit, not a W4A16 model.
    none_fit = invoke(*base, "--recipe", "w4a16", "--calib", text_calib, "--group-size", 12)
    assert none_fit.exit_code == 2, none_fit.output
    assert (
        "divides none of the targeted layers" in none_fit.output
        and "every layer would stay at 8 bits" in none_fit.output
    )


def test_missing_model_folder_says_so(tmp_path):
    result = invoke(
        "quantize", tmp_path / "no-such-model", "--recipe", "fp8-dynamic", "--output", tmp_path / "q"
    )
    assert result.exit_code == 2 and "the model folder does not exist" in result.output
    assert "config.json is missing" not in result.output


def test_damaged_samples_file_with_a_matching_hash_names_the_line(text_model, text_calib, tmp_path):
    from quantkit.fsutil import sha256_file

    damaged = tmp_path / "damaged-set"
    shutil.copytree(text_calib, damaged)
    samples = damaged / "samples.jsonl"
    lines = samples.read_text().splitlines()
    lines[4] = lines[4][: len(lines[4]) // 2]
    samples.write_text("\n".join(lines) + "\n")
    report = json.loads((damaged / "report.json").read_text())
    report["samples_sha256"] = sha256_file(samples)
    (damaged / "report.json").write_text(json.dumps(report))
    before = tree_hash(damaged)
    result = invoke(
        "quantize",
        text_model,
        "--recipe",
        "w4a16",
        "--calib",
        damaged,
        "--output",
        tmp_path / "q",
        "--dry-run",
    )
    assert result.exit_code == 2, result.output
    assert f"{samples}:5" in result.output and "the calibration set is damaged" in result.output
    assert "JSONDecodeError" not in result.output and tree_hash(damaged) == before


# --------------------------------------------------------------------------- 8. build holds out samples for drift


@pytest.mark.slow
def test_build_on_a_small_set_holds_out_samples_for_drift(text_model, text_calib, tmp_path):
    from quantkit.build import build_checkpoints
    from quantkit.calibset import load_calibration_report

    assert load_calibration_report(text_calib)["size"] == 64
    before = tree_hash(text_calib)
    # No --num-samples: before, all 64 calibrated and drift found no held-out sample.
    # The gate accepts unresolved tasks here: this test is of the hold-out, not of the verdict.
    report = build_checkpoints(
        text_model, tmp_path / "out", ["rtx4090"], calib=text_calib, drift_samples=16, accept_unresolved=True
    )
    assert report.passed, [c.reasons for c in report.checkpoints]  # the CLI's exit code 0
    built = json.loads((tmp_path / "out" / "build.json").read_text())
    assert [c["status"] for c in built["checkpoints"]] == ["passed"], built
    checkpoint = Path(built["checkpoints"][0]["checkpoint"])
    calibration = json.loads((checkpoint / "quantkit.json").read_text())["calibration"]
    drift = json.loads((checkpoint / "verify.json").read_text())["drift"]
    assert calibration["samples_used"] == 64 - 16 and drift["overall"]["samples"] == 16
    assert set(calibration["set"]["by_task"]) == {"precise", "casual"}  # stratified: both tasks calibrate
    assert tree_hash(text_calib) == before


# --------------------------------------------------------------------------- 9. shareable checkpoint files


def test_checkpoint_files_are_readable_by_others(checkpoint, text_model):
    expected = default_mode()
    assert expected & 0o044, "this test needs a umask that lets others read (e.g. 022)"
    for folder in (checkpoint, text_model):
        modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir() if p.is_file()}
        assert modes and set(modes.values()) == {expected}, modes
