"""Stage 2: calibration sets. Build one with :func:`build_calibration_set`; read one with
:func:`load_calibration_set` (a ``datasets.Dataset``, one row per sample with its stratum fields)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from quantkit.calibset.allocate import choose, proportional
from quantkit.calibset.build import (
    REPORT_FILE,
    SAMPLES_FILE,
    SET_FORMAT,
    CalibrateOptions,
    CalibrationSetResult,
    build_calibration_set,
)
from quantkit.errors import InputError
from quantkit.fsutil import sha256_file
from quantkit.media import MediaError, require_regular_file

__all__ = [
    "CalibrateOptions",
    "CalibrationSetResult",
    "build_calibration_set",
    "load_calibration_report",
    "load_calibration_set",
    "stratified_subsample",
]


def load_calibration_report(path: Path) -> dict:
    """The set's report.json, after checking the folder is a complete quantkit calibration set."""
    path = Path(path)
    report_path = path / REPORT_FILE
    if not path.is_dir():
        raise InputError("calibration set folder not found", path=path)
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        report = None
    if not isinstance(report, dict) or report.get("format") != SET_FORMAT:
        raise InputError(
            "not a quantkit calibration set (no valid report.json)",
            path=path,
            hint="make one with `quantkit calibrate`",
        )
    samples = path / report.get("samples_file", SAMPLES_FILE)
    if not samples.is_file() or sha256_file(samples) != report.get("samples_sha256"):
        raise InputError("the calibration set's samples file is missing or was changed", path=samples)
    return report


# A samples.jsonl row's fields and the JSON types each holds (build._row writes them; load_calibration_set's
# datasets.Features are the same columns): a row that differs fails with its line, not in pyarrow.
_ROW_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "task": (str,),
    "tier": (str,),
    "weight": (int, float),
    "family": (str,),
    "modality": (str,),
    "bucket": (str,),
    "stratum": (str,),
    "messages": (list,),
    "images": (list,),
    "videos": (list,),
    "audios": (list,),
    "tokens": (int, type(None)),
    "source": (str,),
}


def _row_problem(row: dict) -> str | None:
    """What is wrong with the types of a samples.jsonl row, or None."""
    for name, types in _ROW_TYPES.items():
        value = row.get(name)
        if not isinstance(value, types) or isinstance(value, bool):
            return f"field {name!r} is {type(value).__name__ if name in row else 'missing'}, not {'/'.join(t.__name__ for t in types)}"
    for name in ("images", "videos", "audios"):
        if not all(isinstance(item, str) for item in row[name]):
            return f"field {name!r} holds something other than file paths"
    for message in row["messages"]:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            return "field 'messages' holds something other than {role, content} texts"
    return None


def _damaged(samples: Path, line: int, problem: str) -> InputError:
    return InputError(
        f"{problem}: the calibration set is damaged",
        path=samples,
        line=line,
        hint="build the set again with `quantkit calibrate`",
    )


def check_set_media(path: Path, report: dict, rows: list[dict]) -> None:
    """Every media file the set's rows name is a regular file (checked before anything opens it:
    a FIFO would block) and, for a set that recorded them (``media_files``: size and mtime, or
    size and digest for the media the set carries), the very file calibrate chose."""
    recorded = report.get("media_files")
    for row in rows:
        for column in ("images", "videos", "audios"):
            for media in row.get(column) or []:
                try:
                    info = require_regular_file(media)
                except MediaError as err:
                    raise InputError(
                        f"{err} (named by sample {row.get('id')!r})",
                        path=media,
                        hint="restore the file calibrate chose, or build the set again with `quantkit calibrate`",
                    ) from None
                if recorded is None:
                    continue
                expected = recorded.get(media)
                changed = expected is None or info.st_size != expected.get("size")
                if not changed and "mtime_ns" in expected:
                    changed = info.st_mtime_ns != expected["mtime_ns"]
                if not changed and "sha256" in expected:
                    changed = sha256_file(Path(media)) != expected["sha256"]
                if changed:
                    raise InputError(
                        f"the media file of sample {row.get('id')!r} changed after calibrate "
                        f"(size or modification time differ from the set's report.json)",
                        path=media,
                        hint="restore the original file (a copy must keep its times: cp -p), "
                        "or build the set again with `quantkit calibrate`",
                    )


def load_calibration_set(path: Path, *, report: dict | None = None):
    """Load a calibration set folder as a ``datasets.Dataset``.

    Columns: id, task, tier, weight, family, modality, bucket, stratum, messages (list of
    {role, content}), images, videos, audios (absolute paths), tokens (None without --model),
    source ("pool file:line"). ``report``: the set's load_calibration_report, when the caller
    has checked (and hashed) it already.
    """
    import datasets

    report = load_calibration_report(path) if report is None else report
    samples = Path(path) / report.get("samples_file", SAMPLES_FILE)
    rows = []
    with open(samples, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise _damaged(samples, number, f"not a JSON line ({err.msg}, column {err.colno})") from None
            if not isinstance(row, dict):
                raise _damaged(samples, number, "a row is not a JSON object")
            problem = _row_problem(row)
            if problem:
                raise _damaged(samples, number, problem)
            rows.append(row)
    check_set_media(path, report, rows)
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "task": datasets.Value("string"),
            "tier": datasets.Value("string"),
            "weight": datasets.Value("float64"),
            "family": datasets.Value("string"),
            "modality": datasets.Value("string"),
            "bucket": datasets.Value("string"),
            "stratum": datasets.Value("string"),
            "messages": datasets.List(
                {"role": datasets.Value("string"), "content": datasets.Value("string")}
            ),
            "images": datasets.List(datasets.Value("string")),
            "videos": datasets.List(datasets.Value("string")),
            "audios": datasets.List(datasets.Value("string")),
            "tokens": datasets.Value("int64"),
            "source": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_list(rows, features=features)


def stratified_subsample(strata: list[str], count: int, *, seed: int = 0) -> list[int]:
    """Indices of ``count`` samples that keep the strata's proportions (never the first ``count``).

    Every stratum keeps at least one sample while ``count`` allows; when it does not, the largest
    strata are kept first.
    """
    groups: dict[str, list[int]] = defaultdict(list)
    for index, stratum in enumerate(strata):
        groups[stratum].append(index)
    if count >= len(strata):
        return list(range(len(strata)))
    if count < len(groups):
        largest = sorted(groups, key=lambda s: (-len(groups[s]), s))[:count]
        groups = {s: groups[s] for s in largest}
    quotas = proportional({s: len(members) for s, members in groups.items()}, count)
    picked = [i for s in sorted(quotas) for i in choose(groups[s], quotas[s], seed=seed, stratum=s)]
    return sorted(picked)
