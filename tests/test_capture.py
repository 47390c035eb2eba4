"""Towers once, decoder many: the decoder's captured inputs replay the full model exactly, a second
recipe runs no tower, and the cache follows the towers' weights.

Real libraries and tiny zoo models throughout; no mocks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from quantkit.features.capture import capture_decoder_inputs, decoder_loader, uniform_kwargs
from quantkit.features.processor import prepare_features, processor_fingerprint
from quantkit.media import write_mp4
from quantkit.models import adapter_for
from quantkit.models.inputs import Sample
from quantkit.models.targets import decoder_layers, resolve_targets
from quantkit.quantize import quantize
from quantkit.recipes import get_recipe
from quantkit.synthetic.media import write_wav
from quantkit.verify.audit import load_tensors, read_tensor_index

pytestmark = pytest.mark.filterwarnings("ignore:Attempting to save a model with offloaded modules")


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("capture-media")
    ramp = np.linspace(0, 255, 96, dtype=np.uint8)
    Image.fromarray(np.stack([np.tile(ramp, (64, 1))] * 3, axis=-1)).save(root / "ramp.png")

    def frames(count: int):
        for i in range(count):
            frame = np.full((48, 64, 3), 30, np.uint8)
            frame[12:36, 4 + 6 * i : 20 + 6 * i] = (220, 40, 40)
            yield frame

    write_mp4(root / "clip.mp4", frames(8), (64, 48), 4)
    chirp = 0.3 * np.sin(2 * np.pi * np.cumsum(np.linspace(200, 800, 24000)) / 16000)
    write_mp4(root / "clip-sound.mp4", frames(8), (64, 48), 4, audio=chirp.astype(np.float32))
    write_wav(root / "speech.wav", chirp)
    return {p.stem: p for p in root.iterdir()}


def turn(prompt: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def samples_for(name: str, media: dict[str, Path]) -> tuple[list[Sample], list[str]]:
    chosen = [
        ("image", Sample(turn("<image>Describe the picture.", "A grey ramp."), images=[media["ramp"]])),
        ("text", Sample(turn("Name three colours.", "Red, yellow and green."))),
        ("video", Sample(turn("<video>What moves?", "A red box slides right."), videos=[media["clip"]])),
    ]
    if "omni" in name:
        chosen.append(
            ("audio", Sample(turn("<audio>What do you hear?", "A rising tone."), audios=[media["speech"]]))
        )
    return [s for _, s in chosen], [label for label, _ in chosen]


def _features(model_dir: Path, samples, labels):
    adapter = adapter_for(model_dir)
    processor = adapter.load_processor(model_dir)
    return (
        adapter,
        processor_fingerprint(model_dir),
        prepare_features(processor, samples, labels=labels, fingerprint="x"),
    )


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-qwen2.5-omni", "tiny-qwen3-omni-moe"])
def test_replaying_captured_inputs_through_the_decoder_gives_the_full_models_logits(zoo_model, media, name):
    """What calibration sees is what the model computes: the decoder alone on its captured
    inputs (text samples given the neutral values that Qwen3-VL's image samples carry) and the
    head give the full model's logits, in float32, to the last bit, both run as the library's
    calibration forwards run (eager attention)."""
    from llmcompressor.utils.helpers import use_eager_attention

    model_dir = zoo_model(name)
    samples, labels = samples_for(name, media)
    adapter, _, prepared = _features(model_dir, samples, labels)
    model = adapter.load_model(model_dir, dtype=torch.float32)
    captured = capture_decoder_inputs(
        model, adapter, prepared.rows, layer_names=list(decoder_layers(model, adapter))
    )
    assert captured.captured == len(samples) and captured.cache_hits == 0
    decoder = model.get_submodule(adapter.decoder_path)
    head = model.get_submodule(adapter.head[0])
    replays = uniform_kwargs(captured.rows)
    assert len({frozenset(kwargs) for kwargs in replays}) == 1  # one signature: one traced graph
    for row, kwargs in zip(prepared.rows, replays, strict=True):
        with torch.no_grad(), use_eager_attention(model), use_eager_attention(decoder):
            full = model(**{k: v for k, v in row.inputs.items() if not isinstance(v, bool) or v}).logits
            replayed = head(decoder(**kwargs).last_hidden_state)
        assert torch.equal(full, replayed), row.label


def _smoothquant_gptq_result(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What SmoothQuant + GPTQ left in the decoder: the smoothed norms (their weights divided by
    the scales that the per-channel activation ranges gave) and each Linear's int8 weights."""
    out = {}
    for name, module in model.named_modules():
        if ".layers." in name and name.endswith("layernorm"):
            out[name] = module.weight.detach().clone()
        elif isinstance(module, torch.nn.Linear) and hasattr(module, "weight_scale"):
            out[name] = torch.round(module.weight / module.weight_scale).to(torch.int8)
    return out


def test_captured_inputs_give_smoothquant_and_gptq_the_whole_models_statistics(zoo_model, media):
    """SmoothQuant's per-channel activation ranges and GPTQ's Hessians on the captured decoder
    inputs are those of whole-model forwards (the basic pipeline, Qwen2.5-Omni's before the
    capture), bit for bit, over image, text, video, audio and a video with its sound track
    (Qwen2.5-Omni's interleaved 3-D rope positions): no padded or masked position, no other
    position and no other batch enters them. Only with the library's error propagation off:
    with it on (quantkit's default) each layer's GPTQ calibrates on its quantized predecessors'
    outputs, which whole-model forwards never see, so from layer 1 on the int8 weights differ."""
    from quantkit.features.processor import calibration_loader
    from quantkit.quantize.calibration import _modifiers
    from quantkit.quantize.pipelines import run_oneshot
    from quantkit.quantize.resolved import resolve

    name = "tiny-qwen2.5-omni"
    samples, labels = samples_for(name, media)
    samples.append(
        Sample(
            turn("<video>What moves and sounds?", "A red box; a rising tone."), videos=[media["clip-sound"]]
        )
    )
    labels.append("video+audio")
    adapter, _, prepared = _features(zoo_model(name), samples, labels)
    assert "use_audio_in_video" in prepared.rows[-1].inputs
    processor = adapter.load_processor(zoo_model(name))
    recipe = get_recipe("w8a8-sq-gptq")

    def calibrated(pipeline: str, **options) -> dict[str, torch.Tensor]:
        model = adapter.load_model(zoo_model(name), dtype=torch.float32)
        resolved = resolve(
            recipe,
            model,
            adapter,
            resolve_targets(model, adapter),
            model_dir=zoo_model(name),
            saved_dtype=torch.float32,
        )
        modifiers = _modifiers(resolved, adapter)
        if pipeline == "sequential":
            layers = list(decoder_layers(model, adapter))
            rows = capture_decoder_inputs(model, adapter, prepared.rows, layer_names=layers).rows
            loader, decoder = decoder_loader(rows), adapter.decoder_path
        else:
            loader, decoder = calibration_loader(prepared.rows, keep_none=False), None
        run_oneshot(
            model,
            processor,
            modifiers,
            loader,
            pipeline=pipeline,
            decoder_layer=adapter.decoder_layer,
            decoder=decoder,
            **options,
        )
        return _smoothquant_gptq_result(model)

    whole = calibrated("basic")
    unpropagated = calibrated("sequential", propagate_error=False)
    assert whole.keys() == unpropagated.keys() and any(key.endswith("layernorm") for key in whole)
    differ = [key for key in whole if not torch.equal(whole[key], unpropagated[key])]
    assert not differ, f"{len(differ)} of {len(whole)} tensors differ, the first {differ[0]}"
    # quantkit's default (the library's): the option reaches oneshot, and propagation is the
    # whole of the difference: layer 0 (nothing quantized before it) is still the same, later
    # layers' int8 weights are not.
    propagated = calibrated("sequential")
    moved = [key for key in whole if not torch.equal(whole[key], propagated[key])]
    assert moved and not any(".layers.0." in key for key in moved), moved


def test_towers_run_once_per_sample_and_never_for_a_cached_second_recipe(zoo_model, media, tmp_path):
    name = "tiny-qwen2.5-omni"
    samples, labels = samples_for(name, media)
    first, second = (
        quantize(
            zoo_model(name),
            tmp_path / recipe,
            get_recipe(recipe),
            samples,
            sample_labels=labels,
            cache_dir=tmp_path / "cache",
            progress=False,
        )
        for recipe in ("fp8", "w4a16")
    )
    with_media = {kind: sum(kind in label for label in labels) for kind in ("image", "video", "audio")}
    one = json.loads((first.output / "quantkit.json").read_text())["calibration"]
    two = json.loads((second.output / "quantkit.json").read_text())["calibration"]
    # Qwen2.5-Omni runs its vision tower once per image or video, its audio tower once per clip.
    assert one["tower_calls"] == {
        "vision": with_media["image"] + with_media["video"],
        "audio": with_media["audio"],
    }
    assert (one["decoder_inputs"]["captured"], one["decoder_inputs"]["cache_hits"]) == (len(samples), 0)
    assert two["tower_calls"] == {"vision": 0, "audio": 0}
    assert (two["decoder_inputs"]["captured"], two["decoder_inputs"]["cache_hits"]) == (0, len(samples))
    assert one["decoder_inputs"]["towers_hash"] == two["decoder_inputs"]["towers_hash"]
    assert one["pipeline"] == two["pipeline"] == "sequential"
    # Every decoder layer still saw every sample.
    assert min(two["decoder_layer_calls"].values()) >= len(samples)


def test_the_cache_follows_the_towers_weights(zoo_model, media, tmp_path):
    name = "tiny-qwen3-vl"
    model_dir = zoo_model(name)
    samples, labels = samples_for(name, media)
    adapter, fingerprint, prepared = _features(model_dir, samples, labels)
    model = adapter.load_model(model_dir, dtype=torch.float32)
    layers = list(decoder_layers(model, adapter))

    def capture():
        return capture_decoder_inputs(
            model,
            adapter,
            prepared.rows,
            layer_names=layers,
            processor_fingerprint=fingerprint,
            cache_dir=tmp_path,
        )

    first, again = capture(), capture()
    assert (first.captured, again.cache_hits) == (len(samples), len(samples))
    for a, b in zip(first.rows, again.rows, strict=True):
        assert a.kwargs.keys() == b.kwargs.keys() and torch.equal(
            a.kwargs["inputs_embeds"], b.kwargs["inputs_embeds"]
        )
    # A decoder-layer weight is not an input of the decoder: still a hit.
    with torch.no_grad():
        model.get_submodule(layers[0]).mlp.up_proj.weight.mul_(0.5)
    assert capture().cache_hits == len(samples)
    # A tower weight is: every sample is captured again.
    with torch.no_grad():
        next(model.get_submodule(adapter.vision_tower).parameters()).add_(0.01)
    changed = capture()
    assert (changed.captured, changed.cache_hits) == (len(samples), 0)
    assert changed.towers_hash != first.towers_hash


def _packed_weights(folder: Path) -> dict[str, torch.Tensor]:
    index = read_tensor_index(folder)
    return load_tensors(folder, index, [name for name in index if name.endswith("weight_packed")])


# Not tiny-qwen2.5-omni: llmcompressor's tracer takes its whole thinker as 1 of 4 subgraphs
# ("wrapped code which calls sequential targets"), so the plain oneshot calibrates no layer and
# saves uninitialised scales (0, 4.6e-41, 1.3e37); quantkit's, from the decoder alone, are the
# weights' own group min-max. There is no plain whole-model reference to compare against.
@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-qwen2.5-vl"])
def test_quantize_gives_the_int4_weights_llmcompressor_gives_on_the_whole_model(
    zoo_model, media, tmp_path, name
):
    """quantkit calibrates the decoder alone on captured inputs; llmcompressor's own oneshot on the
    whole model (its ``independent`` pipeline, sequential at the decoder layer, every calibration
    forward under the library's eager attention) must give the same int4 weights, bit for bit.
    Capturing the towers under the model's own attention (sdpa) moved their outputs by the last
    float32 bit, enough for GPTQ to round some weights of layer 0 the other way, and sequential
    calibration carried that into every later layer."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from torch.utils.data import DataLoader

    from quantkit.models.inputs import processor_inputs

    model_dir = zoo_model(name)
    samples, labels = samples_for(name, media)  # text rows too: their inputs hold no media
    recipe = get_recipe("w4a16")
    ours = quantize(model_dir, tmp_path / "quantkit", recipe, samples, sample_labels=labels, progress=False)

    adapter = adapter_for(model_dir)
    processor = adapter.load_processor(model_dir)
    inputs = [processor_inputs(processor, sample) for sample in samples]
    keys = sorted(set().union(*inputs))
    loader = DataLoader(inputs, batch_size=1, collate_fn=lambda batch: {k: batch[0].get(k) for k in keys})
    model = adapter.load_model(model_dir, dtype=torch.float32)
    targets = resolve_targets(model, adapter)
    modifier = GPTQModifier(
        scheme=recipe.preset,
        targets=targets.targets,
        ignore=targets.ignore,
        actorder=recipe.actorder,
        dampening_frac=recipe.dampening_frac,
        weight_observer=recipe.weight_observer,  # the shipped w4a16's imatrix_mse
    )
    oneshot(
        model=model,
        processor=processor,
        dataset=loader,
        recipe=modifier,
        pipeline="independent",
        sequential_targets=[adapter.decoder_layer],
        num_calibration_samples=len(inputs),
        shuffle_calibration_samples=False,
    )
    model.save_pretrained(tmp_path / "plain", save_compressed=True)

    mine, theirs = _packed_weights(ours.output), _packed_weights(tmp_path / "plain")
    assert mine and mine.keys() == theirs.keys()
    differ = [key for key in sorted(mine) if not torch.equal(mine[key], theirs[key])]
    assert not differ, f"{len(differ)} of {len(mine)} packed weights differ, the first {differ[0]}"
