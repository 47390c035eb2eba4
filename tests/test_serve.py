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
from quantkit.verify.vllm_check import REPO_VENV, vllm_python

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
    # fp8-dynamic runs on vLLM's CPU build (test_verify requires its offline check to pass): a
    # "skipped" here is a failure, not a skip.
    assert result.exit_code == 0, result.output
    assert record["status"] == "passed", record["reason"]
    answers = {a["name"]: a for a in record["answers"]}
    assert set(answers) == {"text", "image", "audio", "video"}
    for name, answer in answers.items():
        assert answer["served_tokens"], name  # the server generated something for each request
        assert answer["served_tokens"] == answer["offline_tokens"], name
        assert answer["served_prompt_tokens"] and answer["same_prompt"], name
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

    # Python's own Ctrl-C handler, as in a terminal: pytest-xdist workers ignore SIGINT (their
    # controller handles it), so there the signal would not interrupt anything.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_once_started, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            check_served(zoo_model("tiny-qwen2.5-omni"), ready_timeout=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    leader, child = (int(pid) for pid in pid_file.read_text().split())
    assert os.getpgid(os.getpid()) != leader  # the server had a process group of its own
    assert not group_alive(leader)  # its shell and the child it started (same group) are gone


def omni_labelled(zoo_model, tmp_path: Path, preset: str) -> Path:
    """tiny-qwen2.5-omni with a config naming one compressed-tensors preset (its weights stay bf16):
    enough for quantkit to read the scheme where no real vLLM loads it."""
    import shutil

    from compressed_tensors.quantization import preset_name_to_scheme

    checkpoint = tmp_path / f"omni-{preset.lower()}"
    shutil.copytree(zoo_model("tiny-qwen2.5-omni"), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    group = preset_name_to_scheme(preset, ["Linear"]).model_dump(mode="json")
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": group},
    }
    (checkpoint / "config.json").write_text(json.dumps(config))
    return checkpoint


def test_missing_kernel_is_skipped_with_vllms_reason(zoo_model, tmp_path, monkeypatch):
    """A shipped scheme the local vLLM build has no kernel for (NVFP4A16 on a CPU: vLLM 0.32's CPU
    server stops with the line below, far above its final error) is 'skipped' with that reason."""
    checkpoint = omni_labelled(zoo_model, tmp_path, "NVFP4A16")
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


KERNEL_LINE = "NotImplementedError: _C::static_scaled_fp8_quant() -> () has no CPU kernel"

