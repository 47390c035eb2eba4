"""The task taxonomy: which tasks a model was trained on, how sensitive each is, what it takes."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quantkit.datafile import load_yaml_model

DEFAULT_TAXONOMY = Path(__file__).resolve().parents[1] / "calibration" / "taxonomy.yaml"
MEDIA_KINDS = ("image", "video", "audio")


def is_valid_modality(name: str) -> bool:
    """Modality names are 'text' or media kinds joined by '+' in image, video, audio order."""
    if name in ("text", "multi-image"):
        return True
    parts = name.split("+")
    if parts and parts[0] == "multi-image":
        parts[0] = "image"
    ordered = [kind for kind in MEDIA_KINDS if kind in parts]
    return parts == ordered and len(set(parts)) == len(parts)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskSpec(_Strict):
    name: str = Field(min_length=1)
    aliases: list[str] = []
    family: str = Field(min_length=1)
    modalities: list[str] = Field(min_length=1)
    tier: str
    weight: float | None = Field(default=None, gt=0, description="overrides the tier's weight")
    description: str = ""

    @model_validator(mode="after")
    def _modalities_known(self) -> TaskSpec:
        bad = [m for m in self.modalities if not is_valid_modality(m)]
        if bad:
            raise ValueError(
                f"unknown modality {bad[0]!r}; use 'text', 'image', 'multi-image', 'video', 'audio' "
                "or media joined by '+' in image, video, audio order (e.g. 'video+audio')"
            )
        return self


class ImageRule(_Strict):
    """The dynamic-resolution rule that turns an image size into vision tokens."""

    patch_size: int = Field(gt=0)
    merge_size: int = Field(gt=0)
    min_pixels: int = Field(gt=0)
    max_pixels: int = Field(gt=0)


class Buckets(_Strict):
    image_tokens: list[int]
    video_seconds: list[float]
    audio_seconds: list[float]
    image_rule: ImageRule

    @model_validator(mode="after")
    def _edges_increase(self) -> Buckets:
        for name in ("image_tokens", "video_seconds", "audio_seconds"):
            edges = getattr(self, name)
            if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
                raise ValueError(f"{name} edges must increase")
        return self


class Taxonomy(_Strict):
    version: int
    tiers: dict[str, float]
    buckets: Buckets
    tasks: list[TaskSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Taxonomy:
        seen: dict[str, str] = {}
        for task in self.tasks:
            if task.tier not in self.tiers:
                raise ValueError(f"task {task.name!r} has tier {task.tier!r}; tiers are {sorted(self.tiers)}")
            for name in (task.name, *task.aliases):
                if name in seen:
                    raise ValueError(f"name {name!r} is used by both {seen[name]!r} and {task.name!r}")
                seen[name] = task.name
        if any(weight <= 0 for weight in self.tiers.values()):
            raise ValueError("tier weights must be positive")
        return self

    def resolve(self, name: str) -> TaskSpec | None:
        """The task called ``name`` or having it as an alias."""
        for task in self.tasks:
            if name == task.name or name in task.aliases:
                return task
        return None

    def weight(self, task: TaskSpec) -> float:
        return task.weight if task.weight is not None else self.tiers[task.tier]


def task_lookup(taxonomy: Taxonomy) -> dict[str, TaskSpec]:
    """``taxonomy.resolve`` as a dict (every name and alias -> the first task naming it), for
    loops over many records."""
    names: dict[str, TaskSpec] = {}
    for task in taxonomy.tasks:
        for name in (task.name, *task.aliases):
            names.setdefault(name, task)
    return names


def load_taxonomy(path: Path | None = None) -> Taxonomy:
    return load_yaml_model(path or DEFAULT_TAXONOMY, Taxonomy, what="taxonomy")
