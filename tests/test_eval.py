"""`quantkit eval`: the harness's own numbers, the recovery direction per metric, exit codes, and
offline task data from text that Python ships."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from quantkit.cli import eval as eval_cli
from quantkit.cli._common import QuantkitGroup
from quantkit.eval import (
    compare,
    evaluate_checkpoints,
    judge,
    recovery,
    render_builtin_tasks,
    scores_from_results,
    update_card,
    write_task_data,
)
from quantkit.eval.prose import SPLITS, prose_paragraphs, sentences, task_records
from quantkit.eval.report import SECTION_END, SECTION_START
from quantkit.eval.tasks import TASKS_DIR

runner = CliRunner()
FAST_TASKS = "quantkit_prose_ppl,quantkit_prose_next_sentence"


def eval_app() -> typer.Typer:
    """The command on a local app (the lead registers it on the main one) with quantkit's error
    handling: QuantkitError -> message and exit code."""
    app = typer.Typer(cls=QuantkitGroup, pretty_exceptions_enable=False)
    app.command("eval")(eval_cli.eval_command)
    app.command("other")(lambda: None)  # two commands keep `eval` a subcommand
    return app


def invoke(*args: str):
    return runner.invoke(eval_app(), ["eval", *map(str, args)])


# ---------------------------------------------------------------------- recovery, no models


def test_recovery_follows_the_metric_direction():
    assert recovery(0.80, 0.78, higher_is_better=True) == pytest.approx(0.975)
    assert recovery(10.0, 10.5, higher_is_better=False) == pytest.approx(10 / 10.5)  # perplexity up: worse
    assert recovery(10.0, 9.5, higher_is_better=False) > 1.0  # perplexity down: better than original
    assert recovery(0.0, 0.0, higher_is_better=True) == 1.0
    assert recovery(0.0, 0.3, higher_is_better=True) is None  # undefined, judged by direction only
    assert recovery(float("nan"), 1.0, higher_is_better=True) is None


def test_judge_against_the_allowed_loss():
    assert judge(10.0, 10.14, False, 1.5)[2]  # 1.38% loss
    rec, loss, within = judge(10.0, 10.2, False, 1.5)  # 1.96% loss
    assert not within and loss == pytest.approx(100 - 100 * 10 / 10.2)
    assert judge(0.5, 0.5, True, 0.0)[2]  # no change passes even with no loss allowed
    assert not judge(0.5, 0.49, True, 0.0)[2]
    assert judge(0.0, 0.25, True, 1.5) == (None, None, True)
    assert judge(1.0, float("nan"), False, 1.5) == (None, None, False)


def test_scores_read_direction_from_the_harness():
    results = {
        "results": {
            "t": {
                "alias": "t",
                "acc,none": 0.5,
                "acc_stderr,none": 0.1,
                "word_perplexity,none": 12.0,
                "word_perplexity_stderr,none": "N/A",
                "exact,strict": 0.25,
            }
        },
        "higher_is_better": {"t": {"acc": True, "word_perplexity": False, "exact": True}},
    }
    scores = {s.key: s for s in scores_from_results(results)}
    assert set(scores) == {("t", "acc", "none"), ("t", "word_perplexity", "none"), ("t", "exact", "strict")}
    assert scores[("t", "acc", "none")].stderr == 0.1
    assert scores[("t", "word_perplexity", "none")].stderr is None
    assert not scores[("t", "word_perplexity", "none")].higher_is_better
    assert scores[("t", "exact", "strict")].label == "exact (strict)"
    worse = json.loads(json.dumps(results))
    worse["results"]["t"]["word_perplexity,none"] = 13.0
    rows = {r.metric: r for r in compare(scores_from_results(results), scores_from_results(worse), 1.5)}
    assert rows["acc"].within and not rows["word_perplexity"].within
    assert rows["word_perplexity"].recovery_pct == pytest.approx(100 * 12 / 13)


# ---------------------------------------------------------------------- task data and YAMLs


def test_prose_comes_from_python_itself_and_splits_disjoint():
    halves = {split: prose_paragraphs(split) for split in SPLITS}
    assert all(len(p) > 150 for p in halves.values())
    assert not {p.topic for p in halves["test"]} & {p.topic for p in halves["calibration"]}
    assert sum(p.words for p in halves["test"]) > 8000
    assert sentences("See e.g. the manual. It is long. Really.") == [
        "See e.g. the manual.",
        "It is long.",
        "Really.",
    ]


def test_task_records_are_well_formed_and_deterministic(tmp_path):
    records = task_records()
    for item in records["prose_next_sentence.jsonl"]:
        assert len(item["choices"]) == 4 and len(set(item["choices"])) == 4
        assert 0 <= item["label"] < 4 and item["context"]
    truths = {p.text for p in prose_paragraphs("test")}
    item = records["prose_next_sentence.jsonl"][0]
    assert any(item["context"] + " " + item["choices"][item["label"]] in t for t in truths)
    for item in records["prose_last_word.jsonl"]:
        assert item["target"].isalpha() and not item["context"].endswith(" ")
    first, second = write_task_data(tmp_path / "a"), write_task_data(tmp_path / "b")
    assert first.sha256 == second.sha256
    assert (tmp_path / "a" / "prose_ppl.jsonl").read_bytes() == (
        tmp_path / "b" / "prose_ppl.jsonl"
    ).read_bytes()


def test_rendered_tasks_use_absolute_data_files(tmp_path):
    import yaml

    rendered, data = render_builtin_tasks(tmp_path)
    templates = sorted(p.name for p in TASKS_DIR.glob("*.yaml"))
    assert sorted(p.name for p in rendered.glob("*.yaml")) == templates
    for path in rendered.glob("*.yaml"):
        config = yaml.safe_load(path.read_text())
        files = config["dataset_kwargs"]["data_files"]["test"]
        assert Path(files).is_absolute() and Path(files).is_file(), files
        template = yaml.safe_load((TASKS_DIR / path.name).read_text())
        assert not Path(template["dataset_kwargs"]["data_files"]["test"]).is_absolute()
    assert data.provenance()["records"]["prose_ppl.jsonl"] > 50


def test_card_section_is_replaced_not_appended(tmp_path):
    (tmp_path / "README.md").write_text("# my model\n\nintro\n")
    update_card(tmp_path, f"{SECTION_START}\nfirst\n{SECTION_END}\n")
    update_card(tmp_path, f"{SECTION_START}\nsecond\n{SECTION_END}\n")
    text = (tmp_path / "README.md").read_text()
    assert text.count(SECTION_START) == 1 and "second" in text and "first" not in text
    assert text.startswith("# my model\n\nintro\n")


# ---------------------------------------------------------------------- bad input: exit 2


def fake_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    return folder


def test_missing_checkpoint_folder_is_exit_2(tmp_path):
    original = fake_model(tmp_path / "orig")
    result = invoke(original, tmp_path / "nope", "--tasks", "quantkit_prose_ppl")
    assert result.exit_code == 2, result.output
    assert "checkpoint folder not found" in result.output and "nope" in result.output
    assert "Traceback" not in result.output


def test_unknown_task_is_exit_2_with_close_names(tmp_path):
    original, checkpoint = fake_model(tmp_path / "orig"), fake_model(tmp_path / "ckpt")
    result = invoke(original, checkpoint, "--tasks", "quantkit_prose_pp", "--cache-dir", tmp_path / "cache")
    assert result.exit_code == 2, result.output
    assert "unknown task 'quantkit_prose_pp'" in result.output
    assert "quantkit_prose_ppl" in result.output  # named as a close match
    assert not (checkpoint / "eval.json").exists()


def test_bad_options_are_exit_2(tmp_path):
    original, checkpoint = fake_model(tmp_path / "orig"), fake_model(tmp_path / "ckpt")
    for extra, message in (
        (["--limit", "0"], "Invalid value for '--limit'"),
        (["--max-loss", "-1"], "Invalid value for '--max-loss'"),
        (["--include-path", str(tmp_path / "none")], "--include-path folder not found"),
    ):
        result = invoke(original, checkpoint, "--tasks", "quantkit_prose_ppl", *extra)
        assert result.exit_code == 2, (extra, result.output)
        assert message in result.output


def test_vllm_backend_says_why_it_is_unavailable(tmp_path):
    from quantkit.eval import vllm_status

    python, why = vllm_status()
    if python is not None:
        pytest.skip("lm_eval is installed in the vLLM environment here")
    original, checkpoint = fake_model(tmp_path / "orig"), fake_model(tmp_path / "ckpt")
    result = invoke(original, checkpoint, "--tasks", "quantkit_prose_ppl", "--backend", "vllm")
    assert result.exit_code == 2, result.output
    assert "--backend vllm is not available" in result.output
    assert ("lm_eval is not installed" in result.output) or ("no vLLM environment" in result.output)


# ---------------------------------------------------------------------- real runs on tiny models


@pytest.fixture(scope="module")
def qwen3_pair(zoo_model, tmp_path_factory) -> tuple[Path, Path]:
    """tiny-qwen3 and its data-free FP8 checkpoint made by quantkit."""
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe

    original = zoo_model("tiny-qwen3")
    checkpoint = tmp_path_factory.mktemp("eval") / "tiny-qwen3-fp8-dynamic"
    quantize(original, checkpoint, resolve_recipe("fp8-dynamic"), [], progress=False)
    return original, checkpoint


def direct_harness(model_dir: Path, tasks: list[str], include: Path, limit: int) -> dict:
    """lm_eval as anyone would run it on the folder: its own loader, the checkpoint's dtype, the
    log-softmax in float32 as quantkit asks."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(model_dir), "dtype": "bfloat16", "softmax_dtype": "float32"},
        device="cpu",
        tasks=tasks,
        limit=limit,
        task_manager=TaskManager(include_path=str(include), include_defaults=False),
        log_samples=False,
    )
    return {s.key: s.value for s in scores_from_results(results)}


