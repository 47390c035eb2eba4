"""What the user named, as sources to read: pool files (JSONL, JSON arrays, Parquet, CSV), folders
saved with ``save_to_disk``, Hub-layout folders, LLaMA-Factory data folders through their
``dataset_info.json`` (each entry a source, with its formatting, columns and tags), and InternVL
meta files (each entry's annotation file a source, its media under the entry's ``root``)."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import InputError
from quantkit.mediasources import is_utf8_name
from quantkit.pool.formats import FormatSpec
from quantkit.pool.jsonfile import first_char
from quantkit.pool.tables import hub_files, is_save_to_disk

FILE_TYPES = (".jsonl", ".json", ".parquet", ".csv")
CONFIG_TYPES = (".yaml", ".yml")  # a LLaMA-Factory training config names its data
META_MAX_BYTES = 1 << 20  # a .json object this small may be an InternVL meta file (it lists annotations)
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
    roots: tuple[Path, ...] = ()  # other folders relative media paths resolve against, after base
    via: str | None = None  # the file that named it (an InternVL meta file)

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
            "csv": "CSV",
        }
        name = kinds[self.kind]
        if self.spec is not None:
            name += f" {self.spec.formatting}"  # as its dataset_info.json entry says
        if self.via is not None:
            name += f" (via {self.via})"
        return name


def _file_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json" if first_char(path) == "[" else "jsonl"
    return suffix.lstrip(".")


def _file_source(path: Path, named: str, base: Path, **extra) -> Source:
    return Source(path=path.resolve(), named=named, kind=_file_kind(path), base=base.resolve(), **extra)


def _llamafactory_root(path: Path) -> tuple[Path, ...]:
    """The LLaMA-Factory data folder (its dataset_info.json) above a file named on its own: media
    paths there are relative to it (LLaMA-Factory's media_dir defaults to dataset_dir)."""
    for folder in list(path.resolve().parents)[1:4]:
        if (folder / "dataset_info.json").is_file():
            return (folder,)
    return ()


def internvl_meta(path: Path) -> dict | None:
    """An InternVL meta file's entries (``{name: {"root", "annotation", ...}}``), or None when the
    file is not one (a small JSON object whose every value names an ``annotation``)."""
    if path.suffix.lower() != ".json" or path.stat().st_size > META_MAX_BYTES or first_char(path) != "{":
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and data and all(isinstance(v, dict) and "annotation" in v for v in data.values()):
        return data
    return None


def read_llamafactory_config(path: Path, wanted: tuple[str, ...]) -> tuple[list[Source], list[str]]:
    """A LLaMA-Factory training config (YAML): its ``dataset`` entries of ``dataset_info.json`` in
    ``dataset_dir`` (default ``data``), media under ``media_dir`` (default ``dataset_dir``); the
    paths relative to the folder LLaMA-Factory runs in (found as for InternVL meta files)."""
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise InputError(f"not a readable YAML file: {err}", path=path) from None
    if not isinstance(config, dict) or not config.get("dataset"):
        raise InputError(
            "a YAML pool must be a LLaMA-Factory training config with a `dataset:` key",
            path=path,
            hint="name the data files, or the folder holding dataset_info.json",
        )
    folder = _near(str(config.get("dataset_dir") or "data"), path)
    if not (folder / "dataset_info.json").is_file():
        raise InputError(f"dataset_dir {folder} holds no dataset_info.json", path=path)
    listed = config["dataset"]
    listed = ",".join(map(str, listed)) if isinstance(listed, list) else str(listed)
    names = wanted or tuple(n.strip() for n in listed.split(",") if n.strip())
    media = config.get("media_dir")
    media_dir = _near(str(media), path) if media else None
    if media_dir is not None and not media_dir.is_dir():
        raise InputError(f"media_dir {media_dir} is not a folder", path=path)
    return read_dataset_info(folder, names, media_dir)


def _near(text: str, meta: Path) -> Path:
    """A path an InternVL meta file (or a LLaMA-Factory config) gives, relative to the folder the
    framework is started in (InternVL's internvl_chat, a few levels above the meta file in
    shell/data/): the first of the file's folder and its parents where it exists, else the
    current folder."""
    for folder in dict.fromkeys([meta.parent.resolve(), *meta.resolve().parents][:4]):
        if (folder / text).exists():
            return folder / text
    return Path(text)


def read_internvl_meta(path: Path, entries: dict) -> tuple[list[Source], list[str]]:
    """Each entry's annotation file as a source, its media relative to the entry's ``root``."""
    sources, notes = [], []
    for name, entry in entries.items():
        annotation = entry.get("annotation")
        if not isinstance(annotation, str) or not annotation:
            raise InputError(f"InternVL meta entry {name!r}: 'annotation' must be a file path", path=path)
        file = _near(annotation, path)
        if not file.is_file():
            notes.append(f"{path.name}: {name!r} not read: annotation file {annotation} not found")
            continue
        root = entry.get("root")
        base = _near(root, path) if isinstance(root, str) and root else file.parent
        sources.append(
            _file_source(file, str(file), base, dataset=name, roots=(file.parent.resolve(),), via="InternVL meta")
        )
    return sources, notes


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


def read_dataset_info(
    folder: Path, wanted: tuple[str, ...], media_dir: Path | None = None
) -> tuple[list[Source], list[str]]:
    """The sources a LLaMA-Factory data folder holds: the entries named in ``wanted`` (all of
    them must exist and be local), or every entry whose file exists, with a note of the others.
    Media resolve against ``media_dir`` (a training config's; by default the data folder)."""
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
            not_read(name, f"{file_name}: calibrate reads .json, .jsonl, .parquet and .csv files")
            continue
        for file in files:  # LLaMA-Factory resolves media against media_dir, by default the data folder
            sources.append(
                _file_source(
                    file, str(folder / file.relative_to(folder)), media_dir or folder, dataset=name, spec=spec,
                    roots=(folder.resolve(),) if media_dir is not None else (),
                )
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
        if path.suffix.lower() in CONFIG_TYPES:
            lf_folders += 1
            found, skipped = read_llamafactory_config(path, tuple(datasets))
            sources += found
            notes += skipped
            continue
        if path.suffix.lower() not in FILE_TYPES:
            raise InputError(
                f"unsupported pool file type {path.suffix!r}",
                path=path,
                hint="use .jsonl, .json, .parquet or .csv",
            )
        meta = internvl_meta(path)
        if meta is not None:
            found, skipped = read_internvl_meta(path, meta)
            sources += found
            notes += skipped
            continue
        sources.append(_file_source(path, str(path), path.parent, roots=_llamafactory_root(path)))
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
