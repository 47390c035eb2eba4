"""YAML data files that libyaml reads but the pure-Python loader does not still fail as bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from quantkit.cli import app
from quantkit.errors import InputError
from quantkit.recipes import load_recipe_file

# libyaml takes a tab after "key:"; the pure loader raises ScannerError on it.
TAB_AND_UNKNOWN = "name:\tr\nhardware: any\nscheme: FP8\nmethod: rtn\nkv_cache_fp88: true\n"


def test_tab_after_colon_and_unknown_field_names_the_file_and_field(tmp_path: Path):
    if not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("PyYAML is built without libyaml here; the pure loader rejects the tab itself")
    path = tmp_path / "tabbed.yaml"
    path.write_text(TAB_AND_UNKNOWN)
    with pytest.raises(InputError) as err:
        load_recipe_file(path)
    assert err.value.path == path and "kv_cache_fp88" in err.value.message
    assert err.value.line == 5  # the node tree comes from the loader that parsed the text


def test_tabbed_taxonomy_with_unknown_field_exits_2_naming_the_file(tmp_path: Path):
    if not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("PyYAML is built without libyaml here; the pure loader rejects the tab itself")
    pool = tmp_path / "pool.jsonl"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    pool.write_text(json.dumps({"task": "chat", "messages": messages}) + "\n")
    taxonomy = tmp_path / "tax.yaml"
    taxonomy.write_text("version:\t1\nnot_a_field: true\n")
    result = CliRunner().invoke(app, ["calibrate", str(pool), "--taxonomy", str(taxonomy), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert (
        "tax.yaml:2:" in result.output and "not_a_field" in result.output and "Traceback" not in result.output
    )