def test_table_equals_a_direct_harness_run(qwen3_pair, tmp_path):
    original, checkpoint = qwen3_pair
    report = evaluate_checkpoints(original, [checkpoint], FAST_TASKS, limit=2, cache_dir=tmp_path / "cache")
    rendered = tmp_path / "cache" / "tasks"
    names = FAST_TASKS.split(",")
    want_original = direct_harness(original, names, rendered, 2)
    want_checkpoint = direct_harness(checkpoint, names, rendered, 2)

    rows = report.checkpoints[0].rows
    assert {(r.task, r.metric, r.filter) for r in rows} == set(want_original)
    for row in rows:
        key = (row.task, row.metric, row.filter)
        assert row.original == want_original[key]  # the same numbers, not close ones
        assert row.quantized == want_checkpoint[key]
        if row.metric == "bits_per_byte":
            assert not row.higher_is_better
            assert row.recovery_pct == pytest.approx(100 * row.original / row.quantized)
    ppl = next(r for r in rows if r.metric == "byte_perplexity")
    assert ppl.original != ppl.quantized  # float32 log-softmax: FP8's change is visible
    assert math.isfinite(ppl.quantized) and ppl.within

    payload = json.loads((checkpoint / "eval.json").read_text())
    assert payload["passed"] is True and payload["limit"] == 2 and payload["tasks"] == names
    assert payload["data"]["sha256"] and "pydoc_data" in payload["data"]["source"]
    card = (checkpoint / "README.md").read_text()
    assert card.count(SECTION_START) == 1 and "quantkit_prose_ppl" in card
    # The quantize model card is still there (Hub front matter, then its title), the section after it.
    assert card.startswith("---\n") and card.index("\n# ") < card.index(SECTION_START)


