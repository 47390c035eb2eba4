"""The README.md model card written beside a quantized checkpoint, from its quantkit.json."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path, PurePath

import yaml

from quantkit.recipes.schemes import SCHEMES

CARD_FILE = "README.md"


def update_card_section(checkpoint: Path, start: str, end: str, section: str) -> Path:
    """Put ``section`` (which begins with ``start`` and ends with ``end``) into the checkpoint's
    README.md: in place of the previous one between those markers, else appended. Later stages
    (eval, build) add their sections this way; the card's own text is left as written."""
    from quantkit.fsutil import write_file_atomic

    path = Path(checkpoint) / CARD_FILE
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    previous = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if previous.search(old):
        new = previous.sub(lambda _: section, old, count=1)
    else:
        new = (old.rstrip("\n") + "\n\n" if old.strip() else "") + section
    write_file_atomic(path, new)
    return path


# The Hub's pipeline tag by what the model takes besides text.
PIPELINE_TAGS = {(False, False): "text-generation", (True, False): "image-text-to-text"}
_HUB_CACHE = re.compile(r"models--([^/]+?)--([^/]+)")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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


def base_model_id(source: str) -> tuple[str, bool]:
    """The Hub id of the source model and whether it is one: a Hub cache snapshot path
    (``.../models--Org--Name/snapshots/...``) or a bare ``org/name``; else the folder's name."""
    found = _HUB_CACHE.search(source)
    if found:
        return f"{found.group(1)}/{found.group(2)}", True
    if _HUB_ID.match(source) and not source.startswith(("./", "../")):
        return source, True
    return PurePath(source).name or source, False


def front_matter(metadata: dict) -> dict:
    """The YAML header the Hugging Face Hub reads (base model, relation, library, tags, pipeline)."""
    adapter = metadata.get("adapter") or {}
    scheme = metadata["resolved_scheme"]
    base, _ = base_model_id(metadata["source"]["model"])
    tags = ["quantkit", "compressed-tensors", scheme["preset"].lower(), metadata["recipe"]["name"]]
    if "gptq" in scheme:
        tags.append("gptq")
    return {
        "base_model": base,
        "base_model_relation": "quantized",
        "library_name": "transformers",
        "pipeline_tag": PIPELINE_TAGS.get(
            (bool(adapter.get("vision_tower")), bool(adapter.get("audio_tower"))), "any-to-any"
        ),
        "tags": list(dict.fromkeys(tags)),
    }


def render_front_matter(metadata: dict) -> str:
    return "---\n" + yaml.safe_dump(front_matter(metadata), sort_keys=False) + "---\n"


def _serving(preset: str) -> str:
    """The card's line on what serves the scheme (the scheme table's text)."""
    text = SCHEMES[preset].card_serving if preset in SCHEMES else ""
    return f"Kernels: {text}." if text else ""


def _algorithms(scheme: dict) -> str:
    """What the resolved scheme (quantkit.json) ran besides rounding, as the card's format line says it."""
    gptq, smoothquant = scheme.get("gptq"), scheme.get("smoothquant")
    return (f", GPTQ (actorder {gptq['actorder']}, dampening {gptq['dampening_frac']})" if gptq else "") + (
        f", SmoothQuant strength {smoothquant['strength']}" if smoothquant else ""
    )


def render_model_card(metadata: dict) -> str:
    recipe = metadata["recipe"]
    scheme = metadata["resolved_scheme"]
    _, on_hub = base_model_id(metadata["source"]["model"])
    lines = [
        render_front_matter(metadata),
        f"# {metadata['name']}",
        "",
        f"Quantized with quantkit from `{metadata['source']['model']}` "
        f"({metadata['source']['architecture']}) using the **{recipe['name']}** recipe.",
        "",
        "## Format",
        "",
        f"- compressed-tensors format `{metadata['checkpoint_format']}`, scheme `{scheme['preset']}`"
        + _algorithms(scheme)
        # the observer the recipe chose (the resolved scheme names the library's default too)
        + (f", weight observer {recipe['weight_observer']}" if recipe.get("weight_observer") else "")
        + (", FP8 KV cache" if scheme.get("kv_cache_scheme") else ""),
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
        _serving(scheme["preset"]),
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
        *(
            []
            if on_hub
            else [
                "",
                "The source was a local folder: set `base_model` above to its Hub id before uploading.",
            ]
        ),
        "",
    ]
    return "\n".join(lines)
