"""A command run from the entry point builds that command alone: `quantkit calibrate` pays
neither the other commands' imports (quantize, build, targets, eval) nor the building of their
options, and still reads and fails as part of the whole `quantkit` group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
sys.argv = ["quantkit", *json.loads(sys.argv[1])]
from quantkit.cli import main
try:
    main()
except SystemExit as done:
    code = done.code
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules if m.startswith("quantkit"))}))
"""


def entry_point(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, env=env, check=False
    )
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"out": proc.stdout, "err": proc.stderr}


def test_a_command_imports_its_own_module_only():
    run = entry_point("calibrate", "--help")
    assert run["code"] == 0 and "--size" in run["out"]
    assert "quantkit.cli.calibrate" in run["modules"]
    others = {"quantkit.cli.build", "quantkit.cli.quantize", "quantkit.cli.eval", "quantkit.build"}
    assert not others & set(run["modules"])


def test_the_whole_group_answers_what_is_not_one_command():
    listing = entry_point("--help")
    assert listing["code"] == 0
    for name in ("zoo", "calibrate", "quantize", "build", "eval"):
        assert name in listing["out"]
    unknown = entry_point("calibrat")
    assert unknown["code"] == 2 and "No such command" in unknown["err"]
    missing = entry_point("calibrate")  # a command alone is still `quantkit calibrate`, not a bare script
    assert (
        missing["code"] == 2 and "quantkit calibrate" in missing["err"] and "pools" in missing["err"].lower()
    )