def test_cli_exits_1_when_a_checkpoint_loses_too_much(qwen3_pair, tmp_path):
    """A checkpoint whose lm_head was scaled up (sharper, wrong predictions) must fail; the FP8 one
    beside it in the same run must not."""
    import torch
    from safetensors.torch import load_file, save_file

    original, fp8 = qwen3_pair
    broken = tmp_path / "broken"
    shutil.copytree(original, broken)
    weights = load_file(broken / "model.safetensors")
    head = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
    weights[head] = (weights[head].float() * 8).to(torch.bfloat16)
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})

    result = invoke(
        original, fp8, broken, "--tasks", "quantkit_prose_ppl", "--limit", "2", "--cache-dir", tmp_path / "c"
    )
    assert result.exit_code == 1, result.output
    assert "loss beyond 1.5%" in result.output and "broken" in result.output
    bad = json.loads((broken / "eval.json").read_text())
    good = json.loads((fp8 / "eval.json").read_text())
    assert bad["passed"] is False and good["passed"] is True
    assert all(r["recovery_pct"] < 98.5 for r in bad["rows"])
    assert (fp8 / "README.md").read_text().count(SECTION_START) == 1  # rerun replaced the section


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "loaded_as"),
    [("tiny-qwen2.5-omni", "Qwen2_5OmniThinkerForConditionalGeneration"), ("tiny-qwen3-vl", "Qwen3VL")],
)
def test_multimodal_checkpoints_run_text_tasks_on_their_language_model(zoo_model, tmp_path, name, loaded_as):
    """A whole-model Omni checkpoint (serving layout, thinker. prefix) is evaluated on its thinker;
    a VL checkpoint on the VL model with text only."""
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe

    original = zoo_model(name)
    checkpoint = tmp_path / f"{name}-fp8"
    quantize(original, checkpoint, resolve_recipe("fp8-dynamic"), [], progress=False)
    report = evaluate_checkpoints(
        original, [checkpoint], "quantkit_prose_ppl", limit=1, cache_dir=tmp_path / "cache", write=False
    )
    result = report.checkpoints[0]
    assert result.run.loaded_as.startswith(loaded_as)
    assert result.rows and all(math.isfinite(r.quantized) for r in result.rows)


