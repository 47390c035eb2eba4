"""Tables: Parquet files, folders saved with ``save_to_disk`` (a Dataset, or a DatasetDict and a
split), and Hub-layout folders (``data/train-*.parquet``), read with ``datasets``. Image, audio
and video features are read undecoded (``{"bytes", "path"}``) so embedded media are written once,
content-addressed, and never decoded to stratify."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from quantkit.errors import InputError

MEDIA_FEATURES = ("Image", "Audio", "Video")


def _undecoded(feature):
    """The feature with every media feature in it set to decode=False."""
    import datasets

    if isinstance(feature, datasets.Image | datasets.Audio) or type(feature).__name__ == "Video":
        kind = type(feature)
        try:
            return kind(decode=False)
        except TypeError:  # pragma: no cover - an older signature
            return feature
    if isinstance(feature, dict):
        return {k: _undecoded(v) for k, v in feature.items()}
    if isinstance(feature, datasets.List | datasets.LargeList):
        return type(feature)(_undecoded(feature.feature))
    if isinstance(feature, datasets.Sequence):
        return datasets.Sequence(_undecoded(feature.feature), length=feature.length)
    if isinstance(feature, list):
        return [_undecoded(feature[0])]
    return feature


def _undecoded_table(table):
    import datasets

    features = datasets.Features({k: _undecoded(v) for k, v in table.features.items()})
    return table.cast(features) if features != table.features else table


def iter_csv(path: Path) -> Iterator[tuple[int, dict]]:
    """Rows of a CSV file with a header (what LLaMA-Factory loads with ``datasets``' csv
    builder), each a dict of strings; 'line' is the file line the row ends on. Empty cells are
    left out, as a JSON record would not have them."""
    import csv

    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            for row in reader:
                yield reader.line_num, {k: v for k, v in row.items() if k is not None and v not in (None, "")}
    except (UnicodeDecodeError, csv.Error) as err:
        raise InputError(f"cannot read the CSV file: {err}", path=path) from None


def csv_at(path: Path, places: list[tuple[int, int]], parse) -> None:
    """Parse again the CSV rows at (line, row index) ``places``."""
    wanted = {index: line for line, index in places}
    rows = {}
    for index, (_, row) in enumerate(iter_csv(path)):
        if index in wanted:
            rows[index] = row
    for line, index in places:
        parse(rows[index], line, index)


def is_save_to_disk(folder: Path) -> bool:
    return (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()


def hub_files(folder: Path, split: str | None) -> tuple[list[Path], str] | None:
    """The Parquet files of one split of a Hub-layout folder (``data/<split>-*.parquet``,
    ``<split>/*.parquet``, or plain ``*.parquet``), and the split; None when it holds none."""
    parquet = sorted(p for p in folder.rglob("*.parquet") if p.is_file())
    if not parquet:
        return None
    by_split: dict[str, list[Path]] = {}
    for path in parquet:
        rel = path.relative_to(folder).parts
        name = path.name.split("-")[0].split(".")[0] if rel[0] == "data" or len(rel) == 1 else rel[0]
        by_split.setdefault(name, []).append(path)
    if split is None:
        split = "train" if "train" in by_split else (next(iter(by_split)) if len(by_split) == 1 else None)
        if split is None:
            raise InputError(
                f"the folder holds the splits {', '.join(sorted(by_split))}",
                path=folder,
                hint="choose one with --split NAME",
            )
    if split not in by_split:
        raise InputError(
            f"no split {split!r} in the folder (it has {', '.join(sorted(by_split))})",
            path=folder,
            hint="choose one with --split NAME",
        )
    return by_split[split], split


def iter_table(path: Path, split: str | None = None) -> Iterator[tuple[int, object]]:
    """Rows of a Parquet file, a saved ``datasets`` folder or a Hub-layout folder; 'line' is the
    1-based row number."""
    yield from enumerate(open_table(path, split), start=1)


def table_at(path: Path, split: str | None, places: list[tuple[int, int]], parse) -> None:
    """Parse again the rows at (row number, row index) ``places``."""
    table = open_table(path, split)
    for line, index in places:
        parse(table[index], line, index)


def open_table(path: Path, split: str | None = None):
    """The table (media features undecoded) of a Parquet file, a saved folder or a Hub-layout folder."""
    import datasets

    try:
        if path.is_dir() and is_save_to_disk(path):
            table = datasets.load_from_disk(str(path))
            if isinstance(table, datasets.DatasetDict):
                splits = list(table)
                chosen = split or ("train" if "train" in table else (splits[0] if len(splits) == 1 else None))
                if chosen is None or chosen not in table:
                    raise InputError(
                        f"a DatasetDict with the splits {', '.join(splits)}"
                        + (f" and no split {split!r}" if split else ""),
                        path=path,
                        hint="choose one with --split NAME",
                    )
                table = table[chosen]
        elif path.is_dir():
            found = hub_files(path, split)
            if found is None:
                raise InputError("the folder holds no Parquet file", path=path)
            table = datasets.Dataset.from_parquet([str(p) for p in found[0]])
        else:
            table = datasets.Dataset.from_parquet(str(path))
    except InputError:
        raise
    except (OSError, ValueError, json.JSONDecodeError) as err:  # the library's own reading errors
        raise InputError(f"cannot read the table: {err}", path=path) from None
    return _undecoded_table(table)
