"""Calibration: the recipe's modifiers run by ``oneshot`` under counting hooks, on the decoder's
captured inputs (sequential pipeline) or the processor outputs; and the --avg-bits ranking
measured on the loaded model when no sensitivity table is given."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from quantkit.errors import InputError
from quantkit.features.capture import capture_decoder_inputs, decoder_loader
from quantkit.features.processor import FeatureRow, PreparedFeatures, calibration_loader
from quantkit.models.adapters import Adapter
from quantkit.models.targets import decoder_layers
from quantkit.progress import calibration_spinner, sample_bar
from quantkit.quantize.pipelines import run_oneshot
from quantkit.quantize.probe import CalibrationProbe
from quantkit.quantize.resolved import ResolvedRecipe, build_modifiers
from quantkit.quantize.spill import spilled_activations
from quantkit.quantize.token_weights import sample_weights, weights_summary, with_token_weights

# The --avg-bits ranking (when no table is given): fusion units (what gets promoted) on a
# stratified subsample of the calibration rows, text cut short, KL estimated to second order from
# a few backward passes (method "fisher": on SmolLM2-135M 5.5x cheaper than measuring every unit,
# Spearman 0.98 against the measured ranking). `quantkit sensitivity` measures (method "kl").
SENSITIVITY_SAMPLES = 8
SENSITIVITY_MAX_SEQ_LEN = 128  # text samples are cut to this for the ranking (not for calibration)
SENSITIVITY_GRANULARITY = "unit"
SENSITIVITY_METHOD = "fisher"
SENSITIVITY_DRAWS = 8


def sensitivity_rows(rows: list[FeatureRow], labels: list[str], count: int) -> list[FeatureRow]:
    """A stratified subsample of the calibration rows, text cut to SENSITIVITY_MAX_SEQ_LEN tokens."""
    from quantkit.calibset import stratified_subsample
    from quantkit.features.processor import TEXT_KEYS

    picked = sorted(stratified_subsample(labels, min(count, len(rows)), seed=0))
    chosen = []
    for index in picked:
        row = rows[index]
        if not (row.has_vision or row.has_audio) and row.tokens > SENSITIVITY_MAX_SEQ_LEN:
            inputs = {
                key: value[..., :SENSITIVITY_MAX_SEQ_LEN]
                if key in TEXT_KEYS and isinstance(value, torch.Tensor)
                else value
                for key, value in row.inputs.items()
            }
            row = FeatureRow(row.sample_id, row.label, inputs, row.from_cache)
        chosen.append(row)
    return chosen


def _modifiers(resolved: ResolvedRecipe, adapter: Adapter) -> list:
    return build_modifiers(
        resolved,
        smoothquant_mappings=[m.as_library_mapping() for m in adapter.smoothquant_mappings],
        awq_mappings=[m.as_library_mapping() for m in adapter.awq_mappings]
        if resolved.awq is not None
        else None,
    )


def release_processor_outputs(rows: list[FeatureRow]) -> None:
    """Once the decoder's inputs are captured, a row's processor outputs (pixel values, audio
    features: larger than the hidden states they become) are read for their shapes only (token
    counts in quantkit.json): keep those, on the meta device, and free the tensors."""
    for row in rows:
        row.inputs = {
            key: value.to("meta") if isinstance(value, torch.Tensor) else value
            for key, value in row.inputs.items()
        }


def calibrate(
    model: torch.nn.Module,
    processor,
    adapter: Adapter,
    resolved: ResolvedRecipe,
    prepared: PreparedFeatures | None,
    *,
    progress: bool = True,
    cache_dir: Path | None = None,
    fingerprint: str | None = None,
    spill_folder: Path | None = None,
) -> CalibrationProbe:
    """Run the resolved recipe's modifiers under counting hooks; verify the hooks when data was used.

    With the ``sequential`` pipeline the decoder's inputs are captured first (towers once per
    sample, none for samples ``cache_dir`` already holds; ``fingerprint`` is the processor's)
    and the decoder alone is calibrated on them; ``probe.capture`` says what ran. With
    ``spill_folder`` the captured inputs and the activation cache live in memory-mapped files
    there (``probe.spill`` says how much)."""
    recipe = resolved.recipe
    modifiers = _modifiers(resolved, adapter)
    weights_record = None
    if recipe.token_weights is not None and prepared is not None:
        vectors = sample_weights(
            prepared.rows, recipe.token_weights, config=model.config, processor=processor
        )
        modifiers, weights_record = (
            with_token_weights(modifiers, vectors),
            weights_summary(recipe.token_weights, vectors),
        )
    with contextlib.ExitStack() as stack:
        probe = stack.enter_context(CalibrationProbe(model, adapter))
        spill = stack.enter_context(spilled_activations(spill_folder)) if spill_folder is not None else None
        loader, decoder, captured = None, None, None
        if prepared is not None and adapter.pipeline == "sequential":
            with sample_bar("capturing decoder inputs", len(prepared.rows), enabled=progress) as advance:
                captured = capture_decoder_inputs(
                    model,
                    adapter,
                    prepared.rows,
                    layer_names=list(decoder_layers(model, adapter)),
                    processor_fingerprint=fingerprint,
                    cache_dir=cache_dir,
                    on_sample=advance,
                )
            release_processor_outputs(prepared.rows)  # the decoder runs on the captured inputs
            if spill is not None:
                for row in captured.rows:
                    row.kwargs = spill.map_kwargs(row.kwargs)
            loader, decoder = decoder_loader(captured.rows), adapter.decoder_path
        elif prepared is not None:
            loader = calibration_loader(prepared.rows, keep_none=False)
        probe.on_layer_call = stack.enter_context(
            calibration_spinner(f"calibrating ({recipe.name}, {adapter.pipeline})", enabled=progress)
        )
        run_oneshot(
            model,
            processor,
            modifiers,
            loader,
            pipeline=adapter.pipeline,
            decoder_layer=adapter.decoder_layer,
            decoder=decoder,
            trust_remote_code=adapter.trust_remote_code,
        )
    probe.capture, probe.spill, probe.token_weights = captured, spill, weights_record
    if prepared is not None:
        rows = prepared.rows
        towers = captured.tower_samples if captured is not None else {}
        probe.verify(
            samples=len(rows),
            vision_samples=towers.get("vision", sum(row.has_vision for row in rows)),
            audio_samples=towers.get("audio", sum(row.has_audio for row in rows)),
        )
    return probe


def measure_sensitivity_for(
    model: torch.nn.Module,
    adapter: Adapter,
    resolved: ResolvedRecipe,
    rows: list[FeatureRow],
    count: int,
    progress: bool,
    *,
    method: str = SENSITIVITY_METHOD,
):
    """The --avg-bits ranking, measured on the loaded (calibration-dtype) model with the 4-bit
    scheme and group size of the resolved recipe's precision plan (its candidates when none
    fits: the measurement refuses that); the weights are restored afterwards."""
    from quantkit.sensitivity.run import measure_loaded, scheme_args

    if not rows:
        raise InputError("--avg-bits ranks layers on calibration samples and none were usable")
    rows = sensitivity_rows(rows, [row.label for row in rows], count)
    precision, group = resolved.precision, resolved.group_size
    return measure_loaded(
        model,
        adapter,
        rows,
        names=resolved.targets.quantize,
        args=scheme_args(precision.low_scheme, group),
        candidates=(group,) if group else precision.candidates,
        scheme=precision.low_scheme,
        granularity=SENSITIVITY_GRANULARITY,
        method=method,
        draws=SENSITIVITY_DRAWS,
        progress=progress,
    )
