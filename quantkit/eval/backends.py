"""Running the harness on one model folder: in this process with transformers (``hf``), or in the
vLLM environment (``vllm``).

hf: the model is loaded the way quantkit loads it everywhere else: through its adapter (a whole
Omni model in the serving layout yields its thinker, which holds the language model), in the dtype
the checkpoint was saved in (compressed-tensors checkpoints decompress on load; some of them fail
when reloaded in float32), and is handed to the harness as an ``HFLM`` object. A causal LM with no
quantkit adapter (Llama, e.g. SmolLM2) loads with ``AutoModelForCausalLM``.

vllm: lm-evaluation-harness has a vLLM backend, but vLLM lives in its own environment
(``.venv-vllm``, other torch / compressed-tensors pins) and lm_eval is not installed there. Installing
it there is left to the user: quantkit reports the backend as unavailable (exit 2) and says why.
Where lm_eval is importable in that environment, the harness runs there in a subprocess.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import CheckFailed, InputError
from quantkit.terminal import pass_on

BACKENDS = ("hf", "vllm")
WORKER = Path(__file__).with_name("harness_worker.py")
# The harness sums log-probabilities in the dtype of its log_softmax, which is the model's unless
# told otherwise: in bfloat16 a document's log-likelihood of -4736 moves in steps of 32, and an
# FP8 checkpoint and its original came out with identical perplexities. Log-softmax in float32.
SOFTMAX_DTYPE = "float32"
RESULT_KEYS = ("results", "groups", "group_subtasks", "higher_is_better", "n-samples", "versions", "n-shot")


@dataclass
class HarnessRun:
    """The harness's result for one model folder (the JSON-safe part of ``simple_evaluate``)."""

    model_dir: Path
    results: dict
    seconds: float
    dtype: str
    loaded_as: str


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_for_eval(model_dir: Path):
    """(model, tokenizer, dtype, class name): the language model of ``model_dir`` in its saved dtype."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.models.adapters import adapter_for, model_architecture
    from quantkit.quantize.run import saved_dtype

    model_dir = Path(model_dir)
    model_architecture(model_dir)  # config.json present and naming an architecture, else InputError
    dtype = saved_dtype(model_dir)
    try:
        adapter = adapter_for(model_dir)
    except InputError:
        adapter = None  # no quantkit adapter: a plain causal LM
    try:
        if adapter is not None:
            model = adapter.load_model(model_dir, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except Exception as err:
        raise InputError(f"could not load the model: {type(err).__name__}: {err}", path=model_dir) from None
    return model, tokenizer, dtype, type(model).__name__


def _json_safe(results: dict) -> dict:
    payload = {key: results.get(key) for key in RESULT_KEYS if key in results}
    return json.loads(json.dumps(payload, default=str))


def run_hf(
    model_dir: Path, tasks: list[str], catalog, *, limit: int | None = None, batch_size: int = 1
) -> HarnessRun:
    """``lm_eval.simple_evaluate`` on the model loaded here, handed over as an HFLM object."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    started = time.perf_counter()
    model, tokenizer, dtype, loaded_as = load_for_eval(model_dir)
    model.to(_device())
    try:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, softmax_dtype=SOFTMAX_DTYPE)
        results = lm_eval.simple_evaluate(
            model=lm, tasks=list(tasks), limit=limit, task_manager=catalog.manager, log_samples=False
        )
    except Exception as err:  # a forward that breaks on this checkpoint is a finding, not a crash
        raise CheckFailed(
            f"the harness failed on this model: {type(err).__name__}: {err}", path=model_dir
        ) from None
    finally:
        del model
        gc.collect()
    return HarnessRun(
        Path(model_dir),
        _json_safe(results),
        round(time.perf_counter() - started, 2),
        str(dtype).removeprefix("torch."),
        loaded_as,
    )


# ---------------------------------------------------------------------- another environment


def vllm_status() -> tuple[Path | None, str]:
    """(interpreter, "") when ``--backend vllm`` can run, else (None, why not)."""
    from quantkit.verify.vllm_check import vllm_python

    python = vllm_python()
    if python is None:
        return None, "no vLLM environment: run `make vllm-env` (or set QUANTKIT_VLLM_PYTHON)"
    probe = subprocess.run(
        [str(python), "-P", "-c", "import lm_eval"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        check=False,
    )
    if probe.returncode != 0:
        return None, (
            f"lm_eval is not installed in the vLLM environment ({python}); vLLM pins its own torch, "
            "transformers and compressed-tensors there, and quantkit does not install lm_eval into it. "
            "Use --backend hf (the same harness, transformers in this environment), or install "
            "lm_eval==0.4.13 into that environment yourself"
        )
    return python, ""


def run_in_environment(
    python: Path,
    model_dir: Path,
    tasks: list[str],
    catalog,
    *,
    model: str = "vllm",
    model_args: dict | None = None,
    limit: int | None = None,
    batch_size: int = 1,
    timeout_s: float = 6 * 3600,
) -> HarnessRun:
    """The harness in another interpreter (the vLLM environment): one fresh process per model."""
    from quantkit.quantize.run import saved_dtype

    started = time.perf_counter()
    dtype = str(saved_dtype(model_dir)).removeprefix("torch.")
    args = {
        "model": model,
        "model_args": model_args
        or {
            "pretrained": str(Path(model_dir).resolve()),
            "dtype": dtype,
            "enforce_eager": True,
            "max_model_len": 4096,
        },
        "tasks": list(tasks),
        "limit": limit,
        "batch_size": batch_size,
        "include_paths": [str(p) for p in catalog.include_paths],
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_ENABLE_V1_MULTIPROCESSING": env.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
        }
    )
    with tempfile.TemporaryDirectory(prefix="quantkit-eval-") as tmp:
        args_path, out_path = Path(tmp) / "args.json", Path(tmp) / "out.json"
        args_path.write_text(json.dumps(args), encoding="utf-8")
        try:
            done = subprocess.run(
                [str(python), "-P", str(WORKER), str(args_path), str(out_path)],
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"the harness ran past {timeout_s:.0f} s", path=model_dir) from None
        pass_on(f"lm_eval in the vLLM environment ({Path(model_dir).name})", done.stdout + done.stderr)
        if done.returncode != 0 or not out_path.is_file():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise CheckFailed(f"the harness failed on this model ({model} backend): {tail}", path=model_dir)
        results = json.loads(out_path.read_text(encoding="utf-8"))
    return HarnessRun(Path(model_dir), results, round(time.perf_counter() - started, 2), dtype, model)
