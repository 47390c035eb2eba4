"""The memory plan: made from config.json alone, written by `quantize --dry-run`, recorded beside the
measured peaks by a real run; an activation cache that does not fit spills to memory-mapped files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from quantkit.calibset import CalibrateOptions, build_calibration_set
from quantkit.cli import app
from quantkit.errors import InputError
from quantkit.models import adapter_for
from quantkit.models.inputs import Sample
from quantkit.quantize import plan, quantize
from quantkit.quantize.plan import GIB
from quantkit.recipes import get_recipe

pytestmark = pytest.mark.filterwarnings("ignore:Attempting to save a model with offloaded modules")
runner = CliRunner()


def config_only(zoo_model, name: str, root: Path) -> Path:
    bare = root / f"{name}-config-only"
    bare.mkdir(exist_ok=True)
    shutil.copy(zoo_model(name) / "config.json", bare / "config.json")
    return bare


def text_samples(count: int) -> list[Sample]:
    return [
        Sample(
            [
                {"role": "user", "content": f"Count from {i} to {i + 9} in words, then say why."},
                {"role": "assistant", "content": " ".join(["one two three four five six seven"] * (2 + i))},
            ]
        )
        for i in range(count)
    ]


def test_plan_from_config_alone_counts_one_layers_hessians_and_every_solve(zoo_model, tmp_path):
    bare = config_only(zoo_model, "tiny-qwen2.5-omni", tmp_path)
    config = json.loads((bare / "config.json").read_text())["text_config"]
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    tokens = [100, 300, 50]
    result = plan(
        bare,
        get_recipe("w4a16"),
        text_samples(3),
        sample_tokens=tokens,
        calibration_dtype=torch.bfloat16,
    )
    memory = result.memory
    # q, k, v, gate, up read the hidden size, o_proj the attention width (= hidden here), down the MLP's.
    assert memory["per_gpu"]["hessians"] == 4 * (6 * hidden**2 + inter**2)
    assert memory["layer_solves"] == 7 * layers and memory["subgraphs"] == layers + 1
    assert memory["tokens"] == {"samples": 3, "total": 450, "max": 300, "source": "measured"}
    # The activation cache grows with the samples' tokens, never with the layer count.
    assert memory["host"]["activation_cache"] >= sum(tokens) * hidden * 2
    assert memory["disk"]["checkpoint"] > 0 and memory["gib"]["host"] > 0
    free = plan(bare, get_recipe("fp8-dynamic"), text_samples(3), sample_tokens=tokens)
    assert free.memory["layer_solves"] == 0 and free.memory["host"]["activation_cache"] == 0
    assert free.memory["per_gpu"]["hessians"] == 0


def test_unknown_token_counts_are_assumed_and_said(zoo_model, tmp_path):
    bare = config_only(zoo_model, "tiny-qwen3", tmp_path)
    result = plan(bare, get_recipe("w4a16"), text_samples(2), sample_tokens=[None, 64])
    assert result.memory["tokens"]["source"].startswith("assumed")
    assert any("calibrate with --model" in note for note in result.memory["notes"])


def test_an_activation_cache_larger_than_the_host_is_spilled(zoo_model, tmp_path):
    from quantkit.models.loading import unfuse_experts_on_meta
    from quantkit.models.targets import resolve_targets
    from quantkit.quantize.plan import memory_plan

    bare = config_only(zoo_model, "tiny-qwen3-vl", tmp_path)
    adapter = adapter_for(bare)
    model = adapter.meta_model(bare)
    unfuse_experts_on_meta(model)
    targets = resolve_targets(model, adapter)
    tokens = [20_000] * 50
    common = dict(calibration_dtype=torch.bfloat16, saved_dtype=torch.bfloat16, device="cuda")
    common["checkpoint"] = 0  # what is spilled does not depend on it
    roomy = memory_plan(model, adapter, get_recipe("w4a16"), targets, tokens, available=1024 * GIB, **common)
    tight = memory_plan(model, adapter, get_recipe("w4a16"), targets, tokens, available=8 * GIB, **common)
    assert not roomy.spill and roomy.fits and "spilled_activations" not in roomy.disk
    assert tight.spill and tight.fits
    assert tight.disk["spilled_activations"] == roomy.host["activation_cache"] + roomy.host["captured_inputs"]
    assert tight.host["total"] < roomy.host["total"]
    assert any("memory-mapped" in note for note in tight.notes)


def test_dry_run_cli_prints_and_writes_the_plan_from_a_config_only_folder(zoo_model, demo_pool, tmp_path):
    model = zoo_model("tiny-qwen2.5-omni")
    calib = tmp_path / "calib"
    build_calibration_set([demo_pool], calib, CalibrateOptions(size=40, model=model, max_seq_len=1024))
    bare = config_only(zoo_model, "tiny-qwen2.5-omni", tmp_path)
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "quantize",
            str(bare),
            "--recipe",
            "w4a16",
            "--calib",
            str(calib),
            "--output",
            str(out),
            "--dry-run",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "memory plan" in result.output and "host" in result.output and "disk" in result.output
    written = json.loads((tmp_path / "out.plan.json").read_text())
    rows = [json.loads(line) for line in (calib / "samples.jsonl").read_text().splitlines()]
    assert written["memory"]["tokens"]["total"] == sum(row["tokens"] for row in rows)
    assert written["memory"]["tokens"]["source"] == "measured"
    assert not out.exists()


def test_the_dry_run_plans_with_the_collector_paused_and_gives_it_back(zoo_model, tmp_path, monkeypatch):
    """`quantize --dry-run` turns Python's cyclic collector off while it imports and plans; an
    in-process caller gets it back on, whether the dry run succeeds or exits 2 on bad input."""
    import gc

    import quantkit.cli.quantize as quantize_cli

    collector_on_while_printing = []
    print_plan = quantize_cli.print_plan

    def spy(*args, **kwargs):
        collector_on_while_printing.append(gc.isenabled())
        return print_plan(*args, **kwargs)

    monkeypatch.setattr(quantize_cli, "print_plan", spy)
    bare = config_only(zoo_model, "tiny-qwen3", tmp_path)
    assert gc.isenabled()
    command = ["quantize", str(bare), "--output", str(tmp_path / "o"), "--dry-run", "--recipe"]
    planned = runner.invoke(app, [*command, "fp8-dynamic"])
    assert planned.exit_code == 0, planned.output
    assert collector_on_while_printing == [False]
    assert gc.isenabled()
    refused = runner.invoke(app, [*command, str(tmp_path / "no-such-recipe.yaml")])
    assert refused.exit_code == 2, refused.output
    assert collector_on_while_printing == [False]  # refused before any plan
    assert gc.isenabled()


@pytest.mark.slow
def test_a_spilled_run_writes_the_same_checkpoint_and_records_plan_and_peaks(zoo_model, tmp_path):
    name = "tiny-qwen3"
    samples = text_samples(4)
    runs = {
        spill: quantize(
            zoo_model(name),
            tmp_path / f"spill-{spill}",
            get_recipe("w4a16"),
            samples,
            spill=spill,
            progress=False,
        )
        for spill in (False, True)
    }
    memory = {spill: result.metadata["memory"] for spill, result in runs.items()}
    assert memory[True]["measured"]["spilled"] and memory[True]["measured"]["spilled_bytes"] > 0
    assert not memory[False]["measured"]["spilled"]
    for record in memory.values():
        assert record["plan"]["tokens"]["samples"] == len(samples)
        assert record["measured"]["peak_rss"] > 0 and record["measured"]["captured_inputs"] > 0
    on_disk = {
        spill: load_file(str(next(result.output.glob("*.safetensors")))) for spill, result in runs.items()
    }
    assert on_disk[True].keys() == on_disk[False].keys()
    assert all(torch.equal(on_disk[True][key], on_disk[False][key]) for key in on_disk[True])
    assert not list(tmp_path.glob(".*.spill"))


def test_the_meta_tree_gives_the_plan_of_the_loaded_model_moe_included(zoo_model):
    """The dry run's module tree (meta device, experts unfused without init) is the tree a real run
    quantizes (weights loaded, experts unfused by llmcompressor): same shapes, same memory plan."""
    from quantkit.models.loading import unfuse_experts, unfuse_experts_on_meta
    from quantkit.models.targets import resolve_targets
    from quantkit.quantize.plan import checkpoint_size_estimate, memory_plan

    folder = zoo_model("tiny-qwen3-omni-moe")
    adapter = adapter_for(folder)
    meta = adapter.meta_model(folder)
    unfuse_experts_on_meta(meta)
    loaded = adapter.load_model(folder, dtype=torch.bfloat16)
    unfuse_experts(loaded)
    shapes = [{name: tuple(p.shape) for name, p in m.named_parameters()} for m in (meta, loaded)]
    assert shapes[0] == shapes[1]
    plans = [
        memory_plan(
            m,
            adapter,
            get_recipe("w4a16"),
            resolve_targets(m, adapter),
            [300, 50],
            calibration_dtype=torch.bfloat16,
            saved_dtype=torch.bfloat16,
            device="cuda",
            available=0,
            checkpoint=checkpoint_size_estimate(
                m, resolve_targets(m, adapter), get_recipe("w4a16"), None, torch.bfloat16, folder
            ),
        ).to_dict()
        for m in (meta, loaded)
    ]
    assert plans[0] == plans[1] and plans[0]["layer_solves"] > 0


def test_a_config_mixing_dense_and_sparse_layers_plans_each_kind_as_the_loaded_model(zoo_model, tmp_path):
    """Qwen3-MoE's ``mlp_only_layers`` make some decoder layers dense: the dry run, which builds
    one decoder layer per kind and multiplies, gives the plan of the loaded model layer by layer."""
    import transformers

    from quantkit.models.loading import unfuse_experts
    from quantkit.models.targets import resolve_targets
    from quantkit.quantize.plan import memory_plan, reduced_tree
    from quantkit.quantize.resolved import resolve

    base = zoo_model("tiny-qwen3-omni-moe")
    config = transformers.AutoConfig.from_pretrained(base)
    config.text_config.mlp_only_layers = [1]  # layers 0, 2, 3 sparse (128 experts in real sizes), 1 dense
    torch.manual_seed(0)
    model_class = getattr(transformers, config.architectures[0])
    folder = tmp_path / "mixed"
    model_class(config).to(torch.bfloat16).save_pretrained(folder)
    adapter = adapter_for(folder)
    kinds = reduced_tree(adapter.meta_model(folder), adapter)[1]
    assert sorted(len(members) for members in kinds.members.values()) == [1, 3]

    recipe = get_recipe("w4a16")
    tokens = [300, 50]
    common = dict(calibration_dtype=torch.bfloat16, device="cuda")
    dry = plan(folder, recipe, text_samples(2), sample_tokens=tokens, host_memory=0, **common)
    loaded = adapter.load_model(folder, dtype=torch.bfloat16)
    unfuse_experts(loaded)
    targets = resolve_targets(loaded, adapter)
    resolved = resolve(recipe, loaded, adapter, targets, model_dir=folder, saved_dtype=torch.bfloat16)
    full = memory_plan(
        loaded,
        adapter,
        recipe,
        targets,
        tokens,
        saved_dtype=torch.bfloat16,
        available=0,
        checkpoint=resolved.checkpoint_bytes,
        **common,
    )
    assert dry.memory == full.to_dict()
    assert dry.counts == targets.counts() and dry.precision == resolved.precision.to_dict()
    assert (dry.group_size, dry.checkpoint_format) == (resolved.group_size, resolved.checkpoint_format)
    # One estimate of the checkpoint's size: what the dry run prints twice is one figure.
    assert dry.checkpoint_bytes == full.disk["checkpoint"] == dry.memory["disk"]["checkpoint"]
    dense = [name for name in targets.quantize if ".layers.1.mlp." in name]
    assert dense and all(".experts." not in name for name in dense)
    assert dry.memory["layer_solves"] == len(targets.quantize)


def test_loading_in_another_dtype_than_the_checkpoints_counts_the_cast(zoo_model, tmp_path):
    """transformers reads a bfloat16 checkpoint's tensors before casting them to float32: the
    host figure holds them on top of the float32 model, and nothing when the dtypes agree."""
    bare = config_only(zoo_model, "tiny-qwen3", tmp_path)
    recipe, samples = get_recipe("fp8-dynamic"), text_samples(1)
    same = plan(bare, recipe, samples, calibration_dtype=torch.bfloat16, host_memory=0).memory
    cast = plan(bare, recipe, samples, calibration_dtype=torch.float32, host_memory=0).memory
    assert "loading" not in same["host"]
    assert cast["host"]["loading"] == 2 * same["host"]["model"]
    assert cast["host"]["total"] == same["host"]["total"] + same["host"]["model"] + cast["host"]["loading"]


def test_the_quantize_page_table_is_the_plans_of_the_four_real_configs():
    """docs/commands/quantize.md's table of real sizes is what `bench/memory_plan.py real --readme` writes from the
    dry run's plans of bench/configs (every figure but the measured CPU time)."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("memory_plan_bench", root / "bench" / "memory_plan.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    readme = (root / "docs" / "commands" / "quantize.md").read_text(encoding="utf-8")
    table = readme[readme.index(bench.TABLE_START) : readme.index(bench.TABLE_END)].splitlines()
    for name in bench.REAL:
        memory = bench.real_plan(root / "bench" / "configs" / name).memory
        line = bench.readme_table([{**bench.real_row(name, memory), "plan_cpu_s": 0}]).splitlines()[-1]
        figures = line.rsplit("|", 2)[0]  # the last cell is the measured CPU time
        assert any(row.startswith(figures) for row in table), f"docs/commands/quantize.md's row for {name} is not {figures}"


