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
    weights = calib.get("token_weights")
    if weights:
        modality, role = (
            ", ".join(f"{k} {v:g}" for k, v in weights[g].items()) for g in ("modality", "role")
        )
        lines.append(
            f"- GPTQ token weights (weighted Hessian): modality {modality}; role {role}; "
            f"task tier {'on' if weights['task_tier'] else 'off'}; {weights['zero_weight_tokens']} of "
            f"{weights['tokens']} tokens at weight 0, mean weight {weights['mean_weight']}"
        )
    return lines


def _precision(metadata: dict) -> list[str]:
    """Group size, the layers kept at 8 bits and why, and the average bits (W4A16 family)."""
    precision = metadata.get("precision")
    if not precision:
        return []
    low = f"{precision['low_scheme']}"
    group = precision.get("group_size")
    lines = [
        "## Precision",
        "",
        f"- 4-bit layers: {low}, group size {group} (the largest of "
        f"{', '.join(map(str, precision['candidates']))} dividing every targeted layer's in-features)"
        if group
        else "- no layer takes a 4-bit group size",
        f"- 8-bit layers: {len(precision['high'])} Linear layer(s) in {precision['high_scheme']}, "
        f"{precision['params_high']:,} of {precision['params_total']:,} weights",
        f"- average: {precision['avg_bits']:.3f} bits per weight ({precision['budget_counts']}); "
        f"{precision['effective_bits']:.3f} counting scales and zero points",
    ]
    experts = precision.get("symmetric_experts") or []
    if group and not precision.get("symmetric", True):
        lines.append(
            "- zero points: one per group on the 4-bit layers"
            + (
                f", except {len(experts)} MoE expert layer(s) kept symmetric (transformers cannot reload "
                "asymmetric experts; vLLM's CPU backend has no kernel for them)"
                if experts
                else ""
            )
        )
    if precision.get("avg_bits_requested") is not None:
        lines.append(
            f"- budget: --avg-bits {precision['avg_bits_requested']} (met: "
            f"{'yes' if precision['avg_bits'] <= precision['avg_bits_requested'] + 1e-9 else 'no'}); layers ranked by "
            "next-token KL when quantized alone"
            + (
                " (second-order estimate)"
                if (precision.get("sensitivity") or {}).get("method") == "fisher"
                else ""
            )
            + ", promoted "
            + (
                "by KL per promoted bit"
                if precision.get("selection") == "density"
                else "most sensitive first"
            )
        )
    chosen = [u for u in precision["units"] if u["bits"] == 8]
    if chosen:
        lines += ["", "| layer (as vLLM fuses it) | weights | why 8 bits |", "|---|---|---|"]
        lines += [f"| `{u['unit']}` | {u['params']:,} | {u['reason']} |" for u in chosen]
    for note in precision.get("notes") or []:
        lines.append(f"- note: {note}")
    return [*lines, ""]


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
        *_precision(metadata),
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
