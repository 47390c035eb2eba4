"""Stage 2: choose the calibration set from a pool, stratified by task x modality x size bucket."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantkit import __version__
from quantkit.calibset.allocate import allocate, choose
from quantkit.calibset.report import summarize, write_report_markdown
from quantkit.calibset.tokens import TokenCounter, image_rule_of, load_processor
from quantkit.errors import InputError
from quantkit.fsutil import atomic_output_dir, check_output_free, refuse_calibrate_overlap, sha256_file
from quantkit.mediasources import MediaStore
from quantkit.pool import PoolReadResult, PoolRecord, gc_paused, read_pool
from quantkit.pool.index import PoolIndex
from quantkit.pool.read import reason_kind
from quantkit.pool.record import ignored_text
from quantkit.taxonomy import DEFAULT_TAXONOMY, Taxonomy, load_taxonomy

SET_FORMAT = "quantkit-calibration-set"
SET_VERSION = 1
SAMPLES_FILE = "samples.jsonl"
REPORT_FILE = "report.json"
MEDIA_DIR = "media"  # embedded media (data URIs, datasets Image / Audio bytes) the set carries
REPORT_MARKDOWN = "report.md"
VERIFY_KINDS = ("image", "video", "audio")
# What calibrate writes into a set folder: the signature an earlier set is recognised by (and the
# only folder `calibrate --force` replaces).
SET_FILES = frozenset({SAMPLES_FILE, REPORT_FILE, REPORT_MARKDOWN})


def is_calibration_set(folder: Path) -> bool:
    """``folder`` holds exactly what calibrate writes: samples.jsonl, report.json (with the set's
    format marker), report.md, and at most a media/ folder of plain files; nothing else."""
    folder = Path(folder)
    try:
        entries = {entry.name: entry for entry in folder.iterdir()}
    except OSError:
        return False
    if set(entries) - {MEDIA_DIR} != SET_FILES or any(
        entries[name].is_symlink() or not entries[name].is_file() for name in SET_FILES
    ):
        return False
    media = entries.get(MEDIA_DIR)
    if media is not None:
        if media.is_symlink() or not media.is_dir():
            return False
        if any(item.is_symlink() or not item.is_file() for item in media.iterdir()):
            return False
    try:
        report = json.loads((folder / REPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and report.get("format") == SET_FORMAT


@dataclass(frozen=True)
class CalibrateOptions:
    size: int = 5000
    seed: int = 0
    taxonomy: Path | None = None
    model: Path | None = None
    max_seq_len: int | None = None
    min_per_stratum: int = 2
    task_field: str = "task"
    skip_invalid: bool = False
    allow_missing_tasks: bool = False
    strict: bool = False
    force: bool = False
    # Where records come from and how they are read.
    media_roots: tuple[Path, ...] = ()  # folders media may lie in besides the pool's own
    datasets: tuple[str, ...] = ()  # LLaMA-Factory dataset names (dataset_info.json entries)
    split: str | None = None  # the split of a DatasetDict / Hub-layout folder
    verify_media: tuple[str, ...] = ("image", "audio")  # kinds checked to decode to their end
    workers: int | None = None  # processes a big JSONL file is read in (None: one per CPU)
    ignore_fields: tuple[str, ...] = ()  # unused record fields that may hold media (--ignore-field)
    # Tasks for records without a task field (quantkit.taskassign).
    task_mappings: tuple[str, ...] = ()  # --task SOURCE=TASK
    default_task: tuple[str, ...] = ()  # --default-task MODALITY=TASK or TASK (repeatable)
    dry_run: bool = False  # read and validate everything, write nothing


@dataclass
class CalibrationSetResult:
    output: Path | None  # None for a dry run
    report: dict
    notes: list[str] = field(default_factory=list)
    error: InputError | None = None  # a dry run's verdict: what a real run would fail with


@dataclass
class _Hooks:
    """Callbacks the CLI uses for progress; tests leave them empty."""

    on_bytes: Callable[[int], None] | None = None
    on_phase: Callable[[str], None] | None = None

    def phase(self, text: str) -> None:
        if self.on_phase is not None:
            self.on_phase(text)


def _validate_options(options: CalibrateOptions) -> None:
    if options.size < 1:
        raise InputError("--size must be at least 1")
    if options.max_seq_len is not None and options.model is None:
        raise InputError("--max-seq-len needs --model", hint="token counts come from the model's processor")
    if options.max_seq_len is not None and options.max_seq_len < 1:
        raise InputError("--max-seq-len must be at least 1")
    if options.workers is not None and options.workers < 1:
        raise InputError("--workers must be at least 1")
    unknown = [k for k in options.verify_media if k not in VERIFY_KINDS]
    if unknown:
        raise InputError(
            f"--verify-media: unknown media kind {unknown[0]!r}", hint="use image, video, audio, all or none"
        )


def _task_assigner(taxonomy: Taxonomy, options: CalibrateOptions):
    """The TaskAssigner for records without a task field: --task mappings, the taxonomy's match
    rules, --default-task. None where quantkit.taskassign is not installed yet (then every
    record needs its field, as before)."""
    try:
        from quantkit.taskassign import TaskAssigner
    except ImportError:
        if options.task_mappings or options.default_task:
            raise InputError(
                "--task / --default-task need quantkit.taskassign, which this build lacks"
            ) from None
        return None
    return TaskAssigner(taxonomy, options.task_mappings, options.default_task)


def source_table(pool: PoolReadResult) -> list[dict]:
    """Per source: format detected, records, skipped by reason, tasks by origin, modalities."""
    return [stats.as_dict() for stats in pool.sources]


def _missing_tasks(taxonomy: Taxonomy, present: set[str]) -> list[str]:
    return [task.name for task in taxonomy.tasks if task.name not in present]


def _members_by_stratum(index: PoolIndex, usable: np.ndarray) -> dict[str, np.ndarray]:
    """The usable record numbers of each stratum, ordered by (record_id, source, line): the order
    the seeded choice draws from. One stratum at a time, its ids sorted as bytes in numpy."""
    groups = index.groups
    names = sorted({g.stratum for g in groups})
    number = {name: i for i, name in enumerate(names)}
    stratum_of_group = np.array([number[g.stratum] for g in groups], dtype=np.int32)
    strata = stratum_of_group[index.group_of(usable)]
    result: dict[str, np.ndarray] = {}
    for i, name in enumerate(names):
        members = usable[np.flatnonzero(strata == i)]
        if len(members):
            result[name] = members[_id_order(index, members)]
    return result


def _id_order(index: PoolIndex, members: np.ndarray) -> np.ndarray:
    """The positions of ``members`` in (record_id, source, line) order. Distinct ids of up to 64
    bytes sort as fixed-width bytes in numpy (UTF-8 bytes order = code point order); anything else
    (equal ids, a NUL, longer ids) by Python's sort of the decoded ids."""
    ends = np.frombuffer(index.id_end, dtype=np.uint32).astype(np.int64)
    stop = ends[members]
    start = np.where(members > 0, ends[np.maximum(members.astype(np.int64) - 1, 0)], 0)
    lengths = stop - start
    width = int(lengths.max()) if len(lengths) else 0
    if 0 < width <= 64 and 0 not in index.ids:  # zero-padding then sorts shorter ids first, as str does
        blob = np.frombuffer(index.ids, dtype=np.uint8)
        table = np.zeros((len(members), width), dtype=np.uint8)
        for j in range(width):
            has = np.flatnonzero(lengths > j)
            table[has, j] = blob[start[has] + j]
        keys = table.view(f"S{width}").ravel()
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        if not (ordered[1:] == ordered[:-1]).any():
            return order
    ids = [index.record_id(n) for n in members.tolist()]
    if len(set(ids)) == len(ids):
        return np.asarray(sorted(range(len(ids)), key=ids.__getitem__), dtype=np.int64)
    sources, lines, group, groups = index.sources, index.line, index.group, index.groups
    keys = [(ids[j], sources[groups[group[n]].source], lines[n]) for j, n in enumerate(members.tolist())]
    return np.asarray(sorted(range(len(ids)), key=keys.__getitem__), dtype=np.int64)


