"""Shared fixtures: the demo pool and tiny zoo models, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Nothing in the tests may reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def demo_pool(tmp_path_factory) -> Path:
    """The built-in demo pool (JSONL path), as `quantkit demo-pool` writes it."""
    from quantkit.zoo.demo_pool import write_demo_pool

    summary = write_demo_pool(tmp_path_factory.mktemp("demo") / "pool", per_task=6, seed=0)
    return summary.jsonl


@pytest.fixture(scope="session")
def zoo_model(tmp_path_factory):
    """Factory: ``zoo_model("tiny-qwen3-vl")`` builds that tiny model once and returns its folder."""
    from quantkit.zoo.models import build_zoo_model

    root = tmp_path_factory.mktemp("zoo")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_zoo_model(name, root / name, seed=0)
        return built[name]

    return get


@pytest.fixture(scope="session")
def resolve_on(zoo_model):
    """Factory: ``resolve_on(recipe, "tiny-qwen3", avg_bits=4.5)`` is ``recipe`` resolved on that
    zoo model from its config alone, as quantize resolves it before loading any weight."""

    def get(recipe, name: str = "tiny-qwen3", **options):
        from quantkit.models.adapters import adapter_for
        from quantkit.quantize.preflight import resolve_from_config

        folder = zoo_model(name)
        resolved, _ = resolve_from_config(folder, recipe, adapter_for(folder, None), **options)
        return resolved

    return get
