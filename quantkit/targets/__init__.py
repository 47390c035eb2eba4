"""Stage 6: hardware targets (``recipes/targets.yaml``) and the build that makes one checkpoint
per target: quantize, then verify, reusing one processed-feature cache."""

from __future__ import annotations

import difflib
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from quantkit import __version__
from quantkit.datafile import load_yaml_model
from quantkit.errors import InputError, QuantkitError
from quantkit.fsutil import check_model_folder, check_writable, refuse_overlap, sha256_file, write_file_atomic

TARGETS_FILE = Path(__file__).resolve().parents[2] / "recipes" / "targets.yaml"
BUILD_FILE = "build.json"


class Fallback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe: str
    when: str


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    hardware: list[str] = Field(min_length=1)
    recipe: str
    why: str
    fallbacks: list[Fallback] = []


class TargetsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int
    targets: list[Target] = Field(min_length=1)

    @field_validator("targets")
    @classmethod
    def _recipes_exist(cls, targets: list[Target]) -> list[Target]:
        from quantkit.recipes.registry import builtin_recipe_files

        known = set(builtin_recipe_files())
        names = [t.name for t in targets]
        if len(names) != len(set(names)):
            raise ValueError("target names must be unique")
        for target in targets:
            for recipe in (target.recipe, *(f.recipe for f in target.fallbacks)):
                if recipe not in known:
                    raise ValueError(
                        f"target {target.name!r}: unknown recipe {recipe!r}; known: {sorted(known)}"
                    )
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
    return load_yaml_model(path or TARGETS_FILE, TargetsFile, what="targets")


# --------------------------------------------------------------------------------------- build


@dataclass
class CheckpointBuild:
    targets: list[str]
    recipe: str
    checkpoint: str
    status: str  # passed | failed | error | up-to-date
    key: str
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0
    vllm: str | None = None
    size_ratio: float | None = None
    drift: dict | None = None  # overall KL / top-1 of the checkpoint

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "up-to-date")


@dataclass
class BuildReport:
    output_root: str
    model: str
    calib: str | None
    checkpoints: list[CheckpointBuild]

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checkpoints)

    def to_dict(self) -> dict:
        return {
            "output_root": self.output_root,
            "model": self.model,
            "calib": self.calib,
            "passed": self.passed,
            "quantkit_version": __version__,
            "checkpoints": [asdict(c) for c in self.checkpoints],
        }


def model_fingerprint(model_dir: Path) -> str:
    """A hash of the model folder's config and weights (bytes, not dates)."""
    digest = hashlib.sha256()
    for file in sorted(Path(model_dir).iterdir()):
        if file.is_file() and (file.suffix in (".json", ".safetensors", ".jinja", ".txt", ".model")):
            digest.update(file.name.encode())
            digest.update(sha256_file(file).encode())
    return digest.hexdigest()


