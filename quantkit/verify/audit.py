"""Audit a compressed-tensors checkpoint without running it.

Reads config.json and the safetensors headers (tensor names, dtypes, shapes); loads only the
scale tensors. Module names and classes come from the architecture built on the meta device, so
the ignore list and the config groups are matched exactly as compressed-tensors matches them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from quantkit.errors import InputError
from quantkit.modelfiles import read_model_config, safetensors_problems
from quantkit.models.adapters import Adapter, adapter_for, unprefix_pattern
from quantkit.models.loading import generation_without_sklearn, unfuse_experts_on_meta

# Stored dtypes a compression format writes for a quantized weight.
WEIGHT_DTYPES = {
    "pack-quantized": ("weight_packed", {"I32"}),
    "nvfp4-pack-quantized": ("weight_packed", {"U8"}),  # two FP4 (e2m1) values per byte
    "int-quantized": ("weight", {"I8"}),
    "float-quantized": ("weight", {"F8_E4M3"}),
    "naive-quantized": ("weight", {"I8", "F8_E4M3", "BF16", "F16", "F32"}),
}
SCALE_SUFFIXES = (
    "weight_scale",
    "input_scale",
    "output_scale",
    "k_scale",
    "v_scale",
    "weight_global_scale",
    "input_global_scale",
)
FILES_CHECK = "weight files complete (safetensors headers and sizes)"
DTYPE_BYTES = {"I32": 4, "I64": 8, "I8": 1, "U8": 1, "F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4, "F64": 8}


@dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class AuditResult:
    checkpoint: str
    architecture: str
    format: str | None
    checks: list[Check] = field(default_factory=list)
    quantized_modules: list[str] = field(default_factory=list)
    language_model_bytes_16bit: int = 0
    language_model_bytes_stored: int = 0

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def size_ratio(self) -> float:
        return self.language_model_bytes_stored / max(1, self.language_model_bytes_16bit)

    def add(self, name: str, problems: list[str], ok_detail: str = "") -> None:
        shown = "; ".join(problems[:8]) + (f"; ... {len(problems) - 8} more" if len(problems) > 8 else "")
        self.checks.append(Check(name, not problems, shown if problems else ok_detail))

    def to_dict(self) -> dict:
        data = asdict(self)
        data["passed"] = self.passed
        data["size_ratio"] = round(self.size_ratio, 4)
        return data


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    file: str
    key: str  # the name in the file (the index may strip a serving-layout prefix)


def read_tensor_index(checkpoint: Path, strip_prefix: str = "") -> dict[str, TensorInfo]:
    """Names, dtypes and shapes of every tensor in the checkpoint, from the headers only.

    With ``strip_prefix`` (``thinker.`` for Omni serving layouts) only tensors under it are
    indexed, by their name below it."""
    from safetensors import safe_open

    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise InputError("no .safetensors files in the checkpoint", path=checkpoint)
    index: dict[str, TensorInfo] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                if not key.startswith(strip_prefix):
                    continue
                piece = handle.get_slice(key)
                info = TensorInfo(piece.get_dtype(), tuple(piece.get_shape()), file.name, key)
                index[key.removeprefix(strip_prefix)] = info
    return index


def load_tensors(checkpoint: Path, index: dict[str, TensorInfo], names: list[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    by_file: dict[str, list[str]] = {}
    for name in names:
        by_file.setdefault(index[name].file, []).append(name)
    tensors = {}
    for file, keys in by_file.items():
        with safe_open(str(checkpoint / file), framework="pt") as handle:
            for key in keys:
                tensors[key] = handle.get_tensor(index[key].key)
    return tensors


def _quantization_config(checkpoint: Path):
    # compressed-tensors imports transformers' generation stack, which imports scikit-learn
    # (with scipy and pandas, ~2.7 s of CPU) when installed; an audit never generates. Where
    # transformers is already imported (verify after a quantize run) this is a no-op.
    with generation_without_sklearn():
        from compressed_tensors.quantization import QuantizationConfig

    config = read_model_config(checkpoint)
    raw = config.get("quantization_config") or config.get("compression_config")
    if raw is None:
        return config, None, "config.json has no quantization_config"
    try:
        return config, QuantizationConfig.model_validate(raw), ""
    except ValueError as err:
        return config, None, f"quantization_config is not valid compressed-tensors: {err}"


def _expected_scale_shape(args, out_features: int, in_features: int) -> tuple[int, ...] | None:
    strategy = str(getattr(args.strategy, "value", args.strategy))
    if strategy == "tensor":
        return (1,)
    if strategy == "channel":
        return (out_features, 1)
    if strategy in ("group", "tensor_group"):
        return (out_features, math.ceil(in_features / args.group_size))
    if strategy == "block" and args.block_structure:
        rows, cols = args.block_structure
        return (math.ceil(out_features / rows), math.ceil(in_features / cols))
    return None


def module_names_of_keys(model: torch.nn.Module, stored_modules: set[str]) -> dict[str, str]:
    """Map checkpoint module names to the model's module names.

    transformers 5 keeps older on-disk names for some architectures (Qwen2.5-VL: ``visual.*``,
    ``model.layers.*``) and renames them on load; the same renaming is applied here.
    """
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    # Renamings only: converters fuse per-expert Linears into 3D tensors, but quantized experts
    # stay per-expert Linears (the skeleton below is unfused to match).
    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    mapping = {}
    for name in stored_modules:
        renamed, _ = rename_source_key(f"{name}.weight", renamings, [])
        mapping[name] = renamed.removesuffix(".weight")
    return mapping


def _scheme_for(name: str, module: torch.nn.Module, qconfig) -> tuple[str, object] | None:
    """The config group (name, scheme) that claims a module, as compressed-tensors decides it:
    of the groups whose targets match, an exact name first, then a regex, then a class name
    (its match_targets order), whatever the groups' order in config.json."""
    from compressed_tensors.utils import is_match, match_targets

    if not is_match(
        name, module, [t for s in qconfig.config_groups.values() for t in s.targets], qconfig.ignore or []
    ):
        return None
    owner = {}
    for group_name, scheme in qconfig.config_groups.items():
        for target in scheme.targets:
            owner[target] = (group_name, scheme)  # a target in two groups: the last, as in compressed-tensors
    matched = match_targets(name, module, list(owner))
    return owner[matched[0]] if matched else None


