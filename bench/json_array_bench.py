"""Benchmark reading a JSON array pool against the same records as JSONL (issue 37, item 3).

Writes, into a work folder (default: a new folder under /tmp), a JSON array of about the asked
size in the layout LLaMA-Factory's files have (``json.dump(records, f, indent=2)``) and the same
records as JSONL, all naming a few small images written there. Then, each in a fresh process,
alternately: ``read_pool`` of the JSONL file and of the array, in one process (``workers=1``)
and in one part per CPU (the default). Prints, per size and worker count, the wall time of each,
the array / JSONL time ratio, and the peak RSS (VmHWM) of the reading process and of the largest
part-reading child. The files are deleted at the end (``--keep`` keeps them).

    .venv/bin/python bench/json_array_bench.py --sizes 100          # MB of the array
    .venv/bin/python bench/json_array_bench.py --sizes 100,1000 --repeats 1

The 1 GB case writes ~2 GB and reads each file twice: minutes. Standalone: nothing in the package
imports this file.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import ROOT, peak_rss_mb, run_child  # noqa: E402

IMAGES = 8
TASKS = ("short_caption", "ocr", "visual_grounding", "ocr_markdown")
WORDS = [
    "the",
    "a",
    "red",
    "box",
    "price",
    "label",
    "shelf",
    "bottle",
    "cable",
    "shoe",
    "price",
    "tag",
    "sale",
    "new",
    "fresh",
    "12",
    "34",
    "5.99",
    "€",
]


def _record(n: int, rng: random.Random) -> dict:
    question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
    answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 200)))
    return {
        "id": f"rec-{n}",
        "task": TASKS[n % len(TASKS)],
        "messages": [
            {"role": "user", "content": f"<image>{question} ({n})"},
            {"role": "assistant", "content": answer},
        ],
        "images": [f"media/{n % IMAGES}.jpg"],
    }


def make_pool(folder: Path, megabytes: int) -> tuple[Path, Path, int]:
    """The array (``pool.json``, about ``megabytes`` MB) and the same records as ``pool.jsonl``."""
    from PIL import Image

    (folder / "media").mkdir(parents=True, exist_ok=True)
    for i in range(IMAGES):
        Image.new("RGB", (320 + 16 * i, 240), (30 * i, 90, 160)).save(folder / "media" / f"{i}.jpg")
    target = megabytes << 20
    rng = random.Random(0)
    array, lines = folder / "pool.json", folder / "pool.jsonl"
    count = written = 0
    with open(array, "w", encoding="utf-8") as out_array, open(lines, "w", encoding="utf-8") as out_lines:
        out_array.write("[")
        while written < target:
            record = _record(count, rng)
            text = (
                ("," if count else "")
                + "\n  "
                + json.dumps(record, indent=2, ensure_ascii=False).replace("\n", "\n  ")
            )
            out_array.write(text)
            out_lines.write(json.dumps(record, ensure_ascii=False) + "\n")
            written += len(text.encode())
            count += 1
        out_array.write("\n]\n")
    return array, lines, count


def child(path: str, workers: str) -> dict:
    """Read a pool in this (fresh) process: wall time and peak RSS, here and in the children."""
    from quantkit.pool import read_pool
    from quantkit.taxonomy import load_taxonomy

    taxonomy = load_taxonomy()
    started = time.perf_counter()
    result = read_pool([Path(path)], taxonomy, workers=int(workers) if workers != "default" else None)
    wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "records": len(result.index),
        "peak_rss_mb": peak_rss_mb(),
        "child_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100", help="array sizes in MB, comma-separated (100,1000)")
    parser.add_argument("--workers", default="1,default", help="worker counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    parser.add_argument("--child", nargs=2, metavar=("POOL", "WORKERS"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="quantkit-json-array-"))
    rows = []
    try:
        for megabytes in (int(s) for s in args.sizes.split(",")):
            folder = workdir / f"{megabytes}mb"
            array, lines, count = make_pool(folder, megabytes)
            sizes = {"json": array.stat().st_size, "jsonl": lines.stat().st_size}
            print(
                f"{megabytes} MB: {count} records; array {sizes['json'] >> 20} MB, JSONL {sizes['jsonl'] >> 20} MB"
            )
            for workers in args.workers.split(","):
                runs: dict[str, list[dict]] = {"jsonl": [], "json": []}
                for _ in range(args.repeats):
                    for kind, path in (("jsonl", lines), ("json", array)):  # alternately
                        runs[kind].append(run_child(Path(__file__), str(path), workers, code=ROOT))
                assert {r["records"] for rs in runs.values() for r in rs} == {count}
                wall = {kind: statistics.median(r["wall_s"] for r in rs) for kind, rs in runs.items()}
                row = {
                    "array_mb": megabytes,
                    "records": count,
                    "workers": workers,
                    "jsonl_s": round(wall["jsonl"], 2),
                    "array_s": round(wall["json"], 2),
                    "ratio": round(wall["json"] / wall["jsonl"], 2),
                    "jsonl_peak_mb": round(max(r["peak_rss_mb"] for r in runs["jsonl"])),
                    "array_peak_mb": round(max(r["peak_rss_mb"] for r in runs["json"])),
                    "array_child_peak_mb": round(max(r["child_peak_rss_mb"] for r in runs["json"])),
                }
                rows.append(row)
                print(
                    f"  workers {workers}: JSONL {row['jsonl_s']} s, array {row['array_s']} s (ratio {row['ratio']}); "
                    f"peak RSS JSONL {row['jsonl_peak_mb']} MB, array {row['array_peak_mb']} MB "
                    f"(largest part-reading child {row['array_child_peak_mb']} MB)"
                )
            if not args.keep:
                shutil.rmtree(folder)
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
