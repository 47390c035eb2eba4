"""Prove a checkpoint loads and generates in vLLM, and that vLLM agrees with transformers on it.

vLLM lives in its own environment (``make vllm-env`` builds ``.venv-vllm``): it pins another torch
and compressed-tensors than llmcompressor. Each checkpoint runs in a fresh process (after one
failed engine start every later one fails in the same process).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from quantkit.errors import InputError
from quantkit.models.inputs import Sample, processor_capabilities, processor_inputs
from quantkit.recipes.schemes import SHIPPED_PRESETS, preset_scheme
from quantkit.terminal import pass_on

WORKER = Path(__file__).with_name("vllm_worker.py")
REPO_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


@dataclass(frozen=True)
class KernelMessage:
    """A message vLLM raises where its local build has no kernel for a scheme, and where in vLLM
    (0.32, the CPU wheel in requirements-vllm.lock) it comes from."""

    pattern: str  # a regular expression, searched in the error's whole message
    source: str
    # Only a missing kernel when the checkpoint's scheme is one quantkit ships for a GPU target
    # (vLLM serves it there): for any other scheme the same words mean the export is wrong.
    shipped_scheme_only: bool = False


# The known "no kernel here" messages. Anything else a load or a generation raises, a
# NotImplementedError included, is a failure.
MISSING_KERNEL_MESSAGES = (
    KernelMessage(
        r"_C::\w+\(\) -> \(\)",
        "vLLM's CPU C extension registers some CUDA-only ops as argument-less stubs "
        "(static_scaled_fp8_quant: vllm/_custom_ops.py calls it for static FP8 input scales)",
        shipped_scheme_only=True,
    ),
    KernelMessage(
        r"'_OpNamespace' '_C' object has no attribute '\w+'",
        "an op the CPU C extension was built without (cpu_gemm_wna16 without AVX-512), called "
        "from vllm/_custom_ops.py by vllm/model_executor/kernels/linear/mixed_precision/cpu.py",
        shipped_scheme_only=True,
    ),
    KernelMessage(
        r"Failed to find a kernel that can implement the \w+ linear layer",
        "vllm/model_executor/kernels/linear/__init__.py (choose_scaled_mm_linear_kernel, "
        "choose_mp_linear_kernel): no kernel of this platform accepts the layer",
        shipped_scheme_only=True,
    ),
    KernelMessage(
        r"requires AMX tile support",
        "vllm/model_executor/kernels/linear/scaled_mm/cpu.py (the CPU FP8 / int8 scaled-mm kernels)",
        shipped_scheme_only=True,
    ),
    KernelMessage(
        r"Marlin(?: \w+)? (?:only supported on CUDA|not available)",
        "vllm/model_executor/kernels/linear/mixed_precision/marlin.py, .../nvfp4/marlin.py",
        shipped_scheme_only=True,
    ),
    KernelMessage(
        r"No compressed-tensors compatible scheme was found",
        "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py "
        "(_get_scheme_from_parts: no scheme class of this platform takes the arguments)",
        shipped_scheme_only=True,
    ),
)

_ARG_FIELDS = ("num_bits", "type", "strategy", "symmetric", "dynamic")


def _signature(args: dict | None) -> tuple | None:
    return None if not args else tuple(args.get(key) for key in _ARG_FIELDS)


def shipped_schemes(quantization_config: dict) -> list[str] | None:
    """The shipped preset each config group of a checkpoint is, or None when any group is not
    one (other bit widths, types or strategies, or a group size no recipe picks)."""
    schemes = [(name, preset_scheme(name, ["Linear"])) for name in SHIPPED_PRESETS]
    presets = {}
    for name, scheme in schemes:
        dumped = scheme.model_dump(mode="json")
        presets.setdefault((_signature(dumped["weights"]), _signature(dumped["input_activations"])), name)
    groups = (quantization_config or {}).get("config_groups") or {}
    found = []
    for group in groups.values():
        weights = group.get("weights") or {}
        name = presets.get((_signature(weights), _signature(group.get("input_activations"))))
        if name is None or weights.get("group_size") not in (None, 16, 32, 64, 128):
            return None
        found.append(name)
    return found or None


def missing_kernel(message: str, schemes: list[str] | None) -> KernelMessage | None:
    """The known kernel message ``message`` carries, if any; those that vLLM also raises for
    schemes no one serves count only when ``schemes`` (the checkpoint's shipped presets) is set."""
    for known in MISSING_KERNEL_MESSAGES:
        if (schemes or not known.shipped_scheme_only) and re.search(known.pattern, message):
            return known
    return None


def _error_detail(answer: dict) -> str:
    """``type: message`` on one line (vLLM lists the reason of each refused kernel on the lines
    after the first), cut at 600 characters."""
    flat = " ".join(line.strip() for line in str(answer.get("message")).splitlines() if line.strip())
    return f"{answer.get('error_type')}: {flat[:600]}{' ...' if len(flat) > 600 else ''}"


def failed_reason(answer: dict) -> str:
    """An error of vLLM's that is not a missing kernel: its stage, type and message, one line."""
    return f"vLLM {answer.get('stage')} failed: {_error_detail(answer)}"


def classify_failure(answer: dict, schemes: list[str] | None) -> tuple[str, str]:
    """('skipped', why) when the error is a known "no kernel on this backend" message (for a
    scheme vLLM serves elsewhere); else ('failed', why). ``schemes``: shipped_schemes(config)."""
    known = missing_kernel(str(answer.get("message")), schemes)
    if known is None:
        return "failed", failed_reason(answer)
    detail = _error_detail(answer)
    scheme = "/".join(sorted(set(schemes))) if schemes else "this scheme"
    return (
        "skipped",
        f"vLLM's local backend has no kernel for {scheme} ({answer.get('stage')}): {detail}",
    )


def vllm_python() -> Path | None:
    """The vLLM environment's interpreter: $QUANTKIT_VLLM_PYTHON, else the repo's .venv-vllm."""
    configured = os.environ.get("QUANTKIT_VLLM_PYTHON")
    if configured:
        return Path(configured) if Path(configured).exists() else None
    return REPO_VENV if REPO_VENV.exists() else None


def require_vllm_python(option: str) -> Path:
    """The vLLM environment's interpreter for a check asked for with ``option`` (--vllm, --serve);
    InputError (exit 2) when there is none: a check that was asked for and cannot run is never a
    pass."""
    python = vllm_python()
    if python is None:
        configured = os.environ.get("QUANTKIT_VLLM_PYTHON")
        missing = f"$QUANTKIT_VLLM_PYTHON={configured}" if configured else str(REPO_VENV)
        raise InputError(
            f"{option} needs the vLLM environment, and {missing} does not exist",
            hint="run `make vllm-env` (or point $QUANTKIT_VLLM_PYTHON at its python), or drop " + option,
        )
    return python


# How far, in nats under transformers (teacher-forced), each vLLM token may lie below transformers'
# own best token: ln 2, vLLM's token at least half as probable. vLLM's CPU kernels quantize
# activations (dynamic FP8 / INT8) where transformers' reload runs them in 16 bits, with rounding
# that depends on the CPU's instruction set: on a Xeon with AVX-512 BF16/FP16, tiny-omni-skills
# fp8-dynamic's audio prompt ended at a near-tie 0.28 nats apart (transformers' token vs EOS, a
# probability ratio of 1.32), where 0.25 had passed on another CPU. A broken kernel or a checkpoint
# loaded wrong puts vLLM's tokens several nats down (tests/test_verify.py checks it still fails).
AGREEMENT_MARGIN = math.log(2)


@dataclass
class PromptComparison:
    name: str
    vllm_tokens: list[int]
    transformers_tokens: list[int]
    matching_prefix: int
    worst_logprob_gap: float  # max over positions of (transformers' best logprob - logprob of vLLM's token)
    agrees: bool


@dataclass
class VllmCheck:
    checkpoint: str
    status: str  # passed | failed | skipped | unavailable
    reason: str = ""
    prompts: list[PromptComparison] = field(default_factory=list)
    seconds: float = 0.0
    vllm_version: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _test_media(folder: Path) -> dict[str, Path]:
    """A gradient image and a tone, written once: the same files feed vLLM and transformers."""
    import wave

    from PIL import Image

    image = folder / "probe.png"
    gradient = np.linspace(0, 255, 224 * 224 * 3).reshape(224, 224, 3).astype(np.uint8)
    Image.fromarray(gradient).save(image)
    audio = folder / "probe.wav"
    t = np.arange(16000 * 2) / 16000
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    with wave.open(str(audio), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(16000)
        handle.writeframes(pcm.tobytes())
    return {"image": image, "audio": audio}


def probe_samples(processor, folder: Path) -> dict[str, Sample]:
    """One prompt per input kind the model takes: text always, image and audio where supported."""
    media = _test_media(folder)
    kinds = processor_capabilities(processor)

    def ask(text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    samples = {"text": Sample(ask("Describe a red sneaker in one sentence."))}
    if "image" in kinds:
        samples["image"] = Sample(ask("<image>What product is shown?"), images=[media["image"]])
    if "audio" in kinds:
        samples["audio"] = Sample(ask("<audio>Transcribe the audio."), audios=[media["audio"]])
    return samples


def _render(processor, sample: Sample) -> str:
    from quantkit.chat import chat_messages

    owner = processor if hasattr(processor, "apply_chat_template") else processor.tokenizer
    return owner.apply_chat_template(
        chat_messages(sample.messages), add_generation_prompt=True, tokenize=False
    )


def _transformers_side(
    checkpoint: Path, samples: dict[str, Sample], vllm_tokens: dict[str, list[int]], margin: float
):
    """Greedy tokens from transformers on the same checkpoint, and vLLM's tokens scored by it."""
    import torch

    from quantkit.models.adapters import adapter_for
    from quantkit.quantize.run import saved_dtype

    adapter = adapter_for(checkpoint)
    model = adapter.load_model(checkpoint, dtype=saved_dtype(checkpoint))
    processor = adapter.load_processor(checkpoint)
    results = []
    for name, sample in samples.items():
        if name not in vllm_tokens:
            continue
        inputs = processor_inputs(processor, sample, add_generation_prompt=True)
        theirs = vllm_tokens[name]
        with torch.no_grad():
            generated = model.generate(**inputs, max_new_tokens=len(theirs), do_sample=False)
            ours = generated[0, inputs["input_ids"].shape[1] :].tolist()
            # Teacher-force vLLM's tokens: each should be (close to) transformers' own best choice.
            forced = dict(inputs)
            extra = torch.tensor([theirs], dtype=inputs["input_ids"].dtype)
            forced["input_ids"] = torch.cat([inputs["input_ids"], extra], dim=1)
            forced["attention_mask"] = torch.ones_like(forced["input_ids"])
            if "mm_token_type_ids" in forced:
                forced["mm_token_type_ids"] = torch.cat(
                    [inputs["mm_token_type_ids"], torch.zeros_like(extra)], dim=1
                )
            logits = model(**forced).logits[0].float()
        start = inputs["input_ids"].shape[1] - 1
        logprobs = torch.log_softmax(logits[start : start + len(theirs)], dim=-1)
        chosen = logprobs[torch.arange(len(theirs)), torch.tensor(theirs)]
        gap = float((logprobs.max(dim=-1).values - chosen).max()) if theirs else 0.0
        prefix = next(
            (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
            min(len(ours), len(theirs)),
        )
        results.append(PromptComparison(name, theirs, ours, prefix, round(gap, 4), gap <= margin))
    return results


def check_with_vllm(
    checkpoint: Path,
    *,
    max_tokens: int = 8,
    max_model_len: int = 2048,
    margin: float = AGREEMENT_MARGIN,
    timeout: float = 900,
) -> VllmCheck:
    """Load ``checkpoint`` in vLLM, generate greedy tokens for a text prompt and, where the model
    takes them, an image and an audio prompt; then check transformers agrees on the same checkpoint
    (each vLLM token within ``margin`` nats of transformers' best token when teacher-forced:
    AGREEMENT_MARGIN, at least half as probable)."""
    checkpoint = Path(checkpoint).resolve()
    started = time.time()
    python = vllm_python()
    if python is None:
        return VllmCheck(str(checkpoint), "unavailable", "no vLLM environment: run `make vllm-env`")

    from quantkit.models.adapters import adapter_for

    processor = adapter_for(checkpoint).load_processor(checkpoint)
    with tempfile.TemporaryDirectory(prefix="quantkit-vllm-") as tmp:
        folder = Path(tmp)
        samples = probe_samples(processor, folder)
        prompts = []
        for name, sample in samples.items():
            entry = {"name": name, "prompt": _render(processor, sample)}
            if sample.images:
                entry["image"] = str(sample.images[0])
            if sample.audios:
                entry["audio"] = str(sample.audios[0])
            prompts.append(entry)
        limits = {kind: 1 for kind in processor_capabilities(processor)}
        if "video" in limits:
            limits["video"] = 0  # no video prompt is sent; saves the profiler a dummy video
        request = {
            "model": str(checkpoint),
            "max_tokens": max_tokens,
            "max_model_len": max_model_len,
            "limit_mm_per_prompt": limits,
            "prompts": prompts,
        }
        (folder / "request.json").write_text(json.dumps(request))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)  # the worker must not import this environment's packages
        log = folder / "worker.log"
        try:
            with open(log, "w") as handle:
                subprocess.run(
                    [
                        str(python),
                        "-P",
                        str(WORKER),
                        str(folder / "request.json"),
                        str(folder / "answer.json"),
                    ],
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    env=env,
                    timeout=timeout,
                    check=False,
                )
        except subprocess.TimeoutExpired:
            return VllmCheck(str(checkpoint), "failed", f"vLLM did not finish in {timeout:.0f} s")
        finally:
            pass_on(f"vLLM worker ({checkpoint.name})", log.read_text(errors="replace"))
        answer_path = folder / "answer.json"
        if not answer_path.exists():
            tail = log.read_text(errors="replace")[-1500:]
            return VllmCheck(str(checkpoint), "failed", f"the vLLM worker died without an answer:\n{tail}")
        answer = json.loads(answer_path.read_text())
        if answer["status"] != "ok":
            config = json.loads((checkpoint / "config.json").read_text())
            status, reason = classify_failure(answer, shipped_schemes(config.get("quantization_config")))
            return VllmCheck(str(checkpoint), status, reason, seconds=round(time.time() - started, 1))
        comparisons = _transformers_side(checkpoint, samples, answer["outputs"], margin)
    failed = [c.name for c in comparisons if not c.agrees]
    return VllmCheck(
        str(checkpoint),
        "failed" if failed else "passed",
        f"vLLM and transformers disagree on: {', '.join(failed)}" if failed else "",
        comparisons,
        round(time.time() - started, 1),
        answer.get("vllm_version"),
    )
