"""`quantkit verify --serve`: vLLM's OpenAI-compatible server on a quantized omni checkpoint answers a
text, image, audio and video request from the `openai` client with the offline engine's greedy
tokens; bad input is refused before anything starts, and no server outlives the check."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quantkit.cli import app
from quantkit.verify.serve import check_served, group_alive
from quantkit.verify.vllm_check import vllm_python

runner = CliRunner()


def serve_processes(checkpoint: Path) -> list[str]:
    """Command lines of running `vllm_worker.py serve` processes on ``checkpoint``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and str(checkpoint).encode() in args:
            found.append(b" ".join(args).decode(errors="replace"))
    return found


def nothing_listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture(scope="module")
def omni_fp8(zoo_model, tmp_path_factory) -> Path:
    """tiny Qwen2.5-Omni thinker, data-free FP8 (per-channel weights, dynamic activations): a scheme
    vLLM's CPU build serves on AVX2 and AVX-512."""
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe

    out = tmp_path_factory.mktemp("serve") / "omni-fp8-dynamic"
    quantize(zoo_model("tiny-qwen2.5-omni"), out, resolve_recipe("fp8-dynamic"), [], progress=False)
    return out


@pytest.mark.slow
@pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment (make vllm-env)")
def test_served_answers_match_the_offline_engine_for_every_modality(omni_fp8):
    """One `vllm serve`; text, image, audio and video through the openai client; the same greedy
    token ids as vLLM's offline engine; the result in verify.json and the card; no server left."""
    result = runner.invoke(app, ["verify", str(omni_fp8), "--serve"])
    record = json.loads((omni_fp8 / "verify.json").read_text())["serve"]
    if record["status"] == "skipped":
        pytest.skip(record["reason"])
    assert result.exit_code == 0, result.output
    assert record["status"] == "passed", record["reason"]
    answers = {a["name"]: a for a in record["answers"]}
    assert set(answers) == {"text", "image", "audio", "video"}
    for name, answer in answers.items():
        assert answer["served_tokens"], name  # the server generated something for each request
        assert answer["served_tokens"] == answer["offline_tokens"], name
        assert answer["served_text"] == answer["offline_text"], name
    assert "same tokens" in (omni_fp8 / "README.md").read_text()
    assert "Served vs offline engine" in result.output
    assert not serve_processes(omni_fp8)
    assert nothing_listens(record["port"])


def test_bad_checkpoint_is_refused_with_its_path(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    result = runner.invoke(app, ["verify", str(missing), "--serve"])
    assert result.exit_code == 2
    assert str(missing) in " ".join(result.output.split())


def test_taken_port_is_refused_before_anything_starts(zoo_model):
    checkpoint = zoo_model("tiny-qwen2.5-omni")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["verify", str(checkpoint), "--serve", "--port", str(port)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert f"port {port} on 127.0.0.1 is already taken" in output and "--port" in output
    assert not serve_processes(checkpoint.resolve())
    assert not (checkpoint / "verify.json").exists()  # refused before the audit


def stand_in_interpreter(tmp_path: Path, script: str, monkeypatch) -> None:
    """QUANTKIT_VLLM_PYTHON pointing at a shell script: a "server" that behaves as ``script`` says,
    to exercise quantkit's process handling without starting vLLM."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("QUANTKIT_VLLM_PYTHON", str(path))


def test_server_exiting_early_is_a_clear_failure(zoo_model, tmp_path, monkeypatch):
    stand_in_interpreter(
        tmp_path, 'echo "RuntimeError: Engine core initialization failed"\nexit 3\n', monkeypatch
    )
    result = check_served(zoo_model("tiny-qwen2.5-omni"), ready_timeout=60)
    assert result.status == "failed"
    assert (
        "exited (code 3) before it was ready: RuntimeError: Engine core initialization failed"
        in result.reason
    )


def test_server_never_ready_is_stopped_with_its_children(zoo_model, tmp_path, monkeypatch):
    """A server that never answers: a timeout naming it, and its whole process group (the child it
    started included) gone afterwards."""
    pid_file = tmp_path / "pids"
    stand_in_interpreter(tmp_path, f"sleep 300 &\necho $$ $! > {pid_file}\nwait\n", monkeypatch)
    result = check_served(zoo_model("tiny-qwen2.5-omni"), ready_timeout=3)
    assert result.status == "failed"
    assert "was not ready after 3 s" in result.reason
    leader, child = (int(pid) for pid in pid_file.read_text().split())
    assert os.getpgid(os.getpid()) != leader  # the server had a process group of its own
    assert not group_alive(leader)  # its shell and the child it started (same group) are gone


def test_ctrl_c_stops_the_server(zoo_model, tmp_path, monkeypatch):
    pid_file = tmp_path / "pids"
    stand_in_interpreter(tmp_path, f"sleep 300 &\necho $$ $! > {pid_file}\nwait\n", monkeypatch)

    def interrupt_once_started():
        while not pid_file.exists() or not pid_file.read_text().strip():
            threading.Event().wait(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        check_served(zoo_model("tiny-qwen2.5-omni"), ready_timeout=60)
    leader, child = (int(pid) for pid in pid_file.read_text().split())
    assert os.getpgid(os.getpid()) != leader  # the server had a process group of its own
    assert not group_alive(leader)  # its shell and the child it started (same group) are gone


def test_missing_kernel_is_skipped_with_vllms_reason(zoo_model, tmp_path, monkeypatch):
    """A shipped scheme the local vLLM build has no kernel for (NVFP4A16 on a CPU: vLLM 0.32's CPU
    server stops with the line below, far above its final error) is 'skipped' with that reason."""
    import shutil

    from compressed_tensors.quantization import preset_name_to_scheme

    checkpoint = tmp_path / "omni-nvfp4a16"
    shutil.copytree(zoo_model("tiny-qwen2.5-omni"), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    group = preset_name_to_scheme("NVFP4A16", ["Linear"]).model_dump(mode="json")
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": group},
    }
    (checkpoint / "config.json").write_text(json.dumps(config))
    kernel = (
        "ValueError: Forced NVFP4 kernel MarlinNvFp4LinearKernel is not supported: Marlin FP4 not available"
    )
    log = [
        f"(EngineCore pid=11) ERROR 12-01 18:59:58 [core.py:1320] {kernel}",
        *(f"(APIServer pid=10) INFO 12-01 19:00:0{i} [utils.py:1] shutting down" for i in range(9)),
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    stand_in_interpreter(tmp_path, "".join(f"echo '{line}'\n" for line in log) + "exit 1\n", monkeypatch)
    result = check_served(checkpoint, ready_timeout=60)
    assert result.status == "skipped", result.reason
    assert result.reason.startswith(
        f"vLLM's local backend has no kernel for NVFP4A16 (serve): ServerFailed: {kernel}"
    )
