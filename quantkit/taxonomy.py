"""The task taxonomy: which tasks a model was trained on, how sensitive each is, what it takes,
and the `match` rules that recognise a task in records that carry no task field."""

from __future__ import annotations

import difflib
import functools
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

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


def modality_kinds(name: str) -> frozenset[str]:
    """The media kinds a modality name stands for ('multi-image' is images, 'text' none)."""
    if name == "text":
        return frozenset()
    return frozenset("image" if part == "multi-image" else part for part in name.split("+"))


def close_names(name: str, known: list[str]) -> list[str]:
    """Up to three of ``known`` spelled like ``name`` (or inside it, or holding it), case ignored,
    closest first."""
    by_lower: dict[str, str] = {}
    for candidate in known:
        by_lower.setdefault(candidate.lower(), candidate)
    lower = name.lower()
    close = difflib.get_close_matches(lower, list(by_lower), n=3, cutoff=0.6)
    close += [
        k
        for k in by_lower
        if len(k) >= 3 and len(lower) >= 3 and (k in lower or lower in k) and k not in close
    ]
    return [by_lower[k] for k in close[:3]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="wrap")
    @classmethod
    def _unknown_keys_first(cls, data: Any, handler: Any) -> Any:
        """An unknown key is reported by name with the closest valid key, instead of the
        "Field required" that a misspelled required key (``teir``) would also give."""
        if isinstance(data, dict):
            fields = list(cls.model_fields)
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                errors = []
                for key in unknown:
                    close = close_names(str(key), fields)
                    hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(fields)}"
                    error = PydanticCustomError(
                        "unknown_key", "unknown key '{key}'; {hint}", {"key": str(key), "hint": hint}
                    )
                    errors.append(InitErrorDetails(type=error, loc=(key,), input=data[key]))
                raise ValidationError.from_exception_data(cls.__name__, errors)
        return handler(data)


MediaKind = Literal["image", "video", "audio"]
_CONDITIONS = (
    ("user", False, False),
    ("answer", True, False),
    ("unless_user", False, True),
    ("unless_answer", True, True),
)


class PatternSet:
    """Patterns searched as one: "any of them is found", case ignored.

    For speed, the patterns in which case cannot matter (no capital letter outside an escape, no
    ``(?-i``) are joined into one alternation and searched without IGNORECASE in the lowered text
    (Python's re then skips ahead on the patterns' first characters); the others are searched in
    the text as it is, with IGNORECASE. Equal lists share one set (``pattern_set``)."""

    __slots__ = ("lowered", "original", "patterns")

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self.patterns = patterns
        plain = [p for p in patterns if not _has_capital(_ESCAPE.sub("", p)) and "(?-" not in p]
        joined = "|".join(f"(?:{p})" for p in plain)
        try:
            if len(plain) < 2 or _BACKREF.search(joined):
                raise re.error("not joined")
            self.lowered: tuple[re.Pattern, ...] = (re.compile(joined),)
        except re.error:  # e.g. a global flag such as (?m) inside: one by one
            self.lowered = tuple(re.compile(p) for p in plain)
        self.original = tuple(re.compile(p, re.IGNORECASE) for p in patterns if p not in plain)

    def found(self, lowered: str, original: str) -> bool:
        """Whether any pattern is found, given the text lowered and as it is."""
        for pattern in self.lowered:
            if pattern.search(lowered):
                return True
        return any(pattern.search(original) for pattern in self.original)


_ESCAPE, _BACKREF = re.compile(r"\\."), re.compile(r"\\[1-9]|\(\?P=")


def _has_capital(text: str) -> bool:
    return text != text.lower()


@functools.cache
def pattern_set(patterns: tuple[str, ...]) -> PatternSet:
    return PatternSet(patterns)


def _pattern_list(value: Any) -> Any:
    """A pattern or a list of them (lists inside are flattened, so that YAML anchors of pattern
    lists combine: ``[*box, 'coordinates']``), each checked to compile."""
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list):
        return patterns  # pydantic says what is wrong
    flat = [item for entry in patterns for item in (entry if isinstance(entry, list) else [entry])]
    for pattern in flat:
        if isinstance(pattern, str):
            try:
                re.compile(pattern, re.IGNORECASE)
            except re.error as err:
                raise ValueError(f"not a valid regular expression: {pattern!r}: {err}") from None
    return flat