# A stand-in `vllm serve` and offline engine (run by this interpreter): an OpenAI-style chat server on
# the --port it is given, answering each request with token ids made from the request's modality,
# and an offline "engine" giving the same ids. $FAKE_VLLM picks a misbehaviour.
FAKE_VLLM = r"""
import http.server, json, os, sys, time

behaviour = os.environ.get("FAKE_VLLM", "ok")
mode = sys.argv[3]  # argv: -P WORKER MODE ...


def tokens(name):
    return {"token_ids": [7, len(name), 3], "prompt_token_ids": [1, 2, 3, len(name)],
            "text": name + " answer", "finish_reason": "length"}


if mode == "chat":
    request = json.load(open(sys.argv[4]))
    outputs = {item["name"]: tokens(item["name"]) for item in request["requests"]}
    if behaviour == "offline-prompt-differs":
        outputs["text"]["prompt_token_ids"] = [1, 2, 3, 5]
    answer = json.dumps({"status": "ok", "outputs": outputs})
    with open(sys.argv[5], "w") as handle:
        handle.write(answer[:20] if behaviour == "offline-half-written" else answer)
    sys.exit(0)

args = sys.argv[4:]
checkpoint, port = args[0], int(args[args.index("--port") + 1])
LATE = os.environ["FAKE_VLLM_STARTS"] + ".late"
starts = os.environ.get("FAKE_VLLM_STARTS")
if starts:
    with open(starts, "a") as handle:
        handle.write(f"{port}\n")
    first = len(open(starts).read().split()) == 1
if behaviour == "port-taken" or (behaviour == "port-taken-once" and first):
    print("OSError: [Errno 98] Address already in use", flush=True)
    sys.exit(1)
if behaviour == "kernel-line-then-hang":
    print("(EngineCore pid=11) ERROR 12-01 18:59:58 [core.py:1] " + os.environ["KERNEL_LINE"], flush=True)
    time.sleep(300)


class Handler(http.server.BaseHTTPRequestHandler):
    def send(self, code, body):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.send(200, b"")
        elif self.path == "/v1/models" and behaviour == "models-late" and not os.path.exists(LATE):
            open(LATE, "w").close()
            self.send(503, b"")  # a moment's hiccup; the next poll gets the list
        elif self.path == "/v1/models":
            listing = {"object": "list", "data": [{"id": checkpoint, "object": "model"}]}
            self.send(200, b"<html>not vLLM</html>" if behaviour == "foreign" else json.dumps(listing).encode())
        else:
            self.send(404, b"{}")

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = request["messages"][0]["content"]
        name = "text" if isinstance(content, str) else content[0]["type"].split("_")[0]
        if behaviour in ("kernel-line-500", "kernel-line-400"):
            print("(EngineCore pid=11) ERROR 12-01 18:59:58 [core.py:1] " + os.environ["KERNEL_LINE"], flush=True)
            code = 500 if behaviour == "kernel-line-500" else 400
            error = {"error": {"message": "the engine failed", "type": "Error", "code": code}}
            return self.send(code, json.dumps(error).encode())
        answer = tokens(name)
        choice = {"index": 0, "message": {"role": "assistant", "content": answer["text"]},
                  "finish_reason": "length", "token_ids": answer["token_ids"]}
        body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": checkpoint,
                "choices": [choice], "prompt_token_ids": answer["prompt_token_ids"],
                "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}}
        self.send(200, json.dumps(body).encode())

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """QUANTKIT_VLLM_PYTHON pointing at the stand-in above; the client worker runs for real (the
    `openai` client lives in the vLLM environment). Returns a setter for $FAKE_VLLM."""
    import sys

    if not REPO_VENV.exists():
        pytest.skip("no vLLM environment (make vllm-env): the openai client lives there")
    (tmp_path / "fake_vllm.py").write_text(FAKE_VLLM)
    stand_in_interpreter(
        tmp_path,
        f'if [ "$3" = client ]; then exec {REPO_VENV} "$@"; fi\n'
        f'exec {sys.executable} {tmp_path / "fake_vllm.py"} "$@"\n',
        monkeypatch,
    )
    monkeypatch.setenv("KERNEL_LINE", KERNEL_LINE)
    monkeypatch.setenv("FAKE_VLLM_STARTS", str(tmp_path / "starts"))
    return lambda behaviour: monkeypatch.setenv("FAKE_VLLM", behaviour)


def test_loopback_requests_bypass_a_proxy(zoo_model, fake_vllm, monkeypatch):
    """http(s)_proxy set (to a port nothing listens on), no no_proxy: quantkit's readiness poll and
    the openai client still reach the server on 127.0.0.1 directly."""
    from quantkit.verify.serve import free_port

    proxy = f"http://127.0.0.1:{free_port()}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    fake_vllm("ok")
    result = check_served(zoo_model("tiny-qwen2.5-omni"), ready_timeout=8, request_timeout=30)
    assert result.status == "passed", result.reason
    assert {a.name for a in result.answers} == {"text", "image", "audio", "video"}


@pytest.mark.parametrize("mode", ["chat", "client"])
def test_workers_die_with_their_parent(tmp_path, mode):
    """The offline `chat` run and the `client` run die when the process that started them is
    killed (SIGKILL: no handler runs), as the server does: each is blocked here on its request (a
    FIFO nothing writes), so only the kernel's parent-death signal can end it."""
    import subprocess
    import sys
    import time

    from quantkit.verify.vllm_check import WORKER

    request = tmp_path / "request.json"
    os.mkfifo(request)
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import os, subprocess, sys, time\n"
         "env = {**os.environ, 'QUANTKIT_PARENT_PID': str(os.getpid())}\n"
         f"worker = subprocess.Popen([sys.executable, '-P', {str(WORKER)!r}, {mode!r}, {str(request)!r},"
         f" {str(tmp_path / 'answer.json')!r}], env=env)\n"
         "print(worker.pid, flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    worker = int(parent.stdout.readline())
    time.sleep(1.0)  # the worker reaches its main() and blocks on the request
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and running(worker):
        time.sleep(0.2)
    alive = running(worker)
    if alive:  # not left behind by a failing test
        os.kill(worker, signal.SIGKILL)
    assert not alive, f"the {mode} worker outlived its parent"


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_automatic_port_taken_before_the_server_binds_it_is_retried_once(zoo_model, fake_vllm, tmp_path):
    """The free port quantkit picked is gone by the time the server binds it ("Address already in
    use"): a second server on another free port answers."""
    fake_vllm("port-taken-once")
    result = check_served(zoo_model("tiny-qwen2.5-omni"), ready_timeout=30, request_timeout=30)
    assert result.status == "passed", result.reason
    first, second = (int(port) for port in (tmp_path / "starts").read_text().split())
    assert first != second and result.port == second


