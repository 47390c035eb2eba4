"""One list of the files a model's tokenizer and processor are read from: the feature cache's
fingerprint, the files a checkpoint copies and the check that a folder has a processor read it."""

from __future__ import annotations

from pathlib import Path

from quantkit.export.files import copy_sidecar_files
from quantkit.features.processor import processor_fingerprint
from quantkit.modelfiles import PROCESSOR_FILES


def test_a_sentencepiece_tokenizer_change_invalidates_the_feature_cache(tmp_path: Path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "tokenizer.model").write_bytes(b"sentencepiece model v1")
    before = processor_fingerprint(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"sentencepiece model v2")
    assert processor_fingerprint(tmp_path) != before


def test_a_checkpoint_copies_every_processor_file_the_source_has(tmp_path: Path):
    source, output = tmp_path / "source", tmp_path / "output"
    source.mkdir()
    output.mkdir()
    for name in PROCESSOR_FILES:
        (source / name).write_text(name)
    (source / "model.safetensors").write_bytes(b"weights")
    copied = copy_sidecar_files(source, output)
    assert set(copied) == set(PROCESSOR_FILES)
    assert sorted(p.name for p in output.iterdir()) == sorted(PROCESSOR_FILES)
