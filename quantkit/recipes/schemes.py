"""The scheme table: one record per weight scheme quantkit writes, the only place its facts live.

A record names the compressed-tensors preset it is (the library owns the quantization arguments:
:meth:`SchemeSpec.scheme` asks ``preset_name_to_scheme``), and adds what quantkit decides or
knows about it: the checkpoint format, whether the group size is chosen per model, which
algorithms and observers take it, which 8-bit schemes its layers can be promoted to, and what
serves it in vLLM (the model card's text). The few preset facts a recipe needs while it is
validated (weight bits, whether activations are quantized and whether their scales come from
data) are stated here too, because importing compressed-tensors takes seconds; a test compares
them with the library's presets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Activations = Literal["dynamic", "static"]


@dataclass(frozen=True)
class SchemeSpec:
    name: str  # the recipe's ``scheme`` and the compressed-tensors preset it starts from
    format: str  # the compressed-tensors checkpoint format it writes
    weight_bits: int
    # None: 16-bit activations; dynamic: scales computed at run time; static: scales (NVFP4: the
    # per-tensor global scale) fixed from calibration data
    activations: Activations | None
    recipe: bool = True  # a recipe may name it (False: only a promotion target)
    group_size_per_model: bool = False  # int groups along the in-features; quantize picks the size
    zero_point_preset: str | None = None  # the preset with zero points (recipe ``symmetric: false``)
    # Pinned on QuantizationScheme.format: compressed-tensors 0.19 infers int weights with FP8
    # activations as int-quantized, vLLM's CompressedTensorsW4A8Fp8 loads the pack-quantized layout.
    pin_format: bool = False
    awq: bool = False  # AWQ's grid search scales weight channels for an int4 grid
    # imatrix_mse weighs per-channel or per-group scales; per-tensor and block scales it silently
    # computes unweighted, so those schemes refuse it
    imatrix: bool = False
    promotes_to: tuple[str, ...] = ()  # 8-bit schemes its layers may be kept in (mixed precision)
    per_channel_weights: bool = False  # written out: the library's preset of this name is group-wise
    vllm_class: str = ""  # the compressed-tensors scheme class vLLM 0.32's config matcher picks
    vllm_note: str = ""  # said after the class on the card
    kernels: str = ""  # the kernels by CUDA compute capability (SM = major*10+minor), for the card

    def preset(self, symmetric: bool = True) -> str:
        """The compressed-tensors preset name (W4A16 with zero points is the library's W4A16_ASYM)."""
        return self.zero_point_preset if not symmetric and self.zero_point_preset else self.name

    @property
    def card_serving(self) -> str:
        """What the model card says serves it ("" when nothing is said)."""
        return f"vLLM `{self.vllm_class}`{self.vllm_note}: {self.kernels}" if self.kernels else ""

    def weight_args(self, *, symmetric: bool = True, group_size: int | None = None):
        """The weight QuantizationArgs; ``group_size`` replaces the preset's for group-wise schemes."""
        args = self.scheme(["Linear"], symmetric=symmetric).weights
        if args is None:
            raise ValueError(f"scheme {self.name} quantizes no weights")
        if group_size and args.group_size:
            args = args.model_copy(update={"group_size": group_size})  # the preset otherwise untouched
        return args

    def scheme(self, targets: list[str], *, symmetric: bool = True):
        """The compressed-tensors QuantizationScheme on ``targets`` (the library's preset, its
        format pinned where the record says so; per-channel weights where the record says so)."""
        from compressed_tensors.quantization import (
            QuantizationArgs,
            QuantizationScheme,
            preset_name_to_scheme,
        )

        if self.per_channel_weights:
            weights = QuantizationArgs(
                num_bits=self.weight_bits, type="int", strategy="channel", symmetric=True, dynamic=False
            )
            return QuantizationScheme(targets=list(targets), weights=weights)
        scheme = preset_name_to_scheme(self.preset(symmetric), list(targets))
        if self.pin_format:
            scheme.format = self.format
        return scheme


SCHEMES: dict[str, SchemeSpec] = {
    spec.name: spec
    for spec in (
        SchemeSpec(  # int8 per-channel weights, dynamic per-token int8 activations
            "W8A8",
            "int-quantized",
            8,
            "dynamic",
            imatrix=True,
            vllm_class="CompressedTensorsW8A8Int8",
            kernels="CUTLASS int8 GEMM on SM75+ (Turing, Ampere and newer); the CPU backend (oneDNN, AVX2/AVX-512)",
        ),
        SchemeSpec(  # int4 weights packed in int32, group 128
            "W4A16",
            "pack-quantized",
            4,
            None,
            group_size_per_model=True,
            zero_point_preset="W4A16_ASYM",
            awq=True,
            imatrix=True,
            promotes_to=("W8A16", "W8A8"),
            vllm_class="CompressedTensorsWNA16",
            kernels="Marlin on SM80+ (Ampere and newer), Machete on SM90 (Hopper); the CPU backend on AVX-512",
        ),
        SchemeSpec(  # per-tensor FP8 weights, static per-tensor input scale
            "FP8",
            "float-quantized",
            8,
            "static",
            vllm_class="CompressedTensorsW8A8Fp8",
            kernels="FP8 tensor cores on SM89+ (Ada, Hopper, Blackwell); Marlin FP8 weight-only below SM89; "
            "no static-FP8 kernel on the CPU backend",
        ),
        SchemeSpec(  # per-channel FP8 weights, dynamic per-token activations
            "FP8_DYNAMIC",
            "float-quantized",
            8,
            "dynamic",
            imatrix=True,
            vllm_class="CompressedTensorsW8A8Fp8",
            kernels="FP8 tensor cores on SM89+ (Ada, Hopper, Blackwell); Marlin FP8 weight-only below SM89",
        ),
        SchemeSpec(  # 128x128 FP8 weight blocks, dynamic per-token-group (128) FP8 activations
            "FP8_BLOCK",
            "float-quantized",
            8,
            "dynamic",
            vllm_class="CompressedTensorsW8A8Fp8",
            vllm_note=" with 128x128 weight blocks",
            kernels="block-scaled FP8 GEMM (CUTLASS / DeepGEMM) on SM90 (Hopper) and SM100 (Blackwell), "
            "Triton block kernel on SM89 (Ada)",
        ),
        SchemeSpec(  # FP4 (e2m1) weights in groups of 16, FP8 scales, a per-tensor global scale
            "NVFP4A16",
            "nvfp4-pack-quantized",
            4,
            None,
            imatrix=True,
            vllm_class="CompressedTensorsW4A4Fp4(use_a16=True)",
            kernels="Marlin FP4 weight-only on SM80+ (Ampere, Ada, Hopper), FlashInfer / CUTLASS on SM100 and "
            "SM120 (Blackwell)",
        ),
        SchemeSpec(  # NVFP4 weights and FP4 activations (global input scale calibrated from data)
            "NVFP4",
            "nvfp4-pack-quantized",
            4,
            "static",
            imatrix=True,
            vllm_class="CompressedTensorsW4A4Fp4",
            kernels="native FP4 tensor cores (CUTLASS / FlashInfer) on SM100 (B200, GB200) and SM120 (RTX 50, "
            "RTX PRO 6000); below Blackwell vLLM falls back to weight-only FP4 (Marlin) or emulation",
        ),
        SchemeSpec(  # int4 weights packed in int32 (group 128, symmetric), dynamic per-token FP8 activations
            "W4AFP8",
            "pack-quantized",
            4,
            "dynamic",
            pin_format=True,
            imatrix=True,
            vllm_class="CompressedTensorsW4A8Fp8",
            kernels="CUTLASS int4 x FP8 mixed-input GEMM on SM90 (Hopper) only",
        ),
        # The 8-bit layers of a W4A16 recipe: int8 per-channel weights, 16-bit activations (no
        # group, so no divisibility constraint; compressed-tensors 0.19's W8A16 is group-128,
        # which 576-wide layers cannot take).
        SchemeSpec(
            "W8A16",
            "pack-quantized",
            8,
            None,
            recipe=False,
            per_channel_weights=True,
            vllm_class="CompressedTensorsWNA16",
        ),
    )
}

RECIPE_SCHEMES = tuple(name for name, spec in SCHEMES.items() if spec.recipe)
# The schemes a W4A16 recipe may keep layers in (recipe ``promoted_scheme``).
PROMOTED_SCHEMES = tuple(dict.fromkeys(p for spec in SCHEMES.values() for p in spec.promotes_to))
# Weight-only schemes a layer can be measured with (quantkit sensitivity): the group-wise ones
# with and without zero points, and the schemes they promote to that leave activations alone.
SENSITIVITY_SCHEMES = tuple(
    dict.fromkeys(
        [
            *(s.preset(sym) for s in SCHEMES.values() if s.group_size_per_model for sym in (True, False)),
            *(
                p
                for s in SCHEMES.values()
                if s.group_size_per_model
                for p in s.promotes_to
                if SCHEMES[p].activations is None
            ),
        ]
    )
)
# The compressed-tensors presets quantkit's checkpoints carry, recipe schemes first (a checkpoint's
# config group is named after the first whose arguments it has).
SHIPPED_PRESETS = tuple(
    dict.fromkeys(
        [
            *(s.preset(sym) for s in SCHEMES.values() if s.recipe for sym in (True, False)),
            *PROMOTED_SCHEMES,
        ]
    )
)


def scheme_spec(name: str) -> SchemeSpec:
    """The record of a scheme or of a preset it writes (``W4A16_ASYM`` -> W4A16's)."""
    if name in SCHEMES:
        return SCHEMES[name]
    for spec in SCHEMES.values():
        if spec.zero_point_preset == name:
            return spec
    raise KeyError(f"unknown scheme {name!r}")


def schemes_where(**facts) -> set[str]:
    """The recipe schemes whose record has every given fact (``schemes_where(awq=True)``)."""
    return {n for n in RECIPE_SCHEMES if all(getattr(SCHEMES[n], k) == v for k, v in facts.items())}


def preset_scheme(preset: str, targets: list[str]):
    """The QuantizationScheme a preset name of the table stands for (``W4A16_ASYM``: W4A16's
    record with zero points; ``W8A16``: quantkit's per-channel one)."""
    spec = scheme_spec(preset)
    return spec.scheme(targets, symmetric=preset != spec.zero_point_preset)