def test_chosen_port_taken_when_the_server_binds_it_is_bad_input(zoo_model, fake_vllm):
    from quantkit.errors import InputError
    from quantkit.verify.serve import free_port

    fake_vllm("port-taken")
    port = free_port()
    with pytest.raises(InputError) as refused:
        check_served(zoo_model("tiny-qwen2.5-omni"), port=port, ready_timeout=30)
    assert f"port {port}" in str(refused.value) and "--port" in str(refused.value)


@pytest.mark.parametrize(
    ("behaviour", "preset", "status"),
    [
        ("kernel-line-then-hang", "FP8", "failed"),
        ("kernel-line-400", "FP8", "failed"),
        ("kernel-line-500", "FP8", "skipped"),
        ("kernel-line-500", None, "failed"),
    ],
)
def test_a_kernel_line_in_the_log_skips_only_a_crash(
    zoo_model, fake_vllm, tmp_path, behaviour, preset, status
):
    """The server's log names a missing kernel (static FP8's stub op): a server that never gets
    ready, or a request it refuses (400), is still a failure; only a request it fails with HTTP
    500 (or a server that exits, test_missing_kernel_is_skipped_with_vllms_reason) is skipped, on
    that one line, and only for a scheme quantkit ships (the unquantized model is none: failed)."""
    fake_vllm(behaviour)
    checkpoint = omni_labelled(zoo_model, tmp_path, preset) if preset else zoo_model("tiny-qwen2.5-omni")
    result = check_served(checkpoint, ready_timeout=5, request_timeout=30)
    assert result.status == status, result.reason
    if status == "skipped":
        assert result.reason.endswith(f"(text request): InternalServerError: {KERNEL_LINE}"), result.reason


def test_a_prompt_rendered_differently_fails_though_the_answer_matches(zoo_model, fake_vllm):
    """Same 3 answer tokens, but the server rendered the text prompt to other token ids than the
    offline engine (a template or media difference a few output tokens can hide): failed."""
    fake_vllm("offline-prompt-differs")
    result = check_served(zoo_model("tiny-qwen2.5-omni"), ready_timeout=30, request_timeout=30)
    assert result.status == "failed"
    assert result.reason == "the served tokens differ from the offline engine's on: text (prompt)"
    text = next(a for a in result.answers if a.name == "text")
    assert text.served_tokens == text.offline_tokens and not text.same_prompt and not text.matches


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        ("foreign", "/v1/models is not an OpenAI model list: '<html>not vLLM</html>'"),
        ("offline-half-written", "WorkerDied: the chat run ended with an unreadable answer"),
        ("models-late", None),
    ],
)
def test_unreadable_answers_are_failures_with_a_message(zoo_model, fake_vllm, behaviour, reason):
    """Something else on the port answering /v1/models with HTML, an offline answer file cut short:
    failures that say so, not tracebacks; /v1/models not answering for a moment is not one."""
    fake_vllm(behaviour)
    result = check_served(zoo_model("tiny-qwen2.5-omni"), ready_timeout=30, request_timeout=30)
    if reason is None:
        assert result.status == "passed", result.reason
    else:
        assert result.status == "failed" and reason in result.reason, result.reason


