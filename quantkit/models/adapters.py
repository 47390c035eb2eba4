"""Model adapters: what quantkit needs to know about an architecture, as data.

An adapter says how to load a checkpoint, where its language model lives, what stays in full
precision, which SmoothQuant and AWQ mappings balance which norms, and which llmcompressor pipeline
calibrates it correctly. The built-in adapters are YAML files in ``recipes/adapters/``; a user
adapter with the same fields (``--adapter FILE``) covers a custom architecture.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quantkit.datafile import load_yaml_model
from quantkit.errors import InputError
from quantkit.modelfiles import read_model_config

ADAPTERS_DIR = Path(__file__).resolve().parents[2] / "recipes" / "adapters"
AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForImageTextToText")
MODULE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")

Group = Literal["language_model", "vision", "audio", "head", "other"]
GROUPS: tuple[Group, ...] = ("language_model", "vision", "audio", "head", "other")


def _check_pattern(pattern: str) -> str:
    """A module pattern is an exact module name or ``re:`` + a regular expression (compressed-tensors)."""
    if pattern.startswith("re:"):
        try:
            re.compile(pattern[3:])
        except re.error as err:
            raise ValueError(f"bad regular expression {pattern!r}: {err}") from None
    elif not MODULE_PATH.match(pattern):
        raise ValueError(f"{pattern!r} is neither a module name nor a 're:' pattern")
    return pattern


def matches(name: str, pattern: str) -> bool:
    """The same rule compressed-tensors applies: ``re:`` patterns match from the start, others exactly."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    return any(matches(name, pattern) for pattern in patterns)


def prefix_pattern(pattern: str, prefix: str) -> str:
    """A module pattern for a wrapping model: exact names and ``re:^`` patterns get the prefix;
    unanchored patterns (``re:.*lm_head``) and class names (``Linear``) already match anywhere."""
    if pattern.startswith("re:^"):
        return "re:^" + re.escape(prefix) + pattern[len("re:^") :]
    if pattern.startswith("re:") or pattern == "Linear" or not pattern:
        return pattern
    return prefix + pattern


def unprefix_pattern(pattern: str, prefix: str) -> str:
    """The inverse of :func:`prefix_pattern`."""
    escaped = "re:^" + re.escape(prefix)
    if pattern.startswith(escaped):
        return "re:^" + pattern[len(escaped) :]
    return pattern.removeprefix(prefix)


def is_under(name: str, path: str | None) -> bool:
    """``name`` is the module at ``path`` or inside it ("" is the whole model)."""
    if path is None:
        return False
    return path == "" or name == path or name.startswith(path + ".")


class KeepRule(BaseModel):
    """Modules that stay in full precision, and why (the reason goes into the model card)."""

    model_config = ConfigDict(extra="forbid")

    pattern: str
    reason: str

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        return _check_pattern(value)


class SmoothQuantMapping(BaseModel):
    """Layers fed by one norm (``balance``) and that norm (``smooth``), as llmcompressor's
    SmoothQuantModifier takes them: ``[[balance...], smooth]``. Anchor every pattern to the
    language model (``re:^model\\.layers\\.\\d+\\....$``): bare ``re:.*q_proj`` also hits the
    audio tower's attention."""

    model_config = ConfigDict(extra="forbid")

    balance: list[str] = Field(min_length=1)
    smooth: str

    @field_validator("balance")
    @classmethod
    def _balance_patterns(cls, value: list[str]) -> list[str]:
        return [_check_pattern(v) for v in value]

    @field_validator("smooth")
    @classmethod
    def _smooth_pattern(cls, value: str) -> str:
        return _check_pattern(value)

    def as_library_mapping(self) -> list:
        return [list(self.balance), self.smooth]


