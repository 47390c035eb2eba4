"""Old module paths of modules that moved down the stage order, kept importable.

``quantkit.quantize.features`` is now ``quantkit.features.processor`` and so on; code and tests
that import the old path get the same module object (one module, so a monkeypatch on either name
patches both). Registered by the package that used to hold the module.
"""

from __future__ import annotations

import importlib
import sys


def register(package: str, moved: dict[str, str]) -> None:
    """``package.<old>`` -> the module at ``moved[old]``."""
    parent = sys.modules[package]
    for old, new in moved.items():
        module = importlib.import_module(new)
        sys.modules[f"{package}.{old}"] = module
        setattr(parent, old, module)
