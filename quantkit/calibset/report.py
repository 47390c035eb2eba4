"""What a calibration set holds, by task, tier, modality and bucket: for report.json, report.md and
the table `quantkit calibrate` prints."""

from __future__ import annotations

from collections import Counter
from operator import attrgetter, itemgetter
from pathlib import Path

from quantkit.pool import PoolReadResult, PoolRecord
from quantkit.pool.record import stratum_name
from quantkit.taxonomy import Taxonomy, task_lookup

_KEY = attrgetter("task", "modality", "bucket")  # what a stratum is made of


def _stratum_name(key: tuple[str, str, str]) -> str:
    """PoolRecord.stratum for a (task, modality, bucket) key."""
    return stratum_name(*key)


def _breakdown(pool: Counter, selected: Counter, label, total: int) -> list[dict]:
    """Pool and selected counts by ``label(key)``, from counts by (task, modality, bucket)."""
    in_pool, chosen = Counter(), Counter()
    for key, count in pool.items():
        in_pool[label(key)] += count
    for key, count in selected.items():
        chosen[label(key)] += count
    total = max(1, total)
    return [
        {
            "name": name,
            "pool": in_pool[name],
            "selected": chosen[name],
            "share": round(chosen[name] / total, 4),
        }
        for name in sorted(in_pool)
    ]


def _stats(values: list[int]) -> dict:
    ordered = sorted(values)

    def pct(p: float) -> int:
        return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]

    return {
        "min": ordered[0],
        "mean": round(sum(ordered) / len(ordered), 1),
        "p50": pct(0.5),
        "p95": pct(0.95),
        "max": ordered[-1],
        "total": sum(ordered),
    }


def summarize(
    *,
    taxonomy: Taxonomy,
    pool: PoolReadResult,
    usable: list[PoolRecord],
    selected: list[PoolRecord],
    tokens: dict[str, int] | None,
    too_long: list[PoolRecord],
    task_assignment: dict | None = None,
) -> dict:
    """The report's figures. ``task_assignment`` is ``TaskAssigner.summary()`` (how each record
    got its task), kept as ``report["task_assignment"]`` and rendered in report.md."""
    # One pass over the records: everything below is counted by (task, modality, bucket).
    pool_keys, selected_keys = Counter(map(_KEY, usable)), Counter(map(_KEY, selected))
    strata = {key: _stratum_name(key) for key in pool_keys.keys() | selected_keys.keys()}
    tasks = []
    by_task_pool, by_task_sel = Counter(), Counter()
    for key, count in pool_keys.items():
        by_task_pool[key[0]] += count
    for key, count in selected_keys.items():
        by_task_sel[key[0]] += count
    total = max(1, len(selected))
    for task in taxonomy.tasks:
        tasks.append(
            {
                "name": task.name,
                "tier": task.tier,
                "weight": taxonomy.weight(task),
                "pool": by_task_pool[task.name],
                "selected": by_task_sel[task.name],
                "share": round(by_task_sel[task.name] / total, 4),
            }
        )
    pool_strata = {strata[key] for key in pool_keys}
    chosen_strata = {strata[key] for key in selected_keys}
    skipped = Counter(s.reason.split(":")[0] for s in pool.skipped)
    tiers = {name: task.tier for name, task in task_lookup(taxonomy).items()}
    n = len(selected)
    return {
        "pool_records": len(usable) + len(too_long),
        "tasks": tasks,
        "tiers": _breakdown(pool_keys, selected_keys, lambda key: tiers[key[0]], n),
        "modalities": _breakdown(pool_keys, selected_keys, itemgetter(1), n),
        "buckets": _breakdown(pool_keys, selected_keys, itemgetter(2), n),
        "strata": _breakdown(pool_keys, selected_keys, strata.__getitem__, n),
        "coverage": {
            "tasks_in_taxonomy": len(taxonomy.tasks),
            "tasks_selected": len({key[0] for key in selected_keys}),
            "strata_in_pool": len(pool_strata),
            "strata_selected": len(chosen_strata),
            "strata_missing": sorted(pool_strata - chosen_strata),
        },
        "tokens": _stats(list(tokens.values())) if tokens else None,
        "too_long": {
            "count": len(too_long),
            "by_task": dict(sorted(Counter(r.task for r in too_long).items())),
        },
        "skipped": {
            "count": len(pool.skipped),
            "by_reason": dict(sorted(skipped.items())),
            "records": [{"source": s.source, "line": s.line, "reason": s.reason} for s in pool.skipped[:100]],
        },
        "duplicates_dropped": pool.duplicates,
        "modality_not_listed_for_task": dict(sorted(pool.modality_mismatches.items())),
        "task_assignment": task_assignment,
    }


