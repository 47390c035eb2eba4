"""Each stage imports only the stages below it: a walk over every import in the package (function-
level imports included) fails on an upward import or a cycle between packages."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "quantkit"
# Higher imports lower, never the other way; the same rank may import each other without a cycle.
# cli -> build, verify, eval -> zoo -> quantize -> export -> sensitivity -> precision ->
# recipes / models / features -> calibset -> pool -> the base modules.
RANKS = {
    "__main__": 100,
    "cli": 90,
    "zoo": 75,  # tiny models, demo pools, skills generators: below eval, which scores skills
    "build": 80,
    "verify": 80,
    "eval": 80,
    "quantize": 70,
    "export": 65,
    "sensitivity": 60,
    "precision": 50,
    "recipes": 40,
    "models": 40,
    "features": 40,
    "calibset": 30,
    "pool": 20,
}
BASE = 10  # errors, fsutil, datafile, media, chat, taxonomy, progress, the package root
# Imports the order does not cover, each with its reason.
ALLOWED = {
    ("quantkit.calibset.tokens", "quantkit.models.inputs"): "token counts go through the one "
    "sample -> processor-inputs path, which imports base modules only (checked below)",
    ("quantkit.calibset.samples", "quantkit.models.inputs"): "a draw for a model turns rows into "
    "samples and asks the processor what media it takes on that same path (base modules only)",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANKS else ""


def _rank(module: str) -> int:
    return RANKS.get(_package(module), BASE)


def imports() -> dict[str, set[str]]:
    """Every quantkit module -> the quantkit modules it imports (anywhere in its body)."""
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
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("quantkit"))
        found[module] = targets
    return found


def test_no_module_imports_a_stage_above_it():
    upward = [
        f"{module} ({_package(module) or 'base'}) imports {target} ({_package(target) or 'base'})"
        for module, targets in imports().items()
        for target in targets
        if _rank(target) > _rank(module) and (module, target) not in ALLOWED
    ]
    assert not upward, "\n".join(upward)


def test_allowed_exceptions_import_only_base_modules():
    table = imports()
    for _, target in ALLOWED:
        assert all(_rank(t) == BASE for t in table[target]), (target, table[target])


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
