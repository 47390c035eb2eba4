"""Architectures: adapters (load, language model, keep-list, SmoothQuant mappings, pipeline) and the
one path by which samples become model inputs (:mod:`quantkit.models.inputs`)."""

from quantkit.models.adapters import (
    ADAPTERS_DIR,
    GROUPS,
    Adapter,
    AwqMapping,
    KeepRule,
    KnownFailure,
    SmoothQuantMapping,
    adapter_for,
    builtin_adapters,
    load_adapter_file,
    model_architecture,
)

__all__ = [
    "ADAPTERS_DIR",
    "GROUPS",
    "Adapter",
    "AwqMapping",
    "KeepRule",
    "KnownFailure",
    "SmoothQuantMapping",
    "adapter_for",
    "builtin_adapters",
    "load_adapter_file",
    "model_architecture",
]
