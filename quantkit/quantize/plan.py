"""The memory plan: whether a quantize run fits, said before any weight is read.

Computed from the model's module tree on the meta device (config.json alone) and the calibration
samples' token counts (measured by ``quantkit calibrate --model``; an assumed length where a set
has none, and the plan says so). The figures follow what the run holds:

- **per GPU** (llmcompressor's sequential pipeline onloads one decoder layer at a time): that
  layer's weights in the calibration dtype, its GPTQ Hessians (4 x in_features^2 bytes per
  targeted Linear, all of the layer's at once), the solve's workspace for its largest Linear, and
  one sample's activations inside the layer (calibration runs eager attention: the score matrix
  is heads x L^2, and the causal mask L^2);
- **host**: the runtime (Python, torch, transformers, llmcompressor), the model in the
  calibration dtype (or what ``--offload disk`` keeps in memory), the captured decoder inputs of
  every sample and the activation cache at one layer boundary (hidden states, the position
  embeddings and the eager causal mask of every sample), and, without a GPU, the per-layer
  figures above too;
- **disk**: the checkpoint (quantized layers at their bits plus scales, the rest in the saved
  dtype), written once in a staging folder; the ``--offload disk`` folder; the spilled activation
  cache when it does not fit in host memory (memory-mapped files beside the staging folder).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from quantkit.models.adapters import Adapter
from quantkit.models.targets import TargetPlan, decoder_layers
from quantkit.precision.mixed import PrecisionPlan
from quantkit.recipes import Recipe

GIB = 2**30
# Resident memory of a process that imported torch, transformers and llmcompressor (measured on
# the 2-core CI machine: 1.06 GB at import, 1.1 GB with quantkit's own modules).
RUNTIME_HOST_BYTES = int(1.1 * GIB)
# Token count assumed for a sample whose calibration set records none (sets built without --model).
ASSUMED_TOKENS = 1024
# Free host memory kept for everything the plan does not count (allocator slack, page cache).
HOST_HEADROOM = 0.10
HESSIAN_BYTES = 4  # GPTQ accumulates in float32
LOAD_COPIES = 2  # the checkpoint's tensors held while loading casts them (see memory_plan)


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def host_memory_available() -> int | None:
    """MemAvailable from /proc/meminfo (bytes), None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class MemoryPlan:
    device: str  # "cuda" (one decoder layer on each GPU at a time) or "cpu" (everything on the host)
    calibration_dtype: str
    saved_dtype: str
    decoder_layers: int
    subgraphs: int  # what the sequential pipeline runs in order (one per layer, plus the tail)
    layer_solves: int  # GPTQ solves (one per targeted Linear); 0 for round-to-nearest recipes
    tokens: dict  # samples, total, max, source ("measured" / "assumed N per sample" / "none")
    per_gpu: dict[str, int]
    host: dict[str, int]
    disk: dict[str, int]
    host_available: int | None
    spill: bool  # the activation cache goes to memory-mapped files (it does not fit the host)
    fits: bool | None  # the host total within the available memory (None: unknown)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["gib"] = {
            "per_gpu": round(self.per_gpu["total"] / GIB, 2),
            "host": round(self.host["total"] / GIB, 2),
            "disk": round(self.disk["total"] / GIB, 2),
        }
        return data

    def lines(self) -> list[str]:
        """The plan as a few lines for the terminal."""

        def gib(value: int) -> str:
            return f"{value / GIB:.2f} GiB"

        per_gpu = ", ".join(f"{k} {gib(v)}" for k, v in self.per_gpu.items() if k != "total")
        host = ", ".join(f"{k} {gib(v)}" for k, v in self.host.items() if k != "total")
        disk = ", ".join(f"{k} {gib(v)}" for k, v in self.disk.items() if k != "total")
        tokens = self.tokens
        out = [
            f"memory plan ({self.device}, {self.calibration_dtype}): {self.decoder_layers} decoder layers, "
            f"{self.subgraphs} subgraphs, {self.layer_solves} layer solves; {tokens['samples']} samples, "
            f"{tokens['total']} tokens (max {tokens['max']}, {tokens['source']})",
            f"  per GPU  {gib(self.per_gpu['total'])}  ({per_gpu})"
            if self.device == "cuda"
            else f"  per layer (on the host, no GPU)  {gib(self.per_gpu['total'])}  ({per_gpu})",
            f"  host     {gib(self.host['total'])}  ({host})"
            + (f"; available {gib(self.host_available)}" if self.host_available else ""),
            f"  disk     {gib(self.disk['total'])}  ({disk})",
        ]
        out += [f"  note: {note}" for note in self.notes]
        return out


