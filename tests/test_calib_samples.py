"""One way to draw calibration samples for a model (quantkit.models.samples): the processor
loaded once and handed back, the set read and hashed once, the same samples whichever caller
draws them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import quantkit.calibset
from quantkit.calibset import CalibrateOptions, build_calibration_set, load_calibration_report
from quantkit.models.adapters import adapter_for
from quantkit.models.inputs import processor_capabilities
from quantkit.models.samples import draw_samples, open_set, samples_from_set


@pytest.fixture(scope="module")
def calib(demo_pool, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("draw") / "set"
    build_calibration_set([demo_pool], folder, CalibrateOptions(size=48))
    return folder


def test_a_draw_hands_back_the_processor_and_hashes_the_set_once(zoo_model, calib, monkeypatch):
    model = zoo_model("tiny-qwen2.5-omni")
    adapter = adapter_for(model)
    hashed = []
    sha256_file = quantkit.calibset.sha256_file

    def counted(path):
        hashed.append(Path(path).name)
        return sha256_file(path)

    monkeypatch.setattr(quantkit.calibset, "sha256_file", counted)
    drawn = draw_samples(model, calib, adapter=adapter, num_samples=10, seed=3)
    assert hashed.count(quantkit.calibset.SAMPLES_FILE) == 1
    assert drawn.processor is not None and drawn.sha256 == load_calibration_report(calib)["samples_sha256"]
    # The same draw as from the processor's media kinds by hand, sample for sample.
    by_hand = samples_from_set(
        calib, model_kinds=processor_capabilities(drawn.processor), num_samples=10, seed=3
    )
    assert drawn.samples == by_hand.samples and drawn.labels == by_hand.labels and drawn.info == by_hand.info
    opened = open_set(model, calib, adapter=adapter)
    assert opened.draw(10, seed=3).info == drawn.info and len(opened.draw().samples) == len(opened.usable)


def test_a_config_only_folder_draws_by_the_towers_when_allowed(zoo_model, calib, tmp_path):
    """`quantize --dry-run` of a folder with the config alone: the adapter's towers say which media
    the model takes (no processor to load); every other caller needs the processor files."""
    model = zoo_model("tiny-qwen2.5-omni")
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(model / "config.json", config_only / "config.json")
    adapter = adapter_for(config_only)
    drawn = draw_samples(config_only, calib, adapter=adapter, config_only_ok=True)
    full = draw_samples(model, calib, adapter=adapter_for(model))
    assert drawn.processor is None and drawn.info == full.info
    with pytest.raises(Exception):  # noqa: B017 (transformers' own error for a folder without a tokenizer)
        draw_samples(config_only, calib, adapter=adapter)