def test_a_served_failure_reads_as_the_offline_checks():
    """vLLM's error behind --serve is worded as `verify --vllm` words it: its stage and type, the
    message on one line (vLLM lists each refused kernel's reason on the next lines), cut at 600."""
    from quantkit.verify.serve import _served_problem

    problem = {"stage": "load", "error_type": "RuntimeError", "message": "first\n  second\n" + "x" * 700}
    status, reason = _served_problem(problem, "", None)
    assert status == "failed"
    assert reason.startswith("vLLM load failed: RuntimeError: first second xxx") and reason.endswith("x ...")
    assert len(reason) == len("vLLM load failed: RuntimeError: ") + 600 + len(" ...")  # cut at 600


ANSWER = {"token_ids": [7, 4, 3], "prompt_token_ids": [1, 2, 3], "text": "a red sneaker"}


@pytest.mark.parametrize(
    ("served", "offline"),
    [
        (ANSWER, {**ANSWER, "token_ids": [7, 4, 9]}),  # a different token
        (ANSWER, {**ANSWER, "prompt_token_ids": [1, 2]}),  # a different prompt
        (ANSWER, None),  # the offline engine has no answer for the request
        (ANSWER, {**ANSWER, "token_ids": []}),  # the offline engine generated nothing
        ({**ANSWER, "token_ids": []}, {**ANSWER, "token_ids": []}),  # neither generated anything
        ({**ANSWER, "prompt_token_ids": []}, {**ANSWER, "prompt_token_ids": []}),  # no prompt ids came
    ],
)
def test_answers_that_are_not_the_offline_engines_fail_the_report(tmp_path, served, offline):
    from quantkit.verify import VerifyReport
    from quantkit.verify.audit import AuditResult
    from quantkit.verify.serve import ServeCheck, _judge

    outputs = {"text": offline} if offline is not None else {}
    check = _judge(
        ServeCheck(str(tmp_path), "failed"),
        tmp_path,
        {"status": "ok", "outputs": {"text": served}, "errors": {}},
        {"status": "ok", "outputs": outputs},
        "",
    )
    assert check.status == "failed" and "differ from the offline engine's on: text" in check.reason
    assert not check.answers[0].matches
    assert not VerifyReport(str(tmp_path), AuditResult(str(tmp_path), "test", None), serve=check).passed


def test_the_offline_engines_answer_passes_the_report(tmp_path):
    from quantkit.verify import VerifyReport
    from quantkit.verify.audit import AuditResult
    from quantkit.verify.serve import ServeCheck, _judge

    served = {"status": "ok", "outputs": {"text": ANSWER}, "errors": {}}
    check = _judge(
        ServeCheck(str(tmp_path), "failed"),
        tmp_path,
        served,
        {"status": "ok", "outputs": {"text": ANSWER}},
        "",
    )
    assert check.status == "passed" and check.answers[0].matches and check.answers[0].same_prompt
    assert VerifyReport(str(tmp_path), AuditResult(str(tmp_path), "test", None), serve=check).passed


def test_serve_without_a_vllm_environment_is_bad_input(zoo_model, tmp_path, monkeypatch):
    """An explicit --serve that cannot run is refused (exit 2, how to make the environment), before
    the audit: no verify.json, nothing in the card."""
    checkpoint = zoo_model("tiny-qwen2.5-omni")
    card = (checkpoint / "README.md").read_text() if (checkpoint / "README.md").exists() else None
    monkeypatch.setenv("QUANTKIT_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    result = runner.invoke(app, ["verify", str(checkpoint), "--serve"])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert "make vllm-env" in output and str(tmp_path / "no-such-python") in output
    assert not (checkpoint / "verify.json").exists()
    assert ((checkpoint / "README.md").read_text() if (checkpoint / "README.md").exists() else None) == card
