"""Per-layer sensitivity: how far the model's next-token distribution moves when only one layer
(or one fusion unit, or one decoder block) is quantized.

Method. The reference run (one forward per batch of samples, unquantized) stores the next-token
log-probabilities at up to ``max_positions`` evenly spaced positions per sample, and, through
hooks, every decoder block's input, its other call arguments (masks, rotary embeddings) and
whatever the model adds between blocks (Qwen3-VL's deepstack features, as a difference). For
each row of the table the row's weights are replaced by their round-to-nearest
quantize-dequantize (quantkit.sensitivity.fakequant), the blocks from the row's own block
onwards are replayed from the cached input, the final norm and head run on the scored positions
only, the KL against the reference is taken, and the weights are restored bit for bit.

Cost. Rows x samples forward passes, each from the row's block to the end: about half a forward
on average, plus the head on the scored positions only. Text samples of equal length run as one
batch. A replay is checked against the reference before it is trusted (from block 0, nothing
quantized: same logits); a model whose blocks cannot be replayed that way (state carried between
blocks other than the hidden states) falls back to whole forwards (``mode: full``), about twice
the cost. ``granularity="unit"`` measures fused units (q/k/v, gate/up) together and
``granularity="block"`` whole decoder blocks: 7x and ~30x fewer rows on a Llama-style model,
for large models.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from quantkit.features.processor import FeatureRow, collate_one
from quantkit.precision.table import SensitivityRow
from quantkit.sensitivity.fakequant import fake_quantized

GRANULARITIES = ("layer", "unit", "block")
REPLAY_TOLERANCE = 1e-3  # max |replayed - reference| logit, relative to the largest reference logit


@dataclass
class Batch:
    inputs: dict
    positions: torch.Tensor  # scored positions (same for every row of the batch)
    rows: int
    tokens: int
    # replay cache, filled by the reference run
    block_inputs: list[torch.Tensor] = field(default_factory=list)
    block_args: list[tuple] = field(default_factory=list)
    block_kwargs: list[dict] = field(default_factory=list)
    deltas: list[torch.Tensor | None] = field(default_factory=list)
    ref_logits: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None


@dataclass
class MeasuredUnit:
    name: str
    layers: list[str]
    block: int | None  # index of the decoder block to replay from; None: whole forward


def score_positions(tokens: int, limit: int | None) -> torch.Tensor:
    """Up to ``limit`` evenly spaced positions that predict a next token (0 .. tokens-2)."""
    last = max(tokens - 1, 1)
    if limit is None or limit >= last:
        return torch.arange(last)
    return torch.linspace(0, last - 1, limit).round().long().unique()


def make_batches(rows: list[FeatureRow], *, max_positions: int | None, batch_size: int) -> list[Batch]:
    """Text-only rows of equal length and keys are stacked (up to ``batch_size``); rows with media
    run alone (their processor outputs do not stack)."""
    groups: dict[tuple, list[FeatureRow]] = {}
    singles: list[list[FeatureRow]] = []
    for row in rows:
        tensors = all(isinstance(v, torch.Tensor) or v is None for v in row.inputs.values())
        if row.has_vision or row.has_audio or not tensors:
            singles.append([row])
            continue
        keys = tuple(sorted(k for k, v in row.inputs.items() if v is not None))
        groups.setdefault((row.tokens, keys), []).append(row)
    chunks = [
        group[i : i + batch_size] for group in groups.values() for i in range(0, len(group), batch_size)
    ]
    batches = []
    for chunk in [*chunks, *singles]:
        keys = sorted(set().union(*(row.inputs for row in chunk)))
        collate = collate_one(keys, keep_none=False)
        parts = [collate([row.inputs]) for row in chunk]
        if len(parts) == 1:
            inputs = parts[0]
        else:
            inputs = {key: torch.cat([part[key] for part in parts], dim=0) for key in parts[0]}
        tokens = chunk[0].tokens
        batches.append(Batch(inputs, score_positions(tokens, max_positions), len(chunk), tokens * len(chunk)))
    return batches


def _hidden(output):
    return output[0] if isinstance(output, tuple) else output


class Replayer:
    """Decoder blocks, final norm and head of a model, and the per-batch caches to replay them."""

    def __init__(
        self, model: torch.nn.Module, blocks: dict[str, torch.nn.Module], norm: torch.nn.Module | None
    ):
        self.model = model
        self.names = list(blocks)
        self.blocks = list(blocks.values())
        self.norm = norm
        self.head = model.get_output_embeddings()
        self.ok = self.head is not None
        self.reason = "" if self.ok else "the model has no output embeddings (head) to apply"

    def reference(self, batch: Batch) -> None:
        """Run the unquantized model once; keep the scored log-probs and the replay cache."""
        calls: list[int] = []
        inputs: dict[int, torch.Tensor] = {}
        args: dict[int, tuple] = {}
        kwargs: dict[int, dict] = {}
        outputs: dict[int, torch.Tensor] = {}
        head_input: list[torch.Tensor] = []
        handles = []

        def pre(index):
            def hook(module, a, kw):
                calls.append(index)
                if a:
                    inputs[index], args[index], kwargs[index] = a[0], tuple(a[1:]), dict(kw)
                else:
                    rest = dict(kw)
                    inputs[index] = rest.pop("hidden_states")
                    args[index], kwargs[index] = (), rest

            return hook

        def post(index):
            def hook(module, a, kw, output):
                outputs[index] = _hidden(output)

            return hook

        for index, block in enumerate(self.blocks):
            handles.append(block.register_forward_pre_hook(pre(index), with_kwargs=True))
            handles.append(block.register_forward_hook(post(index), with_kwargs=True))
        if self.head is not None:
            handles.append(self.head.register_forward_pre_hook(lambda m, a: head_input.append(a[0])))
        try:
            with torch.no_grad():
                logits = self.model(**batch.inputs, use_cache=False).logits
        finally:
            for handle in handles:
                handle.remove()
        scored = logits[:, batch.positions].float()
        batch.ref_logits = scored
        batch.ref_logp = torch.log_softmax(scored, dim=-1)
        if not self.ok:
            return
        if calls != list(range(len(self.blocks))):
            self._fail(f"decoder blocks ran in order {calls[:8]}..., not once each in order")
            return
        if len(head_input) != 1 or head_input[0].shape[1] != outputs[len(self.blocks) - 1].shape[1]:
            self._fail("the head did not run once on every position")
            return
        batch.block_inputs = [inputs[i] for i in range(len(self.blocks))]
        batch.block_args = [args[i] for i in range(len(self.blocks))]
        batch.block_kwargs = [kwargs[i] for i in range(len(self.blocks))]
        deltas: list[torch.Tensor | None] = []
        for i in range(len(self.blocks)):
            following = inputs[i + 1] if i + 1 < len(self.blocks) else None
            if following is None:
                deltas.append(None)
            elif following.shape != outputs[i].shape:
                self._fail(f"block {i + 1}'s input differs in shape from block {i}'s output")
                return
            else:
                delta = following - outputs[i]
                deltas.append(delta if bool(delta.abs().max() > 0) else None)
        batch.deltas = deltas
        with torch.no_grad():
            tail = (
                self.norm(outputs[len(self.blocks) - 1])
                if self.norm is not None
                else outputs[len(self.blocks) - 1]
            )
        if not torch.allclose(tail, head_input[0], rtol=1e-5, atol=1e-5):
            self._fail("the head's input is not the final norm of the last block's output")

    def _fail(self, reason: str) -> None:
        self.ok, self.reason = False, reason

    def logits(self, batch: Batch, start: int | None) -> torch.Tensor:
        """Scored logits, replaying from block ``start`` (None, or replay unusable: whole forward)."""
        with torch.no_grad():
            if start is None or not self.ok:
                return self.model(**batch.inputs, use_cache=False).logits[:, batch.positions].float()
            hidden = batch.block_inputs[start]
            for i in range(start, len(self.blocks)):
                hidden = _hidden(self.blocks[i](hidden, *batch.block_args[i], **batch.block_kwargs[i]))
                if batch.deltas[i] is not None:
                    hidden = hidden + batch.deltas[i]
            hidden = hidden[:, batch.positions]
            if self.norm is not None:
                hidden = self.norm(hidden)
            return self.head(hidden).float()

    def verify(self, batch: Batch) -> None:
        """A replay from block 0 with nothing changed must give the reference logits."""
        if not self.ok:
            return
        replayed = self.logits(batch, 0)
        scale = float(batch.ref_logits.abs().max()) or 1.0
        error = float((replayed - batch.ref_logits).abs().max()) / scale
        if error > REPLAY_TOLERANCE:
            self._fail(f"replaying the blocks from cached inputs is off by {error:.2e} (relative)")


def find_norm(model: torch.nn.Module, root: str) -> torch.nn.Module | None:
    """The language model's final norm (``<root>.norm``), where it has one."""
    for name in (
        f"{root}.norm" if root else "norm",
        f"{root}.final_layernorm" if root else "final_layernorm",
    ):
        try:
            return model.get_submodule(name)
        except AttributeError:
            continue
    return None


