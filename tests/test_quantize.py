"""`quantize`: every zoo model x every recipe end to end, and every proof it must make before writing.

Real libraries throughout (llmcompressor, compressed-tensors, transformers), tiny zoo models built
in temporary folders, real media files. The every-model-x-every-recipe matrix is marked slow.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from quantkit.errors import CheckFailed, InputError
from quantkit.features.processor import FeatureRow, calibration_loader, collate_one
from quantkit.media import write_mp4
from quantkit.models import adapter_for
from quantkit.models.adapters import matches
from quantkit.models.inputs import Sample, processor_inputs
from quantkit.models.targets import (
    check_quantized_modules,
    compact_patterns,
    language_model_root,
    resolve_targets,
)
from quantkit.quantize import (
    CalibrationProbe,
    calibrate,
    check_scales,
    plan,
    quantize,
    resolve,
    unfuse_experts,
)
from quantkit.recipes import SCHEME_FORMATS, Recipe, get_recipe, resolve_recipe
from quantkit.synthetic.media import write_wav
from quantkit.zoo.models import ZOO

# llmcompressor converts the model to accelerate offloading to save it; harmless on CPU.
pytestmark = pytest.mark.filterwarnings("ignore:Attempting to save a model with offloaded modules")

RECIPES = ["w8a8-sq-gptq", "fp8", "fp8-dynamic", "w4a16"]
KNOWN_REFUSED = {("tiny-qwen3-omni-moe", "w8a8-sq-gptq")}
MATRIX = [(m, r) for m in ZOO for r in RECIPES if (m, r) not in KNOWN_REFUSED]
# Each recipe's error bound, from its scheme: the relative MSE of the checkpoint's logits against
# the original's (bf16, same inputs) may be at most FACTOR x that of round-to-nearest of the same
# scheme, simulated in the test on the same model (rtn_simulation below; independent of
# llmcompressor's quantization and of quantkit's export):
#   (RTN scheme, factor, why)
ERROR_BOUNDS = {
    # GPTQ (and SmoothQuant) exist to beat round-to-nearest on the same grid.
    "w4a16": ("W4A16", 1.0, "GPTQ must beat round-to-nearest of its own grid"),
    "w8a8-sq-gptq": ("W8A8", 1.0, "SmoothQuant + GPTQ must beat round-to-nearest W8A8"),
    # The recipe is round-to-nearest itself: the checkpoint, reloaded, reproduces it up to the
    # 16-bit rounding of its scales.
    "fp8-dynamic": ("FP8_DYNAMIC", 1.5, "the checkpoint is this RTN, up to 16-bit scales"),
    # Round-to-nearest too, on its own grid: one scale per weight tensor, one per input from the
    # absmax over the calibration set. Beyond the 16-bit scales, the checkpoint's input scales were
    # observed in float32 on inputs through the already quantized earlier layers (the sequential
    # pipeline's error propagation), the simulation's on the bf16 original: the same maxima to a
    # few percent, so the same 1.5.
    "fp8": ("FP8", 1.5, "the checkpoint is this RTN, up to 16-bit scales and observation dtype"),
}
# Recipes whose checkpoint is the simulation itself, not merely bounded by it: also at least
# 1/FACTOR of it. A wrong simulation mostly errs upwards (fp8's input scales too small clip), which
# an upper bound alone lets pass. fp8-dynamic is its own round-to-nearest too (data-free, per-token
# input scales taken at run time, so only the 16-bit weight scales differ): ratios 0.86-1.08 over
# the zoo, well inside the factor.
TWO_SIDED = {"fp8", "fp8-dynamic"}
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)
QUANT_SUFFIXES = (
    "weight_scale",
    "weight_zero_point",
    "weight_packed",
    "weight_shape",
    "weight_g_idx",
    "input_scale",
    "input_zero_point",
    "k_scale",
    "v_scale",
    "weight_global_scale",
)
WALL_TIMES: dict[tuple[str, str], float] = {}


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def media(tmp_path_factory) -> dict[str, Path]:
    """Small real media: two images, a silent clip, a clip with a sound track, a WAV."""
    root = tmp_path_factory.mktemp("media")
    ramp = np.linspace(0, 255, 96, dtype=np.uint8)
    Image.fromarray(np.stack([np.tile(ramp, (64, 1))] * 3, axis=-1)).save(root / "ramp.png")
    checker = (np.indices((64, 64)).sum(axis=0) // 8 % 2 * 255).astype(np.uint8)
    Image.fromarray(np.stack([checker, 255 - checker, checker], axis=-1)).save(root / "checker.png")

    def frames(count: int):
        for i in range(count):
            frame = np.full((48, 64, 3), 30, np.uint8)
            frame[12:36, 4 + 6 * i : 20 + 6 * i] = (220, 40, 40)
            yield frame

    seconds = 2
    tone = (0.3 * np.sin(2 * np.pi * 330 * np.arange(16000 * seconds) / 16000)).astype(np.float32)
    write_mp4(root / "clip.mp4", frames(8), (64, 48), 4)
    write_mp4(root / "clip_sound.mp4", frames(8), (64, 48), 4, audio=tone)
    chirp = 0.3 * np.sin(2 * np.pi * np.cumsum(np.linspace(200, 800, 24000)) / 16000)
    write_wav(root / "speech.wav", chirp)
    return {p.stem: p for p in root.iterdir()}


def turn(prompt: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def calibration_samples(name: str, media: dict[str, Path]) -> tuple[list[Sample], list[str]]:
    """A mixed set restricted to what the model takes; labels are the modality (the strata)."""
    kinds = set(ZOO[name].modalities)
    candidates = [
        ("image", Sample(turn("<image>Describe the picture.", "A grey ramp."), images=[media["ramp"]])),
        ("image", Sample(turn("<image>What pattern is this?", "A checkerboard."), images=[media["checker"]])),
        (
            "video",
            Sample(turn("<video>What moves, and where?", "A red box slides right."), videos=[media["clip"]]),
        ),
        (
            "text",
            Sample(
                turn("Name three colours and one fruit for each.", "Red apple, yellow banana, green pear.")
            ),
        ),
        (
            "text",
            Sample(
                turn(
                    "Explain in two sentences why the sky looks blue during the day.",
                    "Air scatters short blue wavelengths more than red ones. So blue light reaches us from every direction.",
                )
            ),
        ),
        ("audio", Sample(turn("<audio>What do you hear?", "A rising tone."), audios=[media["speech"]])),
        (
            "video+audio",
            Sample(
                turn("<video>What is shown and heard?", "A box and a tone."), videos=[media["clip_sound"]]
            ),
        ),
    ]
    chosen = [
        (label, s)
        for label, s in candidates
        if {k for k in ("image", "video", "audio") if k in label} <= kinds
    ]
    return [s for _, s in chosen], [label for label, _ in chosen]


def evaluation_samples(name: str, media: dict[str, Path]) -> dict[str, Sample]:
    kinds = set(ZOO[name].modalities)
    samples = {"text": Sample(turn("Write one line about the sea.", "Waves fold over the sand."))}
    if "image" in kinds:
        samples["image"] = Sample(
            turn("<image>Which side is brighter?", "The right side."), images=[media["ramp"]]
        )
    if "video" in kinds:
        samples["video"] = Sample(turn("<video>How many boxes?", "One."), videos=[media["clip"]])
    if "audio" in kinds:
        samples["audio"] = Sample(turn("<audio>Is the pitch rising?", "Yes."), audios=[media["speech"]])
        samples["video+audio"] = Sample(
            turn("<video>Describe it.", "A box, a tone."), videos=[media["clip_sound"]]
        )
    return samples


@pytest.fixture(scope="session")
def features_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("features-cache")


@pytest.fixture(scope="session")
def quantized(zoo_model, media, features_cache, tmp_path_factory):
    """Factory: ``quantized(model, recipe)`` runs quantize once per pair and returns the result."""
    root = tmp_path_factory.mktemp("quantized")
    done: dict[tuple[str, str], object] = {}

    def get(name: str, recipe: str):
        if (name, recipe) not in done:
            samples, labels = calibration_samples(name, media)
            started = time.perf_counter()
            done[(name, recipe)] = quantize(
                zoo_model(name),
                root / f"{name}-{recipe}",
                get_recipe(recipe),
                samples,
                sample_labels=labels,
                calib_info={
                    "hash": "test-set",
                    "strata": {label: labels.count(label) for label in set(labels)},
                },
                cache_dir=features_cache,
                progress=False,
            )
            WALL_TIMES[(name, recipe)] = round(time.perf_counter() - started, 2)
        return done[(name, recipe)]

    yield get
    if WALL_TIMES:
        print("\nquantize wall times (s):")
        for (name, recipe), seconds in sorted(WALL_TIMES.items()):
            print(f"  {name:22s} {recipe:14s} {seconds:7.2f}")


@pytest.fixture(scope="session")
def reference(zoo_model, media):
    """Factory: the original model's bf16 logits on the evaluation inputs, once per model."""
    cache: dict[str, dict] = {}

    def get(name: str) -> dict[str, tuple[dict, torch.Tensor]]:
        if name not in cache:
            model_dir = zoo_model(name)
            adapter = adapter_for(model_dir)
            processor = adapter.load_processor(model_dir)
            model = adapter.load_model(model_dir, dtype=torch.bfloat16)
            cache[name] = {}
            for kind, sample in evaluation_samples(name, media).items():
                inputs = processor_inputs(processor, sample)
                with torch.no_grad():
                    cache[name][kind] = (inputs, model(**inputs).logits.float())
        return cache[name]

    return get


