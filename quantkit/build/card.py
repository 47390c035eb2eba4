"""The build section of each candidate's model card: what the gate made of it, for every target
that kept or tried it."""

from __future__ import annotations

from pathlib import Path

from quantkit.build.judge import budget_text, step_interval, worst_interval_text
from quantkit.build.record import DRIFT_LIMITS, LOSS_DEFINITION, ORDER_RULE, TargetBuild
from quantkit.eval.gate import DECISION

_CARD_START, _CARD_END = "<!-- quantkit:build:start -->", "<!-- quantkit:build:end -->"


def card_section(checkpoint: str, targets: list[TargetBuild], drift_reported: list[str] = ()) -> str:
    """The card's build section: each target that kept this checkpoint (with its chain), and each
    that tried it and went on (why); the drift limits it broke without them being judged."""
    kept = [t for t in targets if t.checkpoint == checkpoint]
    verdict = "kept this checkpoint" if kept else "did not keep this checkpoint for any target"
    lines = [
        _CARD_START,
        "## Build: accuracy gate",
        "",
        f"`quantkit build` {verdict}. Loss: {LOSS_DEFINITION}",
        "",
        f"Decision: {DECISION}",
        "",
        f"Candidates: {ORDER_RULE}.",
        "",
    ]
    for target in kept:
        lines += [f"Target `{target.name}`: {worst_interval_text(target.chain[-1], target)}.", ""]
        lines += [
            f"Target `{target.name}` (budget {budget_text(target)} per task), candidates in the order tried:",
            "",
            "| # | recipe | avg bits | size | worst task | loss [95% interval] (n) | its KL / entropy | "
            "verdict | tried because |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for index, step in enumerate(target.chain, 1):
            lines.append(
                f"| {index} | {step.recipe} | {_fmt_bits(step.avg_bits)} | {_fmt_size(step.size_ratio)} | "
                f"{step.worst_task or '-'} | {step_interval(step)} | "
                f"{_fmt_percent(step.kl_losses.get(step.worst_task or ''))} | {step.verdict} | {step.why} |"
            )
        lines.append("")
        if target.chain[-1].detail:  # the kept one's notes (tasks below the accuracy floor, ...)
            lines += [f"Note: {target.chain[-1].detail}.", ""]
        if target.chain[-1].unmeasured:
            lines += [
                f"Tasks of the calibration set not measured: {', '.join(target.chain[-1].unmeasured)}.",
                "",
            ]
    for target in targets:
        for step in target.chain:
            if step.checkpoint == checkpoint and target.status == "stale" and step.verdict == "kept":
                lines += [
                    f"Target `{target.name}` kept an earlier build of this folder, since rebuilt: its "
                    "record is stale until it is built again.",
                    "",
                ]
            elif step.checkpoint == checkpoint and step.verdict != "kept":
                lines += [
                    f"Not kept for target `{target.name}` (budget {budget_text(target)}): {step.detail}.",
                    "",
                ]
    if drift_reported:
        lines += [
            f"Drift limits broken, reported and not judged (`--drift-limits report`: "
            f"{DRIFT_LIMITS['report']}): {'; '.join(drift_reported)}.",
            "",
        ]
    lines += ["The whole chain is in the build folder's `build.json`.", _CARD_END, ""]
    return "\n".join(lines)


def update_card(checkpoint: Path, section: str) -> None:
    from quantkit.export.card import update_card_section

    update_card_section(checkpoint, _CARD_START, _CARD_END, section)


def _fmt_bits(bits: float | None) -> str:
    return "-" if bits is None else f"{bits:g}"


def _fmt_size(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}x"


def _fmt_percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}%"