def _signature(layer: torch.nn.Module) -> tuple:
    """What makes two decoder layers the same kind for the plan: their module tree (names and
    classes) and every parameter's shape and dtype. Qwen3-MoE's dense (``mlp_only_layers``,
    ``decoder_sparse_step``) and sparse layers differ; the 48 sparse layers of a 30B MoE do not."""
    return tuple(
        (
            name,
            type(module).__qualname__,
            tuple((p, tuple(t.shape), t.dtype) for p, t in module.named_parameters(recurse=False)),
        )
        for name, module in layer.named_modules()
    )


@dataclass
class LayerKinds:
    """The decoder layers grouped by kind: ``members`` maps the layer standing for a kind (its
    module name) to the full model's layers of that kind, in order. On the full tree the
    representative is the kind's first layer; on :func:`reduced_tree`'s tree it is the kind's
    position in the shortened layer list."""

    members: dict[str, list[str]]
    order: list[str]  # every decoder layer of the full model, in order

    @classmethod
    def each(cls, layers: dict[str, torch.nn.Module]) -> LayerKinds:
        """Every layer its own kind (a full tree: nothing to multiply)."""
        return cls({name: [name] for name in layers}, list(layers))

    @classmethod
    def of(cls, layers: dict[str, torch.nn.Module]) -> LayerKinds:
        first: dict[tuple, str] = {}
        members: dict[str, list[str]] = {}
        for name, layer in layers.items():
            rep = first.setdefault(_signature(layer), name)
            members.setdefault(rep, []).append(name)
        return cls(members, list(layers))

    @property
    def layers(self) -> int:
        return len(self.order)

    def rep_of(self, name: str) -> str | None:
        """The representative layer ``name`` lies in (None: outside every decoder layer)."""
        head = name
        while head:
            if head in self.members:
                return head
            head = head.rpartition(".")[0]
        return None

    def multiplicity(self, name: str) -> int:
        """How many modules of the full model ``name`` (a module of this tree) stands for."""
        rep = self.rep_of(name)
        return len(self.members[rep]) if rep else 1

    def expand(self, items: dict) -> dict:
        """A mapping keyed by names in this tree -> keyed by the full model's names, in the full
        model's order (the layers' entries where the first layer's were)."""
        out: list[tuple[str, object]] = []
        inside: dict[str, list[tuple[str, object]]] = {rep: [] for rep in self.members}
        position = None
        for name, value in items.items():
            rep = self.rep_of(name)
            if rep is None:
                out.append((name, value))
                continue
            position = len(out) if position is None else position
            inside[rep].append((name[len(rep) :], value))
        if position is not None:
            owner = {full: rep for rep, fulls in self.members.items() for full in fulls}
            layers = [(full + suffix, value) for full in self.order for suffix, value in inside[owner[full]]]
            out[position:position] = layers
        return dict(out)

    def expand_names(self, names: list[str]) -> list[str]:
        return list(self.expand(dict.fromkeys(names)))


def reduced_tree(model: torch.nn.Module, adapter: Adapter) -> tuple[torch.nn.Module, LayerKinds] | None:
    """``model`` (fused, on the meta device) with its decoder-layer list cut to one layer per
    kind, and the kinds mapping the kept layers to the full model's (None: the layers are not
    one list, nothing is cut). Building and walking 25,919 modules of a 48-layer x 128-expert
    MoE takes seconds; one layer per kind, multiplied, gives the same plan."""
    layers = decoder_layers(model, adapter)
    containers = {name.rpartition(".")[0] for name in layers}
    if len(containers) != 1:
        return None
    container = containers.pop()
    full = LayerKinds.of(layers)
    if len(full.members) == len(layers):
        return None  # every layer its own kind: nothing to cut
    kept = list(full.members)
    model.set_submodule(container, torch.nn.ModuleList([layers[name] for name in kept]))
    members = {f"{container}.{i}": full.members[name] for i, name in enumerate(kept)}
    return model, LayerKinds(members, full.order)


