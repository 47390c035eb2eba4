"""A recipe's ``weight_observer`` picks llmcompressor's weight observer (imatrix_mse: the
importance-weighted MSE search): it reaches the library's resolved scheme, quantkit.json's record
of it, a token-weighted GPTQ modifier, and a bad value is refused at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantkit.errors import InputError
from quantkit.quantize.resolved import build_modifiers
from quantkit.recipes import get_recipe, load_recipe_file


def _imatrix(name: str = "w4a16"):
    return get_recipe(name).model_copy(update={"weight_observer": "imatrix_mse"})


def _observer_class(name: str):
    from llmcompressor.observers import Observer

    return Observer.get_value_from_registry(name)


def test_every_observer_a_recipe_may_name_is_the_librarys():
    from typing import get_args

    from quantkit.recipes.schema import WeightObserver

    for name in get_args(WeightObserver):
        assert _observer_class(name) is not None


def _weight_observers(modifier) -> set[str]:
    groups = modifier.resolve_quantization_config().config_groups.values()
    return {group.weights.observer for group in groups}


@pytest.mark.parametrize("name", ["w4a16", "fp8-dynamic"])
def test_imatrix_reaches_the_library_modifier(name: str, resolve_on):
    from llmcompressor.observers import IMatrixMSEObserver

    sq = [
        [
            [r"re:^model\.layers\.\d+\.mlp\.(gate|up)_proj$"],
            r"re:^model\.layers\.\d+\.post_attention_layernorm$",
        ]
    ]
    quantizer = build_modifiers(resolve_on(_imatrix(name)), smoothquant_mappings=sq)[-1]
    assert _weight_observers(quantizer) == {"imatrix_mse"}
    assert quantizer.weight_observer == "imatrix_mse"
    assert _observer_class("imatrix_mse") is IMatrixMSEObserver
    assert resolve_on(_imatrix(name)).to_dict()["weights"]["observer"] == "imatrix_mse"
    # unset: the library's default observer, and no override on the modifier
    unset = get_recipe(name).model_copy(update={"weight_observer": None})
    plain = build_modifiers(resolve_on(unset), smoothquant_mappings=sq)[-1]
    assert plain.weight_observer is None and _weight_observers(plain) != {"imatrix_mse"}


def test_the_shipped_w4a16_calibrates_imatrix_scales_and_memoryless_minmax_turns_it_off(resolve_on):
    """w4a16 ships with imatrix_mse (it beat plain GPTQ on SmolLM2-135M, bench/RESULTS.md); the
    recipe's documented way back to plain GPTQ's range reaches the library as that observer."""
    shipped = get_recipe("w4a16")
    assert shipped.weight_observer == "imatrix_mse" and shipped.needs_data
    quantizer = build_modifiers(resolve_on(shipped))[-1]
    assert quantizer.weight_observer == "imatrix_mse" and _weight_observers(quantizer) == {"imatrix_mse"}
    off = shipped.model_copy(update={"weight_observer": "memoryless_minmax"})
    quantizer = build_modifiers(resolve_on(off))[-1]
    assert _weight_observers(quantizer) == {"memoryless_minmax"}
    assert resolve_on(off).to_dict()["weights"]["observer"] == "memoryless_minmax"
    # AWQ rescales the weights after the imatrix statistics are gathered: its recipe keeps the default
    assert get_recipe("w4a16-awq").weight_observer is None


def test_imatrix_reaches_config_groups_and_token_weighted_gptq(resolve_on):
    """The group size chosen for a model (config_groups) and the weighted GPTQ subclass keep it."""
    from quantkit.quantize.token_weights import weighted_gptq_modifier_class, with_token_weights

    resolved = resolve_on(_imatrix().model_copy(update={"group_size": 64}))
    assert resolved.config_groups and resolved.group_size == 64
    (gptq,) = build_modifiers(resolved)
    (weighted,) = with_token_weights([gptq], [])
    assert isinstance(weighted, weighted_gptq_modifier_class())
    for modifier in (gptq, weighted):
        (group,) = modifier.resolve_quantization_config().config_groups.values()
        assert (group.weights.observer, group.weights.group_size) == ("imatrix_mse", 64)


def test_imatrix_needs_calibration_data():
    rtn = get_recipe("fp8-dynamic")
    assert not rtn.needs_data
    assert rtn.model_copy(update={"weight_observer": "imatrix_mse"}).needs_data


@pytest.mark.parametrize(
    "body, words",
    [
        ("scheme: W4A16\nmethod: gptq\nweight_observer: imatrix\n", ["weight_observer", "imatrix_mse"]),
        ("scheme: FP8\nmethod: rtn\nweight_observer: imatrix_mse\n", ["weight_observer", "FP8"]),
        ("scheme: FP8_BLOCK\nmethod: rtn\nweight_observer: imatrix_mse\n", ["weight_observer", "FP8_BLOCK"]),
        (
            "scheme: W8A8\nmethod: gptq\nsmoothquant_strength: 0.8\nweight_observer: imatrix_mse\n",
            ["weight_observer", "SmoothQuant"],
        ),
        ("scheme: W4A16\nmethod: awq\nweight_observer: imatrix_mse\n", ["weight_observer", "awq"]),
        ("scheme: W4A16\nmethod: gptq\nweight_observer: minmax\n", ["weight_observer", "memoryless_minmax"]),
    ],
)
def test_bad_observer_is_refused(tmp_path: Path, body: str, words: list[str]):
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nhardware: any\n" + body)
    with pytest.raises(InputError) as err:
        load_recipe_file(path)
    for word in words:
        assert word in err.value.message
