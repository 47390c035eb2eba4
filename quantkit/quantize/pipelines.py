"""Running llmcompressor's ``oneshot`` with the calibration pipeline an adapter asks for.

- ``sequential`` -> the library's ``independent`` pipeline: each modifier in its own pass, the
  data-hungry ones through the layer-by-layer sequential pipeline (memory-frugal on big models,
  propagates quantization error), split at the adapter's decoder-layer class.
- ``basic`` -> ``quantkit_staged_basic`` (registered below): each modifier in its own pass, with
  whole-model forwards (the library's ``basic``). One pass per modifier matters for
  SmoothQuant + GPTQ: GPTQ's Hessians must see the smoothed activations, as they do in
  ``independent``; the library's plain ``basic`` would run both in the same pass.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch.utils.data import DataLoader

STAGED_BASIC = "quantkit_staged_basic"
_registered = False


def _register_staged_basic() -> None:
    """Register the pipeline with llmcompressor's registry (once per process)."""
    global _registered
    if _registered:
        return
    from compressed_tensors.utils import patch_attr
    from llmcompressor.core import active_session
    from llmcompressor.pipelines.registry import CalibrationPipeline

    @CalibrationPipeline.register(STAGED_BASIC)
    class StagedBasicPipeline(CalibrationPipeline):
        """``independent`` with ``basic`` (not ``sequential``) for the modifiers that need data."""

        @staticmethod
        def __call__(model: torch.nn.Module, dataloader: DataLoader, dataset_args) -> None:
            session = active_session()
            modifiers = session.lifecycle.recipe.modifiers
            with patch_attr(session.lifecycle.recipe, "modifiers", None):
                for modifier in modifiers:
                    session.lifecycle.recipe.modifiers = [modifier]
                    name = "basic" if modifier.requires_calibration_data else "datafree"
                    CalibrationPipeline.load_from_registry(name)(model, dataloader, dataset_args)

    _registered = True


def library_pipeline(pipeline: Literal["sequential", "basic"]) -> str:
    if pipeline == "basic":
        _register_staged_basic()
        return STAGED_BASIC
    return "independent"


def run_oneshot(
    model: torch.nn.Module,
    processor,
    modifiers: list,
    loader: DataLoader | None,
    *,
    pipeline: Literal["sequential", "basic"],
    decoder_layer: str,
    trust_remote_code: bool = False,
) -> None:
    """Apply ``modifiers`` to ``model`` in place; nothing is saved here."""
    from llmcompressor import oneshot

    oneshot(
        model=model,
        processor=processor,
        dataset=loader,
        recipe=modifiers,
        pipeline=library_pipeline(pipeline),
        sequential_targets=[decoder_layer],
        num_calibration_samples=len(loader) if loader is not None else 0,
        shuffle_calibration_samples=False,
        save_compressed=True,
        trust_remote_code_model=trust_remote_code,  # oneshot re-reads the config from disk
    )
