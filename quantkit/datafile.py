"""Loading YAML data files into pydantic models, with errors that name the file, line and field."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from quantkit.errors import InputError

Model = TypeVar("Model", bound=BaseModel)


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """Follow a pydantic error location through the YAML node tree to a 1-based line number."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
            if match is None:
                # An extra (forbidden) key points at the key itself.
                match_key = next((k for k, _ in node.value if getattr(k, "value", None) == key), None)
                return match_key.start_mark.line + 1 if match_key is not None else line
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
        line = node.start_mark.line + 1
    return line


def load_yaml_model(path: Path, model: type[Model], *, what: str) -> Model:
    """Parse ``path`` and validate it as ``model``; the first problem becomes an InputError."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} file not found", path=path)
    text = path.read_text(encoding="utf-8")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        try:  # libyaml where built in: ~8x faster; its error wording is terser, so errors re-parse
            data = yaml.load(text, Loader=loader)
        except yaml.YAMLError:
            data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise InputError(f"not valid YAML: {getattr(err, 'problem', err)}", path=path, line=line) from None
    if not isinstance(data, dict):
        raise InputError(f"a {what} file must hold a mapping at the top level", path=path, line=1)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = tuple(first["loc"])
        field = ".".join(str(part) for part in loc) or "(top level)"
        try:  # the node tree only to name the line, from the loader that parsed the text
            line = _line_of(yaml.compose(text, Loader=loader), loc)
        except yaml.YAMLError:
            line = None
        raise InputError(
            f"invalid {what}: field '{field}': {first['msg']}",
            path=path,
            line=line,
            hint=f"{len(err.errors())} problem(s) in all" if len(err.errors()) > 1 else None,
        ) from None