class AwqMapping(SmoothQuantMapping):
    """One AWQ smoothing step: the module whose output AWQ scales down (``smooth``: a norm, or a
    Linear such as ``up_proj``) and every module that reads that output (``balance``), whose
    weights it scales up to match. Every reader must be listed (a MoE router too, first, so that
    the activations AWQ measures are every token's, not one expert's), or the model's function
    changes. Anchored to the language model like SmoothQuant mappings."""

    def as_library_mapping(self):
        from llmcompressor.modifiers.transform.awq import AWQMapping

        return AWQMapping(smooth_layer=self.smooth, balance_layers=list(self.balance))


class KnownFailure(BaseModel):
    """A recipe scheme whose checkpoint a serving library cannot load for this architecture."""

    model_config = ConfigDict(extra="forbid")

    schemes: list[str] = Field(min_length=1)
    reason: str


class ServingLayout(BaseModel):
    """How vLLM expects this model on disk when that differs from the quantized module.

    vLLM serves Omni models only as the whole model (``Qwen2_5OmniForConditionalGeneration``:
    ``thinker_config`` inside the model config, weights under ``thinker.``) and runs only the
    thinker. quantkit quantizes the thinker and writes it in that layout; such a folder (or a real
    full upstream Omni checkpoint) loads back as the module at ``attribute`` alone.
    """

    model_config = ConfigDict(extra="forbid")

    architecture: str = Field(description="architecture name vLLM's registry serves")
    aliases: list[str] = Field(default_factory=list, description="other names of the whole model")
    config_class: str = Field(description="transformers config class of the whole model")
    attribute: str = Field(pattern=r"^[a-z_]+$", description="the wrapped module, e.g. thinker")
    config_extra: dict = Field(default_factory=dict, description="set on the whole model's config")

    @property
    def prefix(self) -> str:
        return self.attribute + "."