@pytest.mark.slow
def test_harness_in_another_interpreter_gives_the_same_numbers(qwen3_pair, tmp_path):
    """The subprocess path that `--backend vllm` uses, driven with this interpreter and the hf model
    type (lm_eval is not in the vLLM environment): same tasks, same numbers as in-process."""
    import sys

    from quantkit.eval.backends import run_hf, run_in_environment
    from quantkit.eval.tasks import task_catalog

    original, _ = qwen3_pair
    catalog = task_catalog([], tmp_path / "cache", ["quantkit_prose_ppl"])
    here = run_hf(original, ["quantkit_prose_ppl"], catalog, limit=2)
    there = run_in_environment(
        Path(sys.executable),
        original,
        ["quantkit_prose_ppl"],
        catalog,
        model="hf",
        model_args={"pretrained": str(original), "dtype": "bfloat16", "softmax_dtype": "float32"},
        limit=2,
    )
    assert {s.key: s.value for s in scores_from_results(there.results)} == {
        s.key: s.value for s in scores_from_results(here.results)
    }


def test_columns_name_each_checkpoint_by_its_recipe(qwen3_pair, tmp_path):
    """Folder names that share a long prefix were cut into identical headers ("tiny-qwen3-qu…");
    each column is named by its checkpoint's recipe, whole, and the path is given under the table."""
    from quantkit.cli import app
    from quantkit.quantize import quantize
    from quantkit.recipes import resolve_recipe

    original, fp8 = qwen3_pair
    prefix = "tiny-qwen3-quantized-for-the-serving-fleet-"
    dynamic = shutil.copytree(fp8, tmp_path / f"{prefix}fp8-dynamic")
    block = tmp_path / f"{prefix}fp8-block"
    quantize(original, block, resolve_recipe("fp8-block"), [], progress=False)
    result = runner.invoke(
        app,
        ["eval", str(original), str(dynamic), str(block), "--tasks", "quantkit_prose_ppl", "--limit", "2",
         "--cache-dir", str(tmp_path / "c")],  # fmt: skip
        env={"COLUMNS": "100"},
    )
    assert result.exit_code == 0, result.output
    header = result.output[result.output.index("┏") : result.output.index("┡")]  # the header rows
    assert "#1 fp8-dynamic" in header and "#2 fp8-block" in header, result.output
    assert "…" not in header and prefix not in header
    assert f"#1 {dynamic}" in result.output.replace("\n", "") and f"#2 {block}" in result.output.replace("\n", "")
