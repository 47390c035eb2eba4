"""Quantization recipes: data in ``recipes/*.yaml``, validated here, turned into llmcompressor modifiers."""

from quantkit.recipes.modifiers import build_modifiers, kv_cache_fp8_args, resolved_scheme
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
    "build_modifiers",
    "get_recipe",
    "kv_cache_fp8_args",
    "list_recipes",
    "load_recipe_file",
    "resolve_recipe",
    "resolved_scheme",
]