class Adapter(BaseModel):
    """Everything quantkit needs to know about one architecture."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    architectures: list[str] = Field(min_length=1, description="config.json `architectures` it serves")
    auto_class: Literal["AutoModelForCausalLM", "AutoModelForImageTextToText"]
    trust_remote_code: bool = False
    language_model: str = Field(description="module path of the language model, e.g. model.language_model")
    decoder_layer: str = Field(description="class name of the language model's decoder layer")
    decoder: str | None = Field(
        default=None,
        description="module path where the language-model decoder starts (what receives the merged "
        "input embeddings, positions and masks; its inputs are captured once per sample and the "
        "decoder alone is calibrated); default: language_model",
    )
    vision_tower: str | None = None
    audio_tower: str | None = None
    head: list[str] = Field(default_factory=lambda: ["lm_head"])
    keep: list[KeepRule] = Field(default_factory=list)
    pipeline: Literal["sequential", "basic"]
    smoothquant_mappings: list[SmoothQuantMapping] = Field(default_factory=list)
    awq_mappings: list[AwqMapping] = Field(
        default_factory=list, description="AWQ's smoothing steps (recipes with method: awq)"
    )
    known_failures: list[KnownFailure] = Field(default_factory=list)
    serving: ServingLayout | None = None

    @field_validator("language_model", "decoder", "vision_tower", "audio_tower")
    @classmethod
    def _module_path(cls, value: str | None) -> str | None:
        if value is not None and not MODULE_PATH.match(value):
            raise ValueError(f"{value!r} is not a module path like 'model.language_model'")
        return value

    @field_validator("head")
    @classmethod
    def _head_names(cls, value: list[str]) -> list[str]:
        return [_check_pattern(v) for v in value]

    @model_validator(mode="after")
    def _towers_outside_language_model(self) -> Adapter:
        for tower in (self.vision_tower, self.audio_tower):
            if tower is not None and is_under(tower, self.language_model):
                raise ValueError(f"tower {tower!r} lies inside the language model {self.language_model!r}")
        return self

    @property
    def decoder_path(self) -> str:
        """Where the decoder starts: ``decoder``, else the language model's path."""
        return self.decoder if self.decoder is not None else self.language_model

    # ------------------------------------------------------------------ module groups

    @property
    def keep_patterns(self) -> list[str]:
        return [rule.pattern for rule in self.keep]

    def group_of(self, name: str) -> Group:
        """Which part of the model a module belongs to (towers win over a too-wide LM path)."""
        if is_under(name, self.vision_tower):
            return "vision"
        if is_under(name, self.audio_tower):
            return "audio"
        if matches_any(name, self.head):
            return "head"
        if is_under(name, self.language_model):
            return "language_model"
        return "other"

    def keep_reason(self, name: str) -> str | None:
        for rule in self.keep:
            if matches(name, rule.pattern):
                return rule.reason
        return None

    def should_quantize(self, name: str) -> bool:
        """The positive rule: a Linear is quantized iff it is in the language model and not kept."""
        return self.group_of(name) == "language_model" and self.keep_reason(name) is None

    def known_failure(self, scheme: str) -> KnownFailure | None:
        return next(
            (f for f in self.known_failures if scheme.upper() in {s.upper() for s in f.schemes}), None
        )

    # ------------------------------------------------------------------ loading

    def _auto(self):
        import transformers

        return getattr(transformers, self.auto_class)

    def is_wrapped(self, model_dir: Path) -> bool:
        """The folder holds the whole model in the serving layout (or a full upstream checkpoint)."""
        if self.serving is None:
            return False
        layout = self.serving
        return model_architecture(model_dir) in (layout.architecture, *layout.aliases)

    def _inner_config(self, model_dir: Path):
        """The wrapped module's config, with the whole model's quantization_config in its own names."""
        from transformers import AutoConfig

        whole = read_model_config(model_dir)
        inner = whole.get(f"{self.serving.attribute}_config")
        if not isinstance(inner, dict):
            raise InputError(
                f"config.json field '{self.serving.attribute}_config' is not an object of settings",
                path=Path(model_dir) / "config.json",
                hint="download or copy the model again",
            )
        inner = dict(inner)
        quantization = whole.get("quantization_config")
        if quantization is not None:
            quantization = json.loads(json.dumps(quantization))
            prefix = self.serving.prefix
            quantization["ignore"] = [unprefix_pattern(p, prefix) for p in quantization.get("ignore") or []]
            for group in (quantization.get("config_groups") or {}).values():
                group["targets"] = [unprefix_pattern(t, prefix) for t in group.get("targets") or []]
            inner["quantization_config"] = quantization
        with config_errors(model_dir):
            return AutoConfig.for_model(**inner)

    def load_model(
        self,
        model_dir: Path,
        *,
        dtype: torch.dtype,
        offload: str | None = None,
        offload_folder: Path | None = None,
        max_cpu_memory: int | None = None,
    ) -> torch.nn.Module:
        """Load real weights in ``dtype`` (float32 for calibration: faster on CPUs, see notes).

        A whole Omni model (the serving layout, or an upstream checkpoint with a talker) yields
        its thinker alone: that is what is quantized and what vLLM runs.

        ``offload`` loads through compressed-tensors' offloading (what llmcompressor's
        pipelines onload layer by layer): "cpu" keeps every weight in host memory, shared by all
        ranks under torchrun (rank 0 reads, the others map it); "disk" keeps what does not fit
        in host memory (``max_cpu_memory`` bytes; default: what is free, less 5 GB) as files
        under ``offload_folder``.
        """
        kwargs: dict = {"dtype": dtype}
        if self.is_wrapped(model_dir):
            kwargs.update(
                config=self._inner_config(model_dir), key_mapping={"^" + re.escape(self.serving.prefix): ""}
            )
        else:
            kwargs["trust_remote_code"] = self.trust_remote_code
        loading = contextlib.nullcontext()
        if offload is not None:
            from compressed_tensors.offload import load_offloaded_model

            loading = load_offloaded_model(self._auto())
            kwargs["device_map"] = "cpu" if offload == "cpu" else "auto_offload"
            if offload == "disk":
                kwargs["offload_folder"] = str(offload_folder)
                if max_cpu_memory is not None:
                    kwargs["max_memory"] = {"cpu": int(max_cpu_memory)}
        with loading, config_errors(model_dir):
            model = self._auto().from_pretrained(model_dir, **kwargs)
        return model.eval()

    def meta_model(self, model_dir: Path, *, light_imports: bool = False) -> torch.nn.Module:
        """The model's module tree on the ``meta`` device: no weights read, no memory used (the
        init functions skipped, transformers' own switch: meta tensors hold no values to set).
        ``light_imports`` (the config-only dry run): transformers' generation stack imported
        without scikit-learn (loading.generation_without_sklearn)."""
        from transformers import AutoConfig
        from transformers.initialization import no_init_weights

        from quantkit.models.loading import generation_without_sklearn

        with generation_without_sklearn(light_imports):
            if self.is_wrapped(model_dir):
                with torch.device("meta"), no_init_weights():
                    return self._auto().from_config(self._inner_config(model_dir))
            with config_errors(model_dir):
                config = AutoConfig.from_pretrained(model_dir, trust_remote_code=self.trust_remote_code)
            with torch.device("meta"), no_init_weights():
                return self._auto().from_config(config, trust_remote_code=self.trust_remote_code)

    def load_processor(self, model_dir: Path):
        """The model's processor; a bare tokenizer for text models (what processor_inputs expects)."""
        from transformers import AutoProcessor, AutoTokenizer

        if self.vision_tower is None and self.audio_tower is None:
            return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=self.trust_remote_code)
        return AutoProcessor.from_pretrained(model_dir, trust_remote_code=self.trust_remote_code)


