"""Run lm-evaluation-harness in another Python environment and write its results as JSON.

Started by :func:`quantkit.eval.backends.run_in_environment` as
``PYTHON -P harness_worker.py ARGS.json OUT.json``: it imports nothing from quantkit (the other
environment has its own torch / transformers, e.g. the vLLM one) and only lm_eval's public API.
"""

from __future__ import annotations

import json
import sys


def main(args_path: str, out_path: str) -> int:
    with open(args_path, encoding="utf-8") as handle:
        args = json.load(handle)
    import lm_eval
    import torch
    from lm_eval.tasks import TaskManager

    # The harness's hf model defaults to "cuda" even where there is none.
    device = args.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")

    manager = TaskManager(include_path=args["include_paths"])
    results = lm_eval.simple_evaluate(
        model=args["model"],
        model_args=args["model_args"],
        tasks=args["tasks"],
        limit=args.get("limit"),
        batch_size=args.get("batch_size", 1),
        device=device,
        task_manager=manager,
        log_samples=False,
    )
    keep = ("results", "groups", "group_subtasks", "higher_is_better", "n-samples", "versions", "n-shot")
    payload = {key: results.get(key) for key in keep if key in results}
    payload["lm_eval_version"] = getattr(lm_eval, "__version__", None)
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
