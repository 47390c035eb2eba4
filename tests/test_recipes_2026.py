"""The 2026 recipes (issue 21): block-wise FP8, NVFP4 (weight-only and W4A4), W4AFP8 and AWQ
W4A16, on every zoo model; and the Blackwell and Hopper targets that use them.

Real libraries (llmcompressor, compressed-tensors, transformers, vLLM where it has a kernel), the
tiny zoo models and real media; the fixtures and helpers are test_quantize's.
"""

from __future__ import annotations

import json

import pytest
import test_quantize
import torch
from test_mixed_precision import vllm_answer
from test_verify import served_or_skip

from quantkit.models import adapter_for, builtin_adapters
from quantkit.quantize.resolved import build_modifiers
from quantkit.recipes import SCHEME_FORMATS, get_recipe, list_recipes
from quantkit.recipes.schemes import SCHEMES
from quantkit.verify import audit_checkpoint
from quantkit.verify.vllm_check import shipped_schemes, vllm_python
from quantkit.zoo.models import ZOO

pytestmark = pytest.mark.filterwarnings("ignore:Attempting to save a model with offloaded modules")

# recipe -> (compressed-tensors preset, needs calibration data, checkpoint format)
NEW_RECIPES = {
    "fp8-block": ("FP8_BLOCK", False, "float-quantized"),
    "nvfp4-a16": ("NVFP4A16", False, "nvfp4-pack-quantized"),
    "w4a8-fp8": ("W4AFP8", True, "pack-quantized"),
    "nvfp4": ("NVFP4", True, "nvfp4-pack-quantized"),
    "w4a16-awq": ("W4A16", True, "pack-quantized"),
}
# Each recipe's error bound, as test_quantize.ERROR_BOUNDS: the relative logit MSE of the reloaded
# checkpoint may be at most FACTOR x that of round-to-nearest on the checkpoint's own grid (its
# config groups), simulated on the original model (checkpoint_rtn_simulation below):
#   (factor, two-sided, why)
ERROR_BOUNDS = {
    # Data-free round-to-nearest recipes: the checkpoint is this simulation, up to 16-bit scales
    # (and, for NVFP4, llmcompressor's global scale shared by fused q/k/v and gate/up layers).
    "fp8-block": (1.5, True, "the checkpoint is this RTN, up to 16-bit scales"),
    "nvfp4-a16": (1.5, True, "the checkpoint is this RTN, up to 16-bit scales and fused global scales"),
    # Weights round to nearest too; the inputs' global scales come from the calibration absmax,
    # observed here on the original model (the checkpoint's through already quantized layers).
    "nvfp4": (1.5, True, "the checkpoint is this RTN, up to scales and the observation's inputs"),
    # GPTQ and AWQ exist to beat round-to-nearest on the same grid.
    "w4a8-fp8": (1.0, False, "GPTQ must beat round-to-nearest of its own grid"),
    "w4a16-awq": (1.0, False, "AWQ must beat round-to-nearest of its own grid"),
}
# transformers 5.17 cannot reload block-scaled FP8 into fused MoE experts: its DecompressExperts
# stacks the per-expert weight_scale blocks against the fused weight's rows (size mismatch 256 vs 2).
FP8_BLOCK_EXPERTS = "transformers' DecompressExperts cannot re-fuse block-scaled FP8 experts"
# transformers 5.17 reloads NVFP4 experts without their per-tensor global scale: DecompressExperts
# hands compressed-tensors only weight_packed and weight_scale (the load report lists every
# expert's weight_global_scale as unexpected), so each expert comes back about 30,000x too large.
NVFP4_EXPERTS = (
    "transformers' DecompressExperts drops the NVFP4 experts' weight_global_scale (experts reload "
    "about 30,000x too large)"
)
# Strict: the day one reloads, it fails here and its known limit in docs/limits.md (and README) goes.
KNOWN_RELOAD_FAILURES = {
    ("tiny-qwen3-omni-moe", "fp8-block"): FP8_BLOCK_EXPERTS,
    ("tiny-qwen3-omni-moe", "nvfp4-a16"): NVFP4_EXPERTS,
    ("tiny-qwen3-omni-moe", "nvfp4"): NVFP4_EXPERTS,
}
MATRIX = [
    pytest.param(m, r, marks=pytest.mark.xfail(strict=True, reason=KNOWN_RELOAD_FAILURES[m, r]))
    if (m, r) in KNOWN_RELOAD_FAILURES
    else (m, r)
    for m in ZOO
    for r in NEW_RECIPES
]
MATRIX_IDS = [f"{m}-{r}" for m in ZOO for r in NEW_RECIPES]