def build_key(model_hash: str, calib_hash: str | None, recipe, num_samples: int | None, vllm: bool) -> str:
    """What makes a checkpoint "the same": model, calibration data, recipe, options, quantkit version."""
    payload = {
        "model": model_hash,
        "calib": calib_hash if recipe.needs_data else None,
        "recipe": recipe.model_dump(mode="json"),
        "num_samples": num_samples if recipe.needs_data else None,
        "vllm": vllm,
        "quantkit": __version__,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _previous(output_root: Path) -> dict[str, dict]:
    path = output_root / BUILD_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return {}
    entries = [*data.get("earlier", []), *data.get("checkpoints", [])]
    return {entry["checkpoint"]: entry for entry in entries}


def _write_build_file(output_root: Path, report: BuildReport, previous: dict[str, dict]) -> None:
    """build.json: this run's checkpoints, plus earlier ones this run did not touch."""
    data = report.to_dict()
    touched = {c.checkpoint for c in report.checkpoints}
    data["earlier"] = [entry for name, entry in sorted(previous.items()) if name not in touched]
    write_file_atomic(output_root / BUILD_FILE, json.dumps(data, indent=2) + "\n")


def _up_to_date(before: dict | None, key: str, checkpoint: Path) -> bool:
    """The last build made this checkpoint from the same inputs, it passed, and it is still there."""
    return (
        before is not None
        and before["key"] == key
        and before["status"] in ("passed", "up-to-date")
        and (checkpoint / "quantkit.json").is_file()
    )


def build_checkpoints(
    model_dir: Path,
    output_root: Path,
    target_names: list[str],
    *,
    calib: Path | None = None,
    num_samples: int | None = None,
    vllm: bool = False,
    drift_samples: int = 12,
    force: bool = False,
    targets_file: Path | None = None,
    on_checkpoint=None,
) -> BuildReport:
    """Quantize and verify ``model_dir`` once per distinct recipe among ``target_names``.

    A target that fails (bad input, failed proof, failed verification) is recorded and the
    others go on. A checkpoint whose inputs (model bytes, calibration set, recipe, options)
    match the last build and that passed then is skipped unless ``force``. ``on_checkpoint`` is
    called with each (CheckpointBuild, VerifyReport | None) as it finishes.

    Without ``num_samples``, a stratified share of the set (``drift_samples``, at most a quarter
    of it) is held out of calibration so that the drift check has samples it did not see.
    """
    from quantkit.calibset import load_calibration_report
    from quantkit.models.adapters import adapter_for
    from quantkit.models.inputs import processor_capabilities
    from quantkit.quantize import quantize
    from quantkit.quantize.calibration_set import samples_from_set
    from quantkit.recipes import get_recipe
    from quantkit.verify import verify_checkpoint

    if not target_names:
        raise InputError("no target given", hint="pass --target NAME (see `quantkit targets`)")
    model_dir, output_root = Path(model_dir), Path(output_root)
    refuse_overlap(output_root, {"model folder": model_dir, "calibration set": calib}, option="--output-root")
    check_model_folder(model_dir)
    check_writable(output_root, option="--output-root")
    table = load_targets(targets_file)
    chosen = [table.get(name) for name in target_names]
    adapter = adapter_for(model_dir)
    calib_hash = load_calibration_report(calib)["samples_sha256"] if calib is not None else None
    recipes: dict[str, list[str]] = {}
    for target in chosen:
        recipes.setdefault(target.recipe, []).append(target.name)
    needs_data = [name for name in recipes if get_recipe(name).needs_data]
    if needs_data and calib is None:
        raise InputError(f"recipes {', '.join(needs_data)} calibrate on data: pass --calib SET")

    output_root.mkdir(parents=True, exist_ok=True)
    cache_dir = output_root / ".cache" / "features"
    model_hash = model_fingerprint(model_dir)
    previous = _previous(output_root)
    drawn = None
    report = BuildReport(str(output_root), str(model_dir), str(calib) if calib else None, [])
    for recipe_name, names in recipes.items():
        recipe = get_recipe(recipe_name)
        checkpoint = output_root / f"{model_dir.name}-{recipe.name}"
        key = build_key(model_hash, calib_hash, recipe, num_samples, vllm)
        entry = CheckpointBuild(names, recipe.name, str(checkpoint), "error", key)
        before = previous.get(str(checkpoint))
        if not force and _up_to_date(before, key, checkpoint):
            entry.status = "up-to-date"
            entry.vllm, entry.size_ratio, entry.drift = (
                before.get("vllm"),
                before.get("size_ratio"),
                before.get("drift"),
            )
            report.checkpoints.append(entry)
            if on_checkpoint:
                on_checkpoint(entry, None)
            _write_build_file(output_root, report, previous)
            continue
        started = time.perf_counter()
        verified = None
        try:
            if recipe.needs_data and drawn is None:
                kinds = processor_capabilities(adapter.load_processor(model_dir))
                drawn = samples_from_set(calib, model_kinds=kinds, num_samples=num_samples)
                held_out = min(drift_samples, len(drawn.samples) // 4) if num_samples is None else 0
                if held_out:  # drift needs samples calibration did not see
                    drawn = samples_from_set(
                        calib, model_kinds=kinds, num_samples=len(drawn.samples) - held_out
                    )
            quantize(
                model_dir,
                checkpoint,
                recipe,
                drawn.samples if recipe.needs_data else [],
                sample_labels=drawn.labels if recipe.needs_data else None,
                calib_info=drawn.info if recipe.needs_data else None,
                force=True,  # a stale or failed checkpoint of this recipe is replaced
                cache_dir=cache_dir,
                progress=False,
            )
            verified = verify_checkpoint(
                checkpoint,
                reference=model_dir if calib is not None else None,
                calib=calib,
                vllm=vllm,
                num_samples=drift_samples,
            )
            entry.status = "passed" if verified.passed else "failed"
            entry.size_ratio = round(verified.audit.size_ratio, 4)
            entry.reasons = [f"audit: {c.name}: {c.detail}" for c in verified.audit.checks if not c.passed]
            if verified.drift is not None:
                overall = verified.drift.overall
                entry.drift = {"kl": overall.kl, "top1": overall.top1, "cosine": overall.cosine}
                entry.reasons += [f"drift: {b}" for b in verified.drift.breaches]
            if verified.vllm is not None:
                entry.vllm = verified.vllm.status
                if verified.vllm.status == "failed":
                    entry.reasons.append(f"vllm: {verified.vllm.reason}")
        except QuantkitError as error:  # one target's failure must not lose the others
            entry.status = "error"
            entry.reasons = [str(error)]
        entry.seconds = round(time.perf_counter() - started, 1)
        report.checkpoints.append(entry)
        if on_checkpoint:
            on_checkpoint(entry, verified)
        _write_build_file(
            output_root, report, previous
        )  # after each: an interrupted build keeps what finished
    _write_build_file(output_root, report, previous)
    return report
