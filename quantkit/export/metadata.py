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
