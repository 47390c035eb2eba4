"""Proof that calibration data reached the model: forward hooks that count calls.

llmcompressor's sequential pipeline can trace only part of a model and calibrate nothing without
raising (seen on Omni thinkers: towers never called, NaN scales). Counting real forward calls on
every decoder layer and on each tower turns that silence into a failed check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from quantkit.errors import CheckFailed
from quantkit.models.adapters import Adapter
from quantkit.models.targets import decoder_layers


def _is_real_call(args: tuple, kwargs: dict) -> bool:
    """A call with data, not an fx tracing pass (whose tensors are Proxy objects)."""
    values = [*args, *kwargs.values()]
    if any(isinstance(value, torch.fx.Proxy) for value in values):
        return False
    return any(isinstance(value, torch.Tensor) and value.device.type != "meta" for value in values)


@dataclass
class CalibrationProbe:
    """Context manager counting forward calls on the decoder layers and the towers."""

    model: torch.nn.Module
    adapter: Adapter
    on_layer_call: Callable[[], None] | None = None
    counts: dict[str, int] = field(default_factory=dict)
    capture: object | None = None  # the CapturedInputs calibration ran on (sequential pipeline)
    spill: object | None = None  # the Spill that held the activation cache on disk, if any
    token_weights: dict | None = None  # quantkit.json's record of the recipe's token weights (when on)
    _handles: list = field(default_factory=list)

    def watched(self) -> dict[str, torch.nn.Module]:
        modules = dict(decoder_layers(self.model, self.adapter))
        for tower in (self.adapter.vision_tower, self.adapter.audio_tower):
            if tower:
                modules[tower] = self.model.get_submodule(tower)
        return modules

    @property
    def towers(self) -> dict[str, str]:
        return {
            kind: path
            for kind, path in (("vision", self.adapter.vision_tower), ("audio", self.adapter.audio_tower))
            if path
        }

    def __enter__(self) -> CalibrationProbe:
        tower_paths = set(self.towers.values())
        for name, module in self.watched().items():
            self.counts[name] = 0
            self._handles.append(
                module.register_forward_hook(self._hook(name, name not in tower_paths), with_kwargs=True)
            )
        return self

    def _hook(self, name: str, is_layer: bool):
        def count(_module, args, kwargs, _output):
            if _is_real_call(args, kwargs):
                self.counts[name] += 1
                if is_layer and self.on_layer_call is not None:
                    self.on_layer_call()

        return count

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def layer_counts(self) -> dict[str, int]:
        tower_paths = set(self.towers.values())
        return {name: n for name, n in self.counts.items() if name not in tower_paths}

    def verify(self, *, samples: int, vision_samples: int, audio_samples: int) -> None:
        """Fail unless each decoder layer ran at least once per sample, and each tower at least
        once per sample that carries its modality."""
        problems = []
        starved = [name for name, n in self.layer_counts().items() if n < samples]
        if starved:
            shown = ", ".join(f"{name} ({self.counts[name]})" for name in starved[:8])
            problems.append(
                f"{len(starved)} decoder layer(s) saw fewer than {samples} calibration calls: {shown}"
            )
        wanted = {"vision": vision_samples, "audio": audio_samples}
        for kind, path in self.towers.items():
            if wanted[kind] and self.counts[path] < wanted[kind]:
                problems.append(
                    f"the {kind} tower ({path}) ran {self.counts[path]} time(s) for {wanted[kind]} sample(s) with {kind} input"
                )
        if problems:
            raise CheckFailed(
                "calibration did not reach the whole model: " + "; ".join(problems),
                hint="the calibration pipeline skipped part of the model; set the adapter's pipeline to 'basic'. "
                "Nothing was written",
            )
