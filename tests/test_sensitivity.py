"""Sensitivity: a deliberately fragile layer ranks first; the fake quantization is the library's;
block replay equals whole forwards; weights come back bit for bit; the table and the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_quantize  # the media fixture and mixed samples of the quantize tests
import torch

from quantkit.features.processor import FeatureRow
from quantkit.models import adapter_for
from quantkit.models.inputs import Sample
from quantkit.precision.table import format_table, load_table, save_table
from quantkit.sensitivity import (
    fake_quantized,
    measure_loaded,
    qdq_weight,
    scheme_args,
    sensitivity,
)
from quantkit.sensitivity.measure import make_batches, measurement_units, score_positions

media = test_quantize.media  # a session fixture, shared
DAMAGED = "model.layers.2.mlp.down_proj"
OUTLIER_COLUMNS = (5, 133, 261, 389)  # one per group of 128 along down_proj's 512 in-features
OUTLIER_FACTOR = 64.0

TEXTS = [
    ("Name three colours and one fruit for each.", "Red apple, yellow banana, green pear."),
    ("Explain why the sky looks blue.", "Air scatters short blue wavelengths more than red ones."),
    ("Write one line about the sea.", "Waves fold over the sand and the tide comes back."),
    ("What is the capital of France?", "Paris is the capital and the largest city of France."),
    ("Count from one to five.", "One, two, three, four, five."),
    ("Describe a red sneaker.", "A bright red canvas shoe with white laces and a rubber sole."),
]


def text_samples() -> list[Sample]:
    return [Sample([{"role": "user", "content": q}, {"role": "assistant", "content": a}]) for q, a in TEXTS]


def damage(source: Path, output: Path, layer: str = DAMAGED) -> Path:
    """The same function, a fragile layer: a few input columns of ``layer`` (a down_proj) scaled by
    64 and the matching rows of up_proj divided by 64. The model computes the same thing, but each
    4-bit group holding an outlier column gets a scale 64x too coarse for its other weights."""
    from quantkit.export.files import copy_sidecar_files

    if (output / "config.json").is_file():
        return output
    adapter = adapter_for(source)
    model = adapter.load_model(source, dtype=torch.float32)
    down = model.get_submodule(layer)
    up = model.get_submodule(layer.replace("down_proj", "up_proj"))
    with torch.no_grad():
        for column in OUTLIER_COLUMNS:
            down.weight[:, column] *= OUTLIER_FACTOR
            up.weight[column, :] /= OUTLIER_FACTOR
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(output)
    copy_sidecar_files(source, output)
    return output


@pytest.fixture(scope="session")
def damaged_qwen3(zoo_model, tmp_path_factory) -> Path:
    return damage(zoo_model("tiny-qwen3"), tmp_path_factory.mktemp("damaged") / "tiny-qwen3-damaged")


# ------------------------------------------------------------------------------ fake quantization


def test_qdq_is_what_the_library_computes(zoo_model):
    """Round-to-nearest W4A16 by llmcompressor's QuantizationModifier (its observer, its scales)
    gives the same weights as qdq_weight."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model_dir = zoo_model("tiny-qwen3")
    model = adapter_for(model_dir).load_model(model_dir, dtype=torch.float32)
    originals = {n: m.weight.detach().clone() for n, m in model.named_modules() if n.endswith("proj")}
    for preset in ("W4A16", "W4A16_ASYM", "W8A16"):
        oneshot(
            model=model, recipe=[QuantizationModifier(scheme=preset, targets=["Linear"], ignore=["lm_head"])]
        )
        for name in ("model.layers.0.self_attn.q_proj", "model.layers.3.mlp.down_proj"):
            module = model.get_submodule(name)
            library = fake_quantize(
                originals[name],
                module.weight_scale,
                module.weight_zero_point,
                module.quantization_scheme.weights,
            )
            ours = qdq_weight(originals[name], module.quantization_scheme.weights)
            assert torch.allclose(ours, library, atol=1e-6), (preset, name)
            assert not torch.equal(ours, originals[name])
        model = adapter_for(model_dir).load_model(model_dir, dtype=torch.float32)


