"""vLLM serving speed of bf16 and quantized checkpoints, per modality (GPU only).

The shape of table 7 of the seed article (section 06): seconds per sample and output tokens per
second for image, audio, short video, long video and text, per checkpoint, and the speed-up over
bf16. Every checkpoint gets the same prompts, the same synthetic media and the same output
lengths (``ignore_eos=True``, greedy), one request at a time (batch size 1), after one warm-up
request per modality. Each checkpoint runs in its own process (a failed ``LLM()`` poisons the
process, and GPU memory is returned between checkpoints).

Where CUDA is absent it prints why it skips and exits 0: nothing here can run on a CPU.

    python bench/gpu_vllm.py --bf16 MODEL_DIR --quantized CKPT_DIR [CKPT_DIR ...] [--samples 5]
        [--json OUT] [--markdown OUT]

Run it with the vLLM environment's Python (``make vllm-env``; vLLM pins its own torch and
compressed-tensors). It imports nothing from quantkit. Checkpoints are named by their
quantkit.json recipe when they have one, else by folder name. ``--plan-only`` renders the prompts
with each checkpoint's processor and stops (no vLLM, works on a CPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

# modality -> media and output length. Long video is sized like the article's (about 20k prefill
# tokens with Qwen2.5-VL-style 28-pixel merged patches, 4k decode).
WORKLOADS = {
    "image": {"image": (1280, 720), "max_tokens": 256, "ask": "Describe the product and read every label."},
    "audio": {"audio_s": 30, "max_tokens": 256, "ask": "Transcribe the speech."},
    "video_short": {
        "video": (448, 252, 10),
        "max_tokens": 256,
        "ask": "When does the product appear on screen?",
    },
    "video_long": {
        "video": (448, 252, 120),
        "max_tokens": 4096,
        "ask": "Split the stream into per-product segments with start and end times.",
    },
    "text": {"max_tokens": 256, "ask": "Write a product description for a steel kettle. " * 8},
}
VIDEO_FPS = 2


def skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False); vLLM speed needs a GPU"
    return None


# --- media and prompts (same for every checkpoint) ----------------------------------------------


def make_media(kind: str, spec: dict):
    import numpy as np

    rng = np.random.default_rng(0)
    if "image" in spec:
        from PIL import Image

        width, height = spec["image"]
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        return {"image": Image.fromarray(pixels)}
    if "audio_s" in spec:
        rate = 16000
        t = np.arange(int(rate * spec["audio_s"])) / rate
        wave = 0.2 * np.sin(2 * np.pi * 220 * t) + 0.02 * rng.standard_normal(t.size)
        return {"audio": (wave.astype(np.float32), rate)}
    if "video" in spec:
        width, height, seconds = spec["video"]
        frames = rng.integers(0, 256, (seconds * VIDEO_FPS, height, width, 3), dtype=np.uint8)
        return {"video": frames}
    return {}


def _processor(checkpoint: Path):
    from transformers import AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(str(checkpoint))
    except (OSError, ValueError):
        return AutoTokenizer.from_pretrained(str(checkpoint))


MEDIA_KEYS = {"image": ("image", "image_processor"), "audio_s": ("audio", "feature_extractor")}
MEDIA_KEYS["video"] = ("video", "video_processor")


def takes(processor, spec: dict) -> bool:
    """Whether the checkpoint's processor takes the workload's medium (text always)."""
    return all(
        getattr(processor, attr, None) is not None for key, (_, attr) in MEDIA_KEYS.items() if key in spec
    )


def render_prompt(processor, kind: str, spec: dict) -> str:
    """The checkpoint's own chat template with one media placeholder part, as served."""
    parts = [{"type": medium} for key, (medium, _) in MEDIA_KEYS.items() if key in spec]
    content = [*parts, {"type": "text", "text": spec["ask"]}] if parts else spec["ask"]
    owner = processor if hasattr(processor, "apply_chat_template") else processor.tokenizer
    return owner.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def checkpoint_name(checkpoint: Path, fallback: str) -> str:
    meta = checkpoint / "quantkit.json"
    if meta.is_file():
        recipe = json.loads(meta.read_text(encoding="utf-8")).get("recipe") or {}
        return recipe.get("name") or checkpoint.name
    return fallback


# --- one checkpoint (child process) -------------------------------------------------------------