def _fp8(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    scale = amax.clamp(min=1e-12) / FP8_MAX
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale


def _int(x: torch.Tensor, bits: int, amax: torch.Tensor) -> torch.Tensor:
    """Symmetric int grid: scale = absmax / (2^(bits-1) - 0.5), levels -2^(bits-1) .. 2^(bits-1)-1."""
    top = 2 ** (bits - 1)
    scale = amax.clamp(min=1e-12) / (top - 0.5)
    return (x / scale).round().clamp(-top, top - 1) * scale


def _int_asym(x: torch.Tensor, bits: int, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    levels = 2**bits - 1
    low, high = low.clamp(max=0), high.clamp(min=0)
    scale = ((high - low) / levels).clamp(min=1e-12)
    zero = (-low / scale).round().clamp(0, levels)
    return ((x / scale).round() + zero).clamp(0, levels).sub(zero) * scale


def rtn_weight(weight: torch.Tensor, scheme: str, group: int | None, symmetric: bool) -> torch.Tensor:
    w = weight.float()
    if scheme == "FP8_DYNAMIC":  # per output channel
        return _fp8(w, w.abs().amax(dim=1, keepdim=True))
    if scheme == "FP8":  # per tensor
        return _fp8(w, w.abs().amax())
    if scheme in ("W8A8", "W8A16"):
        return _int(w, 8, w.abs().amax(dim=1, keepdim=True))
    g = w.reshape(w.shape[0], -1, group)  # W4A16: groups along the input features
    if symmetric:
        return _int(g, 4, g.abs().amax(dim=-1, keepdim=True)).reshape(w.shape)
    return _int_asym(g, 4, g.amin(dim=-1, keepdim=True), g.amax(dim=-1, keepdim=True)).reshape(w.shape)


def rtn_activation(x: torch.Tensor, scheme: str, static_amax: torch.Tensor | None = None) -> torch.Tensor:
    """Dynamic per-token activations (FP8_DYNAMIC, W8A8), static per-tensor ones (FP8: the
    calibration's ``static_amax``); W4A16 / W8A16 leave them alone."""
    if scheme not in ("FP8_DYNAMIC", "W8A8", "FP8"):
        return x
    v = x.float()
    if scheme == "FP8":
        assert static_amax is not None, "static FP8 needs the calibration's input absmax"
        return _fp8(v, static_amax).to(x.dtype)
    amax = v.abs().amax(dim=-1, keepdim=True)
    return (_fp8(v, amax) if scheme == "FP8_DYNAMIC" else _int(v, 8, amax)).to(x.dtype)


def observed_input_absmax(
    model: torch.nn.Module, names: list[str], calibration: list[dict]
) -> dict[str, torch.Tensor]:
    """Each module's input absmax over every calibration input, as the FP8 preset's observer
    (llmcompressor's static_minmax: the running min and max over all batches, symmetric) keeps
    it. Every MoE expert sees every token, as under oneshot's ``moe_calibrate_all_experts`` (its
    default): an expert's scale covers tokens the router sends elsewhere."""
    from llmcompressor.modeling.moe.context import moe_calibration_context

    absmax: dict[str, torch.Tensor] = {}

    def observe(name: str):
        def hook(_module, args):
            if args[0].numel():
                value = args[0].detach().abs().amax().float()
                absmax[name] = torch.maximum(absmax[name], value) if name in absmax else value

        return hook

    handles = [model.get_submodule(name).register_forward_pre_hook(observe(name)) for name in names]
    try:
        with torch.no_grad(), moe_calibration_context():
            for inputs in calibration:
                model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    assert set(absmax) == set(names), f"never called: {sorted(set(names) - set(absmax))[:5]}"
    return absmax


def rtn_simulation(model_dir: Path, result, scheme: str, samples: list[Sample] = ()) -> torch.nn.Module:
    """The original model with every layer quantkit quantized rounded to nearest on ``scheme``'s
    grid, in memory: absmax (or min/max with a zero point) scales, weights per output channel or
    per group of the checkpoint's group size, activations per token. W4A16: the checkpoint's own
    split (8-bit layers at W8A16, MoE experts without zero points). FP8 (static): weights and
    inputs per tensor, input scales observed on the original model run on ``samples`` (the
    calibration samples the checkpoint was quantized with)."""
    from quantkit.precision.mixed import four_bit_symmetric

    adapter = adapter_for(model_dir)
    model = adapter.load_model(model_dir, dtype=torch.bfloat16)
    unfuse_experts(model)
    input_absmax: dict[str, torch.Tensor] = {}
    if scheme == "FP8":  # before any weight is rounded: the original's inputs
        processor = adapter.load_processor(model_dir)
        calibration = [processor_inputs(processor, sample) for sample in samples]
        input_absmax = observed_input_absmax(model, result.quantized_modules, calibration)
    weights = result.metadata["resolved_scheme"].get("weights") or {}
    high = result.precision.high if result.precision else {}
    for name in result.quantized_modules:
        module = model.get_submodule(name)
        layer_scheme = "W8A16" if scheme == "W4A16" and name in high else scheme
        symmetric = four_bit_symmetric(name, bool(weights.get("symmetric", True)))
        with torch.no_grad():
            module.weight.copy_(rtn_weight(module.weight, layer_scheme, weights.get("group_size"), symmetric))
        if layer_scheme in ("FP8_DYNAMIC", "W8A8", "FP8"):
            module.register_forward_pre_hook(
                lambda _m, args, s=layer_scheme, a=input_absmax.get(name): (
                    rtn_activation(args[0], s, a),
                    *args[1:],
                )
            )
    return model


def test_static_fp8_simulation_is_the_presets_observer_and_grid():
    """The FP8 simulation's input absmax (several batches), per-tensor weight and activation
    rounding against the FP8 preset's own observers and compressed-tensors' fake quantization."""
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from llmcompressor.observers import Observer

    scheme = preset_name_to_scheme("FP8", ["Linear"])
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(16, 8))
    batches = [torch.randn(1, 5, 16, generator=generator) * spread for spread in (1.0, 3.0, 0.5)]
    inputs = Observer.load_from_registry(
        scheme.input_activations.observer, base_name="input", args=scheme.input_activations
    )
    for batch in batches:
        inputs(batch)
    input_q = inputs.get_qparams()
    weights = Observer.load_from_registry("memoryless_minmax", base_name="weight", args=scheme.weights)
    weight = layer[0].weight.detach()
    weight_q = weights(weight).get_qparams()

    absmax = observed_input_absmax(layer, ["0"], [{"input": batch} for batch in batches])["0"]
    assert absmax == max(batch.abs().max() for batch in batches)  # the largest batch sets it
    expected = fake_quantize(weight, weight_q["scale"], weight_q["zero_point"], scheme.weights)
    assert torch.equal(rtn_weight(weight, "FP8", None, True), expected)
    for batch in batches:
        expected = fake_quantize(batch, input_q["scale"], input_q["zero_point"], scheme.input_activations)
        assert torch.equal(rtn_activation(batch, "FP8", absmax), expected)
    with pytest.raises(AssertionError):  # a static scheme without its calibration
        rtn_activation(batches[0], "FP8")


def relative_mse(logits: torch.Tensor, reference_logits: torch.Tensor) -> float:
    return float((logits - reference_logits).pow(2).mean() / reference_logits.pow(2).mean())


def reloaded_errors(adapter, output: Path, references: dict) -> dict[str, float]:
    """The checkpoint reloaded by transformers (compressed-tensors decompresses it), run on every
    modality in ``references`` (kind -> (inputs, bf16 logits)): relative logit MSE per kind."""
    model = adapter.load_model(output, dtype=torch.bfloat16)
    errors = {}
    for kind, (inputs, ref_logits) in references.items():
        with torch.no_grad():
            logits = model(**inputs).logits.float()
        assert logits.shape == ref_logits.shape and torch.isfinite(logits).all(), kind
        errors[kind] = relative_mse(logits, ref_logits)
    return errors


def saved_tensor_dtypes(output: Path) -> dict[str, str]:
    dtypes = {}
    for path in sorted(output.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                dtypes[key] = str(handle.get_slice(key).get_dtype())
    return dtypes


def same_names(names) -> set[str]:
    return set(names)


def legacy_vl_names(names) -> set[str]:
    """Qwen2.5-VL checkpoints keep the pre-transformers-5 layout: model.layers.*, visual.*."""
    renamed = set()
    for name in names:
        for new, old in (("model.language_model.", "model."), ("model.visual.", "visual.")):
            if name.startswith(new):
                name = old + name[len(new) :]
        renamed.add(name)
    return renamed


def no_partial_output(output: Path) -> bool:
    return not output.exists() and not list(output.parent.glob(f".{output.name}.partial-*"))


# ------------------------------------------------------------------------------------ the matrix


@pytest.mark.slow
@pytest.mark.parametrize("name, recipe_name", MATRIX, ids=[f"{m}-{r}" for m, r in MATRIX])
def test_every_zoo_model_with_every_recipe(quantized, reference, zoo_model, media, name, recipe_name):
    result = quantized(name, recipe_name)
    recipe = get_recipe(recipe_name)
    output = result.output
    adapter = adapter_for(zoo_model(name))

    # 1. The format the recipe implies.
    config = json.loads((output / "config.json").read_text())
    qconfig = config["quantization_config"]
    assert qconfig["format"] == SCHEME_FORMATS[recipe.scheme] == result.checkpoint_format
    assert config.get("dtype", config.get("text_config", {}).get("dtype")) == "bfloat16"

    # 2. Nothing outside the language model is quantized; everything else stays bf16. Module
    #    names and on-disk names can differ: transformers 5 saves Qwen2.5-VL in its legacy layout.
    dtypes = saved_tensor_dtypes(output)
    on_disk = {key.rsplit(".", 1)[0] for key in dtypes if key.rsplit(".", 1)[1] in QUANT_SUFFIXES}
    lm = adapter.language_model + "."
    assert result.quantized_modules and all(m.startswith(lm) for m in result.quantized_modules)
    if adapter.serving is not None:  # Omni: written as the whole model vLLM serves, thinker under "thinker."
        assert config["architectures"] == [adapter.serving.architecture]
        assert config[f"{adapter.serving.attribute}_config"]["architectures"] == [ZOO[name].architecture]

        def as_saved(names):
            return {adapter.serving.prefix + n for n in names}
    else:
        as_saved = same_names if on_disk == set(result.quantized_modules) else legacy_vl_names
    assert on_disk == as_saved(result.quantized_modules)
    if recipe.scheme == "W4A16":  # zero points on every 4-bit layer except MoE experts (kept symmetric)
        with_zero_points = {key.rsplit(".", 1)[0] for key in dtypes if key.endswith(".weight_zero_point")}
        assert not recipe.symmetric and with_zero_points
        assert with_zero_points == {m for m in on_disk if ".experts." not in m}
    for key, dtype in dtypes.items():
        if key.rsplit(".", 1)[0] not in on_disk and dtype != "I64":
            assert dtype == "BF16", (key, dtype)
    # vLLM reads the ignore list: every kept Linear (towers, head), by its on-disk name; plus
    # the MoE routers, which llmcompressor lists though they are not nn.Linear in transformers 5.
    ignored = {entry for entry in qconfig["ignore"] if not entry.startswith("re:")}
    assert as_saved(result.kept_modules) <= ignored
    prefix = adapter.serving.prefix if adapter.serving else ""
    assert all(adapter.keep_reason(n.removeprefix(prefix)) for n in ignored - as_saved(result.kept_modules))
    # Patterns quantkit adds so transformers matches kept modules by their in-memory names.
    patterns = [entry for entry in qconfig["ignore"] if entry.startswith("re:")]
    assert all(not any(matches(q, p) for p in patterns) for q in result.quantized_modules)

    # 3. Calibration provably reached every decoder layer and the towers (data recipes).
    calls = result.calibration_calls
    if recipe.needs_data:
        assert result.samples_used == len(calibration_samples(name, media)[0])
        layers = {k: v for k, v in calls.items() if k.startswith(lm)}
        assert len(layers) == 4 and min(layers.values()) >= result.samples_used
        # The towers ran for these samples: here, or in the run that filled the feature cache with
        # the decoder inputs they produced (the cache is keyed by the towers' weights).
        from_cache = (result.decoder_inputs or {}).get("cache_hits") == result.samples_used
        for tower in (adapter.vision_tower, adapter.audio_tower):
            if tower:
                assert calls[tower] > 0 or from_cache, tower
    else:
        assert result.samples_used == 0 and result.pipeline == "datafree"

    # 4. Sidecar files, quantkit.json and the model card.
    for file in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        "README.md",
    ):
        assert (output / file).is_file(), file
    if ZOO[name].modalities:
        assert (output / "processor_config.json").is_file()
    metadata = json.loads((output / "quantkit.json").read_text())
    assert metadata["recipe"]["name"] == recipe_name
    assert metadata["libraries"]["llmcompressor"] and metadata["libraries"]["compressed-tensors"]
    assert metadata["calibration"]["set"]["hash"] == "test-set"
    assert metadata["run"]["wall_time_s"] > 0 and metadata["run"]["peak_rss_mb"] > 0
    assert metadata["modules"]["quantized"] == result.quantized_modules
    assert recipe_name in (output / "README.md").read_text()

    # 5. Reloads with transformers; a forward pass on every modality the model takes.
    errors = reloaded_errors(adapter, output, reference(name))
    # 6. The error bound the scheme implies: against round-to-nearest of the scheme, simulated.
    rtn_scheme, factor, why = ERROR_BOUNDS[recipe_name]
    simulated = rtn_simulation(zoo_model(name), result, rtn_scheme, calibration_samples(name, media)[0])
    rtn_errors = {}
    for kind, (inputs, ref_logits) in reference(name).items():
        with torch.no_grad():
            rtn_errors[kind] = relative_mse(simulated(**inputs).logits.float(), ref_logits)
    ours, rtn = sum(errors.values()) / len(errors), sum(rtn_errors.values()) / len(rtn_errors)
    print(
        f"\n{name} {recipe_name}: relative logit MSE {ours:.5f}, round-to-nearest {rtn_scheme} {rtn:.5f} "
        f"(ratio {ours / rtn:.2f}, bound {factor}); per input { ({k: round(v, 5) for k, v in errors.items()}) }"
    )
    assert ours <= factor * rtn, f"{why}: {ours:.5f} vs {factor} x {rtn:.5f}; {errors} / {rtn_errors}"
    if recipe_name in TWO_SIDED:
        assert ours >= rtn / factor, f"{why}: {ours:.5f} vs {rtn:.5f} / {factor}; {errors} / {rtn_errors}"


@pytest.mark.slow
def test_gptq_beats_round_to_nearest_by_3x(quantized, reference, zoo_model, media, tmp_path):
    """GPTQ W4A16 vs. QuantizationModifier with the same scheme, same model and samples."""
    name = "tiny-qwen3-vl"
    gptq = quantized(name, "w4a16")
    rtn_recipe = Recipe(name="w4a16-rtn", hardware="test", scheme="W4A16", method="rtn")
    samples, labels = calibration_samples(name, media)
    rtn = quantize(
        zoo_model(name), tmp_path / "rtn", rtn_recipe, samples, sample_labels=labels, progress=False
    )
    errors = {}
    for label, result in (("gptq", gptq), ("rtn", rtn)):
        model = adapter_for(result.output).load_model(result.output, dtype=torch.bfloat16)
        per_input = []
        for inputs, ref_logits in reference(name).values():
            with torch.no_grad():
                per_input.append(relative_mse(model(**inputs).logits.float(), ref_logits))
        errors[label] = sum(per_input) / len(per_input)
    ratio = errors["rtn"] / errors["gptq"]
    print(
        f"\nW4A16 relative logit MSE: GPTQ {errors['gptq']:.5f}, RTN {errors['rtn']:.5f}, ratio {ratio:.1f}x"
    )
    assert ratio >= 3.0, errors


@pytest.mark.slow
def test_kv_cache_fp8_quantizes_only_language_model_attention(zoo_model, media, tmp_path):
    name = "tiny-qwen2.5-omni"
    samples, labels = calibration_samples(name, media)
    recipe = resolve_recipe("fp8-dynamic", kv_cache_fp8=True)
    result = quantize(
        zoo_model(name), tmp_path / "kv", recipe, samples[:4], sample_labels=labels[:4], progress=False
    )
    config = json.loads((result.output / "config.json").read_text())
    assert config["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8
    kv_keys = [k for k in saved_tensor_dtypes(result.output) if k.endswith(("k_scale", "v_scale"))]
    assert len(kv_keys) == 2 * 4 and all(
        k.startswith("thinker.model.layers.") for k in kv_keys
    )  # serving layout
    assert result.metadata["modules"]["kv_cache"] == [f"model.layers.{i}.self_attn" for i in range(4)]


@pytest.mark.slow
def test_a_whole_omni_model_is_written_back_in_its_own_layout(zoo_model, media, tmp_path):
    """An upstream Qwen2.5-Omni checkpoint is the whole model (thinker under "thinker."): its
    quantized checkpoint has each name once under "thinker.", never "thinker.thinker." (transformers
    saves a model loaded with a key mapping under the mapped-back names), and passes the audit."""
    from quantkit.export.serving import write_serving_layout
    from quantkit.verify.audit import audit_checkpoint

    name = "tiny-qwen2.5-omni"
    whole = tmp_path / "whole"
    shutil.copytree(zoo_model(name), whole)
    write_serving_layout(whole, adapter_for(whole).serving)
    assert adapter_for(whole).is_wrapped(whole)
    samples, labels = calibration_samples(name, media)
    result = quantize(
        whole,
        tmp_path / "q",
        get_recipe("fp8-dynamic"),
        samples[:4],
        sample_labels=labels[:4],
        progress=False,
    )
    keys = list(saved_tensor_dtypes(result.output))
    assert all(k.startswith("thinker.") and not k.startswith("thinker.thinker.") for k in keys), keys[:3]
    qconfig = json.loads((result.output / "config.json").read_text())["quantization_config"]
    assert not [entry for entry in qconfig["ignore"] if "thinker.thinker" in entry]
    audit = audit_checkpoint(result.output)
    assert audit.passed, [c for c in audit.checks if not c.passed]


@pytest.mark.slow
def test_second_recipe_reuses_processed_features(zoo_model, media, tmp_path):
    name = "tiny-qwen3-vl"
    samples, labels = calibration_samples(name, media)
    cache = tmp_path / "cache"
    first = quantize(
        zoo_model(name),
        tmp_path / "a",
        get_recipe("fp8"),
        samples,
        sample_labels=labels,
        cache_dir=cache,
        progress=True,
    )
    second = quantize(
        zoo_model(name),
        tmp_path / "b",
        get_recipe("fp8"),
        samples,
        sample_labels=labels,
        cache_dir=cache,
        progress=False,
    )
    assert (first.preprocessed, first.cache_hits) == (len(samples), 0)
    assert (second.preprocessed, second.cache_hits) == (0, len(samples))
    assert (
        first.samples_by_label
        == second.samples_by_label
        == {label: labels.count(label) for label in set(labels)}
    )


# ------------------------------------------------------------------------------------ refusals


def test_omni_moe_w8a8_is_refused_before_any_work(zoo_model, media, tmp_path):
    name = "tiny-qwen3-omni-moe"
    samples, _ = calibration_samples(name, media)
    output = tmp_path / "out"
    with pytest.raises(InputError) as err:
        quantize(zoo_model(name), output, get_recipe("w8a8-sq-gptq"), samples, progress=False)
    assert "cannot reload" in err.value.message and "Qwen3-Omni-MoE" in err.value.message
    assert "w4a16" in err.value.hint
    assert no_partial_output(output)
    assert plan(zoo_model(name), get_recipe("w8a8-sq-gptq"), samples).known_failure


def test_taken_output_needs_force(zoo_model, tmp_path):
    output = tmp_path / "taken"
    output.mkdir()
    with pytest.raises(InputError, match="already exists"):
        quantize(zoo_model("tiny-qwen3"), output, get_recipe("fp8-dynamic"), [], progress=False)


def test_data_recipe_without_samples_is_refused(zoo_model, tmp_path):
    with pytest.raises(InputError, match="needs calibration samples"):
        quantize(zoo_model("tiny-qwen3"), tmp_path / "o", get_recipe("w4a16"), [], progress=False)


def test_label_count_must_match(zoo_model, media, tmp_path):
    samples, _ = calibration_samples("tiny-qwen3", media)
    with pytest.raises(InputError, match="labels"):
        quantize(
            zoo_model("tiny-qwen3"),
            tmp_path / "o",
            get_recipe("fp8"),
            samples,
            sample_labels=["x"],
            progress=False,
        )


# ------------------------------------------------------------------------------------ positive targets


def test_adapter_too_wide_leaves_vision_linears_quantized_and_is_caught(zoo_model, tmp_path):
    """language_model 'model' and no vision tower: the vision Linears become targets. The check
    locates the language model from the decoder layers and names them."""
    model_dir = zoo_model("tiny-qwen3-vl")
    data = adapter_for(model_dir).model_dump()
    data.update(language_model="model", vision_tower=None, keep=[{"pattern": "lm_head", "reason": "head"}])
    wrong = type(adapter_for(model_dir)).model_validate(data)
    output = tmp_path / "out"
    with pytest.raises(CheckFailed) as err:
        quantize(model_dir, output, get_recipe("fp8-dynamic"), [], adapter=wrong, progress=False)
    message = err.value.message
    assert "quantized module(s) outside the language model (model.language_model)" in message
    assert "model.visual.blocks.0.attn.qkv" in message
    assert no_partial_output(output)


def test_adapter_too_narrow_leaves_language_model_linears_unquantized_and_is_caught(zoo_model, tmp_path):
    model_dir = zoo_model("tiny-qwen3-vl")
    data = adapter_for(model_dir).model_dump()
    data.update(language_model="model.language_model.layers.0")
    wrong = type(adapter_for(model_dir)).model_validate(data)
    output = tmp_path / "out"
    with pytest.raises(CheckFailed) as err:
        quantize(model_dir, output, get_recipe("fp8-dynamic"), [], adapter=wrong, progress=False)
    message = err.value.message
    assert "21 language-model Linear layer(s) left unquantized" in message
    assert "model.language_model.layers.1.self_attn.q_proj" in message
    assert no_partial_output(output)


def test_check_catches_a_target_list_with_a_layer_dropped(zoo_model):
    """The stage functions, with one language-model Linear removed from the targets on purpose."""
    model_dir = zoo_model("tiny-qwen2.5-omni")
    adapter = adapter_for(model_dir)
    model = adapter.load_model(model_dir, dtype=torch.float32)
    targets = resolve_targets(model, adapter)
    dropped = "model.layers.2.mlp.down_proj"
    targets.quantize.remove(dropped)
    targets.ignore.append(dropped)
    resolved = resolve(
        get_recipe("fp8-dynamic"), model, adapter, targets, model_dir=model_dir, saved_dtype=torch.float32
    )
    calibrate(model, None, adapter, resolved, None, progress=False)
    with pytest.raises(CheckFailed) as err:
        check_quantized_modules(model, adapter)
    assert f"1 language-model Linear layer(s) left unquantized: {dropped}" in err.value.message


# ------------------------------------------------------------------------------------ scales


def test_check_scales_refuses_nonfinite_and_nonpositive_scales(zoo_model):
    model_dir = zoo_model("tiny-qwen3")
    adapter = adapter_for(model_dir)
    model = adapter.load_model(model_dir, dtype=torch.float32)
    unfuse_experts(model)
    targets = resolve_targets(model, adapter)
    resolved = resolve(
        get_recipe("fp8-dynamic"), model, adapter, targets, model_dir=model_dir, saved_dtype=torch.float32
    )
    calibrate(model, None, adapter, resolved, None, progress=False)
    assert check_scales(model) == 28  # one weight_scale per quantized Linear
    scale = model.get_submodule("model.layers.1.mlp.up_proj").weight_scale
    with torch.no_grad():
        scale[3] = math.nan
    with pytest.raises(CheckFailed) as err:
        check_scales(model)
    assert "model.layers.1.mlp.up_proj.weight_scale: 1 non-finite value(s)" in err.value.message
    with torch.no_grad():
        scale[3] = 0.0
    with pytest.raises(CheckFailed, match=r"up_proj.weight_scale: 1 value\(s\) <= 0"):
        check_scales(model)
    with torch.no_grad():
        scale[3] = 1.0
        model.get_submodule("model.layers.0.self_attn.q_proj").weight[0, 0] = math.inf
    with pytest.raises(CheckFailed, match=r"q_proj.weight: non-finite"):
        check_scales(model)


# ------------------------------------------------------------------------------------ dry run


def test_plan_counts_groups_from_the_config_alone(zoo_model, media, tmp_path):
    """Only config.json is copied: the plan must not need (or read) any weights."""
    name = "tiny-qwen3-omni-moe"
    bare = tmp_path / "config-only"
    bare.mkdir()
    shutil.copy(zoo_model(name) / "config.json", bare / "config.json")
    samples, labels = calibration_samples(name, media)
    result = plan(bare, get_recipe("w4a16"), samples, sample_labels=labels)
    assert result.counts == {
        "language_model": {"quantized": 64, "kept": 0},
        "vision": {"quantized": 0, "kept": 14},
        "audio": {"quantized": 0, "kept": 15},
        "head": {"quantized": 0, "kept": 1},
        "other": {"quantized": 0, "kept": 0},
    }
    assert (result.adapter, result.pipeline, result.checkpoint_format) == (
        "qwen3-omni-moe",
        "sequential",
        "pack-quantized",
    )
    assert result.samples == len(samples)
    assert result.samples_by_label == {label: labels.count(label) for label in set(labels)}
    assert result.samples_by_modality == {"audio": 1, "image": 2, "text": 2, "video": 2}
    assert result.known_failure is None
    free = plan(bare, get_recipe("fp8-dynamic"), samples, sample_labels=labels)
    assert (free.samples, free.pipeline, free.needs_data) == (0, "datafree", False)
    json.dumps(free.to_dict())  # serialisable for the CLI


def test_plan_for_a_vision_model(zoo_model, tmp_path):
    bare = tmp_path / "vl"
    bare.mkdir()
    shutil.copy(zoo_model("tiny-qwen3-vl") / "config.json", bare / "config.json")
    result = plan(bare, get_recipe("w8a8-sq-gptq"), [])
    assert result.counts["language_model"] == {"quantized": 28, "kept": 0}
    assert result.counts["vision"] == {"quantized": 0, "kept": 14}
    assert result.pipeline == "sequential"


# ------------------------------------------------------------------------------------ small parts


def test_compact_patterns_fall_back_to_names_when_a_layer_is_left_out():
    universe = [f"m.layers.{i}.{p}" for i in range(3) for p in ("q", "k")] + ["m.layers.0", "m"]
    everything = [n for n in universe if n.endswith((".q", ".k"))]
    assert compact_patterns(everything, universe) == [r"re:^m\.layers\.\d+\.(q|k)$"]
    partial = [n for n in everything if n != "m.layers.1.k"]
    patterns = compact_patterns(partial, universe)
    assert r"re:^m\.layers\.\d+\.(q|k)$" not in patterns and "m.layers.1.k" not in patterns
    assert set(partial) == {n for n in universe if any(n == p for p in patterns)}


@pytest.mark.parametrize(
    "layers, root",
    [
        (["model.language_model.layers.0", "model.language_model.layers.1"], "model.language_model"),
        (["model.layers.0"], "model"),
        (["layers.0", "layers.1"], ""),
    ],
)
def test_language_model_root(layers, root):
    assert language_model_root(layers) == root


def test_collate_keeps_or_drops_missing_keys_and_turns_true_flags_into_tensors():
    row = {"input_ids": torch.ones(1, 3, dtype=torch.long), "use_audio_in_video": True}
    keys = ["input_ids", "pixel_values", "use_audio_in_video"]
    kept = collate_one(keys, keep_none=True)([row])
    assert kept["pixel_values"] is None and kept["use_audio_in_video"].item() is True
    dropped = collate_one(keys, keep_none=False)([{**row, "use_audio_in_video": False}])
    assert set(dropped) == {"input_ids"}
    loader = calibration_loader(
        [FeatureRow("a", "x", row), FeatureRow("b", "y", {"input_ids": row["input_ids"]})], keep_none=False
    )
    assert [set(batch) for batch in loader] == [{"input_ids", "use_audio_in_video"}, {"input_ids"}]


def test_probe_counts_only_real_calls_and_reports_starved_layers(zoo_model):
    model_dir = zoo_model("tiny-qwen3")
    adapter = adapter_for(model_dir)
    model = adapter.load_model(model_dir, dtype=torch.float32)
    with CalibrationProbe(model, adapter) as probe, torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3]]))
    assert set(probe.layer_counts().values()) == {1}
    probe.verify(samples=1, vision_samples=0, audio_samples=0)
    with pytest.raises(CheckFailed, match="4 decoder layer"):
        probe.verify(samples=2, vision_samples=0, audio_samples=0)


