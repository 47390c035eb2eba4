"""quantkit.json: what was done, with what, on which data; and the versions that did it."""

from __future__ import annotations

import json
import resource
from importlib import metadata as importlib_metadata
from pathlib import Path

LIBRARIES = (
    "quantkit",
    "torch",
    "transformers",
    "llmcompressor",
    "compressed-tensors",
    "accelerate",
    "datasets",
)
METADATA_FILE = "quantkit.json"


def library_versions() -> dict[str, str | None]:
    import quantkit

    versions: dict[str, str | None] = {"quantkit": quantkit.__version__}  # also when not pip-installed
    for name in LIBRARIES[1:]:
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def write_metadata(directory: Path, metadata: dict) -> Path:
    path = Path(directory) / METADATA_FILE
    path.write_text(json.dumps(metadata, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    return path


def read_metadata(directory: Path) -> dict:
    return json.loads((Path(directory) / METADATA_FILE).read_text(encoding="utf-8"))


def recipe_label(recipe: str, avg_bits: float | None) -> str:
    """How tables name a checkpoint's recipe: ``w4a16``, or ``w4a16 @4.5`` under an --avg-bits budget."""
    return recipe if avg_bits is None else f"{recipe} @{avg_bits:g}"


def checkpoint_label(directory: Path) -> str:
    """What tells a checkpoint apart in a table: its recipe label from quantkit.json; the folder's
    name for one quantkit did not write."""
    try:
        metadata = read_metadata(directory)
        recipe = metadata["recipe"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return Path(directory).name
    return recipe_label(recipe, (metadata.get("precision") or {}).get("avg_bits_requested"))