def block_of(name: str, block_names: list[str]) -> int | None:
    for index, block in enumerate(block_names):
        if name.startswith(block + "."):
            return index
    return None


def measurement_units(names: list[str], block_names: list[str], granularity: str) -> list[MeasuredUnit]:
    from quantkit.precision.mixed import fusion_units

    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}")
    if granularity == "layer":
        groups = {name: [name] for name in names}
    elif granularity == "unit":
        groups = fusion_units(names)
    else:
        groups = {}
        for name in names:
            index = block_of(name, block_names)
            groups.setdefault(block_names[index] if index is not None else name, []).append(name)
    units = []
    for unit, layers in groups.items():
        blocks = [block_of(layer, block_names) for layer in layers]
        start = None if any(b is None for b in blocks) else min(blocks)
        units.append(MeasuredUnit(unit, layers, start))
    return units


def _kl_stats(logits: torch.Tensor, batch: Batch) -> tuple[float, float, float, float]:
    """(sum of KL over positions, positions with the same top-1, squared error, squared reference)."""
    logp = torch.log_softmax(logits, dim=-1)
    ref_logp = batch.ref_logp
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
    same = (logits.argmax(-1) == batch.ref_logits.argmax(-1)).sum()
    error = (logits - batch.ref_logits).pow(2).sum()
    norm = batch.ref_logits.pow(2).sum()
    return float(kl.sum()), float(same), float(error), float(norm)