QWEN3 = next(a for a in builtin_adapters() if a.name == "qwen3")

# test_quantize's fixtures: media, the feature cache, quantize once per (model, recipe), bf16 logits.
media = test_quantize.media
features_cache = test_quantize.features_cache
quantized = test_quantize.quantized
reference = test_quantize.reference


# ------------------------------------------------------------------------------ the recipe files


def test_new_recipes_are_listed_with_scheme_data_needs_and_format():
    infos = {info.name: info for info in list_recipes()}
    for name, (scheme, needs_data, fmt) in NEW_RECIPES.items():
        info = infos[name]
        assert (info.scheme, info.needs_data, info.checkpoint_format) == (scheme, needs_data, fmt)
        assert SCHEME_FORMATS[scheme] == fmt
        assert info.hardware and info.description


@pytest.mark.parametrize("name", list(NEW_RECIPES))
def test_new_recipes_are_the_library_presets(name, resolve_on):
    """quantkit.json reports the compressed-tensors preset itself, and llmcompressor gets its name."""
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = NEW_RECIPES[name][0]
    recipe = get_recipe(name)
    awq = [m.as_library_mapping() for m in QWEN3.awq_mappings]
    resolved = resolve_on(recipe)  # on tiny-qwen3: every width takes the presets' groups
    *_, modifier = build_modifiers(resolved, awq_mappings=awq)
    targets = resolved.targets.targets
    library = preset_name_to_scheme(recipe.preset, targets)  # W4A16 with zero points: W4A16_ASYM
    if SCHEMES[scheme].pin_format:  # the preset itself, with the format vLLM loads pinned on it
        (group,) = modifier.config_groups.values()
        assert group.format == SCHEMES[scheme].format == NEW_RECIPES[name][2]
        assert group.model_dump(exclude={"format"}) == library.model_dump(exclude={"format"})
    elif resolved.precision is not None:  # W4A16: the preset's weights, with the group size chosen
        (group,) = modifier.config_groups.values()
        chosen = library.weights.model_copy(update={"group_size": resolved.group_size})
        # (the library fills in its default observer on the modifier's copy)
        assert group.weights.model_dump(exclude={"observer"}) == chosen.model_dump(exclude={"observer"})
    else:
        assert modifier.scheme == recipe.preset
    preset = library.model_dump(mode="json", exclude_none=True)
    resolved = resolved.to_dict()
    assert resolved["preset"] == scheme and resolved["format"] == NEW_RECIPES[name][2]
    assert resolved["weights"] == preset["weights"]
    assert resolved.get("input_activations") == preset.get("input_activations")
    assert SCHEMES[scheme].card_serving


def test_fp8_block_has_128x128_weight_blocks_and_nvfp4_a16_leaves_activations_alone(resolve_on):
    block = resolve_on(get_recipe("fp8-block")).to_dict()
    assert block["weights"]["strategy"] == "block" and block["weights"]["block_structure"] == [128, 128]
    assert block["input_activations"]["dynamic"] is True and block["input_activations"]["group_size"] == 128
    fp4 = resolve_on(get_recipe("nvfp4-a16")).to_dict()
    assert (fp4["weights"]["num_bits"], fp4["weights"]["type"], fp4["weights"]["group_size"]) == (
        4,
        "float",
        16,
    )
    assert "input_activations" not in fp4