def _table(title: str, rows: list[dict], columns: list[str]) -> list[str]:
    lines = [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [f"{row[c] * 100:.1f}%" if c == "share" else str(row[c]) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _quoted(text: str) -> str:
    """``text`` as inline Markdown code (placeholders such as <image> stay visible)."""
    return "`" + text.replace("`", "'") + "`"


def _task_assignment(summary: dict | None) -> list[str]:
    """The "How tasks were assigned" section: per task, counts by origin; per mapping and per rule,
    its count; per rule that took records, two of their prompts."""
    if not summary:
        return []
    lines = [
        "## How tasks were assigned",
        "",
        f"Precedence: {summary['precedence']}. Counts are of the {summary['records']} records as read, "
        "before duplicates and invalid records were dropped.",
        "",
        "| task | field | mapping | rule | default | total |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary["tasks"].items():
        cells = [row[key] for key in ("field", "mapping", "rule", "default", "total")]
        lines.append(f"| {name} | " + " | ".join(map(str, cells)) + " |")
    lines.append("")
    if summary["mappings"]:
        lines += ["Mappings (`--task SOURCE=TASK`, the first that matches wins):", ""]
        lines += [
            f"- {_quoted(m['source'] + '=' + m['task'])}: {m['count']} record(s)" for m in summary["mappings"]
        ]
        lines.append("")
    defaults = summary.get("default_tasks")
    if defaults:
        lines += ["Default tasks (`--default-task`, per modality: a task takes only the modalities it lists):", ""]
        lines += [
            f"- {row['modality']} -> {row['task']}: {row['count']} record(s) (`--default-task {row['flag']}`)"
            for row in defaults
        ]
        lines.append("")
    used = [rule for rule in summary["rules"] if rule["count"]]
    if used:
        lines += ["Rules of the taxonomy that took records (tried in file order, the first match wins):", ""]
        for rule in used:
            what = ": " + rule["description"].replace("<", "&lt;") if rule["description"] else ""
            lines.append(f"- **{rule['rule']}** -> {rule['task']}, {rule['count']} record(s){what}")
            lines += [f"  - {_quoted(example)}" for example in rule["examples"]]
        lines.append("")
    unused = [rule["rule"] for rule in summary["rules"] if not rule["count"]]
    if unused:
        lines += [f"Rules that matched no record: {', '.join(unused)}", ""]
    unassigned = summary["unassigned"]
    if unassigned["count"]:
        lines += [f"Records without a task: {unassigned['count']}", ""]
        lines += [
            f"- {row['dataset'] + ' (' + row['source'] + ')' if row['dataset'] else row['source']}: "
            f"{row['count']}, e.g. {_quoted(row['example'])}"
            for row in unassigned["by_source"]
        ]
        lines.append("")
    return lines


def write_report_markdown(report: dict, path: Path) -> None:
    cov = report["coverage"]
    lines = [
        "# Calibration set",
        "",
        f"- samples: {report['size']} of {report['size_requested']} requested, "
        f"from {report['pool_records']} usable pool records (seed {report['seed']})",
        f"- coverage: {cov['tasks_selected']}/{cov['tasks_in_taxonomy']} tasks, "
        f"{cov['strata_selected']}/{cov['strata_in_pool']} strata (task x modality x size bucket)",
        f"- exact duplicates dropped: {report['duplicates_dropped']}; invalid records skipped: "
        f"{report['skipped']['count']}; over max length: {report['too_long']['count']}",
        f"- samples file: `{report['samples_file']}` (sha256 {report['samples_sha256'][:16]}...)",
        "",
    ]
    lines += _table("By task", report["tasks"], ["name", "tier", "weight", "pool", "selected", "share"])
    lines += _task_assignment(report.get("task_assignment"))
    lines += _table("By tier", report["tiers"], ["name", "pool", "selected", "share"])
    lines += _table("By modality", report["modalities"], ["name", "pool", "selected", "share"])
    lines += _table("By size bucket", report["buckets"], ["name", "pool", "selected", "share"])
    if report["tokens"]:
        stats = report["tokens"]
        lines += [
            "## Tokens per sample",
            "",
            f"min {stats['min']}, mean {stats['mean']}, p50 {stats['p50']}, p95 {stats['p95']}, "
            f"max {stats['max']}, total {stats['total']}",
            "",
        ]
    if report["notes"]:
        lines += ["## Notes", "", *[f"- {note}" for note in report["notes"]], ""]
    path.write_text("\n".join(lines), encoding="utf-8")