class _UsableGroups:
    """The usable records as the report counts them: one group (task, modality, bucket) each."""

    def __init__(self, index: PoolIndex, usable: np.ndarray) -> None:
        self.index, self.usable = index, usable

    def __len__(self) -> int:
        return len(self.usable)

    def __iter__(self):
        return self.index.groups_of(self.usable)


def build_calibration_set(
    pools: list[Path],
    output: Path,
    options: CalibrateOptions = CalibrateOptions(),
    *,
    on_bytes: Callable[[int], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> CalibrationSetResult:
    """Read ``pools``, choose ``options.size`` samples and write the set folder at ``output``.

    Same inputs and seed give a byte-identical folder. Raises InputError (nothing written) for
    bad input: malformed records, unknown tasks, missing media, missing tasks, too small a pool
    under ``strict``.
    """
    hooks = _Hooks(on_bytes, on_phase)
    _validate_options(options)
    if not options.dry_run:
        if output is None:
            raise InputError("--output is required (or pass --dry-run to only read and check the pool)")
        output = Path(output)
        refuse_calibrate_overlap(
            output,
            pools,
            options.taxonomy,
            options.model,
            options.media_roots,
            previous_set=output.is_dir() and is_calibration_set(output),
        )
        check_output_free(output, options.force, replaceable=is_calibration_set, what="calibration set")
    taxonomy_path = Path(options.taxonomy) if options.taxonomy else DEFAULT_TAXONOMY
    taxonomy = load_taxonomy(taxonomy_path)

    # Embedded media are written beside the output while reading; the selected ones move into
    # the set's media/ folder, the rest go with this folder.
    if output is not None:
        store = MediaStore(Path(output).absolute().parent / f".{Path(output).name}.media-{os.getpid()}")
    else:  # a dry run writes nothing the user sees
        store = MediaStore(Path(tempfile.gettempdir()) / f"quantkit-dry-run-media-{os.getpid()}")
    try:
        return _build(pools, output, options, taxonomy, taxonomy_path, hooks, store)
    finally:
        shutil.rmtree(store.folder, ignore_errors=True)


def _build(pools, output, options, taxonomy, taxonomy_path, hooks, store) -> CalibrationSetResult:
    processor = image_rule = None
    if options.model is not None:
        processor = load_processor(options.model)
        image_rule = image_rule_of(processor)

    assigner = _task_assigner(taxonomy, options)
    hooks.phase("reading pool")
    pool = read_pool(
        pools,
        taxonomy,
        image_rule=image_rule,
        task_field=options.task_field,
        skip_invalid=options.skip_invalid,
        on_bytes=hooks.on_bytes,
        media_roots=tuple(options.media_roots),
        datasets=tuple(options.datasets),
        split=options.split,
        store=store,
        assigner=assigner,
        verify_media=frozenset(options.verify_media),
        workers=options.workers,
        ignore_fields=tuple(options.ignore_fields),
    )
    unassigned = assigner.unassigned_error() if assigner is not None else None
    if options.dry_run:
        return _dry_run(pool, unassigned)
    if unassigned is not None:
        raise unassigned
    notes: list[str] = list(pool.notes)
    index = pool.index
    groups = index.groups
    usable = index.rows  # record numbers, in reading order
    # (the groups present by bincount: np.unique imports numpy.ma, which nothing else here needs)
    present = np.flatnonzero(np.bincount(index.group_of(usable), minlength=len(groups))).tolist()
    missing = _missing_tasks(taxonomy, {groups[g].task for g in present})
    if missing and not options.allow_missing_tasks:
        raise InputError(
            f"{len(missing)} task(s) of the taxonomy have no sample in the pool: {', '.join(missing)}",
            hint="every trained task must be calibrated; add samples, or pass --allow-missing-tasks",
        )
    if missing:
        notes.append(f"tasks without samples (allowed): {', '.join(missing)}")

    token_counts: np.ndarray | None = None  # aligned with usable
    too_long: list = []  # the groups of the records left out (what the report counts by)
    if processor is not None:
        hooks.phase("counting tokens")
        usable, token_counts, too_long = _fitting(index, usable, processor, options.max_seq_len)
        if too_long:
            notes.append(f"{len(too_long)} sample(s) over --max-seq-len {options.max_seq_len} left out")

    # Nothing below makes reference cycles: no cyclic GC walking the pool's records meanwhile.
    with gc_paused():
        hooks.phase("allocating")
        by_stratum = _members_by_stratum(index, usable)
        weights = {s: taxonomy.weight(taxonomy.resolve(groups[index.group[m[0]]].task)) for s, m in by_stratum.items()}
        available = {s: len(m) for s, m in by_stratum.items()}
        if len(usable) < options.size:
            message = f"the pool has {len(usable)} usable samples, fewer than --size {options.size}"
            if options.strict:
                raise InputError(message, hint="add samples, lower --size, or drop --strict to use them all")
            notes.append(message + "; all are used")
        counts = allocate(available, weights, options.size, floor=options.min_per_stratum)
        chosen = [
            n
            for stratum in sorted(counts)
            for n in choose(by_stratum[stratum], counts[stratum], seed=options.seed, stratum=stratum)
        ]
        del by_stratum
        selected = index.materialize(chosen)
        tokens: dict[int, int] = {}
        if token_counts is not None:
            positions = np.searchsorted(usable, np.asarray(chosen, dtype=np.int64))
            tokens = {id(r): int(token_counts[p]) for r, p in zip(selected, positions.tolist(), strict=True)}

        row_json = _RowJson(taxonomy)
        rows = [row_json(record, tokens.get(id(record))) for record in selected]
        report = summarize(
            taxonomy=taxonomy,
            pool=pool,
            usable=_UsableGroups(index, usable),
            selected=selected,
            tokens={r.record_id: tokens[id(r)] for r in selected} if tokens else None,
            too_long=too_long,
            task_assignment=pool.task_assignment,
        )
        report.update(
            {
                "format": SET_FORMAT,
                "version": SET_VERSION,
                "quantkit_version": __version__,
                "samples_file": SAMPLES_FILE,
                "size_requested": options.size,
                "size": len(rows),
                "seed": options.seed,
                "min_per_stratum": options.min_per_stratum,
                "max_seq_len": options.max_seq_len,
                "model": str(Path(options.model).resolve()) if options.model else None,
                "taxonomy": {"path": str(taxonomy_path.resolve()), "sha256": sha256_file(taxonomy_path)},
                "inputs": pool.inputs,
                "notes": notes,
            }
        )
        report["sources"] = source_table(pool)
        report["skipped"]["by_kind"] = dict(
            sorted(Counter(reason_kind(s.reason) for s in pool.skipped).items())
        )
        hooks.phase("writing")
        _write_set(output, rows, selected, report, store, force=options.force)
    return CalibrationSetResult(output=output, report=report, notes=notes)


def _fitting(index, usable: np.ndarray, processor, max_seq_len: int | None):
    """The records of ``usable`` within ``max_seq_len`` tokens under the model's processor (all,
    without a limit), their token counts and the groups of those left out."""
    counter = TokenCounter(processor)
    counts = np.zeros(len(usable), dtype=np.int64)
    for start in range(0, len(usable), 4096):  # records read again a batch at a time
        for offset, record in enumerate(index.materialize(usable[start : start + 4096])):
            counts[start + offset] = counter(json.loads(record.payload), limit=max_seq_len)
    fits = counts <= max_seq_len if max_seq_len is not None else np.ones(len(usable), bool)
    too_long = list(index.groups_of(usable[~fits]))
    if not fits.any():
        raise InputError(f"every sample is longer than --max-seq-len {max_seq_len}")
    return usable[fits], counts[fits], too_long


def _write_set(output: Path, rows: list[str], selected, report: dict, store, *, force: bool) -> None:
    """The set's folder, written atomically: samples.jsonl, the media it carries, report.json and
    report.md (the report gains the media fingerprints and the samples' hash)."""
    with atomic_output_dir(output, force=force) as staging:
        refuse_media_inside(output, selected)
        rows = _carry_embedded(rows, selected, store, staging, Path(output).absolute() / MEDIA_DIR)
        report["media_files"] = _media_fingerprints(selected, store, Path(output).absolute() / MEDIA_DIR)
        samples_path = staging / SAMPLES_FILE
        with open(samples_path, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(row + "\n")
        report["samples_sha256"] = sha256_file(samples_path)
        (staging / REPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        write_report_markdown(report, staging / REPORT_MARKDOWN)
        _append_markdown(report, staging / REPORT_MARKDOWN)


def _dry_run(pool: PoolReadResult, error: InputError | None) -> CalibrationSetResult:
    """What a dry run reports: the sources, the skipped records by reason, the notes."""
    report = {
        "sources": source_table(pool),
        "pool_records": len(pool.records),
        "duplicates_dropped": pool.duplicates,
        "skipped": {
            "count": len(pool.skipped),
            "by_kind": dict(sorted(Counter(reason_kind(s.reason) for s in pool.skipped).items())),
            "records": [{"source": s.source, "line": s.line, "reason": s.reason} for s in pool.skipped[:100]],
        },
        "task_assignment": pool.task_assignment,
        "notes": list(pool.notes),
    }
    return CalibrationSetResult(output=None, report=report, notes=list(pool.notes), error=error)


def refuse_media_inside(output: Path, selected: list[PoolRecord]) -> None:
    """A media file the new set uses must not lie inside the folder the set replaces."""
    output = Path(output).absolute()
    for record in selected:
        for path in record.media:
            if output in Path(path).parents:
                raise InputError(
                    f"--output holds the media file {path}, which the new set uses: replacing it would delete it",
                    path=output,
                    hint="choose another --output",
                )


def _media_fingerprints(selected: list[PoolRecord], store: MediaStore, final: Path) -> dict[str, dict]:
    """What tells a set's media file from one replaced later (quantkit.calibset.check_set_media):
    size and modification time of the pool's files; size and digest of the embedded media the
    set carries (written afresh by each run: their times differ, their bytes do not)."""
    prefix = str(store.folder) + os.sep
    found: dict[str, dict] = {}
    for path in {p for record in selected for p in record.media}:
        info = os.stat(path)
        if path.startswith(prefix):
            found[str(final / os.path.basename(path))] = {"size": info.st_size, "sha256": sha256_file(Path(path))}
        else:
            found[path] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns}
    return dict(sorted(found.items()))


def _carry_embedded(
    rows: list[str], selected: list[PoolRecord], store: MediaStore, staging: Path, final: Path
) -> list[str]:
    """Move the embedded media the selected samples use into the set's media/ folder and point
    their rows at the final place."""
    prefix = str(store.folder) + os.sep
    used = {p for record in selected for p in record.media if p.startswith(prefix)}
    if not used:
        return rows
    (staging / MEDIA_DIR).mkdir()
    for path in sorted(used):
        shutil.copy2(path, staging / MEDIA_DIR / os.path.basename(path))
    old, new = _json_str(prefix)[1:-1], _json_str(str(final) + os.sep)[1:-1]
    return [row.replace(old, new) if old in row else row for row in rows]


def _append_markdown(report: dict, path: Path) -> None:
    """The sources and the skipped records by reason, after the report's tables."""
    lines = [
        "## Sources",
        "",
        "| source | format | records | skipped | tasks by origin | modalities | ignored fields |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["sources"]:
        cells = [
            row["name"],
            row["format"],
            str(row["records"]),
            ", ".join(f"{k}: {v}" for k, v in row["skipped"].items()) or "0",
            ", ".join(f"{k}: {v}" for k, v in row["task_origins"].items()),
            ", ".join(f"{k}: {v}" for k, v in row["modalities"].items()),
            ignored_text(row.get("ignored", {})) or "-",
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    skipped = report["skipped"]
    if skipped["count"]:
        lines += ["## Skipped records", ""]
        for kind, count in skipped["by_kind"].items():
            lines.append(f"- {kind}: {count}")
        lines += ["", "| record | reason |", "|---|---|"]
        lines += [
            f"| {r['source']}:{r['line']} | {r['reason'].replace('|', '/')} |" for r in skipped["records"]
        ]
        if skipped["count"] > len(skipped["records"]):
            lines.append(
                f"| ... | {skipped['count'] - len(skipped['records'])} more (report.json lists 100) |"
            )
        lines.append("")
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines))


_dumps = functools.partial(json.dumps, ensure_ascii=False, sort_keys=True)
_json_str = json.encoder.encode_basestring  # _dumps of a str


class _RowJson:
    """A sample's line of samples.jsonl: ``_dumps(_row(record, taxonomy, tokens))``, assembled from
    the record's JSON pieces (its payload's fields) and the JSON of the fields its stratum decides,
    computed once per stratum; the keys in sorted order, as ``sort_keys`` writes them."""

    def __init__(self, taxonomy: Taxonomy) -> None:
        self.taxonomy = taxonomy
        self.strata: dict[tuple[str, str, str], tuple[str, str, str, str, str]] = {}

    def __call__(self, record: PoolRecord, tokens: int | None) -> str:
        key = (record.task, record.modality, record.bucket)
        parts = self.strata.get(key)
        if parts is None:
            task = self.taxonomy.resolve(record.task)
            parts = self.strata[key] = (
                ', "bucket": ' + _dumps(record.bucket) + ', "family": ' + _dumps(task.family) + ', "id": ',
                ', "modality": ' + _dumps(record.modality) + ', "source": ',
                ', "stratum": ' + _dumps(record.stratum) + ', "task": ',
                ', "tier": ' + _dumps(task.tier) + ', "tokens": ',
                ', "weight": ' + _dumps(self.taxonomy.weight(task)) + "}",
            )
        parts_json = record.json
        audios, images, task_json, videos = (
            parts_json.audios,
            parts_json.images,
            parts_json.task,
            parts_json.videos,
        )
        return (
            '{"audios": ' + audios + parts[0] + _json_str(record.record_id) + ', "images": ' + images
            + ', "messages": ' + record.text_key + parts[1] + _json_str(f"{record.source}:{record.line}")
            + parts[2] + task_json + parts[3] + _dumps(tokens) + ', "videos": ' + videos + parts[4]
        )  # fmt: skip


def _row(record: PoolRecord, taxonomy: Taxonomy, tokens: int | None) -> dict:
    task = taxonomy.resolve(record.task)
    row = json.loads(record.payload)
    row.update(
        {
            "tier": task.tier,
            "weight": taxonomy.weight(task),
            "family": task.family,
            "modality": record.modality,
            "bucket": record.bucket,
            "stratum": record.stratum,
            "tokens": tokens,
            "source": f"{record.source}:{record.line}",
        }
    )
    return row
