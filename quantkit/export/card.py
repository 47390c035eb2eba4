"""The README.md model card written beside a quantized checkpoint, from its quantkit.json."""

from __future__ import annotations

from collections import Counter


def _group_table(metadata: dict) -> list[str]:
    lines = ["| part | quantized Linear layers | kept in 16-bit |", "|---|---|---|"]
    for group, row in metadata["modules"]["counts"].items():
        if row["quantized"] or row["kept"]:
            lines.append(f"| {group.replace('_', ' ')} | {row['quantized']} | {row['kept']} |")
    return lines


def _kept_reasons(metadata: dict) -> list[str]:
    reasons = Counter(metadata["modules"]["kept"].values())
    return [f"- {reason}: {count} Linear layer(s)" for reason, count in reasons.most_common()]


def _calibration(metadata: dict) -> list[str]:
    calib = metadata["calibration"]
    if not calib.get("needed"):
        return ["Data-free recipe: no calibration samples were used."]
    lines = [
        f"- samples used: {calib['samples_used']} ({calib['tokens']} tokens), "
        f"pipeline `{calib['pipeline']}`, calibrated in {metadata['dtypes']['calibration']}",
    ]
    if calib.get("by_label"):
        parts = ", ".join(f"{label}: {n}" for label, n in sorted(calib["by_label"].items()))
        lines.append(f"- samples per stratum: {parts}")
    if calib.get("set"):
        set_info = calib["set"]
        if "hash" in set_info:
            lines.append(f"- calibration set hash: `{set_info['hash']}`")
    if calib.get("dropped"):
        lines.append(f"- samples dropped: {len(calib['dropped'])} (reasons in quantkit.json)")
    towers = calib.get("tower_calls") or {}
    if towers:
        lines.append(
            "- tower forward calls during calibration: " + ", ".join(f"{k} {v}" for k, v in towers.items())
        )
    return lines


def render_model_card(metadata: dict) -> str:
    recipe = metadata["recipe"]
    scheme = metadata["resolved_scheme"]
    lines = [
        f"# {metadata['name']}",
        "",
        f"Quantized with quantkit from `{metadata['source']['model']}` "
        f"({metadata['source']['architecture']}) using the **{recipe['name']}** recipe.",
        "",
        "## Format",
        "",
        f"- compressed-tensors format `{metadata['checkpoint_format']}`, scheme `{scheme['preset']}`"
        + (
            f", GPTQ (actorder {recipe['actorder']}, dampening {recipe['dampening_frac']})"
            if recipe["method"] == "gptq"
            else ""
        )
        + (
            f", SmoothQuant strength {recipe['smoothquant_strength']}"
            if recipe.get("smoothquant_strength")
            else ""
        )
        + (", FP8 KV cache" if recipe.get("kv_cache_fp8") else ""),
        f"- intended hardware: {recipe['hardware']}",
        f"- unquantized tensors stored as {metadata['dtypes']['saved']}",
        "",
        "Only the language model's Linear layers are quantized; everything else keeps its original precision.",
        "",
        *_group_table(metadata),
        "",
        "Kept in full precision:",
        "",
        *_kept_reasons(metadata),
        "",
        "## Calibration",
        "",
        *_calibration(metadata),
        "",
        "## Serving",
        "",
        "```",
        "vllm serve <this folder>",
        "```",
        "",
        "vLLM reads `quantization_config` from config.json. Processor, tokenizer, chat template and",
        "generation config are copied unchanged from the source model.",
        "",
        "## Provenance",
        "",
        "Library versions: " + ", ".join(f"{k} {v}" for k, v in metadata["libraries"].items() if v) + ".",
        f"Wall time {metadata['run']['wall_time_s']} s, peak RSS {metadata['run']['peak_rss_mb']} MB.",
        "Full details in `quantkit.json`.",
        "",
    ]
    return "\n".join(lines)
