"""Towers once, decoder many: what enters the language-model decoder, captured once per sample.

Only the language model is quantized, so everything before its decoder (the processor, the vision
and audio towers, the embedding merge, 3-D rope positions, Qwen3-VL's deepstack features) computes
the same thing for every recipe. :func:`capture_decoder_inputs` runs the model up to the decoder
(the adapter's ``decoder`` path) once per sample: a forward pre-hook records the decoder's keyword
arguments and stops the forward there, so the capture costs the towers and the merge only. The
captured inputs go into the feature cache, keyed by the sample, the processor's files and a hash
of every weight outside the decoder layers (towers, projectors, embeddings), so a second recipe
reads them and runs no tower. Calibration then runs the decoder alone through llmcompressor's
sequential pipeline (:mod:`quantkit.quantize.pipelines`); replaying the captured kwargs through
the decoder gives the full model's hidden states exactly. The capture runs under llmcompressor's
``calibration_forward_context`` (eager attention), as the library runs every calibration forward:
under the model's own attention (sdpa) the towers' outputs differ in the last float32 bit, enough
for GPTQ to round some layer-0 weights the other way and, layer by layer, for every later one.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from quantkit.errors import CheckFailed
from quantkit.features.processor import FeatureRow, collate_one, load_entry, store_entry
from quantkit.models.adapters import Adapter, matches_any

# Bump when what is captured for the same model and sample changes.
CAPTURE_VERSION = 2  # 2: towers run under the library's calibration forward (eager attention)
CACHE_SUBDIR = "decoder-inputs"


class _Captured(Exception):  # noqa: N818 - control flow, not an error
    """Raised by the pre-hook to stop the forward at the decoder, carrying its inputs."""

    def __init__(self, kwargs: dict) -> None:
        super().__init__("decoder inputs captured")
        self.kwargs = kwargs


@dataclass
class DecoderInputs:
    """One sample's decoder keyword arguments (tensors, or lists of tensors, on the CPU)."""

    sample_id: str
    label: str
    kwargs: dict
    has_vision: bool
    has_audio: bool
    from_cache: bool = False

    @property
    def tokens(self) -> int:
        return sequence_length(self.kwargs)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _tensors(self.kwargs))


@dataclass
class CapturedInputs:
    rows: list[DecoderInputs]
    captured: int = 0  # samples whose towers ran in this process
    cache_hits: int = 0
    towers_hash: str | None = None  # None: the weights could not be hashed (offloaded), no cache
    tower_samples: dict[str, int] = field(default_factory=dict)  # kind -> samples that ran it here

    @property
    def nbytes(self) -> int:
        return sum(row.nbytes for row in self.rows)


def _tensors(kwargs: dict):
    for value in kwargs.values():
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, list):
            yield from value


def _keep(value) -> bool:
    """Data the decoder computes with: a tensor, or a list of tensors (deepstack features)."""
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(v, torch.Tensor) for v in value)


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return [v.detach().to("cpu", copy=True) for v in value]


def clean_kwargs(kwargs: dict) -> dict:
    """The decoder's data arguments, on the CPU: flags (``return_dict``, ``use_cache``), None and
    caches are dropped (the calibration pipeline sets its own)."""
    return {key: _to_cpu(value) for key, value in kwargs.items() if _keep(value)}


def sequence_length(kwargs: dict) -> int:
    for key in ("inputs_embeds", "hidden_states"):
        if isinstance(kwargs.get(key), torch.Tensor):
            return int(kwargs[key].shape[-2])
    for key in ("attention_mask", "input_ids"):
        if isinstance(kwargs.get(key), torch.Tensor):
            return int(kwargs[key].shape[-1])
    raise CheckFailed(f"captured decoder inputs carry no sequence: {sorted(kwargs)}")


def capture_one(model: torch.nn.Module, decoder: torch.nn.Module, inputs: dict) -> dict:
    """Run ``model(**inputs)`` up to ``decoder``, as llmcompressor runs a calibration forward,
    and return the decoder's keyword arguments."""
    names = list(inspect.signature(decoder.forward).parameters)

    def stop(_module, args, kwargs):
        raise _Captured(clean_kwargs({**dict(zip(names, args, strict=False)), **kwargs}))

    from llmcompressor.utils.helpers import calibration_forward_context

    handle = decoder.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        with calibration_forward_context(model):
            model(**inputs)
    except _Captured as captured:
        return captured.kwargs
    finally:
        handle.remove()
    raise CheckFailed(
        "the model's forward never reached its decoder",
        hint="check the adapter's decoder path (the module that receives the input embeddings)",
    )