PLAN_THEN_ASSIST = """
import sys
from pathlib import Path
from quantkit.quantize import plan
from quantkit.models.inputs import Sample
from quantkit.recipes import get_recipe
plan(Path(sys.argv[1]), get_recipe("w4a16"), [Sample([{"role": "user", "content": "hi"}])], host_memory=0,
     light_imports=True)
print("sklearn after the plan:", "sklearn" in sys.modules)
print("imported in the plan:", sorted(m for m in sys.modules if m in (
    "transformers.data.metrics", "transformers.generation.candidate_generator", "transformers.file_utils")))
import transformers.data.metrics as metrics
import transformers.file_utils as file_utils
import transformers.generation.candidate_generator as generation
from transformers.utils import is_sklearn_available
from transformers.utils.import_utils import is_sklearn_available as defined
assert is_sklearn_available is defined and is_sklearn_available(), is_sklearn_available
assert generation.is_sklearn_available is is_sklearn_available is metrics.is_sklearn_available
assert file_utils.is_sklearn_available is is_sklearn_available, file_utils.is_sklearn_available
print("roc_curve:", generation.roc_curve([0, 1, 1], [0.1, 0.8, 0.6])[0].tolist())
print("f1:", metrics.f1_score([0, 1, 1], [0, 1, 0]), "pearson:", round(float(metrics.pearsonr([1, 2, 3], [1, 2, 4])[0]), 3))
"""

