"""The recipe file format: which scheme, which algorithm, and the few knobs worth turning."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quantkit.recipes.schemes import PROMOTED_SCHEMES, RECIPE_SCHEMES, SCHEMES, SchemeSpec, schemes_where

# Views of the scheme table (quantkit.recipes.schemes) the recipe's rules read.
SCHEME_FORMATS: dict[str, str] = {name: SCHEMES[name].format for name in RECIPE_SCHEMES}
GROUP_SCHEMES = schemes_where(group_size_per_model=True)  # group_size applies

# llmcompressor 0.14 GPTQModifier defaults (tests compare them with the library).
GPTQ_DEFAULT_ACTORDER = "static"
GPTQ_DEFAULT_DAMPENING_FRAC = 0.01

Scheme = Literal[RECIPE_SCHEMES]  # type: ignore[valid-type]
# Schemes a W4A16 recipe keeps its 8-bit layers in (mixed precision, or no group size divides).
PromotedScheme = Literal[PROMOTED_SCHEMES]  # type: ignore[valid-type]
ActOrder = Literal["static", "weight", "group", "dynamic"]
# llmcompressor 0.14 weight observers a recipe may pick (llmcompressor.observers): memoryless_minmax
# (the library's default for weights), memoryless_mse (grid search on the weight's own error),
# imatrix_mse (that search weighted by each input channel's E[x^2] on the calibration data,
# llama.cpp's importance matrix). The moving-average minmax / mse are for activations.
WeightObserver = Literal["memoryless_minmax", "memoryless_mse", "imatrix_mse"]


class DriftLimits(BaseModel):
    """How far a checkpoint's next-token distribution may move from the original's on held-out
    calibration samples, per modality and per task (``quantkit verify --reference``)."""

    model_config = ConfigDict(extra="forbid")

    max_kl: float = Field(gt=0, description="mean next-token KL(original || quantized), nats")
    min_top1: float = Field(ge=0, le=1, description="fraction of positions with the same top-1 token")
    min_cosine: float = Field(ge=-1, le=1, description="mean cosine between logit vectors")


class ModalityWeights(BaseModel):
    """Token-weight multipliers by what a position holds (the model's media placeholder tokens)."""

    model_config = ConfigDict(extra="forbid")

    text: float = Field(default=1.0, ge=0)
    image: float = Field(default=1.0, ge=0)
    video: float = Field(default=1.0, ge=0)
    audio: float = Field(default=1.0, ge=0)


class RoleWeights(BaseModel):
    """Token-weight multipliers by chat turn (from the chat template's turn markers)."""

    model_config = ConfigDict(extra="forbid")

    system: float = Field(default=1.0, ge=0)
    user: float = Field(default=1.0, ge=0)
    answer: float = Field(default=1.0, ge=0, description="the assistant's turns")


class TokenWeights(BaseModel):
    """GPTQ with a weighted Hessian, H = sum_t w_t x_t x_t^T, w_t = modality x role (x the sample's
    task-tier weight from the taxonomy when ``task_tier``). Absent: every token counts the same."""

    model_config = ConfigDict(extra="forbid")

    modality: ModalityWeights = Field(default_factory=ModalityWeights)
    role: RoleWeights = Field(default_factory=RoleWeights)
    task_tier: bool = Field(default=False, description="multiply by the sample's task-tier weight")


class Recipe(BaseModel):
    """A quantization recipe (``recipes/NAME.yaml`` or a user file)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    hardware: str = Field(description="where the checkpoint is meant to run fast")
    scheme: Scheme
    method: Literal["gptq", "rtn", "awq"] = Field(
        description="gptq: GPTQ weight rounding from calibration data; rtn: round-to-nearest "
        "(llmcompressor QuantizationModifier; static activation scales still come from data); "
        "awq: AWQ (llmcompressor AWQModifier with the adapter's awq_mappings) scales weight "
        "channels by their activations on the calibration data, then round-to-nearest (W4A16)"
    )
    smoothquant_strength: float | None = Field(default=None, gt=0.0, le=1.0)
    actorder: ActOrder | None = Field(
        default=GPTQ_DEFAULT_ACTORDER,
        description="GPTQ column order: static (by Hessian diagonal, no runtime cost; the library "
        "default), group (reorder within groups; writes a g_idx), weight, dynamic, or null (none)",
    )
    dampening_frac: float = Field(
        default=GPTQ_DEFAULT_DAMPENING_FRAC,
        gt=0.0,
        lt=1.0,
        description="GPTQ Hessian dampening, as a fraction of its mean diagonal (library default 0.01)",
    )
    group_size: int | None = Field(
        default=None,
        ge=8,
        description="W4A16 only: weights per scale along the input features. null: the largest of "
        "128, 64, 32 that divides every targeted layer's in-features (layers none divides stay at 8 "
        "bits); a number: that group size (layers it does not divide stay at 8 bits; one that divides "
        "no layer is refused)",
    )
    symmetric: bool = Field(
        default=True,
        description="W4A16 only: false adds a zero point per group (asymmetric int4, like W4A16_ASYM) to "
        "every 4-bit layer but MoE experts, which stay symmetric (transformers cannot reload asymmetric "
        "experts; vLLM's CPU backend has no kernel for them)",
    )
    promoted_scheme: PromotedScheme = Field(
        default="W8A16",
        description="W4A16 only: the scheme of layers kept at 8 bits (quantize --avg-bits, or layers no "
        "group size divides). W8A16: int8 weights, 16-bit activations (vLLM: GPU kernels; its CPU "
        "backend has 4-bit weight-only kernels only). W8A8: int8 weights and dynamic per-token int8 "
        "activations (vLLM: GPUs with int8 tensor cores and the CPU backend); the checkpoint's "
        "format becomes mixed-precision",
    )
    weight_observer: WeightObserver | None = Field(
        default=None,
        description="how each weight group's scale and zero point are chosen (the library's observer): "
        "null or memoryless_minmax: its range; memoryless_mse: the range that minimises the rounding "
        "error; imatrix_mse: that "
        "error weighted by each input channel's mean square activation on the calibration data",
    )
    kv_cache_fp8: bool = False
    drift_thresholds: DriftLimits | None = None
    token_weights: TokenWeights | None = Field(
        default=None, description="GPTQ only: weight tokens by modality, role and task tier (off: absent)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        spec = self.spec
        if self.smoothquant_strength is not None and spec.activations is None:
            raise ValueError(
                f"smoothquant_strength: SmoothQuant only helps schemes that quantize activations, not {self.scheme}"
            )
        if self.method == "awq" and not spec.awq:
            raise ValueError(
                f"method: awq takes the weight-only int4 scheme ({', '.join(sorted(schemes_where(awq=True)))}), "
                f"not {self.scheme}"
            )
        if self.weight_observer == "imatrix_mse" and not spec.imatrix:
            raise ValueError(
                f"weight_observer: imatrix_mse weighs per-channel or per-group scales, and {self.scheme} "
                f"has per-tensor or block scales (use it with {', '.join(sorted(schemes_where(imatrix=True)))})"
            )
        if self.weight_observer == "imatrix_mse" and (
            self.smoothquant_strength is not None or self.method == "awq"
        ):
            # The library gathers E[x^2] in the same pass in which SmoothQuant / AWQ rescale the
            # weights afterwards: the search would weigh W*s by the unscaled inputs' statistics.
            raise ValueError(
                "weight_observer: imatrix_mse measures the inputs before SmoothQuant / AWQ rescale "
                "them, so it cannot be combined with smoothquant_strength or method: awq"
            )
        if self.method != "gptq":
            stray = {"actorder", "dampening_frac", "token_weights"} & self.model_fields_set
            if stray:
                raise ValueError(f"{', '.join(sorted(stray))}: GPTQ settings need method: gptq")
        if not spec.group_size_per_model:
            stray = {"group_size", "symmetric", "promoted_scheme"} & self.model_fields_set
            if stray:
                raise ValueError(
                    f"{', '.join(sorted(stray))}: only group-wise weight schemes ({', '.join(sorted(GROUP_SCHEMES))}) "
                    f"take it, not {self.scheme}"
                )
        return self

    @property
    def needs_data(self) -> bool:
        """Whether calibration samples are required (data-free recipes ignore them)."""
        return (
            self.method in ("gptq", "awq")
            or self.smoothquant_strength is not None
            or self.spec.activations == "static"
            or self.kv_cache_fp8
            or self.weight_observer == "imatrix_mse"
        )

    @property
    def spec(self) -> SchemeSpec:
        """The scheme table's record of this recipe's scheme."""
        return SCHEMES[self.scheme]

    @property
    def preset(self) -> str:
        """The compressed-tensors preset the recipe starts from (W4A16 with ``symmetric: false``
        is the library's W4A16_ASYM)."""
        return self.spec.preset(self.symmetric)

    @property
    def checkpoint_format(self) -> str:
        """The compressed-tensors ``format`` the checkpoint's quantization_config will carry."""
        return self.spec.format

    def with_kv_cache_fp8(self, enabled: bool = True) -> Recipe:
        return self.model_copy(update={"kv_cache_fp8": enabled})
