"""Each stage imports only the stages below it: a walk over every import in the package (function-
level imports included) fails on an upward import, an import of the test zoo, or a cycle between
packages."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "quantkit"
# The stage order, lowest first; a stage imports its own rank and those below, never above.
RANKS = {
    "pool": 20,
    "calibset": 30,
    "models": 40,
    "features": 40,
    "recipes": 40,
    "precision": 50,
    "sensitivity": 60,
    "quantize": 70,
    "export": 75,
    "verify": 80,
    "eval": 80,
    "targets": 90,  # renamed quantkit.build (issue 36); either name ranks here
    "build": 90,
    "zoo": 95,  # tiny models, demo pools, training: may import every stage but cli
    "cli": 100,
    "__main__": 110,
}
# Everything else (errors, fsutil, datafile, progress, terminal, media, chat, taxonomy, taskassign,
# synthetic, the package root) is a base module: it imports base modules only.
BASE = 10
# Only these packages may import the zoo (the commands that build demo material).
ZOO_IMPORTERS = {"zoo", "cli"}
# Known exceptions, by (importing package, imported package), each with its reason.
KNOWN_EXCEPTIONS = {
    ("quantize", "export"): "quantize.run writes the checkpoint itself (export.write_checkpoint, the "
    "serving layout); the orchestrator above both should call export once quantize/run.py is split "
    "(issue 36 item 2)",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANKS else ""


def _rank(module: str) -> int:
    return RANKS.get(_package(module), BASE)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports() -> dict[str, set[str]]:
    """Every quantkit module -> the quantkit modules it imports (anywhere in its body);
    ``from quantkit.x import y`` counts as an import of ``quantkit.x.y`` where y is a module."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("quantkit")
            ):
                targets.add(node.module)
                targets.update(
                    f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")
                )
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("quantkit"))
        found[module] = targets
    return found


def _label(module: str) -> str:
    return f"{module} ({_package(module) or 'base'})"


def test_the_walk_sees_function_level_and_package_imports():
    table = imports()
    assert "quantkit.calibset" in table["quantkit.cli.calibrate"]  # inside calibrate(): start-up stays light
    assert "quantkit.media" in table["quantkit.synthetic.skills_tasks"]  # `from quantkit import media`


def test_no_module_imports_a_stage_above_it():
    upward = [
        f"{_label(module)} imports {_label(target)}"
        for module, targets in imports().items()
        for target in targets
        if _rank(target) > _rank(module) and (_package(module), _package(target)) not in KNOWN_EXCEPTIONS
    ]
    assert not upward, "\n".join(upward)


def test_only_the_zoo_and_its_commands_import_the_zoo():
    into_zoo = [
        f"{_label(module)} imports {target}"
        for module, targets in imports().items()
        for target in targets
        if _package(target) == "zoo" and _package(module) not in ZOO_IMPORTERS
    ]
    assert not into_zoo, "\n".join(into_zoo)


def test_each_known_exception_is_still_needed():
    """An exception that no import uses any more is deleted, so that it cannot hide a new arrow."""
    used = {
        (_package(m), _package(t)) for m, targets in imports().items() for t in targets if _rank(t) > _rank(m)
    }
    assert set(KNOWN_EXCEPTIONS) <= used, sorted(set(KNOWN_EXCEPTIONS) - used)


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for module, targets in imports().items():
        for target in targets:
            if _package(module) != _package(target):
                graph[_package(module)].add(_package(target))
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join([*path, node, nxt])
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_importing_sensitivity_does_not_import_quantize():
    code = "import sys, quantkit.sensitivity; print(sorted(m for m in sys.modules if m.startswith('quantkit.quantize')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