def test_scheme_args_for_sensitivity():
    assert scheme_args("W4A16").group_size == 128 and scheme_args("W4A16", 64).group_size == 64
    assert scheme_args("W4A16_ASYM").symmetric is False
    eight = scheme_args("W8A16")  # per channel, as quantize writes its 8-bit layers
    assert (eight.num_bits, eight.strategy, eight.group_size) == (8, "channel", None)


def test_fake_quantized_restores_weights_bit_for_bit(zoo_model):
    model_dir = zoo_model("tiny-qwen3")
    model = adapter_for(model_dir).load_model(model_dir, dtype=torch.float32)
    name = "model.layers.1.mlp.gate_proj"
    before = model.get_submodule(name).weight.detach().clone()
    with fake_quantized(model, {name: scheme_args("W4A16")}):
        assert not torch.equal(model.get_submodule(name).weight, before)
    assert torch.equal(model.get_submodule(name).weight, before)


# ------------------------------------------------------------------------------ ranking


def test_damaged_layer_ranks_first(damaged_qwen3):
    table = sensitivity(damaged_qwen3, text_samples(), progress=False)
    ranked = table.ranked()
    print("\n" + "\n".join(format_table(table, top=5)))
    assert ranked[0].name == DAMAGED and ranked[0].layers == [DAMAGED]
    assert ranked[0].kl > 1.5 * ranked[1].kl
    assert len(ranked) == 28 and [r.rank for r in ranked] == list(range(1, 29))
    assert table.mode == "replay" and not table.skipped
    assert table.scheme["weights"]["group_size"] == 128 and table.scheme["weights"]["num_bits"] == 4
    assert table.samples == len(TEXTS) and table.positions > 0
    cost = table.cost
    assert cost["forward_passes"] == 28 * len(TEXTS)
    # replay runs each row from its own block: 28 rows over 4 blocks, 7 rows per block
    assert cost["forward_pass_equivalents"] == pytest.approx(7 * (4 + 3 + 2 + 1) * len(TEXTS) / 4)


def test_fisher_estimate_agrees_with_the_measured_kl(damaged_qwen3):
    """The second-order estimate (all rows from a few backward passes) ranks the damaged layer
    first too, and lands near the measured KL of the layers that matter."""
    measured = sensitivity(damaged_qwen3, text_samples(), granularity="unit", progress=False)
    estimated = sensitivity(
        damaged_qwen3, text_samples(), granularity="unit", method="fisher", draws=16, progress=False
    )
    assert estimated.method == "fisher" and estimated.mode == "fisher"
    assert estimated.ranked()[0].name == measured.ranked()[0].name == DAMAGED
    kl = {r.name: r.kl for r in measured.rows}
    for row in estimated.ranked()[:4]:
        assert 0.5 * kl[row.name] < row.kl < 2 * kl[row.name], (row.name, row.kl, kl[row.name])
    assert estimated.ranked()[0].top1 is None  # not estimated
    assert estimated.cost["backward_passes"] == 16 * len(TEXTS)


def test_undamaged_model_does_not_rank_that_layer_first(zoo_model):
    table = sensitivity(zoo_model("tiny-qwen3"), text_samples(), progress=False)
    assert table.ranked()[0].name != DAMAGED