def measure(
    model: torch.nn.Module,
    rows: list[FeatureRow],
    layer_args: dict,
    *,
    blocks: dict[str, torch.nn.Module],
    root: str,
    granularity: str = "layer",
    max_positions: int | None = 128,
    batch_size: int = 8,
    replay: bool = True,
    on_unit: Callable[[], None] | None = None,
) -> tuple[list[SensitivityRow], dict, str, list[str]]:
    """Measure every unit of ``layer_args`` (Linear name -> QuantizationArgs); returns the ranked
    rows, the cost, the mode (replay / full) and notes. ``replay=False`` forces whole forwards."""
    started = time.perf_counter()
    batches = make_batches(rows, max_positions=max_positions, batch_size=batch_size)
    replayer = Replayer(model, blocks, find_norm(model, root))
    for batch in batches:
        replayer.reference(batch)
    replayer.verify(batches[0])
    if not replay:
        replayer._fail("replay turned off")
    notes = []
    if not replayer.ok:
        notes.append(f"whole forward per row: {replayer.reason}")
        for batch in batches:  # free the unusable cache
            batch.block_inputs, batch.block_args, batch.block_kwargs, batch.deltas = [], [], [], []
    reference_s = time.perf_counter() - started
    units = measurement_units(list(layer_args), list(blocks), granularity)
    positions = sum(int(b.positions.numel()) * b.rows for b in batches)
    results = []
    block_passes = 0
    clock = time.perf_counter()
    for unit in units:
        kl = same = error = norm = 0.0
        with fake_quantized(model, {name: layer_args[name] for name in unit.layers}):
            for batch in batches:
                start = unit.block if replayer.ok else None
                stats = _kl_stats(replayer.logits(batch, start), batch)
                kl, same, error, norm = kl + stats[0], same + stats[1], error + stats[2], norm + stats[3]
                block_passes += batch.rows * (len(blocks) - (start or 0))
        params = sum(model.get_submodule(n).weight.numel() for n in unit.layers)
        results.append(
            SensitivityRow(
                name=unit.name,
                layers=list(unit.layers),
                params=int(params),
                kl=kl / positions,
                top1=same / positions,
                rel_logit_mse=error / norm if norm else 0.0,
            )
        )
        if on_unit:
            on_unit()
    for rank, row in enumerate(sorted(results, key=lambda r: (-r.kl, r.name)), start=1):
        row.rank = rank
    samples = sum(b.rows for b in batches)
    cost = {
        "positions": positions,
        "rows_measured": len(units),
        "samples": samples,
        "batches": len(batches),
        "forward_passes": len(units) * samples,
        "forward_pass_equivalents": round(block_passes / max(len(blocks), 1), 1),
        "reference_passes": samples,
        "reference_s": round(reference_s, 2),
        "measure_s": round(time.perf_counter() - clock, 2),
        "s_per_row": round((time.perf_counter() - clock) / max(len(units), 1), 3),
    }
    return results, cost, "replay" if replayer.ok else "full", notes


def _without_weight_gradients(function):
    """Run ``function(model, ...)`` with the model's parameters frozen: gradients reach the
    activations only, never the weights; the flags are restored afterwards."""

    @functools.wraps(function)
    def wrapper(model: torch.nn.Module, *args, **kwargs):
        trainable = [p for p in model.parameters() if p.requires_grad]
        for parameter in trainable:
            parameter.requires_grad_(False)
        try:
            return function(model, *args, **kwargs)
        finally:
            for parameter in trainable:
                parameter.requires_grad_(True)

    return wrapper