class MatchRule(_Strict):
    """One way to recognise a task in a record without a task field; every condition given must
    hold. Patterns are Python regular expressions searched anywhere in the text with case ignored;
    a list means "any of them"."""

    description: str = ""
    user: list[str] = Field(default=[], description="the system + user text matches one of these")
    answer: list[str] = Field(default=[], description="the assistant text matches one of these")
    media: list[MediaKind] = Field(default=[], description="the record carries every one of these")
    unless_user: list[str] = Field(default=[], description="the user text matches none of these")
    unless_answer: list[str] = Field(default=[], description="the answer matches none of these")
    unless_media: list[MediaKind] = Field(default=[], description="the record carries none of these")
    _conditions: tuple = PrivateAttr(default=())

    @field_validator("user", "answer", "unless_user", "unless_answer", mode="before")
    @classmethod
    def _patterns(cls, value: Any) -> Any:
        return _pattern_list(value)

    @model_validator(mode="after")
    def _satisfiable(self) -> MatchRule:
        if not (
            self.user
            or self.answer
            or self.media
            or self.unless_user
            or self.unless_answer
            or self.unless_media
        ):
            raise ValueError(
                "a match rule needs at least one condition: user, answer, media, unless_user, "
                "unless_answer or unless_media"
            )
        both = set(self.media) & set(self.unless_media)
        if both:
            raise ValueError(f"media {sorted(both)} both required and excluded: the rule could never match")
        return self

    def model_post_init(self, context: Any) -> None:
        conditions = []
        for name, on_answer, negate in _CONDITIONS:
            patterns = getattr(self, name)
            if patterns:
                conditions.append((pattern_set(tuple(patterns)), on_answer, negate))
        self._conditions = tuple(conditions)

    @property
    def conditions(self) -> tuple[tuple[PatternSet, bool, bool], ...]:
        """The text conditions, compiled once when the taxonomy is read: (patterns, on the answer
        (else the user text), negated (an ``unless_``))."""
        return self._conditions

    def fits_media(self, kinds: frozenset[str]) -> bool:
        """Whether a record carrying media ``kinds`` passes the media conditions."""
        return kinds.issuperset(self.media) and kinds.isdisjoint(self.unless_media)

    def text_matches(self, user_text: str, answer_text: str) -> bool:
        """Whether the text conditions hold (TaskAssigner does the same, sharing the searches)."""
        texts = ((user_text.lower(), user_text), (answer_text.lower(), answer_text))
        return all(
            patterns.found(*texts[on_answer]) != negate for patterns, on_answer, negate in self._conditions
        )

    def summary(self) -> str:
        """The conditions in a line, for the report."""
        parts = []
        if self.media:
            parts.append("media " + "+".join(self.media))
        if self.unless_media:
            parts.append("no " + "/".join(self.unless_media))
        for name in ("user", "answer", "unless_user", "unless_answer"):
            patterns = getattr(self, name)
            if patterns:
                parts.append(f"{name} ~ " + " | ".join(patterns))
        return "; ".join(parts)


class TaskSpec(_Strict):
    name: str = Field(min_length=1)
    aliases: list[str] = []
    family: str = Field(min_length=1)
    modalities: list[str] = Field(min_length=1)
    tier: str
    weight: float | None = Field(default=None, gt=0, description="overrides the tier's weight")
    description: str = ""
    match: list[MatchRule] = Field(default=[], description="rules for records without a task field")

    @model_validator(mode="after")
    def _modalities_known(self) -> TaskSpec:
        bad = [m for m in self.modalities if not is_valid_modality(m)]
        if bad:
            raise ValueError(
                f"unknown modality {bad[0]!r}; use 'text', 'image', 'multi-image', 'video', 'audio' "
                "or media joined by '+' in image, video, audio order (e.g. 'video+audio')"
            )
        kinds = [modality_kinds(m) for m in self.modalities]
        for i, rule in enumerate(self.match):
            if not any(rule.fits_media(k) for k in kinds):
                raise ValueError(
                    f"match[{i}] of task {self.name!r} requires media {rule.media or 'none'} (excluding "
                    f"{rule.unless_media or 'none'}): no modality of the task ({', '.join(self.modalities)}) "
                    "fits, so it could never assign the task to a record it suits"
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
    patterns: dict[str, list[str]] = Field(
        default={}, description="named pattern lists for the rules to share through YAML anchors"
    )

    @field_validator("patterns", mode="before")
    @classmethod
    def _named_patterns(cls, value: Any) -> Any:
        return {k: _pattern_list(v) for k, v in value.items()} if isinstance(value, dict) else value

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

    def suggest(self, name: str) -> str:
        """What to say about an unknown task name: the closest names (aliases too), else the tasks."""
        close = close_names(name, [n for task in self.tasks for n in (task.name, *task.aliases)])
        if close:
            return "did you mean " + " or ".join(repr(c) for c in close) + "?"
        return f"known tasks: {', '.join(task.name for task in self.tasks)}"


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