def audit_checkpoint(checkpoint: Path, *, adapter: Adapter | Path | None = None) -> AuditResult:
    """Check a quantized checkpoint's config and tensors against each other and against the
    model's architecture. Never raises for a failed check: each lands in ``result.checks``."""
    checkpoint = Path(checkpoint)
    adapter = adapter_for(checkpoint, adapter)
    config, qconfig, config_problem = _quantization_config(checkpoint)
    result = AuditResult(
        checkpoint=str(checkpoint),
        architecture=(config.get("architectures") or ["?"])[0],
        format=getattr(qconfig, "format", None),
    )
    result.add("quantization_config present and valid", [config_problem] if config_problem else [])
    if qconfig is None:
        return result

    damaged = safetensors_problems(checkpoint)
    result.add(FILES_CHECK, damaged)
    if damaged:  # nothing below can read the tensors
        return result
    prefix = adapter.serving.prefix if adapter.is_wrapped(checkpoint) else ""
    if prefix:  # judge the thinker by its own names, as the tensors below the prefix hold it
        qconfig.ignore = [unprefix_pattern(p, prefix) for p in qconfig.ignore or []]
        for scheme in qconfig.config_groups.values():
            scheme.targets = [unprefix_pattern(t, prefix) for t in scheme.targets]
    index = read_tensor_index(checkpoint, prefix)
    skeleton = adapter.meta_model(checkpoint)

    unfuse_experts_on_meta(skeleton)  # quantized MoE checkpoints hold one Linear per expert
    linears = {n: m for n, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)}
    module_names = {n for n, _ in skeleton.named_modules()}
    saved_names = {
        key.rsplit(".", 1)[0] for key in index if key.rsplit(".", 1)[-1] in ("weight", "weight_packed")
    }
    to_module = module_names_of_keys(skeleton, saved_names)
    quantized_saved = {
        key.rsplit(".", 1)[0] for key in index if key.endswith((".weight_scale", ".weight_packed"))
    }
    stored = {to_module.get(name, name) for name in quantized_saved}
    result.quantized_modules = sorted(stored)

    # Which modules the config claims, and whether the tensors agree.
    claimed = {n: s for n, m in linears.items() if (s := _scheme_for(n, m, qconfig)) is not None}
    result.add(
        "config groups and stored tensors agree",
        [f"{n}: claimed by {claimed[n][0]} but stored unquantized" for n in sorted(set(claimed) - stored)]
        + [f"{n}: stored quantized but no config group claims it" for n in sorted(stored - set(claimed))],
        f"{len(stored)} quantized modules",
    )

    outside = [
        f"{n} ({adapter.group_of(n)})" for n in sorted(stored) if adapter.group_of(n) != "language_model"
    ]
    result.add("only the language model is quantized", outside, f"all under {adapter.language_model!r}")

    missed = [n for n in sorted(linears) if adapter.should_quantize(n) and n not in stored]
    result.add("every language-model Linear not kept on purpose is quantized", missed)

    from compressed_tensors.utils import match_name

    # An entry is alive if it names a module as saved (what vLLM reads) or as built (what transformers reads).
    known = module_names | saved_names
    dead = [entry for entry in (qconfig.ignore or []) if not any(match_name(n, entry) for n in known)]
    result.add("every ignore entry matches a module", [f"{e!r} matches nothing" for e in dead])

    saved_name = {module: saved for saved, module in to_module.items()}
    result.add(
        "quantized tensors have the scheme's dtype and shape",
        _layout_problems(claimed, stored, linears, index, saved_name),
    )
    result.add("every scale is finite and positive", _scale_problems(checkpoint, index))

    for name, module in linears.items():
        if adapter.group_of(name) != "language_model":
            continue
        result.language_model_bytes_16bit += module.in_features * module.out_features * 2
        prefix = saved_name.get(name, name) + "."
        result.language_model_bytes_stored += sum(
            math.prod(info.shape) * DTYPE_BYTES.get(info.dtype, 2)
            for key, info in index.items()
            if key.startswith(prefix) and key.count(".") == prefix.count(".")
        )
    return result