def test_max_seq_len_truncates_text_and_drops_media_samples(zoo_model, media, tmp_path):
    from quantkit.features.processor import prepare_features, processor_fingerprint

    model_dir = zoo_model("tiny-qwen3-vl")
    processor = adapter_for(model_dir).load_processor(model_dir)
    samples, labels = calibration_samples("tiny-qwen3-vl", media)
    full = prepare_features(processor, samples, labels=labels, fingerprint="x")
    limit = 24
    assert all(row.tokens > limit for row in full.rows)
    cut = prepare_features(processor, samples, labels=labels, fingerprint="x", max_seq_len=limit)
    assert [row.label for row in cut.rows] == ["text", "text"]
    assert all(row.tokens == limit and row.inputs["attention_mask"].shape[-1] == limit for row in cut.rows)
    assert sorted(d["label"] for d in cut.dropped) == ["image", "image", "video"]
    assert all("exceed max_seq_len 24" in d["reason"] for d in cut.dropped)
    # The cache holds the untruncated inputs, keyed by content and processor files.
    cache = tmp_path / "cache"
    fingerprint = processor_fingerprint(model_dir)
    first = prepare_features(processor, samples, labels=labels, fingerprint=fingerprint, cache_dir=cache)
    again = prepare_features(
        processor, samples, labels=labels, fingerprint=fingerprint, cache_dir=cache, max_seq_len=limit
    )
    assert (first.processed, again.cache_hits, len(again.rows)) == (len(samples), len(samples), 2)
    for before, after in zip(
        first.rows,
        prepare_features(processor, samples, labels=labels, fingerprint=fingerprint, cache_dir=cache).rows,
        strict=True,
    ):
        assert before.sample_id == after.sample_id and after.from_cache
        assert torch.equal(before.inputs["input_ids"], after.inputs["input_ids"])


