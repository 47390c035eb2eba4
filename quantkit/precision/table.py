"""The sensitivity table: one row per measured unit (a Linear, a fusion unit or a decoder block),
ranked, with what was measured and what it cost; JSON on disk."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quantkit.errors import InputError
from quantkit.fsutil import write_file_atomic

TABLE_VERSION = 1


@dataclass
class SensitivityRow:
    name: str  # the Linear, the fusion unit (``...qkv_proj``) or the decoder block
    layers: list[str]  # the Linear layers quantized together for this row
    params: int
    kl: float  # mean next-token KL(original || only this row quantized), nats per position
    top1: float | None  # fraction of scored positions whose top-1 token is unchanged (kl method)
    rel_logit_mse: float | None  # ||logits - original||^2 / ||original||^2 at the scored positions
    rank: int = 0

    @property
    def score(self) -> float:
        return self.kl


@dataclass
class SensitivityTable:
    model: str
    architecture: str
    scheme: dict  # preset + weight args the layers were fake-quantized with
    granularity: str  # layer | unit | block
    mode: str  # replay (cached block inputs) | full (whole forward per row)
    samples: int
    sample_ids: list[str]
    tokens: int
    positions: int  # scored positions, all samples
    rows: list[SensitivityRow]
    skipped: dict[str, str] = field(default_factory=dict)  # layer -> why not measured
    cost: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    method: str = "kl"  # kl: measured; fisher: second-order estimate from sampled-label gradients
    version: int = TABLE_VERSION

    def ranked(self) -> list[SensitivityRow]:
        return sorted(self.rows, key=lambda r: r.rank)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["rows"] = [asdict(row) for row in self.ranked()]
        return data

    def source_summary(self) -> dict:
        """What quantkit.json records about the ranking a mixed-precision plan used."""
        return {
            "model": self.model,
            "scheme": self.scheme,
            "granularity": self.granularity,
            "mode": self.mode,
            "samples": self.samples,
            "positions": self.positions,
            "metric": "mean next-token KL, one row quantized at a time (round-to-nearest)"
            + ("" if self.method == "kl" else ", Fisher estimate"),
            "method": self.method,
            "cost": self.cost,
        }


def save_table(table: SensitivityTable, path: Path) -> Path:
    write_file_atomic(Path(path), json.dumps(table.to_dict(), indent=2) + "\n")
    return Path(path)


def load_table(path: Path) -> SensitivityTable:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise InputError(
            f"cannot read the sensitivity table: {type(err).__name__}: {err}", path=path
        ) from None
    if not isinstance(data, dict) or data.get("version") != TABLE_VERSION or "rows" not in data:
        raise InputError("not a quantkit sensitivity table (version 1)", path=path)
    from pydantic import TypeAdapter, ValidationError

    try:  # every field of its type: a hand-edited table fails here, not in the ranking
        return TypeAdapter(SensitivityTable).validate_python(data, strict=False)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise InputError(
            f"malformed sensitivity table: field '{field}': {first['msg']}",
            path=path,
            hint="write it again with `quantkit sensitivity -o FILE`",
        ) from None


def format_table(table: SensitivityTable, top: int | None = 20) -> list[str]:
    """Plain-text lines: the ranked rows (the first ``top``) and the cost."""
    rows = table.ranked()
    shown = rows if top is None else rows[:top]
    width = max([len(r.name) for r in shown] + [5])
    lines = [f"{'rank':>4}  {'layer':<{width}}  {'params':>10}  {'KL':>10}  {'top-1':>6}  {'rel MSE':>9}"]
    for row in shown:
        top1 = "-" if row.top1 is None else f"{row.top1:.3f}"
        mse = "-" if row.rel_logit_mse is None else f"{row.rel_logit_mse:.2e}"
        lines.append(
            f"{row.rank:>4}  {row.name:<{width}}  {row.params:>10,}  {row.kl:>10.5f}  {top1:>6}  {mse:>9}"
        )
    if len(rows) > len(shown):
        lines.append(f"... {len(rows) - len(shown)} more rows in the JSON")
    for name, why in table.skipped.items():
        lines.append(f"not measured: {name}: {why}")
    return lines


# ---------------------------------------------------------------------- ranking fusion units

SHOWN = 12  # layers named in a message


def _union_groups(
    units: dict[str, list[str]], rows: list[tuple[list[str], float]]
) -> list[tuple[list[str], float]]:
    """Merge fusion units that one sensitivity row spans (a whole decoder block in block mode);
    returns (units, summed score) per merged group."""
    layer_unit = {layer: unit for unit, layers in units.items() for layer in layers}
    parent = {unit: unit for unit in units}

    def find(unit: str) -> str:
        while parent[unit] != unit:
            parent[unit] = parent[parent[unit]]
            unit = parent[unit]
        return unit

    for layers, _ in rows:
        owners = [find(layer_unit[layer]) for layer in layers if layer in layer_unit]
        for other in owners[1:]:
            parent[find(other)] = find(owners[0])
    scores: dict[str, float] = defaultdict(float)
    for layers, score in rows:
        owners = {find(layer_unit[layer]) for layer in layers if layer in layer_unit}
        for owner in owners:
            scores[owner] += score / len(owners)
    members: dict[str, list[str]] = defaultdict(list)
    for unit in units:
        members[find(unit)].append(unit)
    return [(group, scores.get(root, 0.0)) for root, group in members.items()]


def _sensitivity_rows(sensitivity, targets: list[str]) -> tuple[list[tuple[list[str], float]], dict]:
    table = sensitivity if isinstance(sensitivity, SensitivityTable) else load_table(sensitivity)
    measured = {layer for row in table.rows for layer in row.layers}
    skipped = set(table.skipped)
    missing = [name for name in targets if name not in measured and name not in skipped]
    if missing:
        raise InputError(
            f"the sensitivity table does not cover {len(missing)} targeted layer(s): {', '.join(missing[:SHOWN])}",
            hint="measure it on this model with `quantkit sensitivity` (same adapter)",
        )
    stray = sorted(measured - set(targets))
    if stray:
        raise InputError(
            f"the sensitivity table names {len(stray)} layer(s) this model does not target: {', '.join(stray[:SHOWN])}",
            hint="it was measured on another model or adapter",
        )
    rows = [(list(row.layers), float(row.score)) for row in table.rows]
    return rows, table.source_summary()


def ranked_units(
    sensitivity, names: list[str], units: dict[str, list[str]]
) -> tuple[list[tuple[list[str], float]], dict[str, float], dict[str, int], dict]:
    """A sensitivity table (or its JSON path) over the targeted ``names``, as the fusion ``units``
    it ranks: (groups of units with their summed score, score per unit, rank per unit with 1 the
    most sensitive, where the table came from)."""
    rows, source = _sensitivity_rows(sensitivity, names)
    order = _union_groups(units, rows)
    scores: dict[str, float] = {}
    ranks: dict[str, int] = {}
    for group, score in order:
        for unit in group:
            scores[unit] = score / len(group)
    for rank, (group, _) in enumerate(sorted(order, key=lambda g: -g[1]), start=1):
        for unit in group:
            ranks[unit] = rank
    return order, scores, ranks, source
