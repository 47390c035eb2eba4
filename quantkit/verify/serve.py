"""`quantkit verify --serve`: the checkpoint behind vLLM's OpenAI-compatible server, asked as a user
asks it, and the answers checked against vLLM's offline engine on the same checkpoint.

The server runs in the vLLM environment (.venv-vllm, as ``--vllm``), on the loopback interface and
a free port, in its own process group; it is stopped on every way out (answers in, a failure, a
timeout, Ctrl-C), and it dies with quantkit if quantkit is killed (PR_SET_PDEATHSIG, in
vllm_worker.serve). One text, one image, one audio and one video request go through the ``openai``
client (chat completions; the media as base64 data URLs, made by quantkit.synthetic.media), greedy, with
``max_tokens`` new tokens. The offline engine (``vllm.LLM.chat``) then answers the very same
messages with the sampling the server applies (the model's generation-config defaults, greedy,
the same ``max_tokens``).

"Matches": greedy decoding of the same prompt and media on the same engine build is deterministic,
so the served token ids must equal the offline engine's token for token (and so the text). A tiny
random model's text is noise, but it is the same noise on both paths: a difference means the server
renders the chat template, reads the media or samples differently from the offline engine.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quantkit import media as media_files
from quantkit.errors import InputError
from quantkit.export.card import update_card_section
from quantkit.models.adapters import adapter_for
from quantkit.models.inputs import processor_capabilities
from quantkit.synthetic import media
from quantkit.terminal import pass_on
from quantkit.verify.vllm_check import (
    WORKER,
    classify_failure,
    failed_reason,
    missing_kernel,
    require_vllm_python,
    shipped_schemes,
)

MODALITIES = ("text", "image", "audio", "video")
LOG_TAIL = 2000  # characters of the server's log shown when it fails


class ServerFailed(Exception):
    """The server did not come up (exited, or was not ready in time); the message has its log tail.
    ``exited``: the server stopped by itself; ``port_taken``: it could not bind its port."""

    def __init__(self, message: str, *, exited: bool = False, port_taken: bool = False) -> None:
        super().__init__(message)
        self.exited = exited
        self.port_taken = port_taken


@dataclass
class ServedAnswer:
    name: str  # the modality
    served_tokens: list[int]
    offline_tokens: list[int]
    served_text: str
    offline_text: str
    matches: bool  # identical prompt and answer token ids (greedy: the offline engine's own)
    served_prompt_tokens: int = 0  # how many tokens the prompt (template and media) rendered to
    offline_prompt_tokens: int = 0
    same_prompt: bool = False  # identical prompt token ids: the same template and media rendering


@dataclass
class ServeCheck:
    checkpoint: str
    status: str  # passed | failed | skipped
    reason: str = ""
    answers: list[ServedAnswer] = field(default_factory=list)
    seconds: float = 0.0
    ready_seconds: float | None = None  # from the server's start to its /health answering
    port: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def free_port() -> int:
    """A port nothing listens on now, on the loopback interface (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_port(port: int) -> None:
    """InputError when ``port`` cannot be bound on 127.0.0.1 (taken, or not a port)."""
    if not 0 < port < 65536:
        raise InputError(
            f"--port {port} is not a TCP port", hint="pass 1-65535, or leave it out for a free one"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the server binds (uvicorn): a port whose last connections are in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as err:
            raise InputError(
                f"port {port} on 127.0.0.1 is already taken ({err.strerror or err})",
                hint="pass another --port, or leave it out for a free one",
            ) from err


def serve_python() -> Path:
    """The vLLM environment's interpreter for --serve (see vllm_check.require_vllm_python)."""
    return require_vllm_python("--serve")


def _data_url(path: Path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def probe_media(folder: Path) -> dict[str, Path]:
    """An image, a 2 s speech-like WAV and a 2 s MP4, made with quantkit's own media makers (the
    same bytes every run)."""
    import numpy as np

    rng = np.random.default_rng(0)
    paths = {"image": folder / "probe.png", "audio": folder / "probe.wav", "video": folder / "probe.mp4"}
    shapes = [media.Shape("box", "red", (40, 60, 180, 170), "SALE")]
    media.save_image(media.scene_image((224, 224), "light gray", shapes), paths["image"])
    media.write_wav(paths["audio"], media.speech_like([media.Turn(0.2, 1.8, 160.0)], 2.0, rng))
    moving = [media.Appearance("blue", 0.0, 2.0, (32, 32), x_from=0.0, x_to=1.0)]
    frames = media.video_frames((112, 112), 4, 2.0, "beige", moving)
    media_files.write_mp4(paths["video"], frames, (112, 112), 4)
    return paths


def probe_requests(folder: Path, kinds: set[str]) -> list[dict]:
    """One chat request per modality the model takes (text always), in the OpenAI message shape."""
    paths = probe_media(folder)
    parts = {
        "image": (
            {"type": "image_url", "image_url": {"url": _data_url(paths["image"], "image/png")}},
            "What product is shown?",
        ),
        "audio": (
            {"type": "audio_url", "audio_url": {"url": _data_url(paths["audio"], "audio/wav")}},
            "Transcribe the audio.",
        ),
        "video": (
            {"type": "video_url", "video_url": {"url": _data_url(paths["video"], "video/mp4")}},
            "What moves in the video?",
        ),
    }
    requests = [
        {"name": "text", "messages": [{"role": "user", "content": "Describe a red sneaker in one sentence."}]}
    ]
    for name in MODALITIES[1:]:
        if name in kinds:
            media_part, question = parts[name]
            content = [media_part, {"type": "text", "text": question}]
            requests.append({"name": name, "messages": [{"role": "user", "content": content}]})
    return requests


LOOPBACK = ("127.0.0.1", "localhost")


def _no_proxy(value: str | None) -> str:
    """``value`` (a NO_PROXY list) with the loopback names added: the server is on 127.0.0.1, and a
    user's HTTP(S)_PROXY must not carry quantkit's requests to it."""
    names = [name.strip() for name in (value or "").split(",") if name.strip()]
    return ",".join(names + [name for name in LOOPBACK if name not in names])


def _worker_env() -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "QUANTKIT_PARENT_PID": str(os.getpid()),
        "NO_PROXY": _no_proxy(os.environ.get("NO_PROXY")),
        "no_proxy": _no_proxy(os.environ.get("no_proxy")),
    }
    env.pop("PYTHONPATH", None)  # the worker must not import this environment's packages
    return env


def start_server(
    python: Path, checkpoint: Path, port: int, limits: dict[str, int], log: Path, *, max_model_len: int
) -> subprocess.Popen:
    """``vllm serve CHECKPOINT`` on 127.0.0.1:``port``, in a process group of its own (so that
    stopping it stops the engine processes it starts), its output into ``log``."""
    args = [
        str(checkpoint),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enforce-eager",
        "--max-model-len", str(max_model_len),
        "--dtype", "bfloat16",
        "--limit-mm-per-prompt", json.dumps(limits),
        "--seed", "0",
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    with open(log, "wb") as handle:
        return subprocess.Popen(
            [str(python), "-P", str(WORKER), "serve", *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_worker_env(),
            start_new_session=True,
        )


def log_tail(log: Path, limit: int = LOG_TAIL) -> str:
    text = log.read_text(errors="replace") if log.is_file() else ""
    return text[-limit:].strip() or "(the log is empty)"


_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Interrupt)): (.+)$")


def last_error(log: Path) -> str | None:
    """The last ``SomeError: message`` line of the log, without vLLM's process prefix."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    found = [m for line in text.splitlines() if (m := _ERROR_LINE.search(line))]
    return f"{found[-1].group(1)}: {found[-1].group(2).strip()}" if found else None


_PORT_TAKEN = re.compile(r"address already in use", re.IGNORECASE)  # OSError errno 98, from bind()


def _exited(log: Path, what: str, *, exited: bool = True) -> ServerFailed:
    headline = last_error(log)
    taken = exited and bool(_PORT_TAKEN.search(log.read_text(errors="replace") if log.is_file() else ""))
    return ServerFailed(
        f"{what}{': ' + headline if headline else ''}\nthe server's log ends:\n{log_tail(log)}",
        exited=exited,
        port_taken=taken,
    )


# No proxy: the server is on the loopback interface, whatever HTTP(S)_PROXY says.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, timeout: float = 2.0) -> bytes | None:
    try:
        with _DIRECT.open(url, timeout=timeout) as response:  # noqa: S310 - loopback only
            return response.read() if response.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _model_ids(listing: bytes) -> list | None:
    """The model ids of an OpenAI /v1/models answer; None when it is not one."""
    try:
        return [entry.get("id") for entry in json.loads(listing).get("data", [])]
    except (ValueError, AttributeError, TypeError):
        return None


def wait_ready(server: subprocess.Popen, port: int, model: str, log: Path, timeout: float) -> float:
    """Seconds until the server's /health answers; ServerFailed when it exits first, does not
    answer within ``timeout`` s, or something else answers on the port."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        code = server.poll()
        if code is not None:
            raise _exited(log, f"the vLLM server exited (code {code}) before it was ready")
        # /health answering and /v1/models not (for a moment): ask again.
        healthy = _get(f"http://127.0.0.1:{port}/health") is not None
        if healthy and (listing := _get(f"http://127.0.0.1:{port}/v1/models")) is not None:
            served = _model_ids(listing)
            if served is None:
                raise ServerFailed(
                    f"port {port} answers, but /v1/models is not an OpenAI model list: "
                    f"{listing[:200].decode(errors='replace')!r}"
                )
            if model not in served:
                raise ServerFailed(f"port {port} answers, but not with this checkpoint (it serves {served})")
            return round(time.monotonic() - started, 1)
        time.sleep(1.0)
    raise _exited(log, f"the vLLM server was not ready after {timeout:.0f} s", exited=False)


def group_alive(pgid: int) -> list[int]:
    """Processes of process group ``pgid`` still running (zombies left out), from /proc."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(int(stat.parent.name))
    return alive


def stop_server(server: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM to the server's whole process group (vLLM shuts its engine down on it), SIGKILL to
    whatever of the group is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (server.poll() is None or group_alive(server.pid)):
            time.sleep(0.2)
        if server.poll() is not None and not group_alive(server.pid):
            break
    server.wait()


def _worker(python: Path, mode: str, request: dict, folder: Path, timeout: float) -> dict:
    """One run of vllm_worker.py MODE in the vLLM environment; its answer, or a failure dict."""
    (folder / f"{mode}-request.json").write_text(json.dumps(request))
    answer, log = folder / f"{mode}-answer.json", folder / f"{mode}.log"
    answer.unlink(missing_ok=True)  # an earlier attempt's
    with open(log, "wb") as handle:
        try:
            subprocess.run(
                [str(python), "-P", str(WORKER), mode, str(folder / f"{mode}-request.json"), str(answer)],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=_worker_env(),
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"status": "error", "stage": mode, "error_type": "Timeout",
                    "message": f"the {mode} run did not finish in {timeout:.0f} s"}  # fmt: skip
        finally:
            pass_on(f"vLLM {mode} worker", log.read_text(errors="replace"))
    try:
        result = json.loads(answer.read_text()) if answer.is_file() else None
    except (OSError, ValueError):
        result = None
    if not isinstance(result, dict):
        what = "an unreadable answer" if answer.is_file() else "no answer"
        return {"status": "error", "stage": mode, "error_type": "WorkerDied",
                "message": f"the {mode} run ended with {what}:\n{log_tail(log)}"}  # fmt: skip
    return result


_VLLM_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s*(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?")


def _schemes(checkpoint: Path) -> list[str] | None:
    config = json.loads((checkpoint / "config.json").read_text())
    return shipped_schemes(config.get("quantization_config"))


def _kernel_line(server_log: str, schemes: list[str] | None) -> str | None:
    """vLLM's "no kernel here" line in the server's log (far above the engine's final error, or
    behind a client's bare "500"), without vLLM's process prefix; None when it has none."""
    kernel = next((line for line in server_log.splitlines() if missing_kernel(line, schemes)), None)
    return _VLLM_PREFIX.sub("", kernel.strip()) if kernel else None


def _served_problem(served: dict, server_log: str, schemes: list[str] | None) -> tuple[str, str]:
    """('skipped', vLLM's kernel line) when the server stopped by itself or answered a request
    with HTTP 500 and its log has a known "no kernel here" line; else ('failed', the problem). A
    timeout, a hang or a refused (4xx) request is never a missing kernel, whatever the log says."""
    errors = served.get("errors") or {}
    crashed = [(name, error) for name, error in errors.items() if error.get("status_code") == 500]
    name, error = (crashed or list(errors.items()) or [(None, None)])[0]
    problem = {"stage": f"{name} request", **error} if error else dict(served)
    if served.get("server_exited") or crashed:
        kernel = _kernel_line(server_log, schemes)
        if kernel:
            return classify_failure({**problem, "message": kernel}, schemes)
    return "failed", failed_reason(problem)


def compare(served: dict, offline: dict) -> list[ServedAnswer]:
    """Per request: the served prompt and answer token ids against the offline engine's; a side
    with no tokens never matches."""
    answers = []
    for name, ours in served.items():
        theirs = offline.get(name) or {}
        tokens, offline_tokens = ours.get("token_ids") or [], theirs.get("token_ids") or []
        prompt, offline_prompt = ours.get("prompt_token_ids") or [], theirs.get("prompt_token_ids") or []
        same_prompt = bool(prompt) and prompt == offline_prompt
        answers.append(
            ServedAnswer(
                name,
                tokens,
                offline_tokens,
                ours.get("text", ""),
                theirs.get("text", ""),
                same_prompt and bool(tokens) and tokens == offline_tokens,
                len(prompt),
                len(offline_prompt),
                same_prompt,
            )
        )
    return answers


def check_served(
    checkpoint: Path,
    *,
    port: int | None = None,
    max_tokens: int = 8,
    max_model_len: int = 2048,
    ready_timeout: float = 600,
    request_timeout: float = 300,
) -> ServeCheck:
    """Serve ``checkpoint`` with ``vllm serve``, send one request per modality the model takes with
    the ``openai`` client, stop the server, and check vLLM's offline engine gives the same greedy
    tokens for the same messages. A scheme the local vLLM build has no kernel for is 'skipped'
    with vLLM's reason (vllm_check's classification); bad input (no checkpoint, a taken port, no
    vLLM environment) raises InputError before anything starts."""
    checkpoint = Path(checkpoint).resolve()
    if not (checkpoint / "config.json").is_file():
        raise InputError("not a checkpoint folder (no config.json)", path=checkpoint,
                         hint="pass the folder `quantkit quantize` wrote")  # fmt: skip
    if port is not None:
        check_port(port)
    python = serve_python()
    started = time.time()

    kinds = set(processor_capabilities(adapter_for(checkpoint).load_processor(checkpoint)))
    check = ServeCheck(str(checkpoint), "failed", port=port or free_port())
    with tempfile.TemporaryDirectory(prefix="quantkit-serve-") as tmp:
        folder = Path(tmp)
        request = {
            "model": str(checkpoint),
            "served_model": str(checkpoint),
            "max_tokens": max_tokens,
            "max_model_len": max_model_len,
            "limit_mm_per_prompt": {kind: 1 for kind in sorted(kinds)},
            "timeout": request_timeout,
            "requests": probe_requests(folder, kinds),
        }
        log = folder / "server.log"
        for attempt in (1, 2):
            served = _serve_and_ask(python, check, request, folder, log, ready_timeout)
            if not served.get("port_taken"):
                break
            if port is not None:
                raise InputError(
                    f"port {port} on 127.0.0.1 was taken by the time the vLLM server bound it",
                    hint="pass another --port, or leave it out for a free one",
                )
            if attempt == 1:  # the free port we picked was taken in between: once more, on another
                check.port = free_port()
        server_log = log.read_text(errors="replace") if log.is_file() else ""
        pass_on("vllm serve", server_log)
        if served.get("status") == "ok":
            offline = _worker(python, "chat", request, folder, ready_timeout)
        else:
            offline = None
    check.seconds = round(time.time() - started, 1)
    return _judge(check, checkpoint, served, offline, server_log)


def _serve_and_ask(
    python: Path, check: ServeCheck, request: dict, folder: Path, log: Path, ready_timeout: float
) -> dict:
    """Start the server on ``check.port``, wait for it, send the requests through the client
    worker and stop the server: the client's answer, or a failure dict (``port_taken`` when the
    server could not bind its port; ``server_exited`` when it stopped by itself)."""
    checkpoint = Path(request["model"])
    request["base_url"] = f"http://127.0.0.1:{check.port}/v1"
    server = start_server(
        python, checkpoint, check.port, request["limit_mm_per_prompt"], log,
        max_model_len=request["max_model_len"],
    )  # fmt: skip
    try:
        check.ready_seconds = wait_ready(server, check.port, str(checkpoint), log, ready_timeout)
        timeout = request["timeout"] * len(request["requests"]) + 60
        served = _worker(python, "client", request, folder, timeout)
        served["server_exited"] = server.poll() is not None
    except ServerFailed as failure:
        served = {"status": "error", "stage": "serve", "error_type": "ServerFailed",
                  "message": str(failure), "server_exited": failure.exited,
                  "port_taken": failure.port_taken}  # fmt: skip
    finally:
        stop_server(server)
    return served


def _judge(
    check: ServeCheck, checkpoint: Path, served: dict, offline: dict | None, server_log: str
) -> ServeCheck:
    failed = None
    if served.get("status") != "ok":
        failed = _served_problem(served, server_log, _schemes(checkpoint))
    elif offline is not None and offline.get("status") != "ok":
        # The offline engine's own exception: classified as --vllm classifies it.
        problem = {**offline, "stage": f"offline {offline.get('stage')}"}
        failed = classify_failure(problem, _schemes(checkpoint))
    if failed is not None:
        check.status, check.reason = failed
        if served.get("outputs"):
            check.answers = compare(served["outputs"], {})
        return check
    check.answers = compare(served["outputs"], offline["outputs"])
    differ = [f"{a.name}{'' if a.same_prompt else ' (prompt)'}" for a in check.answers if not a.matches]
    check.status = "failed" if differ else "passed"
    check.reason = (
        f"the served tokens differ from the offline engine's on: {', '.join(differ)}" if differ else ""
    )
    return check


CARD_START = "<!-- quantkit serve -->"
CARD_END = "<!-- /quantkit serve -->"


def card_section(check: ServeCheck) -> str:
    """The card's section on the served check: the verdict and, per modality, whether the served
    answer's tokens are the offline engine's."""
    lines = [
        CARD_START,
        "## Served through vLLM's OpenAI-compatible API",
        "",
        f"`quantkit verify --serve`: **{check.status}**"
        + (f" ({check.reason})" if check.reason else "")
        + ".",
    ]
    if check.answers:
        lines += [
            "",
            "`vllm serve` on this folder answered one request per modality through the `openai` client "
            "(chat completions, media as base64 data URLs, greedy); each answer's tokens, and its prompt's "
            "tokens as the server rendered them, are compared with vLLM's offline engine (`LLM.chat`) "
            "on the same messages.",
            "",
            "| request | prompt tokens | same prompt | served tokens | offline tokens | same tokens |",
            "|---|---|---|---|---|---|",
            *(
                f"| {a.name} | {a.served_prompt_tokens} | {'yes' if a.same_prompt else 'no'} "
                f"| {len(a.served_tokens)} | {len(a.offline_tokens)} | {'yes' if a.matches else 'no'} |"
                for a in check.answers
            ),
        ]
    lines += ["", "Details in `verify.json` (`serve`).", CARD_END, ""]
    return "\n".join(lines)


def write_card_section(checkpoint: Path, check: ServeCheck) -> Path:
    return update_card_section(Path(checkpoint), CARD_START, CARD_END, card_section(check))
