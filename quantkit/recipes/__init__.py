"""Quantization recipes: data in ``recipes/*.yaml``, validated here (quantkit.quantize.resolved resolves
one for a model and builds its llmcompressor modifiers)."""

from quantkit.recipes.modifiers import kv_cache_fp8_args
from quantkit.recipes.registry import (
    RECIPES_DIR,
    RecipeInfo,
    get_recipe,
    list_recipes,
    load_recipe_file,
    resolve_recipe,
)
from quantkit.recipes.schema import SCHEME_FORMATS, Recipe

__all__ = [
    "RECIPES_DIR",
    "SCHEME_FORMATS",
    "Recipe",
    "RecipeInfo",
    "get_recipe",
    "kv_cache_fp8_args",
    "list_recipes",
    "load_recipe_file",
    "resolve_recipe",
]
