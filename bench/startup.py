"""Start-up and dry-run time of the command line, each command in a fresh interpreter (issue 16).

Per command: the CPU time (user + sys of the child process, from the kernel's accounting) and the
wall time, the median of ``--repeats`` runs, and which heavy libraries it imported (one more run
under ``-X importtime``; not timed). The rows:

- ``python -c pass``: the interpreter's own floor;
- ``quantkit --help`` and each command's ``--help``: what every CLI call pays before its work
  (the Typer app imports the stage modules lazily, inside the commands, and the entry point
  builds only the command it runs);
- ``quantize --dry-run`` (fp8-dynamic: data-free, so no calibration set) on the config-only
  folders of bench/configs (the real shapes of Qwen2.5-Omni-7B, Qwen3-Omni-30B-A3B, Qwen3-VL-8B,
  Qwen2.5-VL-72B); the w4a16 plan of those folders, with its precision guard, is what
  ``bench/memory_plan.py real`` times for docs/commands/quantize.md.

Bytecode: each command is run once first, not counted, with Python free to keep the bytecode it
compiles (``PYTHONDONTWRITEBYTECODE`` dropped, the files under ``PYTHONPYCACHEPREFIX`` in the
bench's temporary folder, so the virtual environment is not written): what every call after the
first pays where Python may write its bytecode, as ``make install`` sets up (pip --no-compile,
PYTHONDONTWRITEBYTECODE unexported). One more row runs a dry run with no bytecode cache at all
(every module compiled from source): a first call, or an environment that forbids the files.

The machine's load average before and after goes with the figures (three engineers' CI machines
are noisy: compare rows of one run, not runs of different days).

Run: python bench/startup.py [--repeats 3] [--quick] [--json FILE] [--results bench/RESULTS.md]
[--code DIR] (``--code``: another checkout's quantkit, e.g. main before a change, on the same configs)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import ROOT, child_env, git_commit, median, replace_section  # noqa: E402

HEADING = "## Start-up and dry run (issue 16)"
HEAVY = ("torch", "transformers", "datasets", "llmcompressor", "compressed_tensors", "sklearn", "vllm")
HELP_COMMANDS = ("quantize", "calibrate", "verify", "build", "eval", "sensitivity", "zoo")
REAL = ("Qwen2.5-Omni-7B", "Qwen3-Omni-30B-A3B", "Qwen3-VL-8B", "Qwen2.5-VL-72B")


def dry_run_args(name: str, work: Path) -> list[str]:
    folder, output = ROOT / "bench" / "configs" / name, work / name
    # --force: each repeat writes the same OUTPUT.plan.json, which a dry run otherwise refuses to replace
    options = ["--recipe", "fp8-dynamic", "-o", str(output), "--dry-run", "--force"]
    return ["-m", "quantkit", "quantize", str(folder), *options]


def commands(work: Path, quick: bool) -> list[tuple[str, list[str]]]:
    cli = ["-m", "quantkit"]
    rows = [("python -c pass", ["-c", "pass"]), ("quantkit --help", [*cli, "--help"])]
    rows += [
        (f"quantkit {name} --help", [*cli, name, "--help"]) for name in HELP_COMMANDS[: 1 if quick else None]
    ]
    for name in REAL[1:2] if quick else REAL:
        rows.append((f"quantize --dry-run {name} (fp8-dynamic)", dry_run_args(name, work)))
    return rows


def bytecode_env(code: Path, pycache: Path, cached: bool = True) -> dict[str, str]:
    """The child's environment: Python keeps its compiled bytecode under ``pycache``; not
    ``cached``, it writes none there and finds none (``pycache`` an empty folder: every module
    compiled from source, the checkout's own __pycache__ folders ignored)."""
    env = child_env(code)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    if cached:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def timed(args: list[str], code: Path, pycache: Path, cached: bool = True) -> dict:
    """One fresh interpreter: its CPU seconds (user + sys) and wall seconds. Run in ``code`` (``-m
    quantkit`` imports the quantkit of the working folder before PYTHONPATH's)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=bytecode_env(code, pycache, cached),
        cwd=code,
        check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return {
        "user_s": after.ru_utime - before.ru_utime,
        "sys_s": after.ru_stime - before.ru_stime,
        "wall_s": wall,
    }


def heavy_imports(args: list[str], code: Path, pycache: Path, cached: bool = True) -> list[str]:
    """The heavy libraries a command imports (from ``-X importtime``'s report on stderr)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        # the report goes to stderr, which a command otherwise sends to quantkit.log
        env={**bytecode_env(code, pycache, cached), "QUANTKIT_VERBOSE": "1"},
        cwd=code,
        check=False,
    )
    found = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            top = line.rsplit("|", 1)[1].strip().split(".")[0]
            if top in HEAVY:
                found.add(top)
    return [name for name in HEAVY if name in found]


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def measured(
    label: str, args: list[str], repeats: int, code: Path, pycache: Path, cached: bool = True
) -> dict:
    if cached:
        timed(args, code, pycache)  # the warm-up: compiles the bytecode the counted runs read
    runs = [timed(args, code, pycache, cached) for _ in range(repeats)]
    cpu = [r["user_s"] + r["sys_s"] for r in runs]
    row = {
        "command": label,
        "cpu_s": round(median(cpu), 2),
        "cpu_min_s": round(min(cpu), 2),
        "cpu_max_s": round(max(cpu), 2),
        "wall_s": round(median(r["wall_s"] for r in runs), 2),
        "imports": heavy_imports(args, code, pycache, cached),
    }
    print(json.dumps(row), flush=True)
    return row


def run(repeats: int, quick: bool, code: Path = ROOT) -> dict:
    load_before = load()
    with tempfile.TemporaryDirectory(prefix="qk-startup-") as tmp:
        work, pycache = Path(tmp) / "out", Path(tmp) / "pycache"
        rows = [measured(label, args, repeats, code, pycache) for label, args in commands(work, quick)]
        name = REAL[1]
        label = f"quantize --dry-run {name} (fp8-dynamic), no bytecode cache"
        no_pycache = Path(tmp) / "no-pycache"
        no_pycache.mkdir()
        rows.append(measured(label, dry_run_args(name, work), repeats, code, no_pycache, cached=False))
    return {
        "repeats": repeats,
        "commit": git_commit(code),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_before": load_before,
        "load_after": load(),
        "rows": rows,
    }


def report(result: dict) -> str:
    out = [
        f"Each command in a fresh interpreter, median of {result['repeats']} run(s) after one not "
        f"counted (the bytecode cache's warm-up); CPU = user + sys of the child. Python keeps the bytecode it compiles (as after "
        f"`make install`), except in the last row: no bytecode cache, every module compiled from "
        f"source, what a first call or an environment with PYTHONDONTWRITEBYTECODE pays. Load "
        f"average (1, 5, 15 min) before {result['load_before']}, after {result['load_after']} "
        f"({result['cores']} cores). Measured at commit {result['commit']}; `bench/startup.py` writes this section.",
        "",
        "| command | CPU (median, min-max) | wall | heavy libraries imported |",
        "|---|---|---|---|",
    ]
    for row in result["rows"]:
        out.append(
            f"| `{row['command']}` | {row['cpu_s']:.2f} s ({row['cpu_min_s']:.2f}-{row['cpu_max_s']:.2f}) "
            f"| {row['wall_s']:.2f} s | {', '.join(row['imports']) or 'none'} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repeat, one help and one dry run")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    parser.add_argument("--results", type=Path, help="write the table as a section of this RESULTS.md")
    parser.add_argument("--code", type=Path, default=ROOT, help="measure the quantkit of another checkout")
    args = parser.parse_args(argv)
    result = run(1 if args.quick else args.repeats, args.quick, args.code.resolve())
    text = report(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.results:
        replace_section(args.results, HEADING, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
