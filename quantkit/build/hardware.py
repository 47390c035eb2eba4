"""Hardware targets: ``recipes/targets.yaml`` (a target's hardware, its recipe, its accuracy
budget and its chain of fallbacks), validated with the line and target an error is in."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, field_validator, model_validator

from quantkit.datafile import load_yaml_model
from quantkit.errors import InputError
from quantkit.eval.gate import DEFAULT_MAX_LOSS, LOSS_RANGE, in_loss_range

TARGETS_FILE = Path(__file__).resolve().parents[2] / "recipes" / "targets.yaml"


class When(BaseModel):
    """When the build tries a fallback on its own (any condition that holds), or never (on_request)."""

    model_config = ConfigDict(extra="forbid")

    task_loss_above: StrictFloat | Literal["max_loss"] | None = Field(
        None,
        description="tried when the target's recipe failed: a task lost more than this "
        "(pts of drift loss, % of an eval task's score; max_loss: the build's budget), or it "
        "failed its checks",
    )
    no_calibration_data: StrictBool = Field(False, description="tried when the build has no --calib")
    on_request: StrictBool = Field(
        False, description="never tried by the build on its own: the why says when a person picks it"
    )

    @model_validator(mode="after")
    def _one_kind(self) -> When:
        automatic = self.task_loss_above is not None or self.no_calibration_data
        if self.on_request == automatic:
            raise ValueError(
                "when: give task_loss_above and/or no_calibration_data: true, or on_request: true alone"
            )
        if isinstance(self.task_loss_above, float) and not in_loss_range(self.task_loss_above):
            raise ValueError(
                f"when.task_loss_above {self.task_loss_above}: a loss in [0, 100] "
                "(pts of drift loss, % of an eval task's score)"
            )
        return self

    def describe(self) -> str:
        if self.on_request:
            return "on request only"
        parts = []
        if self.task_loss_above is not None:
            limit = (
                "the budget"
                if self.task_loss_above == "max_loss"
                else f"{self.task_loss_above} pts (% for an eval task)"
            )
            parts.append(f"a task loses more than {limit}")
        if self.no_calibration_data:
            parts.append("no calibration data")
        return " or ".join(parts)


class Fallback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe: str
    when: When
    why: str

    @field_validator("when", mode="before")
    @classmethod
    def _not_prose(cls, value):
        if isinstance(value, str):
            raise ValueError(
                "a condition, not prose: {task_loss_above: max_loss}, {no_calibration_data: true} or "
                "{on_request: true}; the text goes under why"
            )
        return value


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    hardware: list[str] = Field(min_length=1)
    recipe: str
    why: str
    max_loss: StrictFloat = Field(
        DEFAULT_MAX_LOSS,
        ge=LOSS_RANGE[0],
        le=LOSS_RANGE[1],
        description="the most a task may lose: percentage points of drift loss, percent of an eval "
        "task's score (`build --max-loss`)",
    )
    avg_bits: list[StrictFloat] = Field(
        [],
        description="4-bit group recipes: --avg-bits steps tried, in order, when the recipe loses too "
        "much (the last is the cap)",
    )
    fallbacks: list[Fallback] = []

    def budget(self, max_loss: float | None = None) -> float:
        """The most a task may lose for this target: ``max_loss`` (`build --max-loss`) when given,
        else the target's own."""
        return self.max_loss if max_loss is None else max_loss

    @model_validator(mode="after")
    def _chain_is_sound(self) -> Target:
        """Recipes that exist, each once in the chain; avg_bits steps for 4-bit group recipes, rising."""
        from quantkit.precision.mixed import HIGH_BITS, LOW_BITS
        from quantkit.recipes import get_recipe
        from quantkit.recipes.registry import builtin_recipe_files
        from quantkit.recipes.schema import GROUP_SCHEMES

        known = set(builtin_recipe_files())
        chain = [self.recipe, *(f.recipe for f in self.fallbacks)]
        twice = sorted({r for r in chain if chain.count(r) > 1})
        if twice:
            raise ValueError(
                f"recipe(s) {', '.join(twice)} more than once in the target's recipe and fallbacks "
                "(each candidate is tried once); remove the repeats"
            )
        for recipe in chain:
            if recipe not in known:
                raise ValueError(f"unknown recipe {recipe!r}; known: {sorted(known)}")
        steps = self.avg_bits
        if steps and get_recipe(self.recipe).scheme not in GROUP_SCHEMES:
            raise ValueError(
                f"avg_bits promotes layers of 4-bit group recipes "
                f"({', '.join(sorted(GROUP_SCHEMES))}), not {self.recipe!r}; remove it"
            )
        if steps != sorted(set(steps)) or any(not LOW_BITS < b <= HIGH_BITS for b in steps):
            raise ValueError(f"avg_bits {steps} must rise, each in ({LOW_BITS}, {HIGH_BITS}]")
        return self


class TargetsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    targets: list[Target] = Field(min_length=1)

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, targets: list[Target]) -> list[Target]:
        names = [t.name for t in targets]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"target names must be unique: {', '.join(twice)} more than once")
        return targets

    def get(self, name: str) -> Target:
        for target in self.targets:
            if target.name == name:
                return target
        close = difflib.get_close_matches(name, [t.name for t in self.targets], n=1)
        hint = (
            f"did you mean {close[0]!r}?" if close else f"targets: {', '.join(t.name for t in self.targets)}"
        )
        raise InputError(f"unknown target {name!r}", hint=hint)


def load_targets(path: Path | None = None) -> TargetsFile:
    """The targets file, validated; an error names the file, its line and the target."""
    path = Path(path or TARGETS_FILE)
    try:
        return load_yaml_model(path, TargetsFile, what="targets")
    except InputError as error:
        found = re.search(r"field 'targets\.(\d+)", error.message)
        name = _target_name(path, int(found[1])) if found else None
        if name is None:
            raise
        raise InputError(
            f"target {name!r}: {error.message}", path=error.path, line=error.line, hint=error.hint
        ) from None


def _target_name(path: Path, index: int) -> str | None:
    import yaml

    try:
        entry = yaml.safe_load(path.read_text(encoding="utf-8"))["targets"][index]
        return str(entry["name"])
    except (yaml.YAMLError, KeyError, IndexError, TypeError):
        return None