PLAN_FOR_A_REAL_RUN = """
import sys
from pathlib import Path
from quantkit.quantize import plan
from quantkit.models.inputs import Sample
from quantkit.recipes import get_recipe
plan(Path(sys.argv[1]), get_recipe("w4a16"), [Sample([{"role": "user", "content": "hi"}])], host_memory=0)
import sklearn.metrics
import scipy.stats
import transformers.data.metrics as metrics
import transformers.file_utils as file_utils
import transformers.generation.candidate_generator as generation
from transformers.utils.import_utils import is_sklearn_available
assert "llmcompressor" in sys.modules, "the config has no fused experts: llmcompressor was not imported"
for module in (generation, metrics, file_utils):
    assert module.is_sklearn_available is is_sklearn_available, module
assert generation.roc_curve is sklearn.metrics.roc_curve, generation.roc_curve
assert metrics.f1_score is sklearn.metrics.f1_score, metrics.f1_score
assert metrics.pearsonr is scipy.stats.pearsonr, metrics.pearsonr
print("untouched")
"""


def _plan_in_a_fresh_process(script: str) -> str:
    """``script`` run on the Qwen3-Omni-30B-A3B config folder (fused MoE experts: llmcompressor
    is imported) in a fresh interpreter; its stdout."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", script, str(root / "bench" / "configs" / "Qwen3-Omni-30B-A3B")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_config_only_plan_imports_no_scikit_learn_and_transformers_still_finds_it(tmp_path):
    """The dry run builds the meta model (transformers' generation stack) and, for fused MoE
    experts, llmcompressor's expert classes (transformers' GLUE metrics) without importing
    scikit-learn; afterwards every module that took transformers' check (file_utils too, which
    llmcompressor pulls in) has the real one, and assisted decoding's roc_curve and the metrics
    work as before."""
    pytest.importorskip("sklearn", reason="scikit-learn is not installed: nothing to keep out")
    out = _plan_in_a_fresh_process(PLAN_THEN_ASSIST)
    assert "sklearn after the plan: False" in out
    imported = "['transformers.data.metrics', 'transformers.file_utils', 'transformers.generation.candidate_generator']"
    assert f"imported in the plan: {imported}" in out
    assert "roc_curve: [0.0, 0.0, 0.0, 1.0]" in out
    assert "f1: 0.6666666666666666 pearson: 0.982" in out


def test_a_plan_for_a_real_run_imports_transformers_untouched(tmp_path):
    """quantize plans before it loads the weights; that plan (no light_imports) leaves
    transformers' scikit-learn check and names as transformers made them: the real functions."""
    pytest.importorskip("sklearn", reason="scikit-learn is not installed: nothing to compare with")
    assert "untouched" in _plan_in_a_fresh_process(PLAN_FOR_A_REAL_RUN)