@_without_weight_gradients
def estimate_fisher(
    model: torch.nn.Module,
    rows: list[FeatureRow],
    layer_args: dict,
    *,
    blocks: dict[str, torch.nn.Module],
    granularity: str = "layer",
    max_positions: int | None = 128,
    batch_size: int = 8,
    draws: int = 8,
    seed: int = 0,
    on_unit: Callable[[], None] | None = None,
) -> tuple[list[SensitivityRow], dict, str, list[str]]:
    """The same KL, estimated to second order for every row at once (``method="fisher"``).

    For a small weight change the next-token KL is ``1/2 dz^T F dz`` with F the softmax Fisher
    ``diag(p) - p p^T``. Sampling each scored position's token from the model's own distribution
    and back-propagating the summed log-probability gives, for every Linear, the gradient ``g`` at
    its output; with ``dy = x (Q(W) - W)^T`` the change quantizing it makes there, ``<g, dy>^2``
    is an unbiased estimate of the summed ``dz^T F dz`` of that sample (the positions' labels are
    independent, so cross terms vanish in expectation). ``draws`` label draws per batch share one
    forward. Cost: one forward and ``draws`` backward passes per batch for all rows together
    (about 1 + 2 x draws forwards), instead of rows x samples partial forwards; the estimate is
    noisy (relative error about sqrt(2 / (samples x draws))) and second-order only.
    """
    from quantkit.sensitivity.fakequant import qdq_weight

    started = time.perf_counter()
    batches = make_batches(rows, max_positions=max_positions, batch_size=batch_size)
    units = measurement_units(list(layer_args), list(blocks), granularity)
    generator = torch.Generator().manual_seed(seed)
    squares = {unit.name: 0.0 for unit in units}
    positions = 0
    current: dict[str, torch.Tensor] = {}  # layer -> <g, dy> per sample, this draw

    def attach(name: str, args):
        def hook(module, inputs, output):
            with torch.no_grad():
                delta = qdq_weight(module.weight, args) - module.weight
                change = torch.nn.functional.linear(inputs[0].detach(), delta)

            def on_grad(grad):
                dims = tuple(range(1, grad.dim()))
                current[name] = current.get(name, 0) + (grad * change).sum(dim=dims)

            if output.requires_grad:
                output.register_hook(on_grad)

        return hook

    for batch in batches:
        handles = []
        for name, args in layer_args.items():
            handles.append(model.get_submodule(name).register_forward_hook(attach(name, args)))
        embeddings = model.get_input_embeddings()
        handles.append(embeddings.register_forward_hook(lambda m, i, o: o.requires_grad_(True)))
        try:
            with torch.enable_grad():
                logits = model(**batch.inputs, use_cache=False).logits[:, batch.positions].float()
                logp = torch.log_softmax(logits, dim=-1)
                probs = logp.detach().exp().reshape(-1, logp.shape[-1])
                for draw in range(draws):
                    labels = torch.multinomial(probs, 1, generator=generator).reshape(logp.shape[:-1])
                    current.clear()
                    logp.gather(-1, labels[..., None]).sum().backward(retain_graph=draw + 1 < draws)
                    for unit in units:
                        total = sum(current.get(layer, 0) for layer in unit.layers)
                        squares[unit.name] += float((torch.as_tensor(total) ** 2).sum()) / draws
        finally:
            for handle in handles:
                handle.remove()
        positions += int(batch.positions.numel()) * batch.rows
    results = []
    for unit in units:
        params = sum(model.get_submodule(n).weight.numel() for n in unit.layers)
        results.append(
            SensitivityRow(
                name=unit.name,
                layers=list(unit.layers),
                params=int(params),
                kl=0.5 * squares[unit.name] / positions,
                top1=None,
                rel_logit_mse=None,
            )
        )
        if on_unit:
            on_unit()
    for rank, row in enumerate(sorted(results, key=lambda r: (-r.kl, r.name)), start=1):
        row.rank = rank
    samples = sum(b.rows for b in batches)
    elapsed = time.perf_counter() - started
    cost = {
        "positions": positions,
        "rows_measured": len(units),
        "samples": samples,
        "batches": len(batches),
        "draws": draws,
        "forward_passes": len(batches),
        "backward_passes": len(batches) * draws,
        "forward_pass_equivalents": round(samples * (1 + 2 * draws), 1),
        "reference_passes": 0,
        "reference_s": 0.0,
        "measure_s": round(elapsed, 2),
        "s_per_row": round(elapsed / max(len(units), 1), 3),
    }
    return results, cost, "fisher", [f"Fisher estimate: {draws} label draws per batch, second order"]
