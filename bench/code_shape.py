"""The size figures of issue 36, from quantkit's source: modules over 400 / 600 lines, functions over
120 lines, and `quantkit` imports inside functions.

    .venv/bin/python bench/code_shape.py          # a summary and the worst offenders
    .venv/bin/python bench/code_shape.py --json   # the same as JSON
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "quantkit"


def shape() -> dict:
    modules, functions, inner_imports = {}, [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(ROOT))
        text = path.read_text()
        modules[name] = text.count("\n")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{name}:{node.name}"))
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("quantkit") or (
                        isinstance(inner, ast.Import) and any(a.name.startswith("quantkit") for a in inner.names)
                    ):
                        inner_imports.append(f"{name}:{inner.lineno}")
    functions.sort(reverse=True)
    return {
        "lines": sum(modules.values()),
        "modules over 400 lines": {m: n for m, n in sorted(modules.items(), key=lambda i: -i[1]) if n > 400},
        "modules over 600 lines": sorted(m for m, n in modules.items() if n > 600),
        "functions over 120 lines": [f"{f} ({n})" for n, f in functions if n > 120],
        "longest functions": [f"{f} ({n})" for n, f in functions[:5]],
        "quantkit imports inside functions": len(set(inner_imports)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    figures = shape()
    if parser.parse_args().json:
        print(json.dumps(figures, indent=1))
        return
    for key, value in figures.items():
        if isinstance(value, dict):
            print(f"{key}: {len(value)}")
            for module, lines in value.items():
                print(f"  {lines:5d} {module}")
        elif isinstance(value, list):
            print(f"{key}: {len(value)}" + "".join(f"\n  {v}" for v in value))
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
