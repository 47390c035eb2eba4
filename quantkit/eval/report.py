"""What ``quantkit eval`` leaves beside a checkpoint: ``eval.json`` and a section of its README.md.

Both are rewritten on every run: eval.json by a temporary file and a rename (never half-written),
the README section between two markers (replaced, not appended again; the rest of the card is
kept as it is).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from quantkit.fsutil import write_file_atomic

EVAL_FILE = "eval.json"
SECTION_START = "<!-- quantkit:eval:start -->"
SECTION_END = "<!-- quantkit:eval:end -->"


def write_atomic(path: Path, text: str) -> Path:
    """fsutil's one atomic file write, returning the path."""
    write_file_atomic(path, text)
    return Path(path)


def fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value != value:  # NaN
        return "nan"
    return f"{value:.5g}" if abs(value) < 1e6 else f"{value:.4e}"


def fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


def render_card_section(payload: dict) -> str:
    """The README section for one checkpoint, from its eval.json payload."""
    verdict = "**within**" if payload["passed"] else "**beyond**"
    if payload.get("error"):
        verdict = f"**not evaluated** ({payload['error']}), so not within"
    limit = f", at most {payload['limit']} documents per task" if payload.get("limit") else ""
    lines = [
        SECTION_START,
        "## Evaluation",
        "",
        f"lm-evaluation-harness {payload['harness'].get('lm_eval')} ({payload['backend']} backend{limit}), "
        f"this checkpoint against the original `{payload['original']}`. Recovery is quantized / original "
        "for metrics where higher is better and original / quantized where lower is better; the loss "
        f"is 100% - recovery. This checkpoint is {verdict} the allowed loss of {payload['max_loss_pct']}%.",
        "",
        "| task | metric | original | this checkpoint | recovery | within |",
        "|---|---|---|---|---|---|",
    ]
    for row in payload["rows"]:
        arrow = "↑" if row["higher_is_better"] else "↓"
        label = row["metric"] if row["filter"] == "none" else f"{row['metric']} ({row['filter']})"
        lines.append(
            f"| {row['task']} | {label} {arrow} | {fmt(row['original'])} | {fmt(row['quantized'])} | "
            f"{fmt_pct(row['recovery_pct'])} | {'yes' if row['within'] else 'no'} |"
        )
    data = payload.get("data") or {}
    if data.get("source"):
        lines += ["", f"quantkit's own tasks read text from {data['source']} (Python {data['python']})."]
    lines += ["", "Full results in `eval.json`; rerun with `quantkit eval`.", SECTION_END, ""]
    return "\n".join(lines)


def update_card(checkpoint: Path, section: str) -> Path:
    """Put ``section`` into the checkpoint's README.md: replace the previous one, else append."""
    from quantkit.export.card import update_card_section

    return update_card_section(checkpoint, SECTION_START, SECTION_END, section)


def strict_json(value):
    """NaN and infinities become null: eval.json stays JSON that every parser reads."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def write_results(checkpoint: Path, payload: dict) -> tuple[Path, Path]:
    """eval.json and the README section of one checkpoint."""
    checkpoint = Path(checkpoint)
    text = json.dumps(strict_json(payload), indent=2, default=str, allow_nan=False) + "\n"
    eval_path = write_atomic(checkpoint / EVAL_FILE, text)
    card_path = update_card(checkpoint, render_card_section(payload))
    return eval_path, card_path
