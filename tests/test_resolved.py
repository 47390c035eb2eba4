"""A recipe resolved once per run (quantkit.quantize.resolved): the dry run, the modifiers and
quantkit.json read one record, and --avg-bits re-resolves with the ranking instead of patching it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantkit.models import adapter_for
from quantkit.models.targets import resolve_targets
from quantkit.precision.table import SensitivityRow, SensitivityTable
from quantkit.quantize import plan, quantize
from quantkit.quantize.resolved import build_modifiers, resolve
from quantkit.recipes import get_recipe


def test_the_modifiers_get_the_resolved_config_groups_and_leave_them_as_resolved(resolve_on):
    """The library sets observers on the schemes a modifier is given: the record keeps its own."""
    resolved = resolve_on(get_recipe("w4a16").model_copy(update={"weight_observer": None}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.group_size = 32
    recorded = {name: group.model_dump() for name, group in resolved.config_groups.items()}
    (quantizer,) = build_modifiers(resolved)
    config = quantizer.resolve_quantization_config()  # the library's observer defaults land here
    assert {name: group.weights.group_size for name, group in config.config_groups.items()} == {
        name: resolved.group_size for name in recorded
    }
    assert {name: group.model_dump() for name, group in resolved.config_groups.items()} == recorded
    assert resolved.to_dict()["weights"]["group_size"] == resolved.group_size
    assert build_modifiers(resolved)[0].config_groups == resolved.config_groups


def test_the_dry_run_and_quantkit_json_record_one_resolution(zoo_model, tmp_path, resolve_on):
    folder = zoo_model("tiny-qwen3")
    recipe = get_recipe("fp8-dynamic")  # data-free: a run takes seconds
    resolved = resolve_on(recipe)
    planned = plan(folder, recipe, [])
    assert (planned.group_size, planned.checkpoint_format, planned.checkpoint_bytes) == (
        resolved.group_size,
        resolved.checkpoint_format,
        resolved.checkpoint_bytes,
    )
    result = quantize(folder, tmp_path / "out", recipe, [], progress=False)
    assert result.metadata["resolved_scheme"] == resolved.to_dict()
    assert result.checkpoint_format == resolved.checkpoint_format
    assert result.metadata["memory"]["plan"]["disk"]["checkpoint"] == resolved.checkpoint_bytes


def test_avg_bits_resolves_again_with_the_ranking(zoo_model):
    """Without a ranking the 8-bit layers are not chosen yet; resolving again with one promotes
    the most sensitive unit into its own config group, and the first record stays as it was."""
    folder = zoo_model("tiny-qwen3")
    adapter = adapter_for(folder)
    model = adapter.meta_model(folder)
    targets = resolve_targets(model, adapter)
    recipe = get_recipe("w4a16")
    options = dict(model_dir=folder, saved_dtype=torch.bfloat16, avg_bits=4.5)
    unranked = resolve(recipe, model, adapter, targets, **options)
    assert unranked.precision.high == {} and list(unranked.config_groups) == ["group_0"]
    down = [name for name in targets.quantize if name.endswith("layers.0.mlp.down_proj")]
    rows = [
        SensitivityRow(name, [name], 1, kl=1.0 if name in down else 0.0, top1=None, rel_logit_mse=None)
        for name in targets.quantize
    ]
    table = SensitivityTable("m", "a", {}, "layer", "replay", 1, ["x"], 1, 1, rows)
    ranked = resolve(recipe, model, adapter, targets, sensitivity=table, **options)
    assert set(ranked.precision.high) == set(down)
    assert list(ranked.config_groups) == ["group_0", "group_1"]  # the 8-bit group first
    assert ranked.config_groups["group_0"].weights.num_bits == 8
    assert unranked.precision.high == {} and list(unranked.config_groups) == ["group_0"]
