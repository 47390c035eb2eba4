"""Token weights inside GPTQ: the weighted Hessian is x^T diag(w) x, a zero weight drops those
tokens, uniform weights change nothing, and non-uniform weights reach the library's solve.

Real libraries (llmcompressor's GPTQModifier hook, its accumulate_hessian) on tiny zoo models.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pydantic import ValidationError
from safetensors.torch import load_file

from quantkit.features.processor import prepare_features
from quantkit.models import adapter_for
from quantkit.models.inputs import Sample
from quantkit.quantize import quantize
from quantkit.quantize.token_weights import (
    media_token_ids,
    sample_weights,
    tier_weight,
    turn_roles,
    weighted_gptq_modifier_class,
)
from quantkit.recipes import get_recipe
from quantkit.recipes.schema import Recipe, TokenWeights

pytestmark = pytest.mark.filterwarnings("ignore:Attempting to save a model with offloaded modules")

MODEL = "tiny-qwen2.5-vl"


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tw-media") / "ramp.png"
    ramp = np.linspace(0, 255, 96, dtype=np.uint8)
    Image.fromarray(np.stack([np.tile(ramp, (64, 1))] * 3, axis=-1)).save(path)
    return path


def _samples(image: Path) -> tuple[list[Sample], list[str]]:
    def turn(prompt: str, answer: str) -> list[dict]:
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]

    return (
        [
            Sample(turn("<image>Read the text.", "A grey ramp."), images=[image]),
            Sample(turn("Name three colours.", "Red, yellow and green.")),
        ],
        ["ocr", "short_caption"],
    )


@pytest.fixture(scope="module")
def prepared(zoo_model, image):
    model_dir = zoo_model(MODEL)
    adapter = adapter_for(model_dir)
    processor = adapter.load_processor(model_dir)
    samples, labels = _samples(image)
    model = adapter.load_model(model_dir, dtype=torch.float32)
    return model, processor, prepare_features(processor, samples, labels=labels, fingerprint="x")


def _module_inputs(model, rows) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """The first decoder layer's q_proj and its input for every row (the full model's forward)."""
    module = next(m for name, m in model.named_modules() if name.endswith("layers.0.self_attn.q_proj"))
    seen: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda _m, args, _o: seen.append(args[0].detach().clone()))
    try:
        with torch.no_grad():
            for row in rows:
                model(**{k: v for k, v in row.inputs.items() if not isinstance(v, bool) or v})
    finally:
        handle.remove()
    return module, seen


def _hessian(modifier, module, inputs: list[torch.Tensor]) -> torch.Tensor:
    """Run the modifier's Hessian hook on each input as calibration batch i; H / samples."""
    from llmcompressor.core import active_session

    state = active_session().state
    for index, inp in enumerate(inputs):
        state.current_batch_idx = index
        modifier.calibrate_module(module, (inp,), None)
    state.current_batch_idx = -1
    return modifier._hessians.pop(module) / modifier._num_samples.pop(module)


def _plain():
    from llmcompressor.modifiers.quantization import GPTQModifier

    return GPTQModifier(targets=["Linear"], scheme="W4A16")


def _weighted(vectors):
    modifier = weighted_gptq_modifier_class()(targets=["Linear"], scheme="W4A16")
    modifier.set_token_weights(vectors)
    return modifier


def test_token_weights_are_off_unless_the_recipe_says_so():
    recipe = get_recipe("w4a16")
    assert recipe.token_weights is None
    on = Recipe.model_validate({**recipe.model_dump(), "token_weights": {"modality": {"image": 0.2}}})
    assert on.token_weights.modality.image == 0.2 and on.token_weights.role.answer == 1.0
    with pytest.raises(ValidationError, match="pixel"):
        TokenWeights.model_validate({"modality": {"pixel": 1}})
    with pytest.raises(ValidationError, match="greater than or equal"):
        TokenWeights.model_validate({"role": {"answer": -1}})
    with pytest.raises(ValidationError, match="need method: gptq"):
        Recipe.model_validate({**get_recipe("fp8").model_dump(), "token_weights": {}})


def test_the_task_tier_comes_from_the_taxonomy_for_task_and_stratum_labels():
    from quantkit.errors import InputError
    from quantkit.taxonomy import load_taxonomy

    taxonomy = load_taxonomy()
    ocr, caption = (taxonomy.weight(taxonomy.resolve(name)) for name in ("ocr", "short_caption"))
    assert ocr > caption  # precision tasks weigh more than perceptual ones
    assert tier_weight("ocr", taxonomy) == tier_weight("ocr|image|small", taxonomy) == ocr
    with pytest.raises(InputError, match="no_such_task"):
        tier_weight("no_such_task|text|short", taxonomy)


def test_weights_follow_modality_role_and_task_tier(prepared):
    model, processor, features = prepared
    media = media_token_ids(model.config)
    assert media["image"] and media["video"]
    settings = TokenWeights.model_validate(
        {"modality": {"image": 0.5}, "role": {"system": 0.0, "answer": 4.0}, "task_tier": True}
    )
    vectors = sample_weights(features.rows, settings, config=model.config, processor=processor)
    from quantkit.taxonomy import load_taxonomy

    taxonomy = load_taxonomy()
    for row, weights in zip(features.rows, vectors, strict=True):
        ids = row.inputs["input_ids"].reshape(-1).tolist()
        roles = turn_roles(ids, processor.tokenizer)
        assert {"system", "user", "answer"} <= set(roles)
        tier = taxonomy.weight(taxonomy.resolve(row.label))
        for token, role, weight in zip(ids, roles, weights.tolist(), strict=True):
            modality = 0.5 if token in media["image"] else 1.0
            expected = modality * {"system": 0.0, "user": 1.0, "answer": 4.0}[role] * tier
            assert weight == pytest.approx(expected)
    # The image sample's placeholders are weighted as images; the text sample has none.
    assert any(token in media["image"] for token in features.rows[0].inputs["input_ids"].reshape(-1).tolist())


