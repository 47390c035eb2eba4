"""Everything besides weights that a served checkpoint needs, copied byte for byte from the source."""

from __future__ import annotations

import shutil
from pathlib import Path

from quantkit.modelfiles import PROCESSOR_FILES

# Tokenizer, processor (image / video / audio preprocessor configs), chat template.
# config.json, generation_config.json and the weights come from save_pretrained.
SIDECAR_FILES = PROCESSOR_FILES


def copy_sidecar_files(source: Path, destination: Path) -> list[str]:
    """Copy the tokenizer / processor / chat-template files ``source`` has; return their names.

    Copying (rather than re-saving the processor) keeps exactly what the original ships, which is
    what vLLM and the original authors' code expect. generation_config.json is taken from the
    source too when it has one.
    """
    copied = []
    for name in (*SIDECAR_FILES, "generation_config.json"):
        path = Path(source) / name
        if path.is_file():
            shutil.copyfile(path, Path(destination) / name)
            copied.append(name)
    return copied