class ExpandedTree:
    """``get_submodule`` by the full model's names on the reduced tree (what the precision plan
    and the group-size guard read: each layer's in- and out-features)."""

    def __init__(self, model: torch.nn.Module, kinds: LayerKinds):
        self.model = model
        self._modules = dict(model.named_modules())
        self._rep_for = {full: rep for rep, fulls in kinds.members.items() for full in fulls}

    def get_submodule(self, name: str) -> torch.nn.Module:
        head = name
        while head and head not in self._rep_for:
            head = head.rpartition(".")[0]
        own = self._rep_for[head] + name[len(head) :] if head else name
        if own not in self._modules:
            raise AttributeError(f"the model has no module {name!r}")
        return self._modules[own]

    def named_modules(self, *args, **kwargs):
        """The reduced tree's modules (the decoder-layer list sits at the same path: what the
        language model's root is read from)."""
        return self.model.named_modules(*args, **kwargs)


def expand_targets(targets: TargetPlan, kinds: LayerKinds) -> TargetPlan:
    """The reduced tree's target plan as the full model's: names expanded to every layer of their
    kind (the ``re:`` patterns generalise layer indices already)."""
    return TargetPlan(
        groups=kinds.expand(targets.groups),
        quantize=kinds.expand_names(targets.quantize),
        kept=kinds.expand(targets.kept),
        targets=targets.targets,
        ignore=kinds.expand_names(targets.ignore),
    )


def _layer_figures(layer: torch.nn.Module, targeted: set[int], gptq: bool) -> tuple[int, int, int, int]:
    """(parameters, Hessian bytes, GPTQ workspace bytes, widest Linear output) of one decoder layer."""
    params = sum(p.numel() for p in layer.parameters())
    hessians = workspace = widest = 0
    for module in layer.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        widest = max(widest, module.out_features)
        if id(module) not in targeted or not gptq:
            continue
        square = HESSIAN_BYTES * module.in_features**2
        hessians += square
        # The solve: the weight in float32, its quantized copy and error rows, the inverse Hessian.
        workspace = max(workspace, 3 * 4 * module.in_features * module.out_features + 2 * square)
    return params, hessians, workspace, widest


def _module_ids(model: torch.nn.Module, names: list[str]) -> set[int]:
    """The ids of the modules called ``names``: one walk of the tree (``get_submodule`` per name
    walks the path again for each of a MoE model's 18k expert Linears)."""
    modules = dict(model.named_modules())
    return {id(modules[name]) for name in names}


