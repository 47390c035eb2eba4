"""``quantkit eval ORIGINAL CKPT... --tasks skills``: per-task accuracy of ``tiny-omni-skills``.

Each task of ``quantkit.synthetic.skills_tasks`` is scored by its own metric on held-out items (drawn
with EVAL_SEED, a seed no training step uses), through ``generate`` with the model's chat template
and processor, greedy:

- ``exact``: the answer equals the reference (case and surrounding spaces ignored);
- ``iou``: the box ``[x1, y1, x2, y2]`` overlaps the reference with IoU >= 0.5 (score: that rate);
- ``tiou``: temporal IoU of the ``<start> to <end>`` span with the reference (score: the mean);
- ``wer``: word error rate; the score is 1 - WER, floored at 0, so that higher is better.

Recovery per task is checkpoint score / original score. The tasks of the model come from the
``skills.json`` beside it (written by ``zoo build tiny-omni-skills``).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quantkit.errors import InputError
from quantkit.eval.gate import DEFAULT_MAX_LOSS, within
from quantkit.eval.report import (
    SECTION_END,
    SECTION_START,
    fmt,
    fmt_pct,
    strict_json,
    update_card,
    write_atomic,
)
from quantkit.synthetic import EVAL_SEED, skills_tasks  # EVAL_SEED: held-out items, every suite
from quantkit.synthetic.skills_tasks import processor_inputs, suite_module

GROUPS = ("image", "video", "audio", "text")
SCORE_LABELS = {"exact": "exact match", "iou": "IoU>=0.5 rate", "tiou": "mean tIoU", "wer": "1 - WER"}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


# ---------------------------------------------------------------------------------------------- scorers


def _norm(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in text.strip().lower().splitlines())


def exact_match(prediction: str, reference: str) -> float:
    return float(_norm(prediction) == _norm(reference))


def _numbers(text: str, count: int) -> list[float] | None:
    found = [float(v) for v in _NUMBER.findall(text)]
    return found[:count] if len(found) >= count else None


def box_iou(prediction: str, reference: str) -> float:
    """IoU of two ``[x1, y1, x2, y2]`` boxes given as text; 0 when the prediction has no box."""
    a, b = _numbers(prediction, 4), _numbers(reference, 4)
    if a is None or b is None:
        return 0.0
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    area = lambda r: max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])  # noqa: E731
    union = area(a) + area(b) - inter
    return inter / union if union > 0 else 0.0


def iou_hit(prediction: str, reference: str) -> float:
    return float(box_iou(prediction, reference) >= 0.5)


def temporal_iou(prediction: str, reference: str) -> float:
    """IoU of two ``<start> to <end>`` spans (seconds); 0 when the prediction has no span."""
    a, b = _numbers(prediction, 2), _numbers(reference, 2)
    if a is None or b is None or a[1] < a[0]:
        return 0.0
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else float(a == b)


def word_error_rate(prediction: str, reference: str) -> float:
    """(substitutions + deletions + insertions) / reference words, by edit distance over words."""
    hyp, ref = _norm(prediction).split(), _norm(reference).split()
    previous = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, 1):
        current = [i]
        for j, other in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return previous[-1] / max(1, len(ref))


def word_accuracy(prediction: str, reference: str) -> float:
    return max(0.0, 1.0 - word_error_rate(prediction, reference))


SCORERS = {"exact": exact_match, "iou": iou_hit, "tiou": temporal_iou, "wer": word_accuracy}
# Metrics that score an item 0 or 1: one item's change is a whole step (the gate's unresolvable).
HIT_METRICS = frozenset({"exact", "iou"})


# ---------------------------------------------------------------------------------------------- running


@dataclass
class TaskScore:
    task: str
    group: str
    metric: str
    items: int
    score: float
    examples: list[dict] = field(default_factory=list)  # the first few (prediction, answer) pairs
    item_scores: list[float] = field(
        default_factory=list
    )  # per item, in the order drawn (the gate pairs them)


@dataclass
class ModelScores:
    model_dir: str
    seconds: float
    tasks: list[TaskScore]

    def by_task(self) -> dict[str, TaskScore]:
        return {t.task: t for t in self.tasks}


def read_skills(model_dir: Path) -> dict:
    path = Path(model_dir) / "skills.json"
    if not path.is_file():
        raise InputError(
            "no skills.json beside the model: --tasks skills scores tiny-omni-skills",
            path=path,
            hint="quantkit zoo build tiny-omni-skills --output DIR",
        )
    return json.loads(path.read_text(encoding="utf-8"))


def _load(model_dir: Path):
    import torch

    from quantkit.models.adapters import adapter_for
    from quantkit.quantize.run import saved_dtype

    adapter = adapter_for(model_dir)
    try:
        # In the saved dtype, as verify's drift does: some reloaded quantized models fail in float32.
        model = adapter.load_model(model_dir, dtype=saved_dtype(model_dir))
        processor = adapter.load_processor(model_dir)
    except Exception as err:
        raise InputError(f"could not load the model: {type(err).__name__}: {err}", path=model_dir) from None
    if torch.cuda.is_available():  # generation on the GPU where there is one (one device: no sharding)
        model.to("cuda")
    return model.eval(), processor


def score_model(
    model_dir: Path,
    task_names: list[str],
    *,
    items: int = 32,
    batch: int = 16,
    log=None,
    suite_from: Path | None = None,
) -> ModelScores:
    """Generate greedily for ``items`` held-out items per task and score each by its metric.

    The tasks are those of the ``skills.json`` in ``suite_from`` (the original model, for a
    checkpoint: quantize does not copy skills.json), else in ``model_dir``, else tiny-omni-skills'."""
    started = time.monotonic()

    manifest_dir = next(
        (Path(d) for d in (suite_from, model_dir) if d and (Path(d) / "skills.json").is_file()), None
    )
    suite = suite_module(read_skills(manifest_dir)) if manifest_dir else None
    model, processor = _load(Path(model_dir))
    label = Path(model_dir).name
    results = score_loaded(
        model, processor, task_names, items=items, batch=batch, log=log, label=label, suite=suite
    )
    return ModelScores(str(model_dir), round(time.monotonic() - started, 1), results)


