"""Hashes of what quantkit writes, to show a restructure changed no behaviour.

Builds the demo pool, a calibration set from it for a zoo omni model, and one checkpoint per
recipe (and a few option variants: --avg-bits, --group-size, --kv-cache) of two zoo models; writes
the SHA-256 of every file that carries behaviour (calibration samples and report, safetensors,
config.json, recipe.yaml) as JSON. Run it before and after a change and compare:

    .venv/bin/python bench/behaviour_fingerprint.py --work /tmp/fp-before --output before.json
    .venv/bin/python bench/behaviour_fingerprint.py --work /tmp/fp-after --output after.json \
        --compare before.json     # exit 1 and the differing files when they differ

Only the CLI is called (its interface is what a restructure keeps), each step in its own process.
Files whose text records a time, a path or quantkit's own commit (quantkit.json, the model card,
report.md) are left out; what they derive from is hashed. The calibration set's JSON names its
inputs by absolute path and records their mtimes: it is hashed with the scratch folder written as
<work> and the mtimes (and the raw hash of samples.jsonl) dropped, so two scratch folders compare equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("tiny-qwen3", "tiny-qwen2.5-omni")
# (name, extra quantize options): every recipe as shipped, then the options that change the plan.
VARIANTS = (("avg-bits", ["--recipe", "w4a16", "--avg-bits", "4.5"]),
            ("group-size-32", ["--recipe", "w4a16", "--group-size", "32"]),
            ("kv-fp8", ["--recipe", "fp8", "--kv-cache", "fp8"]))
CALIB_FILES = ("samples.jsonl", "report.json")
CHECKPOINT_SUFFIXES = (".safetensors", ".yaml")
CHECKPOINT_NAMES = ("config.json", "generation_config.json")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def quantkit(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    run = subprocess.run([sys.executable, "-m", "quantkit", *args], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"quantkit {' '.join(args)} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")


def recipes() -> list[str]:
    return sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml") if p.stem != "targets")


# mtimes differ between scratch folders; samples_sha256 hashes samples.jsonl with its absolute paths
# (samples.jsonl itself is hashed, normalised).
UNSTABLE_KEYS = ("mtime_ns", "samples_sha256")


def without_unstable_keys(value):
    if isinstance(value, dict):
        return {k: without_unstable_keys(v) for k, v in value.items() if k not in UNSTABLE_KEYS}
    if isinstance(value, list):
        return [without_unstable_keys(v) for v in value]
    return value


def calibration_file_hash(path: Path, work: Path) -> str:
    """The hash of a calibration JSON/JSONL file, independent of where the scratch folder lies."""
    text = path.read_text().replace(str(work.resolve()), "<work>")
    records = ([json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl"
               else [json.loads(text)])
    canonical = "\n".join(json.dumps(without_unstable_keys(record), sort_keys=True) for record in records)
    return hashlib.sha256(canonical.encode()).hexdigest()


def calibration_hashes(calib: Path, work: Path) -> dict[str, str]:
    hashes = {name: calibration_file_hash(calib / name, work) for name in CALIB_FILES}
    for media in sorted(p for p in calib.rglob("*") if p.is_file() and p.parent != calib):
        hashes[str(media.relative_to(calib))] = sha256(media)
    return hashes


def checkpoint_hashes(folder: Path) -> dict[str, str]:
    return {
        p.name: sha256(p)
        for p in sorted(folder.iterdir())
        if p.suffix in CHECKPOINT_SUFFIXES or p.name in CHECKPOINT_NAMES
    }


def fingerprint(work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    for model in MODELS:
        if not (work / model).exists():
            quantkit("zoo", "build", model, "--output", str(work / model))
    if not (work / "pool").exists():
        quantkit("demo-pool", "--output", str(work / "pool"))
    calib = work / "calib"
    if not calib.exists():
        quantkit("calibrate", str(work / "pool" / "pool.jsonl"), "--output", str(calib), "--size", "48",
                 "--model", str(work / "tiny-qwen2.5-omni"), "--max-seq-len", "1024")
    result = {"calibration set": calibration_hashes(calib, work), "checkpoints": {}}
    runs = [(name, ["--recipe", name]) for name in recipes()] + list(VARIANTS)
    for model in MODELS:
        for name, options in runs:
            out = work / "out" / model / name
            if not out.exists():
                print(f"{model} {name}", flush=True)
                quantkit("quantize", str(work / model), *options, "--calib", str(calib), "--num-samples", "8",
                         "--cache-dir", str(work / "cache"), "--output", str(out), "--allow-known-failure")
            result["checkpoints"][f"{model} {name}"] = checkpoint_hashes(out)
    return result


def differences(before: dict, after: dict, prefix: str = "") -> list[str]:
    found = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += differences(a, b, f"{prefix}{key} / ")
        elif a != b:
            found.append(f"{prefix}{key}: {a} -> {b}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="scratch folder (kept; steps found there are reused)")
    parser.add_argument("--output", type=Path, required=True, help="the JSON of hashes")
    parser.add_argument("--compare", type=Path, help="an earlier run's JSON: exit 1 if anything differs")
    args = parser.parse_args()
    result = fingerprint(args.work)
    args.output.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    count = len(result["calibration set"]) + sum(len(v) for v in result["checkpoints"].values())
    print(f"{count} files hashed -> {args.output}")
    if args.compare:
        found = differences(json.loads(args.compare.read_text()), result)
        print("\n".join(found) if found else f"identical to {args.compare}")
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
