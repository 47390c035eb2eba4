"""What the user named, as sources to read: pool files (JSONL, JSON arrays, Parquet), folders
saved with ``save_to_disk``, Hub-layout folders, and LLaMA-Factory data folders through their
``dataset_info.json`` (each entry a source, with its formatting, columns and tags)."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import InputError
from quantkit.media import is_utf8_name
from quantkit.pool.formats import FormatSpec
from quantkit.pool.jsonfile import first_char
from quantkit.pool.tables import hub_files, is_save_to_disk

FILE_TYPES = (".jsonl", ".json", ".parquet")
HUB_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
ENTRY_KEYS = ("file_name", *HUB_KEYS)


@dataclass(frozen=True)
class Source:
    path: Path  # the file or folder, resolved
    named: str  # as the user named it (what --task SOURCE=TASK matches)
    kind: str  # jsonl | json | parquet | dataset | hub
    base: Path  # the folder relative media paths resolve against
    dataset: str | None = None  # the LLaMA-Factory dataset name
    spec: FormatSpec | None = None
    split: str | None = None

    @property
    def label(self) -> str:
        return self.dataset or self.named

    def format_name(self) -> str:
        kinds = {
            "jsonl": "JSONL",
            "json": "JSON array",
            "parquet": "Parquet",
            "dataset": "save_to_disk",
            "hub": "Hub Parquet",
        }
        name = kinds[self.kind]
        if self.spec is not None:
            name += f" {self.spec.formatting}"  # as its dataset_info.json entry says
        return name


def _file_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json" if first_char(path) == "[" else "jsonl"
    return suffix.lstrip(".")


def _file_source(path: Path, named: str, base: Path, **extra) -> Source:
    return Source(path=path.resolve(), named=named, kind=_file_kind(path), base=base.resolve(), **extra)


def is_llamafactory_folder(folder: Path) -> bool:
    info = folder / "dataset_info.json"
    if not info.is_file() or (folder / "state.json").is_file():
        return False
    try:
        data = json.loads(info.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True  # reported with its line by read_dataset_info
    return isinstance(data, dict) and any(
        isinstance(v, dict) and any(k in v for k in ENTRY_KEYS) for v in data.values()
    )


def _spec(name: str, entry: dict, info: Path) -> FormatSpec:
    formatting = entry.get("formatting", "alpaca")
    if formatting not in ("alpaca", "sharegpt"):
        raise InputError(
            f"dataset {name!r}: unknown formatting {formatting!r}",
            path=info,
            hint="LLaMA-Factory's formattings are 'alpaca' and 'sharegpt'",
        )
    columns, tags = entry.get("columns") or {}, entry.get("tags") or {}
    if not isinstance(columns, dict) or not isinstance(tags, dict):
        raise InputError(f"dataset {name!r}: 'columns' and 'tags' must be objects", path=info)
    return FormatSpec(formatting=formatting, columns=dict(columns), tags=dict(tags))


def read_dataset_info(folder: Path, wanted: tuple[str, ...]) -> tuple[list[Source], list[str]]:
    """The sources a LLaMA-Factory data folder holds: the entries named in ``wanted`` (all of
    them must exist and be local), or every entry whose file exists, with a note of the others."""
    info = folder / "dataset_info.json"
    try:
        data = json.loads(info.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputError(f"malformed JSON: {err.msg}", path=info, line=err.lineno) from None
    if not isinstance(data, dict):
        raise InputError("dataset_info.json must map dataset names to entries", path=info)
    names = list(wanted) or list(data)
    unknown = [n for n in names if n not in data]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(data), n=3)
        raise InputError(
            f"no dataset {unknown[0]!r} in dataset_info.json"
            + (f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""),
            path=info,
            hint=f"it lists: {', '.join(sorted(data))}",
        )
    sources: list[Source] = []
    notes: list[str] = []

    def not_read(name: str, why: str) -> None:
        if wanted:
            raise InputError(f"dataset {name!r}: {why}", path=info, hint="leave it out of --dataset")
        notes.append(f"{folder.name}/dataset_info.json: {name!r} not read: {why}")

    for name in names:
        entry = data[name]
        if not isinstance(entry, dict):
            raise InputError(f"dataset {name!r}: the entry must be an object", path=info)
        file_name = entry.get("file_name")
        if not file_name:
            hub = next((entry[k] for k in HUB_KEYS if entry.get(k)), None)
            not_read(name, f"on a hub only ({hub}); quantkit works offline: download it and name the file")
            continue
        if entry.get("ranking"):
            not_read(name, "preference (ranking) data: calibrate takes the chosen answers of plain data only")
            continue
        target = folder / file_name
        if not target.exists():
            not_read(name, f"file {file_name} not found")
            continue
        spec = _spec(name, entry, info)
        files = (
            sorted(p for p in target.rglob("*") if p.is_file() and p.suffix.lower() in FILE_TYPES)
            if target.is_dir()
            else [target]
        )
        if not files or any(p.suffix.lower() not in FILE_TYPES for p in files):
            not_read(name, f"{file_name}: calibrate reads .json, .jsonl and .parquet files")
            continue
        for file in files:  # LLaMA-Factory resolves media against the data folder (media_dir)
            sources.append(
                _file_source(file, str(folder / file.relative_to(folder)), folder, dataset=name, spec=spec)
            )
    return sources, notes


def resolve_sources(
    paths: list[Path], datasets: tuple[str, ...] = (), split: str | None = None
) -> tuple[list[Source], list[str]]:
    """Every source in ``paths``, and notes of what was left out (hub-only dataset entries)."""
    if not paths:
        raise InputError("no pool given", hint="pass one or more pool files or folders")
    sources: list[Source] = []
    notes: list[str] = []
    lf_folders = 0
    for path in map(Path, paths):
        if not path.exists():
            raise InputError("pool not found", path=path)
        if path.is_dir():
            if is_llamafactory_folder(path):
                lf_folders += 1
                found, skipped = read_dataset_info(path, tuple(datasets))
                sources += found
                notes += skipped
            elif is_save_to_disk(path):
                sources.append(Source(path.resolve(), str(path), "dataset", path.resolve(), split=split))
            elif hub_files(path, split) is not None:
                sources.append(Source(path.resolve(), str(path), "hub", path.resolve(), split=split))
            else:
                raise InputError(
                    "a folder pool must be a LLaMA-Factory data folder (with dataset_info.json), a "
                    "`datasets` folder saved with save_to_disk, or a Hub-layout folder of Parquet files",
                    path=path,
                )
            continue
        if path.suffix.lower() not in FILE_TYPES:
            raise InputError(
                f"unsupported pool file type {path.suffix!r}", path=path, hint="use .jsonl, .json or .parquet"
            )
        sources.append(_file_source(path, str(path), path.parent))
    if datasets and not lf_folders:
        raise InputError(
            "--dataset names entries of a LLaMA-Factory dataset_info.json, and no pool given is such a folder",
            hint="pass the data folder (the one holding dataset_info.json)",
        )
    for source in sources:  # its path goes into every sample's `source` and the report: UTF-8 files
        if not is_utf8_name(str(source.path)):
            raise InputError(
                f"the pool file's path is not valid UTF-8: {ascii(str(source.path))}",
                hint="rename the file (or folder) to a UTF-8 name, e.g. convmv -f latin1 -t utf-8 --notest NAME",
            )
    return sources, notes
