"""A model folder: the files its processor is read from, and checks before any work: complete
safetensors files (headers against sizes, the index against the shards) and a config.json that is
a JSON object of settings."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from quantkit.errors import InputError, shorten

# The files a model's tokenizer, processor and chat template are read from: what the feature
# cache's fingerprint hashes, what a checkpoint copies from its source, what says a folder has a
# processor at all. (config.json, generation_config.json and the weights are not among them.)
PROCESSOR_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "processor_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
)


def safetensors_problems(folder: Path) -> list[str]:
    """What is wrong with the ``*.safetensors`` files of ``folder``, from their headers and sizes
    alone (no weight is read): a header that does not parse or is not a JSON object, tensors that
    end past the end of the file (a truncated download or copy), an index that is not a JSON
    object mapping tensor names to shard file names, shards the index names that are missing."""
    folder = Path(folder)
    problems = []
    for file in sorted(folder.glob("*.safetensors")):
        size = file.stat().st_size
        try:
            with open(file, "rb") as handle:
                head = handle.read(8)
                if len(head) < 8:
                    raise ValueError(f"{size} bytes, shorter than a safetensors header")
                (length,) = struct.unpack("<Q", head)
                if 8 + length > size:
                    raise ValueError(f"the header says {8 + length} bytes of header, the file has {size}")
                header = json.loads(handle.read(length))
            if not isinstance(header, dict):
                raise ValueError(f"its header is a JSON {_json_kind(header)}, not an object")
            ends = [
                info["data_offsets"][1]
                for key, info in header.items()
                if key != "__metadata__" and isinstance(info, dict)
            ]
            if not all(isinstance(end, int) for end in ends):
                raise ValueError("a tensor's data_offsets are not whole numbers")
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as err:
            problems.append(f"{file.name}: not a readable safetensors file ({err})")
            continue
        expected = 8 + length + max(ends, default=0)
        if size < expected:
            problems.append(f"{file.name}: truncated: its header needs {expected} bytes, the file has {size}")
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            shards = _index_shards(index)
        except ValueError as err:
            problems.append(f"{index.name}: not a readable index ({err})")
        else:
            problems += [
                f"{name}: named by {index.name} but missing"
                for name in sorted(shards)
                if not (folder / name).is_file()
            ]
    return problems


INDEX_FILE = "model.safetensors.index.json"


def _json_kind(value: object) -> str:
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def _index_shards(index: Path) -> set[str]:
    """The shard file names a safetensors index maps tensors to; ValueError for any other shape."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError("nested too deep") from None
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {_json_kind(data)}, not an object")
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError(f"'weight_map' is a JSON {_json_kind(weight_map)}, not an object of tensor -> file")
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or "/" in shard or shard in (".", ".."):
            raise ValueError(f"the shard of {tensor!r} is {shard!r}, not a file name in the folder")
    return set(weight_map.values())


def read_model_config(folder: Path) -> dict:
    """A model folder's config.json, checked to be a JSON object whose ``architectures`` (when
    given) is a list of names; InputError naming the file, the line and the field otherwise."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise InputError("not a model folder: config.json is missing", path=folder)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputError(f"config.json is not valid JSON: {err.msg}", path=path, line=err.lineno) from None
    except (UnicodeDecodeError, RecursionError) as err:
        raise InputError(f"config.json is not readable JSON ({type(err).__name__})", path=path) from None
    if not isinstance(config, dict):
        raise InputError(
            f"config.json holds a JSON {_json_kind(config)}, not an object", path=path, line=1,
            hint="a model's config.json is an object of settings; download or copy the model again",
        )  # fmt: skip
    architectures = config.get("architectures")
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(a, str) and a for a in architectures)
    ):
        raise InputError(
            f"config.json field 'architectures' is {shorten(repr(architectures), 80)}, not a list of class names",
            path=path,
            hint='write it as a list, e.g. "architectures": ["Qwen3ForCausalLM"]',
        )
    return config


def check_model_folder(folder: Path, *, what: str = "model folder") -> Path:
    """Fail (InputError) unless ``folder`` is an existing folder whose config.json is an object and
    whose safetensors files are complete."""
    folder = Path(folder)
    if not folder.exists():
        raise InputError(f"the {what} does not exist", path=folder, hint="check the path")
    if not folder.is_dir():
        raise InputError(f"the {what} is a file, not a folder", path=folder, hint=f"pass the {what}")
    problems = safetensors_problems(folder)
    if problems:
        raise InputError(
            f"the {what}'s weights are damaged: " + "; ".join(problems),
            path=folder,
            hint="download or copy the model again (the file sizes must match their headers)",
        )
    read_model_config(folder)
    return folder