# ---------------------------------------------------------------------- registry


def builtin_adapter_files() -> list[Path]:
    return sorted(ADAPTERS_DIR.glob("*.yaml"))


def load_adapter_file(path: Path) -> Adapter:
    """A user adapter YAML; errors name the file, the line and the field."""
    return load_yaml_model(Path(path), Adapter, what="adapter")


def builtin_adapters() -> list[Adapter]:
    return [load_adapter_file(path) for path in builtin_adapter_files()]


def model_architecture(model_dir: Path) -> str:
    """``architectures[0]`` from config.json, read without transformers."""
    config_path = Path(model_dir) / "config.json"
    architectures = read_model_config(model_dir).get("architectures") or []
    if not architectures:
        raise InputError("config.json names no architecture", path=config_path, hint="add 'architectures'")
    return architectures[0]


@contextlib.contextmanager
def config_errors(model_dir: Path):
    """transformers' complaints about a config.json field (a wrong type, a value it rejects) as an
    InputError naming the file and the field, not a traceback."""
    from huggingface_hub.errors import StrictDataclassError

    try:
        yield
    except StrictDataclassError as err:
        field = re.search(r"field '([^']+)'", str(err))
        cause = err.__cause__ or err
        raise InputError(
            f"config.json field '{field[1]}': {cause}" if field else f"config.json: {err}",
            path=Path(model_dir) / "config.json",
            hint="fix that field (compare with the model's original config.json) or download the model again",
        ) from None


def adapter_for(model_dir: Path, adapter: Adapter | Path | None = None) -> Adapter:
    """The adapter for a model folder: the one given (object or YAML path) or the built-in one
    whose ``architectures`` lists the checkpoint's architecture."""
    if isinstance(adapter, Adapter):
        return adapter
    if adapter is not None:
        return load_adapter_file(Path(adapter))
    architecture = model_architecture(model_dir)
    known = builtin_adapters()
    for candidate in known:
        if architecture in candidate.architectures:
            return candidate
    names = sorted(a for candidate in known for a in candidate.architectures)
    raise InputError(
        f"no built-in adapter for architecture {architecture!r}",
        path=Path(model_dir) / "config.json",
        hint=f"supported: {', '.join(names)}; for another architecture write an adapter YAML "
        "(see recipes/adapters/README.md) and pass --adapter FILE",
    )
