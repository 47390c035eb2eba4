"""Evaluate checkpoints against their original with lm-evaluation-harness (used as a library).

``evaluate_checkpoints(original, [checkpoint, ...], tasks)`` runs the same harness tasks on every
model and reports the recovery of each metric; quantkit's own offline tasks (real prose shipped
with Python) live in ``calibration/eval_tasks/``. Image, video and audio fidelity is measured by
``quantkit verify`` (drift per stratum), not here: see docs/eval.md.
"""

from quantkit.eval.backends import BACKENDS, HarnessRun, load_for_eval, vllm_status
from quantkit.eval.compare import (
    DEFAULT_MAX_LOSS,
    Comparison,
    Score,
    compare,
    judge,
    recovery,
    scores_from_results,
)
from quantkit.eval.prose import prose_paragraphs, write_task_data
from quantkit.eval.report import EVAL_FILE, render_card_section, update_card, write_results
from quantkit.eval.run import CheckpointEval, EvalReport, evaluate_checkpoints, split_tasks
from quantkit.eval.tasks import TaskCatalog, builtin_task_names, render_builtin_tasks, task_catalog

__all__ = [
    "BACKENDS",
    "DEFAULT_MAX_LOSS",
    "EVAL_FILE",
    "CheckpointEval",
    "Comparison",
    "EvalReport",
    "HarnessRun",
    "Score",
    "TaskCatalog",
    "builtin_task_names",
    "compare",
    "evaluate_checkpoints",
    "judge",
    "load_for_eval",
    "prose_paragraphs",
    "recovery",
    "render_builtin_tasks",
    "render_card_section",
    "scores_from_results",
    "split_tasks",
    "task_catalog",
    "update_card",
    "vllm_status",
    "write_results",
    "write_task_data",
]