def score_loaded(
    model,
    processor,
    task_names: list[str],
    *,
    items: int = 32,
    batch: int = 16,
    log=None,
    label: str = "model",
    suite=None,
) -> list[TaskScore]:
    """The per-task scores of a model already in memory (the trainer measures its runs with it);
    ``suite`` is the task module (``quantkit.synthetic.skills_tasks`` by default)."""
    import torch

    suite = suite or skills_tasks
    results = []
    for name in task_names:
        task = suite.TASKS_BY_NAME[name]
        held_out = suite.make_items(name, items, seed=EVAL_SEED)
        scores, examples = [], []
        for start in range(0, len(held_out), batch):
            chunk = held_out[start : start + batch]
            inputs = processor_inputs(processor, chunk, with_answers=False)
            inputs = {k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=suite.MAX_NEW_TOKENS, do_sample=False)
            texts = processor.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
            for item, text in zip(chunk, texts, strict=True):
                scores.append(SCORERS[task.metric](text, item.answer))
                if len(examples) < 3:
                    examples.append({"prompt": item.prompt, "answer": item.answer, "prediction": text})
        results.append(
            TaskScore(name, task.group, task.metric, len(scores), sum(scores) / len(scores), examples, scores)
        )
        if log:
            log(f"{label}: {name} {results[-1].score:.3f}")
    return results