def measure(checkpoint: str, kinds: list[str], samples: int, max_model_len: int) -> dict:
    from vllm import LLM, SamplingParams

    path = Path(checkpoint)
    started = time.perf_counter()
    llm = LLM(
        model=checkpoint,
        max_model_len=max_model_len,
        limit_mm_per_prompt={"image": 1, "video": 1, "audio": 1},
        seed=0,
    )
    load_s = time.perf_counter() - started
    results = {}
    processor = _processor(path)
    for kind in kinds:
        spec = WORKLOADS[kind]
        if not takes(processor, spec):
            results[kind] = {"error": "the model takes no such input"}
            continue
        item = {"prompt": render_prompt(processor, kind, spec)}
        media = make_media(kind, spec)
        if media:
            item["multi_modal_data"] = media
        params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0, ignore_eos=True)
        try:
            llm.generate([item], params, use_tqdm=False)  # warm-up: compile, caches
            latencies, tokens = [], []
            for _ in range(samples):
                clock = time.perf_counter()
                output = llm.generate([item], params, use_tqdm=False)[0]
                latencies.append(time.perf_counter() - clock)
                tokens.append(len(output.outputs[0].token_ids))
            latency = statistics.median(latencies)
            results[kind] = {
                "s_per_sample": round(latency, 4),
                "output_tokens": int(statistics.median(tokens)),
                "prompt_tokens": len(output.prompt_token_ids or []),
                "tokens_per_s": round(statistics.median(tokens) / latency, 1),
            }
        except Exception as error:  # noqa: BLE001 - a modality the model does not take is a row, not a crash
            results[kind] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
    return {"load_s": round(load_s, 1), "results": results}


# --- the table --------------------------------------------------------------------------------


def table(runs: dict[str, dict], kinds: list[str]) -> str:
    names = list(runs)
    base = runs.get("bf16", {}).get("results", {})
    head = "| modality | " + " | ".join(f"{n} s/sample (tok/s, speed-up)" for n in names) + " |"
    lines = [head, "|---|" + "---|" * len(names)]
    for kind in kinds:
        cells = []
        for name in names:
            cell = runs[name].get("results", {}).get(kind, {})
            if "s_per_sample" not in cell:
                cells.append(cell.get("error", runs[name].get("error", "-")))
                continue
            ref = base.get(kind, {}).get("s_per_sample")
            speedup = f", {ref / cell['s_per_sample']:.2f}x" if ref else ""
            cells.append(f"{cell['s_per_sample']:.3f} ({cell['tokens_per_s']:.0f} tok/s{speedup})")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        checkpoint, kinds, samples, max_model_len = argv[1], argv[2].split(","), int(argv[3]), int(argv[4])
        print(json.dumps(measure(checkpoint, kinds, samples, max_model_len)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bf16", type=Path, help="the unquantized model folder (the reference row)")
    parser.add_argument("--quantized", type=Path, nargs="*", default=[], help="quantized checkpoint folders")
    parser.add_argument("--modalities", default=",".join(WORKLOADS), help="comma-separated subset")
    parser.add_argument("--samples", type=int, default=5, help="timed requests per modality (median)")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument(
        "--plan-only", action="store_true", help="render prompts and stop (no vLLM, any device)"
    )
    args = parser.parse_args(argv)
    kinds = [k for k in args.modalities.split(",") if k]
    unknown = sorted(set(kinds) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown modalities {unknown}; choose from {', '.join(WORKLOADS)}")
    checkpoints = {"bf16": args.bf16} if args.bf16 else {}
    for folder in args.quantized:
        checkpoints[checkpoint_name(folder, folder.name)] = folder

    if args.plan_only:
        for name, folder in checkpoints.items():
            processor = _processor(folder)
            for kind in kinds:
                spec = WORKLOADS[kind]
                prompt = (
                    render_prompt(processor, kind, spec)
                    if takes(processor, spec)
                    else "(the model takes no such input)"
                )
                print(f"{name} {kind} max_tokens={spec['max_tokens']}: {prompt!r}")
        return 0
    reason = skip_reason()
    if reason is not None:
        print(f"gpu_vllm: skipped: {reason}")
        return 0
    if not checkpoints:
        parser.error("give --bf16 and/or --quantized checkpoints")

    runs: dict[str, dict] = {}
    for name, folder in checkpoints.items():
        command = [sys.executable, __file__, "--child", str(folder), ",".join(kinds)]
        command += [str(args.samples), str(args.max_model_len)]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            runs[name] = {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
        else:
            runs[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: {runs[name].get('error') or 'done'}", file=sys.stderr)
    import vllm

    lengths = ", ".join(f"{kind} {WORKLOADS[kind]['max_tokens']}" for kind in kinds)
    text = (
        f"vLLM {vllm.__version__}; batch size 1, greedy, fixed output lengths ({lengths} tokens); "
        f"median of {args.samples} after one warm-up\n\n" + table(runs, kinds)
    )
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
