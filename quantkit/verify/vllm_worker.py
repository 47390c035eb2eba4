"""Runs inside the vLLM environment (.venv-vllm), one checkpoint per process.

It imports nothing from quantkit (quantkit is not installed there): it reads a JSON request,
loads the checkpoint with vLLM, generates greedy tokens for each prompt, and writes a JSON answer.
A failure is reported with the stage it happened in and the exception, so the caller can tell a
scheme the local backend cannot run from a broken checkpoint.

    python vllm_worker.py REQUEST.json ANSWER.json
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


def run(request: dict) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; required on the CPU backend
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # ~9 s engine start instead of ~50 s
    started = time.time()
    try:
        from vllm import LLM, SamplingParams

        llm = LLM(
            model=request["model"],
            enforce_eager=True,
            max_model_len=int(request.get("max_model_len", 2048)),
            dtype=request.get("dtype", "bfloat16"),
            limit_mm_per_prompt=request.get("limit_mm_per_prompt") or None,
            seed=0,
        )
    except BaseException as error:  # noqa: BLE001 - every failure is reported, none crashes the caller
        return _failure("load", error)
    loaded = time.time()
    outputs = {}
    for prompt in request["prompts"]:
        try:
            params = SamplingParams(temperature=0.0, max_tokens=int(request.get("max_tokens", 8)))
            item = {"prompt": prompt["prompt"]}
            media = _media(prompt)
            if media:
                item["multi_modal_data"] = media
            result = llm.generate([item], params, use_tqdm=False)[0]
            outputs[prompt["name"]] = list(result.outputs[0].token_ids)
        except BaseException as error:  # noqa: BLE001
            failure = _failure("generate", error)
            failure["prompt"] = prompt["name"]
            failure["outputs"] = outputs
            return failure
    import vllm

    return {
        "status": "ok",
        "outputs": outputs,
        "vllm_version": vllm.__version__,
        "load_seconds": round(loaded - started, 2),
        "generate_seconds": round(time.time() - loaded, 2),
    }


def main() -> int:
    request_path, answer_path = sys.argv[1], sys.argv[2]
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    answer = run(request)
    with open(answer_path, "w", encoding="utf-8") as handle:
        json.dump(answer, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