def towers_fingerprint(model: torch.nn.Module, adapter: Adapter, layer_names: list[str]) -> str | None:
    """A hash of every tensor outside the decoder layers and the head (towers, projectors,
    embeddings, rotary buffers): what the captured inputs depend on. None when a tensor is not
    in memory (offloaded to meta), so nothing is cached rather than something wrong."""
    prefixes = tuple(name + "." for name in layer_names)
    digest = hashlib.blake2b(digest_size=20)
    digest.update(f"quantkit-capture-{CAPTURE_VERSION}|{adapter.decoder_path}".encode())
    for name, tensor in model.state_dict().items():
        if name.startswith(prefixes) or matches_any(name.rsplit(".", 1)[0], adapter.head):
            continue
        if tensor.device.type == "meta":
            return None
        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(flat.numpy().data)
    return digest.hexdigest()


def _cache_path(cache_dir: Path, key: str, row: FeatureRow) -> Path:
    return Path(cache_dir) / CACHE_SUBDIR / key[:20] / f"{row.sample_id}-{row.tokens}.pt"


def _cache_key(processor_fingerprint: str, towers_hash: str, dtype: torch.dtype) -> str:
    import transformers

    text = f"{processor_fingerprint}|{towers_hash}|{dtype}|torch-{torch.__version__}|transformers-{transformers.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def capture_decoder_inputs(
    model: torch.nn.Module,
    adapter: Adapter,
    rows: list[FeatureRow],
    *,
    layer_names: list[str],
    processor_fingerprint: str | None = None,
    cache_dir: Path | None = None,
    on_sample: Callable[[], None] | None = None,
) -> CapturedInputs:
    """The decoder's inputs for every row: from the cache where it has them, else by running the
    processor's outputs through the model up to the decoder (towers included)."""
    decoder = model.get_submodule(adapter.decoder_path)
    towers_hash = towers_fingerprint(model, adapter, layer_names)
    key = None
    if cache_dir is not None and towers_hash is not None and processor_fingerprint is not None:
        key = _cache_key(processor_fingerprint, towers_hash, _model_dtype(model))
    keys = sorted(set().union(*(row.inputs for row in rows))) if rows else []
    collate = collate_one(keys, keep_none=False)
    result = CapturedInputs(rows=[], towers_hash=towers_hash, tower_samples={"vision": 0, "audio": 0})
    for row in rows:
        path = _cache_path(cache_dir, key, row) if key is not None else None
        kwargs = load_entry(path) if path is not None else None
        cached = kwargs is not None
        if cached:
            result.cache_hits += 1
        else:
            kwargs = capture_one(model, decoder, collate([row.inputs]))
            result.captured += 1
            result.tower_samples["vision"] += row.has_vision
            result.tower_samples["audio"] += row.has_audio
            if path is not None:
                store_entry(path, kwargs)
        result.rows.append(
            DecoderInputs(row.sample_id, row.label, kwargs, row.has_vision, row.has_audio, from_cache=cached)
        )
        if on_sample is not None:
            on_sample()
    return result


# ---------------------------------------------------------------------- the decoder's data loader


def _neutral(example: torch.Tensor | list, example_length: int, length: int, key: str):
    """A value for an argument another sample has and this one lacks, that changes nothing: an
    all-False mask (Qwen3-VL's ``visual_pos_masks``), an empty entry per feature level
    (``deepstack_visual_embeds``: no position takes a visual feature), and for positions what the
    decoder computes without them (0..L-1 on every rope axis: text-only Qwen3-VL samples)."""
    if isinstance(example, list):
        return [t.new_zeros((0, *t.shape[1:])) for t in example]
    shape = list(example.shape)
    if shape and shape[-1] == example_length:
        shape[-1] = length
        if example.dtype == torch.bool:
            return torch.zeros(shape, dtype=torch.bool)
        if not example.is_floating_point() and key.endswith("position_ids"):
            return torch.arange(length, dtype=example.dtype).expand(shape).clone()
    raise CheckFailed(
        f"decoder input {key!r} is given for some calibration samples and not for others, and "
        "quantkit knows no neutral value for it",
        hint="calibrate on samples of one modality, or set the adapter's pipeline to 'basic'",
    )


def uniform_kwargs(rows: list[DecoderInputs]) -> list[dict]:
    """Every row with the same arguments: the sequential pipeline traces the decoder once, with
    the first sample, and replays that graph for every other one."""
    examples: dict[str, tuple] = {}
    for row in rows:
        for name, value in row.kwargs.items():
            examples.setdefault(name, (value, row.tokens))
    out = []
    for row in rows:
        kwargs = dict(row.kwargs)
        for name, (value, length) in examples.items():
            if name not in kwargs:
                kwargs[name] = _neutral(value, length, row.tokens, name)
        out.append(kwargs)
    return out


def _identity(batch):
    return batch


def decoder_loader(rows: list[DecoderInputs]) -> DataLoader:
    """One captured sample per batch, as the decoder's keyword arguments."""
    return DataLoader(uniform_kwargs(rows), batch_size=None, shuffle=False, collate_fn=_identity)