def _attention_widths(decoder: torch.nn.Module) -> tuple[int, int, int]:
    """(hidden size, attention heads, head dimension) from the decoder's text config."""
    config = getattr(decoder, "config", None)
    text = getattr(config, "text_config", None) or config
    hidden = int(text.hidden_size)
    heads = int(getattr(text, "num_attention_heads", 1))
    return hidden, heads, int(getattr(text, "head_dim", None) or hidden // heads)


def checkpoint_size_estimate(
    model: torch.nn.Module,
    targets: TargetPlan,
    recipe: Recipe,
    precision: PrecisionPlan | None,
    dtype: torch.dtype,
    model_dir: Path,
    avg_bits: float | None = None,
    kinds: LayerKinds | None = None,
) -> int:
    """Bytes the checkpoint will take (the one estimate: the free-space check, the dry run, the
    memory plan's disk figure, build's order of fallbacks), from the module tree on the meta
    device: quantized weights at their bits (scales and zero points included), the rest in the
    saved ``dtype``, plus the source's other files (tokenizer, processor). ``kinds``: ``model``
    is a reduced tree (one decoder layer per kind, counted for each layer of its kind)."""
    item = _dtype_bytes(dtype)
    quantized = set(targets.quantize)
    seen: set[int] = set()
    kept_bytes = quantized_weights = rows = 0
    for name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue  # tied weights are saved once
            seen.add(id(param))
            count = kinds.multiplicity(name) if kinds else 1
            if name in quantized and param_name == "weight":
                quantized_weights += param.numel() * count
                rows += param.shape[0] * count
            else:
                kept_bytes += param.numel() * item * count
    if precision is not None:
        bits = max(
            precision.effective_bits, (avg_bits or 0.0) + (precision.effective_bits - precision.avg_bits)
        )
    else:
        bits = recipe.spec.weight_bits
    scales = rows * 8  # a scale (and zero point) per output row: per-channel schemes
    others = sum(
        f.stat().st_size for f in Path(model_dir).iterdir() if f.is_file() and f.suffix != ".safetensors"
    )
    return int(kept_bytes + quantized_weights * bits / 8 + scales + others)


def _token_lengths(tokens: list[int | None], needs_data: bool) -> tuple[list[int], str, list[str]]:
    """Each calibration sample's token count (ASSUMED_TOKENS where unknown; none for a data-free
    recipe), where the counts came from, and the note an assumed count makes."""
    known = [t for t in tokens if t is not None] if needs_data else []
    lengths = known + [ASSUMED_TOKENS] * (len(tokens) - len(known) if needs_data else 0)
    if not needs_data:
        return lengths, "none (data-free recipe)", []
    if len(known) == len(tokens):
        return lengths, "measured", []
    missing = len(tokens) - len(known)
    note = f"{missing} sample(s) carry no token count (calibrate with --model to measure them)"
    return lengths, f"assumed {ASSUMED_TOKENS} for {missing} sample(s)", [note]


def memory_plan(
    model: torch.nn.Module,
    adapter: Adapter,
    recipe: Recipe,
    targets: TargetPlan,
    tokens: list[int | None],
    *,
    calibration_dtype: torch.dtype,
    saved_dtype: torch.dtype,
    device: str | None = None,
    offload: str | None = None,
    max_cpu_memory: int | None = None,
    checkpoint: int,
    available: int | None = None,
    kinds: LayerKinds | None = None,
) -> MemoryPlan:
    """The plan for ``model`` (meta device, experts unfused) with ``tokens`` per calibration
    sample (None where unknown). ``device``: "cuda" when a GPU is there, else "cpu" (the
    per-layer figures then count on the host). ``available`` host bytes default to MemAvailable
    (0: unknown, nothing is decided from it). ``kinds``: ``model`` is a :func:`reduced_tree`
    (one decoder layer per kind; ``targets`` are its names), each layer counted for its kind.
    ``checkpoint``: the checkpoint's bytes (:func:`checkpoint_size_estimate`)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype_bytes = _dtype_bytes(calibration_dtype)
    layers = decoder_layers(model, adapter)
    kinds = kinds or LayerKinds.each(layers)
    hidden, heads, head_dim = _attention_widths(model.get_submodule(adapter.decoder_path))
    gptq = recipe.method == "gptq" and recipe.needs_data
    targeted = _module_ids(model, targets.quantize)
    figures = {rep: _layer_figures(layers[rep], targeted, gptq) for rep in kinds.members}
    layer_params, hessians, workspace, widest = (
        max(column) for column in zip(*figures.values(), strict=True)
    )

    lengths, source, notes = _token_lengths(tokens, recipe.needs_data)
    longest = max(lengths, default=0)
    total_tokens = sum(lengths)

    # One sample inside one layer: hidden-sized tensors (input, norm, attention output, residual,
    # q/k/v), the widest projection three times (gate, up, activation), eager attention scores in
    # the dtype and their float32 softmax, the causal mask.
    activations = (
        longest * dtype_bytes * (8 * hidden + 3 * widest)
        + heads * longest**2 * (dtype_bytes + 4)
        + longest**2 * dtype_bytes
    )
    per_gpu = {
        "layer_weights": layer_params * dtype_bytes,
        "hessians": hessians,
        "gptq_workspace": workspace,
        "activations": activations,
    }
    per_gpu["total"] = sum(per_gpu.values())

    params = sum(p.numel() for p in model.parameters())
    params += sum((len(fulls) - 1) * figures[rep][0] for rep, fulls in kinds.members.items())
    model_bytes = params * dtype_bytes
    disk_bound = offload == "disk" and max_cpu_memory is not None  # the rest is offloaded to disk
    in_memory = min(model_bytes, max_cpu_memory) if disk_bound else model_bytes
    # Per sample at a layer boundary: its hidden states, cos/sin position embeddings, the causal mask.
    boundary = sum(t * dtype_bytes * (hidden + 2 * head_dim) + t * t * dtype_bytes for t in lengths)
    captured = sum(t * (hidden * dtype_bytes + 4 * 8) for t in lengths)  # embeddings + 3-D positions
    host = {
        "runtime": RUNTIME_HOST_BYTES,
        "model": in_memory,
        "captured_inputs": captured,
        "activation_cache": boundary,
    }
    if device != "cuda":
        host["layer_calibration"] = per_gpu["total"] - per_gpu["layer_weights"]  # the weights are in "model"
    host["total"] = sum(host.values())

    available = host_memory_available() if available is None else available
    usable = int(available * (1 - HOST_HEADROOM)) if available else None
    cache = boundary + captured
    spill = bool(recipe.needs_data and usable is not None and host["total"] > usable and cache)
    disk = {"checkpoint": checkpoint}
    if offload == "disk":
        disk["offload"] = model_bytes - in_memory
    if spill:
        disk["spilled_activations"] = cache
        notes.append(
            f"the activation cache ({cache / GIB:.1f} GiB) does not fit next to the model in host memory "
            f"({available / GIB:.1f} GiB available): it is spilled to memory-mapped files beside the output"
        )
        host["total"] -= cache
        host["activation_cache"] = host["captured_inputs"] = 0
    # Loading in another dtype than the checkpoint's: transformers reads each tensor in the saved
    # dtype (its file pages stay mapped) and casts it, which peaks at about the model in the saved
    # dtype twice over on top of the cast model (measured: 166M parameters, bfloat16 to float32,
    # 1.30 GB above the 0.66 GB model). Before calibration: only what exceeds that phase counts.
    if offload != "disk" and calibration_dtype != saved_dtype:
        load_copy = LOAD_COPIES * params * _dtype_bytes(saved_dtype)
        host["loading"] = max(0, load_copy - (host["total"] - host["runtime"] - host["model"]))
        host["total"] += host["loading"]
    if usable is not None and host["total"] > usable:
        notes.append(
            f"the model ({in_memory / GIB:.1f} GiB in {str(calibration_dtype).removeprefix('torch.')}) does not "
            f"fit in host memory ({available / GIB:.1f} GiB available): use --offload disk (--max-cpu-memory GiB)"
            + (" or --calibration-dtype bfloat16" if dtype_bytes > 2 else "")
        )
    disk["total"] = sum(disk.values())
    solves = sum(kinds.multiplicity(name) for name in targets.quantize) if gptq else 0
    return MemoryPlan(
        device=device,
        calibration_dtype=str(calibration_dtype).removeprefix("torch."),
        saved_dtype=str(saved_dtype).removeprefix("torch."),
        decoder_layers=kinds.layers,
        subgraphs=kinds.layers + 1,
        layer_solves=solves,
        tokens={"samples": len(lengths), "total": total_tokens, "max": longest, "source": source},
        per_gpu=per_gpu,
        host=host,
        disk=disk,
        host_available=available,
        spill=spill,
        fits=None if usable is None else host["total"] <= usable,
        notes=notes,
    )


def write_plan_json(path: Path, data: dict) -> None:
    """The dry run's plan as JSON (written beside and renamed)."""
    from quantkit.fsutil import write_file_atomic

    write_file_atomic(Path(path), json.dumps(data, indent=2, sort_keys=True) + "\n")