def test_weighted_hessian_is_the_direct_computation_and_a_zero_weight_drops_the_tokens(prepared):
    model, processor, features = prepared
    module, inputs = _module_inputs(model, features.rows)
    settings = TokenWeights.model_validate({"modality": {"image": 0.0}, "role": {"answer": 3.0}})
    vectors = sample_weights(features.rows, settings, config=model.config, processor=processor)
    assert (vectors[0] == 0).any() and not (vectors[1] == 0).any()

    weighted = _hessian(_weighted(vectors), module, inputs)
    x = [inp.reshape(-1, inp.shape[-1]).double() for inp in inputs]
    direct = sum(2 * xi.T @ torch.diag(w.double()) @ xi for xi, w in zip(x, vectors, strict=True)) / len(x)
    # float32 accumulation (the library's) against float64: equal to 1e-4 of the Hessian's scale.
    scale = float(direct.abs().max())
    torch.testing.assert_close(weighted.double(), direct, rtol=1e-4, atol=1e-4 * scale)

    # Image weight 0, every other weight 1: the library's Hessian on the sample without its image tokens.
    only_image = TokenWeights.model_validate({"modality": {"image": 0.0}})
    vectors = sample_weights(features.rows, only_image, config=model.config, processor=processor)
    kept = [inp[:, w > 0] for inp, w in zip(inputs, vectors, strict=True)]
    assert kept[0].shape[1] < inputs[0].shape[1]
    torch.testing.assert_close(_hessian(_weighted(vectors), module, inputs), _hessian(_plain(), module, kept))


def test_uniform_weights_give_the_librarys_hessian_to_the_bit(prepared):
    model, processor, features = prepared
    module, inputs = _module_inputs(model, features.rows)
    vectors = sample_weights(features.rows, TokenWeights(), config=model.config, processor=processor)
    assert all(bool((v == 1).all()) for v in vectors)
    assert torch.equal(_hessian(_weighted(vectors), module, inputs), _hessian(_plain(), module, inputs))


def _quantized(tmp_path: Path, zoo_model, image, name: str, token_weights: dict | None, **overrides):
    base = get_recipe("w4a16").model_dump()
    recipe = Recipe.model_validate(
        {**base, "name": name, **({"token_weights": token_weights} if token_weights else {}), **overrides}
    )
    samples, labels = _samples(image)
    result = quantize(
        zoo_model(MODEL), tmp_path / name, recipe, samples, sample_labels=labels, progress=False
    )
    tensors = {}
    for file in sorted(result.output.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors, json.loads((result.output / "quantkit.json").read_text()), result.output


def test_non_uniform_weights_change_the_solved_weights_and_are_recorded(zoo_model, image, tmp_path):
    plain, plain_meta, _ = _quantized(tmp_path, zoo_model, image, "plain", None)
    ones, _, _ = _quantized(tmp_path, zoo_model, image, "ones", {"modality": {"text": 1.0}})
    weighted, meta, out = _quantized(
        tmp_path, zoo_model, image, "weighted", {"modality": {"image": 0.0}, "role": {"answer": 4.0}}
    )
    packed = [k for k in plain if k.endswith("weight_packed")]
    assert packed and set(plain) == set(weighted) == set(ones)
    assert all(torch.equal(plain[k], ones[k]) for k in plain)  # uniform: today's checkpoint exactly
    assert any(not torch.equal(plain[k], weighted[k]) for k in packed)
    assert "token_weights" not in plain_meta["recipe"] and "token_weights" not in plain_meta["calibration"]
    record = meta["calibration"]["token_weights"]
    assert record["modality"]["image"] == 0.0 and record["role"]["answer"] == 4.0
    assert 0 < record["zero_weight_tokens"] < record["tokens"] == meta["calibration"]["tokens"]
    assert meta["recipe"]["token_weights"]["modality"]["image"] == 0.0
    assert "GPTQ token weights" in (out / "README.md").read_text()


def test_the_imatrix_observer_calibrates_and_is_named_in_the_checkpoint(zoo_model, image, tmp_path):
    """imatrix_mse reaches the library's weight observer on a real run: its scales differ from the
    default observer's on the same samples, and quantkit.json, config.json and the card name it
    (the shipped w4a16 picks imatrix_mse, so plain GPTQ names the default)."""
    plain, _, _ = _quantized(tmp_path, zoo_model, image, "plain", None, weight_observer="memoryless_minmax")
    weighted, meta, out = _quantized(
        tmp_path, zoo_model, image, "imatrix", None, weight_observer="imatrix_mse"
    )
    scales = [k for k in plain if k.endswith("weight_scale")]
    assert scales and any(not torch.equal(plain[k], weighted[k]) for k in scales)
    assert meta["recipe"]["weight_observer"] == "imatrix_mse"
    assert meta["resolved_scheme"]["weights"]["observer"] == "imatrix_mse"
    assert "imatrix_mse" in (out / "config.json").read_text()
    assert "weight observer imatrix_mse" in (out / "README.md").read_text()