def test_awq_recipe_smooths_with_the_adapters_mappings_then_rounds_to_nearest(resolve_on):
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQMapping, AWQModifier

    recipe = get_recipe("w4a16-awq")
    assert (recipe.scheme, recipe.method, recipe.needs_data) == ("W4A16", "awq", True)
    mappings = [m.as_library_mapping() for m in QWEN3.awq_mappings]
    resolved = resolve_on(recipe)
    awq, quantizer = build_modifiers(resolved, awq_mappings=mappings)
    assert isinstance(awq, AWQModifier) and type(quantizer) is QuantizationModifier
    assert awq.mappings == mappings and all(isinstance(m, AWQMapping) for m in awq.mappings)
    assert resolved.preset == "W4A16_ASYM"  # llmcompressor's AWQ preset: zero points per group
    (group,) = quantizer.config_groups.values()
    assert group.weights.strategy == "group" and not group.weights.symmetric
    # The library's defaults, and quantkit.json says which.
    library = AWQModifier()
    assert resolved.to_dict()["awq"] == {"duo_scaling": library.duo_scaling, "n_grid": library.n_grid}
    assert "gptq" not in resolved.to_dict()
    with pytest.raises(ValueError, match="awq_mappings"):
        build_modifiers(resolved)


@pytest.mark.parametrize("name", list(ZOO))
def test_awq_mappings_resolve_per_decoder_layer_inside_the_language_model(zoo_model, name):
    """What AWQ does with them (compressed-tensors' match_modules_set, one smooth layer per set),
    on the real module tree with the experts unfused as quantize does: one set per decoder layer,
    except v_proj -> o_proj, and every layer reading a smoothed output balanced (the MoE router
    first)."""
    from compressed_tensors.utils import match_modules_set
    from test_adapters import meta_model
    from torch.utils._pytree import tree_leaves

    from quantkit.models.targets import check_awq_mappings

    model_dir = zoo_model(name)
    adapter = adapter_for(model_dir)
    model = meta_model(model_dir, adapter)
    check_awq_mappings(model, adapter)
    names = {module: n for n, module in model.named_modules()}
    for mapping in adapter.awq_mappings:
        groups = list(match_modules_set(model, (mapping.smooth, *mapping.balance)))
        assert len(groups) == 4 * (4 if "experts" in mapping.smooth else 1), mapping  # per layer (expert)
        for smooth, *balance in groups:
            assert len(smooth) == 1
            balanced = [names[m] for m in tree_leaves(balance)]
            if mapping.smooth.endswith("post_attention_layernorm$"):
                moe = any(".experts." in b for b in balanced)
                assert len(balanced) == (1 + 4 * 2 if moe else 2), balanced  # router + gate/up x 4
                assert not moe or balanced[0].endswith(".mlp.gate")


def test_an_awq_recipe_needs_an_adapter_with_awq_mappings(zoo_model):
    from test_adapters import meta_model

    from quantkit.errors import InputError
    from quantkit.models import Adapter
    from quantkit.models.targets import check_awq_mappings

    model_dir = zoo_model("tiny-qwen3")
    bare = Adapter.model_validate(adapter_for(model_dir).model_dump() | {"awq_mappings": []})
    with pytest.raises(InputError, match="no awq_mappings"):
        check_awq_mappings(meta_model(model_dir, bare), bare)


# ------------------------------------------------------------------------------ the matrix