@dataclass
class SkillsReport:
    original: ModelScores
    checkpoints: list[ModelScores]
    max_loss: float
    items: int
    seed: int = EVAL_SEED

    def recovery(self, checkpoint: ModelScores, task: str) -> float | None:
        base = self.original.by_task()[task].score
        return None if base == 0 else 100.0 * checkpoint.by_task()[task].score / base

    def task_within(self, checkpoint: ModelScores, task: str) -> bool:
        """The task's loss, 100% - recovery, within max_loss (a task the original scores 0 on is)."""
        rec = self.recovery(checkpoint, task)
        return rec is None or within(100.0 - rec, self.max_loss)

    def within(self, checkpoint: ModelScores) -> bool:
        return all(self.task_within(checkpoint, t.task) for t in checkpoint.tasks)

    @property
    def passed(self) -> bool:
        return all(self.within(c) for c in self.checkpoints)

    def rows(self) -> list[dict]:
        """Task x (original, each checkpoint, recovery), grouped by image / video / audio / text."""
        order = {g: i for i, g in enumerate(GROUPS)}
        rows = []
        for t in sorted(self.original.tasks, key=lambda t: order.get(t.group, len(GROUPS))):
            row = {"group": t.group, "task": t.task, "metric": SCORE_LABELS[t.metric], "original": t.score}
            row["checkpoints"] = [
                {
                    "checkpoint": c.model_dir,
                    "score": c.by_task()[t.task].score,
                    "recovery_pct": self.recovery(c, t.task),
                }
                for c in self.checkpoints
            ]
            rows.append(row)
        return rows

    def payload_for(self, checkpoint: ModelScores) -> dict:
        return {
            "kind": "skills",
            "original": self.original.model_dir,
            "checkpoint": checkpoint.model_dir,
            "items_per_task": self.items,
            "seed": self.seed,
            "max_loss_pct": self.max_loss,
            "passed": self.within(checkpoint),
            "rows": [
                {**{k: v for k, v in row.items() if k != "checkpoints"}, **c}
                for row in self.rows()
                for c in row["checkpoints"]
                if c["checkpoint"] == checkpoint.model_dir
            ],
            "original_scores": asdict(self.original),
            "checkpoint_scores": asdict(checkpoint),
        }


def render_skills_section(payload: dict) -> str:
    verdict = "**within**" if payload["passed"] else "**beyond**"
    lines = [
        SECTION_START,
        "## Evaluation: per-task skills",
        "",
        f"{payload['items_per_task']} held-out items per task (seed {payload['seed']}), greedy `generate` with "
        f"the chat template, this checkpoint against the original `{payload['original']}`. Recovery is "
        f"checkpoint / original; this checkpoint is {verdict} the allowed loss of {payload['max_loss_pct']}%.",
        "",
        "| group | task | metric | original | this checkpoint | recovery |",
        "|---|---|---|---|---|---|",
    ]
    for row in payload["rows"]:
        lines.append(
            f"| {row['group']} | {row['task']} | {row['metric']} | {fmt(row['original'])} | "
            f"{fmt(row['score'])} | {fmt_pct(row['recovery_pct'])} |"
        )
    lines += [
        "",
        "Full results in `eval.json`; rerun with `quantkit eval ORIGINAL CKPT --tasks skills`.",
        SECTION_END,
        "",
    ]
    return "\n".join(lines)


def evaluate_skills(
    original: Path,
    checkpoints: list[Path],
    *,
    items: int = 32,
    max_loss: float = DEFAULT_MAX_LOSS,
    tasks: list[str] | None = None,
    write: bool = True,
    log=None,
) -> SkillsReport:
    """Score the original and each checkpoint on every task of the original's ``skills.json``;
    write ``eval.json`` and the card section beside each checkpoint."""
    manifest = read_skills(original)
    names = [t["name"] for t in manifest["tasks"]]
    if tasks:
        unknown = sorted(set(tasks) - set(names))
        if unknown:
            raise InputError(
                f"unknown skills task(s) {', '.join(unknown)}", hint=f"choose from {', '.join(names)}"
            )
        names = [n for n in names if n in tasks]
    for folder in (original, *checkpoints):
        if not (Path(folder) / "config.json").is_file():
            raise InputError("not a model folder (no config.json)", path=folder)
    base = score_model(original, names, items=items, log=log)
    scored = [score_model(c, names, items=items, log=log, suite_from=original) for c in checkpoints]
    report = SkillsReport(base, scored, max_loss, items)
    if write:
        for folder, result in zip(checkpoints, scored, strict=True):
            payload = strict_json(report.payload_for(result))
            write_atomic(Path(folder) / "eval.json", json.dumps(payload, indent=2) + "\n")
            update_card(Path(folder), render_skills_section(payload))
    return report
