"""Spilling the activation cache to memory-mapped files when it does not fit in host memory.

llmcompressor's sequential pipeline keeps every sample's activations at the current layer
boundary in its ``IntermediatesCache`` (on the CPU between layers). Inside
:func:`spilled_activations` each tensor the cache stores is written to a file under the given
folder and replaced by a memory-mapped view of it: the kernel pages it in when a layer reads it
and can drop it again, so the cache takes disk instead of resident memory. The files are unlinked
as soon as they are mapped (the space comes back when the last view goes, even after a crash) and
the folder is removed on exit.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

SPILL_MIN_BYTES = 1 << 16  # smaller tensors (masks of short samples, scalars) stay in memory


@dataclass
class Spill:
    folder: Path
    tensors: int = 0
    bytes: int = 0
    _mapped: set[int] = field(default_factory=set)  # data pointers of tensors already on disk
    _names: Iterator[int] = field(default_factory=itertools.count)

    def to_disk(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as a memory-mapped copy (the same tensor when it already is one)."""
        if tensor.data_ptr() in self._mapped:
            return tensor
        tensor = tensor.detach().to("cpu").contiguous()
        size = tensor.numel() * tensor.element_size()
        path = self.folder / f"{next(self._names)}.bin"
        array = np.memmap(path, dtype=np.uint8, mode="w+", shape=(size,))
        array[:] = tensor.reshape(-1).view(torch.uint8).numpy()
        os.unlink(path)  # the mapping keeps the data; nothing is left behind
        mapped = torch.from_numpy(array).view(tensor.dtype).view(tensor.shape)
        self._mapped.add(mapped.data_ptr())
        self.tensors += 1
        self.bytes += size
        return mapped

    def wanted(self, value) -> bool:
        return (
            isinstance(value, torch.Tensor)
            and value.device.type != "meta"
            and value.numel() * value.element_size() >= SPILL_MIN_BYTES
        )

    def map_kwargs(self, kwargs: dict) -> dict:
        """Captured decoder inputs with their large tensors on disk."""
        out = {}
        for key, value in kwargs.items():
            if isinstance(value, list):
                out[key] = [self.to_disk(v) if self.wanted(v) else v for v in value]
            else:
                out[key] = self.to_disk(value) if self.wanted(value) else value
        return out


@contextlib.contextmanager
def spilled_activations(folder: Path) -> Iterator[Spill]:
    """Inside: the sequential pipeline's activation cache lives in memory-mapped files under
    ``folder`` (created, and removed on exit)."""
    from llmcompressor.pipelines.cache import IntermediatesCache, IntermediateValue

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spill = Spill(folder)
    original = IntermediatesCache.__dict__["_offload_value"]

    def offload(cls, value, offload_device, onload_device=None):
        if spill.wanted(value):
            return IntermediateValue(value=spill.to_disk(value), device=onload_device or value.device)
        return original.__func__(cls, value, offload_device, onload_device)

    IntermediatesCache._offload_value = classmethod(offload)
    try:
        yield spill
    finally:
        IntermediatesCache._offload_value = original
        shutil.rmtree(folder, ignore_errors=True)