def checkpoint_rtn_simulation(model_dir, checkpoint, samples) -> torch.nn.Module:
    """The original model with every layer of each of the checkpoint's config groups rounded to
    nearest on that group's grid, by compressed-tensors' own arithmetic: weight scales from
    llmcompressor's memoryless min-max observer, dynamic inputs' scales at each call (as
    compressed-tensors' forward takes them), NVFP4's static input global scale from the inputs'
    absmax over the calibration samples."""
    from compressed_tensors.quantization import DynamicType, QuantizationConfig
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp, generate_gparam
    from compressed_tensors.utils import match_named_modules
    from llmcompressor.observers import Observer
    from llmcompressor.observers.fusion import FusionHandler
    from llmcompressor.observers.helpers import FUSED_LAYER_NAMES

    adapter = adapter_for(model_dir)
    model = adapter.load_model(model_dir, dtype=torch.bfloat16)
    test_quantize.unfuse_experts(model)
    config = QuantizationConfig.model_validate(
        json.loads((checkpoint / "config.json").read_text())["quantization_config"]
    )
    layers = {}  # module name -> (module, scheme)
    for scheme in config.config_groups.values():
        for name, module in match_named_modules(model, scheme.targets, config.ignore or []):
            if isinstance(module, torch.nn.Linear):  # a name pattern also matches experts' containers
                layers[name] = (module, scheme)
    assert layers, "no layer of the original matches the checkpoint's config groups"
    static_global = [
        n
        for n, (_, s) in layers.items()
        if s.input_activations and s.input_activations.dynamic == DynamicType.LOCAL
    ]
    input_global = {}
    if static_global:  # before any weight is rounded: the original's inputs
        processor = adapter.load_processor(model_dir)
        calibration = [test_quantize.processor_inputs(processor, sample) for sample in samples]
        absmax = test_quantize.observed_input_absmax(model, static_global, calibration)
        input_global = {n: generate_gparam(-a.reshape(1), a.reshape(1)) for n, a in absmax.items()}
    # Weight scales first, every one before any weight changes: NVFP4's global scale is shared by
    # the layers vLLM fuses (q/k/v, gate/up), as llmcompressor links their observers.
    observers = {
        name: Observer.load_from_registry("memoryless_minmax", base_name="weight", args=scheme.weights)
        for name, (_, scheme) in layers.items()
    }
    for parent in model.modules():
        for names in FUSED_LAYER_NAMES:
            fused = [getattr(parent, n, None) for n in names]
            pairs = [(observers[n], m) for n, (m, _) in layers.items() if any(m is f for f in fused)]
            if len(pairs) == len(names) > 1:
                FusionHandler.fuse(pairs)
    qparams = {}
    for name, (module, _) in layers.items():
        observers[name](module.weight.float())
    for name in layers:
        qparams[name] = observers[name].get_qparams()
    for name, (module, scheme) in layers.items():
        weight, q = module.weight.float(), qparams[name]
        with torch.no_grad():
            module.weight.copy_(
                fake_quantize(weight, q["scale"], q["zero_point"], scheme.weights, q["global_scale"])
            )
        if scheme.input_activations is not None:
            assert scheme.input_activations.dynamic in (True, DynamicType.LOCAL), scheme.input_activations

            def rounded(_module, args, a=scheme.input_activations, g=input_global.get(name)):
                x = args[0].float()
                scale, zero_point = compute_dynamic_scales_and_zp(x, a, _module, global_scale=g)
                return (fake_quantize(x, scale, zero_point, a, global_scale=g).to(args[0].dtype), *args[1:])

            module.register_forward_pre_hook(rounded)
    return model