def test_sample_id_follows_media_bytes_not_paths(media, tmp_path):
    from quantkit.features.processor import sample_id

    copy = tmp_path / "elsewhere.png"
    shutil.copy(media["ramp"], copy)
    messages = turn("<image>Describe.", "A ramp.")
    assert sample_id(Sample(messages, images=[media["ramp"]])) == sample_id(Sample(messages, images=[copy]))
    Image.new("RGB", (8, 8), (1, 2, 3)).save(copy)
    assert sample_id(Sample(messages, images=[media["ramp"]])) != sample_id(Sample(messages, images=[copy]))
    with pytest.raises(InputError, match="cannot read media"):
        sample_id(Sample(messages, images=[tmp_path / "missing.png"]))


def test_undecodable_media_is_an_input_error_naming_the_sample(zoo_model, tmp_path):
    from quantkit.features.processor import prepare_features

    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video at all")
    model_dir = zoo_model("tiny-qwen3-vl")
    processor = adapter_for(model_dir).load_processor(model_dir)
    sample = Sample(turn("<video>What is it?", "Noise."), videos=[broken])
    with pytest.raises(InputError) as err:
        prepare_features(processor, [sample], labels=["video"], fingerprint="x")
    assert "calibration sample 0 (video)" in err.value.message and str(broken) in err.value.hint