def _layout_problems(claimed, stored, linears, index, saved_name) -> list[str]:
    problems = []
    for module_name in sorted(stored & set(claimed)):
        _, scheme = claimed[module_name]
        module = linears[module_name]
        name = saved_name.get(module_name, module_name)  # tensors are stored under the saved name
        out_f, in_f = module.out_features, module.in_features
        fmt = str(getattr(scheme, "format", None) or "")
        weight_key, dtypes = WEIGHT_DTYPES.get(fmt, ("weight", set(DTYPE_BYTES)))
        if fmt == "" and f"{name}.weight_packed" in index:
            weight_key, dtypes = WEIGHT_DTYPES["pack-quantized"]
        weight = index.get(f"{name}.{weight_key}")
        if weight is None:
            problems.append(f"{name}: no {weight_key}")
            continue
        if weight.dtype not in dtypes:
            problems.append(f"{name}.{weight_key}: dtype {weight.dtype}, expected {sorted(dtypes)}")
        if weight_key == "weight_packed":
            per_int = DTYPE_BYTES.get(weight.dtype, 4) * 8 // scheme.weights.num_bits
            if weight.shape != (out_f, math.ceil(in_f / per_int)):
                problems.append(
                    f"{name}.weight_packed: shape {weight.shape}, expected {(out_f, math.ceil(in_f / per_int))}"
                )
        elif weight.shape != (out_f, in_f):
            problems.append(f"{name}.weight: shape {weight.shape}, expected {(out_f, in_f)}")
        if scheme.weights is not None:
            expected = _expected_scale_shape(scheme.weights, out_f, in_f)
            scale = index.get(f"{name}.weight_scale")
            if scale is None:
                problems.append(f"{name}: no weight_scale")
            elif expected is not None and math.prod(scale.shape) != math.prod(expected):
                problems.append(f"{name}.weight_scale: shape {scale.shape}, expected {expected}")
            if not scheme.weights.symmetric and f"{name}.weight_zero_point" not in index:
                problems.append(f"{name}: asymmetric scheme but no weight_zero_point")
        activations = scheme.input_activations
        if activations is not None and not activations.dynamic and f"{name}.input_scale" not in index:
            problems.append(f"{name}: static activations but no input_scale")
    return problems


def _scale_problems(checkpoint: Path, index: dict[str, TensorInfo]) -> list[str]:
    names = [key for key in index if key.rsplit(".", 1)[-1] in SCALE_SUFFIXES]
    problems = []
    for key, tensor in load_tensors(checkpoint, index, names).items():
        values = tensor.float()
        if not torch.isfinite(values).all():
            problems.append(f"{key}: {int((~torch.isfinite(values)).sum())} non-finite value(s)")
        elif (values <= 0).any():
            problems.append(f"{key}: {int((values <= 0).sum())} value(s) <= 0")
    return problems