def test_replay_equals_whole_forwards_and_restores_the_model(damaged_qwen3):
    adapter = adapter_for(damaged_qwen3)
    model = adapter.load_model(damaged_qwen3, dtype=torch.float32)
    processor = adapter.load_processor(damaged_qwen3)
    from quantkit.models.inputs import processor_inputs
    from quantkit.models.targets import resolve_targets

    rows = [FeatureRow(str(i), "text", processor_inputs(processor, s)) for i, s in enumerate(text_samples())]
    names = resolve_targets(model, adapter).quantize
    state = {k: v.clone() for k, v in model.state_dict().items()}
    kwargs = dict(names=names, args=scheme_args("W4A16"), granularity="unit", progress=False)
    replayed = measure_loaded(model, adapter, rows, **kwargs)
    full = measure_loaded(model, adapter, rows, replay=False, **kwargs)
    assert (replayed.mode, full.mode) == ("replay", "full")
    assert len(replayed.rows) == 16  # 4 blocks x (qkv, o, gate_up, down)
    by_name = {r.name: r for r in full.rows}
    for row in replayed.rows:
        assert row.kl == pytest.approx(by_name[row.name].kl, rel=1e-3, abs=1e-9), row.name
        assert row.top1 == pytest.approx(by_name[row.name].top1)
    assert replayed.cost["forward_pass_equivalents"] < full.cost["forward_pass_equivalents"]
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-qwen2.5-omni"])
def test_replay_holds_on_multimodal_models(zoo_model, media, name):
    """Qwen3-VL adds deepstack visual features between blocks; the Omni thinker takes audio. The
    replay (checked against the reference before use) must still be exact there."""
    samples, labels = test_quantize.calibration_samples(name, media)
    table = sensitivity(zoo_model(name), samples, sample_labels=labels, granularity="block", progress=False)
    assert table.mode == "replay", table.notes
    assert len(table.rows) == 4 and all(r.kl >= 0 for r in table.rows)
    assert table.samples == len(samples)


# ------------------------------------------------------------------------------ pieces


def test_score_positions_are_evenly_spaced_and_predict_a_token():
    assert score_positions(5, None).tolist() == [0, 1, 2, 3]
    spread = score_positions(1000, 10)
    assert len(spread) == 10 and spread[0] == 0 and spread[-1] == 998


def test_text_rows_of_equal_length_share_a_batch():
    def row(tokens: int, sid: str) -> FeatureRow:
        ids = torch.arange(tokens)[None]
        return FeatureRow(sid, "t", {"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    batches = make_batches(
        [row(8, "a"), row(8, "b"), row(5, "c"), row(8, "d")], max_positions=4, batch_size=2
    )
    assert sorted((b.rows, b.inputs["input_ids"].shape[1]) for b in batches) == [(1, 5), (1, 8), (2, 8)]


def test_measurement_units_by_granularity():
    names = [
        f"model.layers.{i}.{p}"
        for i in range(2)
        for p in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj")
    ]
    blocks = ["model.layers.0", "model.layers.1"]
    assert len(measurement_units(names, blocks, "layer")) == 6
    units = measurement_units(names, blocks, "unit")
    assert [u.name for u in units][:2] == [
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.mlp.down_proj",
    ]
    assert [(u.name, u.block) for u in measurement_units(names, blocks, "block")] == [
        ("model.layers.0", 0),
        ("model.layers.1", 1),
    ]


def test_table_round_trips_through_json(damaged_qwen3, tmp_path):
    table = sensitivity(damaged_qwen3, text_samples()[:2], granularity="block", progress=False)
    path = save_table(table, tmp_path / "s.json")
    again = load_table(path)
    assert again.to_dict() == table.to_dict()
    assert json.loads(path.read_text())["rows"][0]["rank"] == 1
    from quantkit.errors import InputError

    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError, match="not a quantkit sensitivity table"):
        load_table(tmp_path / "bad.json")


def test_sensitivity_command(zoo_model, demo_pool, tmp_path):
    """The command as the lead wires it: a calibration set, a subsample, a JSON table."""
    from typer.testing import CliRunner

    from quantkit.calibset import CalibrateOptions, build_calibration_set
    from quantkit.cli import app

    model = zoo_model("tiny-qwen3")
    calib = tmp_path / "calib"
    build_calibration_set([demo_pool], calib, CalibrateOptions(size=60, model=model, max_seq_len=1024))
    out = tmp_path / "table.json"
    result = CliRunner().invoke(
        app,
        [
            "sensitivity",
            str(model),
            "--calib",
            str(calib),
            "--num-samples",
            "4",
            "--output",
            str(out),
            "--top",
            "5",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "forward passes" in result.output and "rank" in result.output
    table = load_table(out)
    assert 1 <= table.samples <= 4 and len(table.rows) == 28  # the set holds few text-only samples
