"""Finding recipes: the built-in ones in ``recipes/*.yaml`` and user files."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from quantkit.datafile import load_yaml_model
from quantkit.errors import InputError
from quantkit.recipes.schema import Recipe

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


@dataclass(frozen=True)
class RecipeInfo:
    """One line of ``quantkit recipes``."""

    name: str
    scheme: str
    method: str
    needs_data: bool
    checkpoint_format: str
    hardware: str
    description: str
    path: Path


# recipes/ also holds the hardware targets table, which is not a recipe.
NOT_RECIPES = {"targets.yaml"}


def builtin_recipe_files() -> dict[str, Path]:
    return {path.stem: path for path in sorted(RECIPES_DIR.glob("*.yaml")) if path.name not in NOT_RECIPES}


def load_recipe_file(path: Path) -> Recipe:
    """A recipe YAML file; errors name the file, the line and the field."""
    return load_yaml_model(Path(path), Recipe, what="recipe")


def list_recipes() -> list[RecipeInfo]:
    infos = []
    for name, path in builtin_recipe_files().items():
        recipe = load_recipe_file(path)
        if recipe.name != name:
            raise InputError(f"recipe name {recipe.name!r} differs from its file name", path=path)
        infos.append(
            RecipeInfo(
                name=recipe.name,
                scheme=recipe.scheme,
                method=recipe.method,
                needs_data=recipe.needs_data,
                checkpoint_format=recipe.checkpoint_format,
                hardware=recipe.hardware,
                description=recipe.description,
                path=path,
            )
        )
    return infos


def get_recipe(name: str) -> Recipe:
    """A built-in recipe by name; an unknown name suggests the closest one."""
    files = builtin_recipe_files()
    if name in files:
        return load_recipe_file(files[name])
    close = difflib.get_close_matches(name, list(files), n=1, cutoff=0.4)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise InputError(
        f"unknown recipe {name!r}",
        hint=f"{hint}known recipes: {', '.join(files)}; or pass a recipe YAML file",
    )


def resolve_recipe(name_or_path: str | Path, *, kv_cache_fp8: bool | None = None) -> Recipe:
    """A built-in name or a path to a YAML file (anything ending in .yaml/.yml or that exists).

    ``kv_cache_fp8`` overrides the recipe's own setting when given (the CLI flag).
    """
    text = str(name_or_path)
    path = Path(text)
    recipe = load_recipe_file(path) if path.suffix in {".yaml", ".yml"} or path.exists() else get_recipe(text)
    if kv_cache_fp8 is not None:
        recipe = recipe.with_kv_cache_fp8(kv_cache_fp8)
    return recipe