def awq_smoothed(source, output, prefix: str) -> list[str]:
    """The 16-bit tensors (norms, routers) the checkpoint holds with other values than the
    original's: the layers AWQ scaled (names without the serving prefix)."""
    from safetensors import safe_open

    def tensors(folder, strip=""):
        found = {}
        for path in sorted(folder.glob("*.safetensors")):
            with safe_open(str(path), "pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if key.endswith("norm.weight") or key.endswith(".mlp.gate.weight"):
                        found[key.removeprefix(strip)] = handle.get_tensor(key)
        return found

    before, after = tensors(source), tensors(output, prefix)
    return sorted(
        k for k, v in after.items() if k in before and not torch.equal(v.float(), before[k].float())
    )


@pytest.mark.slow
@pytest.mark.parametrize("name, recipe_name", MATRIX, ids=MATRIX_IDS)
def test_new_recipe_on_every_zoo_model(quantized, reference, zoo_model, media, name, recipe_name):
    result = quantized(name, recipe_name)
    output = result.output
    adapter = adapter_for(zoo_model(name))
    scheme, needs_data, fmt = NEW_RECIPES[recipe_name]

    config = json.loads((output / "config.json").read_text())
    assert config["quantization_config"]["format"] == fmt == result.checkpoint_format
    # One preset; W4A16 with zero points is W4A16_ASYM, with MoE experts at the symmetric W4A16.
    shipped = shipped_schemes(config["quantization_config"])
    assert shipped and set(shipped) <= {scheme, get_recipe(recipe_name).preset}
    if needs_data:  # GPTQ (w4a8-fp8), the activations' global scales (nvfp4), AWQ's statistics
        assert result.samples_used == len(test_quantize.calibration_samples(name, media)[0]) > 0
    else:
        assert result.samples_used == 0 and result.pipeline == "datafree"
    if scheme == "NVFP4":  # calibrated per-tensor global scales for weights and activations
        keys = {key.rsplit(".", 1)[1] for key in test_quantize.saved_tensor_dtypes(output)}
        assert {"weight_global_scale", "input_global_scale"} <= keys

    if get_recipe(recipe_name).method == "awq":  # AWQ smoothed the language model, and only it
        smoothed = awq_smoothed(zoo_model(name), output, adapter.serving.prefix if adapter.serving else "")
        assert any(n.endswith("post_attention_layernorm.weight") for n in smoothed), smoothed
        assert all(".layers." in n and adapter.group_of(n) not in ("vision", "audio") for n in smoothed)
        if ".experts." in " ".join(result.quantized_modules):  # the MoE router, balanced, stays 16-bit
            assert any(n.endswith(".mlp.gate.weight") for n in smoothed), smoothed

    # The audit: files, layout and scales, and only the language model quantized.
    audit = audit_checkpoint(output)
    assert audit.passed, [(c.name, c.detail) for c in audit.checks if not c.passed]
    lm = adapter.language_model + "."
    assert result.quantized_modules and all(m.startswith(lm) for m in result.quantized_modules)
    assert result.counts["language_model"]["quantized"] == len(result.quantized_modules)
    assert not any(row["quantized"] for group, row in result.counts.items() if group != "language_model")

    # transformers reloads it (compressed-tensors decompresses) and runs every modality it takes,
    # with logits nearer the original's than no logits at all (relative MSE below 1): a layer
    # decompressed with a wrong scale fails this, a 4-bit or FP8 rounding error does not.
    errors = {
        k: round(e, 5) for k, e in test_quantize.reloaded_errors(adapter, output, reference(name)).items()
    }
    print(f"\n{name} {recipe_name}: relative logit MSE after reload {errors}")
    assert max(errors.values()) < 1, errors
    # The bound its scheme implies: against round-to-nearest on the checkpoint's own grid.
    factor, two_sided, why = ERROR_BOUNDS[recipe_name]
    simulated = checkpoint_rtn_simulation(
        zoo_model(name), output, test_quantize.calibration_samples(name, media)[0]
    )
    rtn_errors = {}
    for kind, (inputs, ref_logits) in reference(name).items():
        with torch.no_grad():
            rtn_errors[kind] = test_quantize.relative_mse(simulated(**inputs).logits.float(), ref_logits)
    ours, rtn = sum(errors.values()) / len(errors), sum(rtn_errors.values()) / len(rtn_errors)
    print(f"{name} {recipe_name}: round-to-nearest {rtn:.5f}, ratio {ours / rtn:.2f} (bound {factor})")
    assert ours <= factor * rtn, f"{why}: {ours:.5f} vs {factor} x {rtn:.5f}; {errors} / {rtn_errors}"
    if two_sided:
        assert ours >= rtn / factor, f"{why}: {ours:.5f} vs {rtn:.5f} / {factor}; {errors} / {rtn_errors}"
    serving = SCHEMES[scheme].card_serving
    assert serving and serving in (output / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment (make vllm-env)")
@pytest.mark.parametrize("recipe_name", list(NEW_RECIPES))
def test_vllm_serves_the_new_recipe_or_names_the_missing_kernel(quantized, recipe_name):
    """vLLM's CPU backend has no block-FP8, FP4 or W4A8-FP8 kernel: a skip with vLLM's reason,
    never a pass."""
    from quantkit.verify.vllm_check import check_with_vllm

    served_or_skip(check_with_vllm(quantized("tiny-qwen3-vl", recipe_name).output))


# vLLM's config matcher on each checkpoint, as on the GPU the recipe is for: the compressed-tensors
# scheme class vLLM builds for a layer, and the compute capability (major, minor) it is asked on
# (the matcher gates W4AFP8 on exactly SM90; the CPU backend has no capability).
# The class expected is the scheme table's (what the model card names).
SCHEME_CAPABILITIES = {
    "FP8_BLOCK": (9, 0),
    "NVFP4A16": (8, 0),
    "NVFP4": (10, 0),
    "W4AFP8": (9, 0),
    "W4A16": (8, 0),
}
VLLM_MATCHER = r"""
import enum, inspect, json, sys
import torch
from vllm.model_executor.layers.quantization.compressed_tensors import compressed_tensors as ct
from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsScheme
from vllm.platforms.interface import DeviceCapability
capability = [0, 0]  # set per checkpoint below
type(ct.current_platform).get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(*capability))

# The matcher's choice, not the kernels: each scheme class records its arguments instead of
# building (building reads a running engine's config). The capability check stays the class's own.
def plain(value):
    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "model_dump"):  # compressed-tensors QuantizationArgs
        return value.model_dump(mode="json")
    return value

def recorder(cls):
    signature = inspect.signature(cls.__init__)
    class Picked:
        def __init__(self, *args, **kwargs):
            bound = signature.bind(None, *args, **kwargs)  # with the class's own defaults
            bound.apply_defaults()
            given = {k: plain(v) for k, v in list(bound.arguments.items())[1:] if k != "layer_name"}
            self.label = {
                "class": cls.__name__ + ("(use_a16=True)" if given.get("use_a16") else ""),
                "args": given,
            }

        get_min_capability = cls.get_min_capability
    return Picked

for attr, value in list(vars(ct).items()):
    if isinstance(value, type) and issubclass(value, CompressedTensorsScheme):
        setattr(ct, attr, recorder(value))
answers = []
for job in json.loads(sys.argv[1]):
    capability[:] = job["capability"]
    quant = ct.CompressedTensorsConfig.from_config(json.load(open(job["config"]))["quantization_config"])
    found = {}
    for name in job["names"]:
        scheme = quant.get_scheme(torch.nn.Linear(1, 1), layer_name=name)
        found[name] = None if scheme is None else scheme.label
    answers.append(found)
print("ANSWER" + json.dumps(answers))
"""


def vllm_scheme_classes(python, jobs: list[tuple]) -> list[dict]:
    """Per (checkpoint, capability, layer names): each name's scheme class as vLLM's
    CompressedTensorsConfig picks it (None: unquantized), ``{"class", "args"}``: the class and the
    arguments the matcher builds it with (layer_name left out). One vLLM import for all."""
    request = [{"config": str(c / "config.json"), "capability": list(cap), "names": n} for c, cap, n in jobs]
    return vllm_answer(python, VLLM_MATCHER, json.dumps(request))


# What decides the kernel, per scheme class: the arguments vLLM's matcher passes it.
WEIGHT_FIELDS = ("num_bits", "type", "strategy", "symmetric", "dynamic", "group_size", "block_structure")
GROUP_ARGS = ("num_bits", "strategy", "group_size", "symmetric")


def expected_kernel_args(recipe_name: str, result, module: str) -> dict:
    """The arguments vLLM should build layer ``module``'s scheme class with, from the
    compressed-tensors scheme the recipe resolved to (quantkit.json): the preset, with the group
    size quantize chose for the model and the MoE experts' symmetric weights (quantkit.precision.mixed)."""
    from quantkit.precision.mixed import four_bit_symmetric

    recipe = get_recipe(recipe_name)
    scheme = result.metadata["resolved_scheme"]
    weights, inputs = scheme["weights"], scheme.get("input_activations")
    label = SCHEMES[recipe.scheme].vllm_class
    if label.startswith("CompressedTensorsW4A4Fp4"):  # NVFP4: its groups of 16 are the class's own
        return {"use_a16": inputs is None}
    if label == "CompressedTensorsW8A8Fp8":
        return {
            "weight_quant": {k: weights.get(k) for k in WEIGHT_FIELDS},
            "is_static_input_scheme": bool(inputs) and not inputs["dynamic"],
        }
    args = {k: weights.get(k) for k in GROUP_ARGS}
    args["symmetric"] = four_bit_symmetric(module, weights["symmetric"])
    return args


def kernel_args(found: dict, expected: dict) -> dict:
    """The recorded arguments, cut to what ``expected`` names (nested dicts alike)."""
    return {
        k: kernel_args(found.get(k) or {}, v) if isinstance(v, dict) else found.get(k, "<missing>")
        for k, v in expected.items()
    }


@pytest.mark.slow
@pytest.mark.skipif(vllm_python() is None, reason="no vLLM environment (make vllm-env)")
@pytest.mark.parametrize("recipe_name", list(NEW_RECIPES))
def test_vllm_matcher_resolves_each_layer_to_the_scheme_class(quantized, zoo_model, recipe_name):
    """On every zoo model: every quantized language-model layer to the recipe's scheme class,
    built with the arguments that decide its kernel as the recipe's preset has them (bits,
    strategy, group size or blocks, zero points, static or dynamic inputs, weight-only FP4);
    every kept Linear (towers, head: the names the checkpoint's ignore list holds) to none."""
    scheme = NEW_RECIPES[recipe_name][0]
    capability, expected = SCHEME_CAPABILITIES[scheme], SCHEMES[scheme].vllm_class
    jobs, checks = [], []
    for name in ZOO:
        result = quantized(name, recipe_name)
        adapter = adapter_for(zoo_model(name))
        prefix = adapter.serving.prefix if adapter.serving else ""
        config = json.loads((result.output / "config.json").read_text())
        kept = [entry for entry in config["quantization_config"]["ignore"] if not entry.startswith("re:")]
        layers = {prefix + module: module for module in result.quantized_modules}
        jobs.append((result.output, capability, [*layers, *kept]))
        checks.append((name, result, layers, kept))
    for (name, result, layers, kept), found in zip(
        checks, vllm_scheme_classes(vllm_python(), jobs), strict=True
    ):
        assert {(found[n] or {}).get("class") for n in layers} == {expected}, name
        for served, module in layers.items():
            want = expected_kernel_args(recipe_name, result, module)
            assert kernel_args(found[served]["args"], want) == want, (name, served)
        assert kept and all(found[n] is None for n in kept), name


# ------------------------------------------------------------------------------ targets


def test_blackwell_targets_take_nvfp4_and_hopper_falls_back_to_w4a8_and_fp8_block():
    from quantkit.build import load_targets

    targets = {t.name: t for t in load_targets().targets}
    for name in ("blackwell", "rtx50"):
        assert targets[name].recipe == "nvfp4"
        assert "nvfp4-a16" in [f.recipe for f in targets[name].fallbacks]
        assert "vLLM" in targets[name].why and "SM1" in targets[name].why
    assert any("RTX 5090" in h for h in targets["rtx50"].hardware)
    assert any("B200" in h for h in targets["blackwell"].hardware)
    hopper = {f.recipe: f.why for f in targets["hopper"].fallbacks}
    assert {"w4a8-fp8", "fp8-block"} <= set(hopper)
    assert all("vLLM" in hopper[r] and "SM90" in hopper[r] for r in ("w4a8-fp8", "fp8-block"))