def test_a_module_outside_sklearn_users_imported_while_hidden_is_named_and_given_the_real_check(tmp_path):
    """A module that takes transformers' scikit-learn check and imports scikit-learn names, first
    imported inside the light-import window but not listed in SKLEARN_USERS, gets the real check
    back and is named in a warning instead of staying silently without its names."""
    import subprocess
    import sys

    pytest.importorskip("sklearn", reason="scikit-learn is not installed: nothing is hidden")
    (tmp_path / "uses_sklearn.py").write_text(
        "from transformers.utils import is_sklearn_available\n"
        "if is_sklearn_available():\n"
        "    from sklearn.metrics import roc_curve\n"
    )
    script = (
        "from quantkit.models.loading import generation_without_sklearn\n"
        "from transformers.utils.import_utils import is_sklearn_available\n"
        "with generation_without_sklearn():\n"
        "    import uses_sklearn\n"
        "assert uses_sklearn.is_sklearn_available is is_sklearn_available\n"
        "print('roc_curve' in vars(uses_sklearn))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "False"
    assert "uses_sklearn was imported while scikit-learn was hidden" in proc.stderr
    assert "SKLEARN_USERS" in proc.stderr


def test_a_fixed_block_width_that_does_not_divide_a_layer_is_refused_from_the_config(zoo_model, tmp_path):
    """fp8-block's 128x128 blocks and w4a8-fp8's groups of 128 are not chosen per model: a layer
    whose input width they do not divide (SmolLM2's 576) failed deep inside llmcompressor; the
    plan refuses it first, naming the layers, and the dry run exits 2 with nothing written."""
    bare = config_only(zoo_model, "tiny-qwen3", tmp_path)
    config = json.loads((bare / "config.json").read_text())
    config["intermediate_size"] = 576  # down_proj's input width: 576 = 4.5 x 128, 36 x 16
    (bare / "config.json").write_text(json.dumps(config))
    for name in ("fp8-block", "w4a8-fp8"):
        with pytest.raises(InputError, match=r"mlp\.down_proj \(576\)") as refused:
            plan(bare, get_recipe(name), text_samples(2))
        assert "w4a16" in refused.value.hint
        # The plan holds one decoder layer per kind; the message counts the whole model's layers.
        assert f"and {config['num_hidden_layers']} language-model layer(s)" in str(refused.value)
    plan(bare, get_recipe("nvfp4"), text_samples(2))  # groups of 16 divide 576
    result = runner.invoke(
        app, ["quantize", str(bare), "--recipe", "fp8-block", "--output", str(tmp_path / "o"), "--dry-run"]
    )
    assert result.exit_code == 2, result.output
    assert "128x128 blocks" in result.output and not (tmp_path / "o").exists()
    assert not (tmp_path / "o.plan.json").exists()


def test_an_awq_mapping_wrong_for_the_architecture_is_refused_by_the_plan(zoo_model, tmp_path):
    """An adapter whose AWQ smoothing steps are anchored to another architecture's tree (Qwen2.5-
    Omni's ``thinker.model.layers`` on a Qwen3): the plan refuses it from the config (meta model),
    and so does quantize before any weight is read (the folder holds the config alone)."""
    bare = config_only(zoo_model, "tiny-qwen3", tmp_path)
    root = Path(__file__).resolve().parents[1]
    text = (root / "recipes" / "adapters" / "qwen3.yaml").read_text()
    head, awq = text.split("awq_mappings:")
    wrong = tmp_path / "adapter.yaml"
    wrong.write_text(head + "awq_mappings:" + awq.replace("'re:^model\\.", "'re:^thinker\\.model\\."))
    assert "thinker" in wrong.read_text() and adapter_for(bare, wrong).smoothquant_mappings
    with pytest.raises(InputError, match="AWQ pattern .*thinker.* matches no module"):
        plan(bare, get_recipe("w4a16-awq"), text_samples(2), adapter=wrong)
    with pytest.raises(InputError, match="AWQ pattern .*thinker.* matches no module"):
        quantize(bare, tmp_path / "out", get_recipe("w4a16-awq"), text_samples(2), adapter=wrong)
    assert not (tmp_path / "out").exists()
    plan(bare, get_recipe("w4a16"), text_samples(2), adapter=wrong)  # GPTQ reads no AWQ mapping


def test_the_precision_guard_matches_config_groups_as_compressed_tensors_does(zoo_model):
    """The guard's matcher (patterns compiled once) gives every Linear of a MoE the config group
    compressed-tensors' ``match_name`` gives it: the first name or ``re:`` target in order, then
    the class name "Linear"."""
    from compressed_tensors.utils.match import match_name

    from quantkit.models.loading import unfuse_experts_on_meta
    from quantkit.models.targets import resolve_targets
    from quantkit.precision.mixed import scheme_matcher

    folder = zoo_model("tiny-qwen3-omni-moe")
    result = plan(folder, get_recipe("w4a16"), [], host_memory=0)
    adapter = adapter_for(folder)
    model = adapter.meta_model(folder)
    unfuse_experts_on_meta(model)
    names = resolve_targets(model, adapter).quantize
    expert_patterns = result.precision["symmetric_patterns"]
    assert expert_patterns and any(".experts." in name for name in names)
    targets = [
        (names[0], "exact"),
        ("re:.*down_proj$", "down"),  # before the expert patterns: first match in order wins
        *((pattern, f"expert {i}") for i, pattern in enumerate(expert_patterns)),
        ("Linear", "class"),
    ]

    def library(name: str) -> str | None:
        for target, index in targets:
            if target != "Linear" and match_name(name, target):
                return index
        return next(index for target, index in targets if target == "Linear")

    scheme = scheme_matcher(targets)
    given = {name: scheme(name) for name in names}
    assert given == {name: library(name) for name in names}
    assert {"exact", "down", "expert 0", "class"} <= set(given.values())
    assert scheme_matcher(targets[:-1])("not.a.layer") is None
