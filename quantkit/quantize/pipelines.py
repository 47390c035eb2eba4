"""Running llmcompressor's ``oneshot`` with the calibration pipeline an adapter asks for.

- ``sequential`` with captured decoder inputs -> ``quantkit_decoder_sequential`` (registered
  below): the library's ``independent`` pipeline with the data-hungry modifiers run through its
  layer-by-layer ``sequential`` pipeline on the decoder module alone, the captured inputs as the
  data (quantkit.features.capture). The modifiers are initialised on the whole model (targets,
  ignore, SmoothQuant mappings and config groups keep the whole model's module names, and the
  whole model is what is saved); only the decoder is traced and run, so towers are neither
  traced nor called (tracing a whole Omni thinker split it into 1 of N subgraphs).
- ``sequential`` without captured inputs -> the library's ``independent`` pipeline on the whole
  model, split at the adapter's decoder-layer class.
- ``basic`` -> ``quantkit_staged_basic`` (registered below): each modifier in its own pass, with
  whole-model forwards (the library's ``basic``). One pass per modifier matters for
  SmoothQuant + GPTQ: GPTQ's Hessians must see the smoothed activations, as they do in
  ``independent``; the library's plain ``basic`` would run both in the same pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch
from torch.utils.data import DataLoader

STAGED_BASIC = "quantkit_staged_basic"
DECODER_SEQUENTIAL = "quantkit_decoder_sequential"
_registered = False
_decoder_path: str | None = None  # set by run_oneshot for the decoder pipeline's call


def _register_pipelines() -> None:
    """Register the pipelines with llmcompressor's registry (once per process)."""
    global _registered
    if _registered:
        return
    from compressed_tensors.offload import set_onload_device
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

    @CalibrationPipeline.register(DECODER_SEQUENTIAL)
    class DecoderSequentialPipeline(CalibrationPipeline):
        """``independent`` with ``sequential`` on the decoder alone (the loader holds its inputs)."""

        @staticmethod
        def __call__(model: torch.nn.Module, dataloader: DataLoader, dataset_args) -> None:
            if _decoder_path is None:
                raise RuntimeError("the decoder pipeline runs only inside quantkit's run_oneshot")
            decoder = model.get_submodule(_decoder_path)
            session = active_session()
            modifiers = session.lifecycle.recipe.modifiers
            with patch_attr(session.lifecycle.recipe, "modifiers", None):
                for modifier in modifiers:
                    session.lifecycle.recipe.modifiers = [modifier]
                    if modifier.requires_calibration_data:
                        CalibrationPipeline.load_from_registry("sequential")(
                            decoder, dataloader, dataset_args
                        )
                    else:
                        CalibrationPipeline.load_from_registry("datafree")(model, dataloader, dataset_args)
            # The sequential pipeline left the decoder's modules onloading to the GPU on access, while
            # the rest of the model (the thinker's lm_head, the towers) are plain CPU modules: saving
            # compares the tied embeddings across the two devices (llmcompressor's
            # _retie_embeddings: a RuntimeError, seen on an H200). Onloading to the CPU leaves the
            # model as a CPU run leaves it (there this changes nothing).
            set_onload_device(decoder, torch.device("cpu"))

    _registered = True


@contextlib.contextmanager
def _calibrating_decoder(path: str | None) -> Iterator[None]:
    global _decoder_path
    previous, _decoder_path = _decoder_path, path
    try:
        yield
    finally:
        _decoder_path = previous


def library_pipeline(pipeline: Literal["sequential", "basic"], *, decoder: str | None = None) -> str:
    if pipeline == "basic" or decoder is not None:
        _register_pipelines()
        return STAGED_BASIC if pipeline == "basic" else DECODER_SEQUENTIAL
    return "independent"


@contextlib.contextmanager
def _ranks_synced_after_compression() -> Iterator[None]:
    """Under torchrun with the model on CPUs, a barrier after each compression event.

    There every rank's modules live in CPU memory the ranks share (compressed-tensors'
    distributed CPU cache), and llmcompressor sends no compressed module to the other ranks
    (``broadcast_qparams_and_cleanup`` skips CPU modules): the module's owner writes its weight
    and scales in place, and nothing marks the end of those writes. Without the barrier a rank
    reads a layer another is still writing: in the next layer's inputs, or, after the last
    layer, in the checks and the save (seen: 2,074 negative scales in the last layer's up_proj).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        yield
        return
    from compressed_tensors.utils import patch_attr
    from llmcompressor.core import LifecycleCallbacks

    def then_barrier(event):
        def synced(*args, **kwargs):
            result = event(*args, **kwargs)
            dist.barrier()
            return result

        return synced

    with contextlib.ExitStack() as stack:
        for name in ("sequential_epoch_end", "calibration_end"):
            stack.enter_context(
                patch_attr(LifecycleCallbacks, name, then_barrier(getattr(LifecycleCallbacks, name)))
            )
        yield


@contextlib.contextmanager
def no_pinned_memory_without_cuda() -> Iterator[None]:
    """On a machine without CUDA, llmcompressor's cache pinning becomes a no-op.

    llmcompressor 0.14's AWQ pins each cached batch of a layer's inputs before its grid search
    (IntermediatesCache.pin_memory, for faster host-to-GPU copies), whatever the device; torch
    cannot pin memory without a CUDA driver ("Found no NVIDIA driver on your system"). Without a
    GPU there is no copy to speed up, so skipping the pinning changes nothing else.
    """
    if torch.cuda.is_available():
        yield
        return
    from compressed_tensors.utils import patch_attr
    from llmcompressor.pipelines.cache import IntermediatesCache

    with patch_attr(IntermediatesCache, "pin_memory", lambda self, *args, **kwargs: None):
        yield


def run_oneshot(
    model: torch.nn.Module,
    processor,
    modifiers: list,
    loader: DataLoader | None,
    *,
    pipeline: Literal["sequential", "basic"],
    decoder_layer: str,
    decoder: str | None = None,
    trust_remote_code: bool = False,
    propagate_error: bool = True,
) -> None:
    """Apply ``modifiers`` to ``model`` in place; nothing is saved here. With ``decoder`` (a
    module path), ``loader`` holds that module's captured inputs and only it is calibrated.

    ``propagate_error`` is the library's own setting for ``sequential``: each layer calibrates on
    its predecessors' outputs after they were quantized (True, the library's default and quantkit's),
    or before (False). With False a layer sees what it sees in one whole-model forward, which is
    what ``basic`` calibrates on; the tests use it to show that the captured inputs give SmoothQuant
    and GPTQ the whole model's statistics exactly."""
    from llmcompressor import oneshot

    with _calibrating_decoder(decoder), _ranks_synced_after_compression(), no_pinned_memory_without_cuda():
        oneshot(
            model=model,
            processor=processor,
            dataset=loader,
            recipe=modifiers,
            pipeline=library_pipeline(pipeline, decoder=decoder),
            sequential_targets=[decoder_layer],
            num_calibration_samples=len(loader) if loader is not None else 0,
            shuffle_calibration_samples=False,
            save_compressed=True,
            trust_remote_code_model=trust_remote_code,  # oneshot re-reads the config from disk
            propagate_error=propagate_error,
        )
