"""Loading helpers every stage shares: the checkpoint's saved dtype, casting back to it, and MoE
experts unfused into per-expert Linears (on real weights or on the meta device)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import sys
from pathlib import Path

import torch

from quantkit.modelfiles import read_model_config

# transformers modules that import scikit-learn / scipy names at import time when scikit-learn is
# installed: the names each takes, and where from (generation_without_sklearn).
SKLEARN_USERS = {
    "transformers.generation.candidate_generator": {"roc_curve": "sklearn.metrics"},
    "transformers.data.metrics": {
        "pearsonr": "scipy.stats",
        "spearmanr": "scipy.stats",
        "f1_score": "sklearn.metrics",
        "matthews_corrcoef": "sklearn.metrics",
    },
}


def saved_dtype(model_dir: Path) -> torch.dtype:
    """The dtype the checkpoint is stored in (config.json ``dtype`` / ``torch_dtype``, top level
    or text_config), bfloat16 when it does not say. Read before loading: loading in float32
    rewrites the in-memory config."""
    config = read_model_config(model_dir)
    text_config = config.get("text_config")
    for section in (config, text_config if isinstance(text_config, dict) else {}):
        for key in ("dtype", "torch_dtype"):
            value = getattr(torch, str(section.get(key)), None)
            if isinstance(value, torch.dtype) and value.is_floating_point:
                return value
    return torch.bfloat16


def set_saved_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast the model and make its config (and sub-configs: text, vision, audio) say so: loading
    in float32 rewrote ``config.dtype``, and ``model.to`` does not touch it."""
    from compressed_tensors.offload import remove_dispatch
    from transformers import PretrainedConfig

    # oneshot leaves every module behind an offload cache whose __setitem__ copies new values
    # into the old (float32) storage: drop that wrapping first or the cast does nothing.
    remove_dispatch(model, onload_tensors=True)
    model.to(dtype)
    pending, seen = [model.config], set()
    while pending:
        config = pending.pop()
        if id(config) in seen:
            continue
        seen.add(id(config))
        config.dtype = dtype
        pending.extend(v for v in vars(config).values() if isinstance(v, PretrainedConfig))


def unfuse_experts(model: torch.nn.Module) -> None:
    """MoE experts stored as fused 3D tensors -> per-expert Linears (what oneshot does anyway,
    done first so the targets name the real modules)."""
    from llmcompressor.modeling.moe.linearize import get_non_linearized_moes, linearize_moe

    if get_non_linearized_moes(model):
        linearize_moe(model)


def unfuse_experts_on_meta(model: torch.nn.Module, *, light_imports: bool = False) -> None:
    """The same module tree as :func:`unfuse_experts`, built on the meta device (no copy).
    The library's expert check reads each module's class source; it runs once per class here
    (48 MoE layers of one class: one check, not 48). A tree where no class holds a fused
    ``down_proj`` Parameter (what the library's protocol and both of its registered expert
    classes, GPT-OSS and Llama 4, hold) has nothing to unfuse: llmcompressor (1-1.5 s to import,
    the datasets stack with it) is not imported for it. ``light_imports`` (the config-only dry
    run): import it without scikit-learn (:func:`generation_without_sklearn`)."""
    first_of_class: dict[type, torch.nn.Module] = {}
    for _, module in model.named_modules():
        first_of_class.setdefault(type(module), module)
    if not any(
        isinstance(getattr(m, "down_proj", None), torch.nn.Parameter) for m in first_of_class.values()
    ):
        return
    with generation_without_sklearn(light_imports):  # llmcompressor imports transformers.data.metrics
        from llmcompressor.modeling.moe.helpers import FusedExpertsProtocol
        from llmcompressor.modeling.moe.linear_experts import LinearExperts2D

    fused = {  # the rule of llmcompressor's get_non_linearized_moes, applied per class
        cls: LinearExperts2D.get_linear_experts_cls(cls)
        for cls, module in first_of_class.items()
        if isinstance(module, FusedExpertsProtocol) or LinearExperts2D.get_registration(cls) is not None
    }
    from transformers.initialization import no_init_weights

    # Meta tensors hold no values: skipping the init functions (transformers' own switch) makes
    # the 18,432 expert Linears of a 48-layer x 128-expert model cheap to build.
    with torch.device("meta"), no_init_weights():
        for name, module in [(n, m) for n, m in model.named_modules() if type(m) in fused]:
            model.set_submodule(name, fused[type(module)](getattr(module, "config", model.config)))


def _imported_on_call(module: str, name: str):
    """A function that imports ``module``'s ``name`` on its first call and calls it."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = name
    return call


def _no_sklearn() -> bool:
    """transformers' ``is_sklearn_available`` while :func:`generation_without_sklearn` runs."""
    return False


_IMPORTS_SKLEARN = re.compile(r"^\s*(from|import)\s+(sklearn|scipy)\b", re.MULTILINE)


def _imports_sklearn(module) -> bool:
    """Whether ``module``'s source imports scikit-learn or scipy names (read from its file)."""
    try:
        return bool(_IMPORTS_SKLEARN.search(Path(module.__file__).read_text(encoding="utf-8")))
    except (AttributeError, TypeError, OSError, UnicodeDecodeError):
        return False


@contextlib.contextmanager
def generation_without_sklearn(enabled: bool = True):
    """Import transformers' generation stack (every model class inherits GenerationMixin; its
    candidate generator takes ``roc_curve``) and its GLUE metrics (llmcompressor imports them)
    without scikit-learn: both import it, with scipy and pandas, whenever it is installed (lm-eval
    needs it), 2.4 s of CPU for a config-only plan that neither generates nor scores. The dry run
    and the checkpoint audit (neither generates) ask for it (``enabled``); a real run imports
    transformers untouched.

    While it runs transformers' check says no. On exit every module holding that stand-in
    (``from .utils import is_sklearn_available``: transformers.file_utils, SKLEARN_USERS, ...)
    gets the real check back, and, where scikit-learn is installed, each SKLEARN_USERS module
    gets its names as functions that import them on their first call: they behave as before. A
    module imported in the window that imports scikit-learn / scipy names and is not in
    SKLEARN_USERS lacks them: it is named in a warning. Modules already imported are left as
    they are."""
    if not enabled:
        yield
        return
    import transformers.utils as utils
    from transformers.utils import import_utils

    pending = [name for name in SKLEARN_USERS if name not in sys.modules]
    if not pending:
        yield
        return
    before = set(sys.modules)
    real = import_utils.is_sklearn_available
    utils.is_sklearn_available = import_utils.is_sklearn_available = _no_sklearn
    try:
        yield
    finally:
        utils.is_sklearn_available = import_utils.is_sklearn_available = real
        installed = real()
        for name, module in list(sys.modules.items()):
            # The module's own namespace, not getattr: a module-level __getattr__ (transformers'
            # moved-module aliases such as image_processing_*_fast) imports its target on a miss,
            # 400-odd modules and ~1 s of CPU for a name none of them holds.
            if getattr(module, "__dict__", {}).get("is_sklearn_available") is not _no_sklearn:
                continue
            module.is_sklearn_available = real
            if name in SKLEARN_USERS:
                if installed:
                    for attr, source in SKLEARN_USERS[name].items():
                        setattr(module, attr, _imported_on_call(source, attr))
            elif name not in before and installed and _imports_sklearn(module):
                logging.getLogger("quantkit").warning(
                    f"{name} was imported while scikit-learn was hidden (a config-only plan) and "
                    "lacks its scikit-learn / scipy names; add it to SKLEARN_USERS in "
                    "quantkit/models/loading.py"
                )
