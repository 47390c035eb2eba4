"""Benchmark `TaskAssigner.assign` (issue 15): the per-record cost of giving unlabelled records a task.

Makes N evidences (default 100,000) per path, then times `assign` over them with the shipped
taxonomy: every record labelled (the field decides), every record under a `--task` mapping, every
record left to the taxonomy's `match` rules (realistic prompts of every task, English and Chinese,
each made distinct; "templated": the same prompts repeated, as templated training data has them,
answers distinct), and records no rule takes (they fall to `--default-task`, after every rule
that fits their media was tried). Prints seconds per N and microseconds per record (median of the
repeats; CPU time of this process, so that a busy machine counts less). The goal: well under a second or two per 100,000 on every path.

    .venv/bin/python bench/taskassign_bench.py [--records 100000] [--repeats 3]

Standalone: nothing in the package imports this file.
"""

from __future__ import annotations

import argparse
import statistics
import time

from quantkit.taskassign import TaskAssigner, TaskEvidence
from quantkit.taxonomy import load_taxonomy

IMG, V, A = frozenset({"image"}), frozenset({"video"}), frozenset({"audio"})
PROMPTS = [
    ("<image>Please read all the text on this product label.", "ORGANIC OAT MILK", IMG),
    ("<image>请识别图中的文字。", "限时特价", IMG),
    ("<image>Convert this table to Markdown.", "| a | b |\n|---|---|\n| 1 | 2 |", IMG),
    ("<image>Locate the red handbag.", "<|box_start|>(120,45),(380,400)<|box_end|>", IMG),
    ("<image>框出图中的口红", "[10, 20, 200, 300]", IMG),
    ("<image>Describe this image in one sentence.", "A woman holds a bag.", IMG),
    ("<video>When does the host first show the blue dress?", "From 12.5s to 30s.", V),
    ("<video>请按商品对直播视频分段", "00:00-01:10 口红", V | A),
    ("<video>What selling points does the host mention?", "Quiet motor.", V | A),
    ("<video>这个视频讲了什么？", "主播在试穿外套。", V),
    ("<audio>Transcribe the audio.", "hello and welcome", A),
    ("<audio>区分说话人，并写出每个人说的话。", "甲：你好", A),
    ("<image><audio>", "It costs 99 yuan.", IMG | A),
    ("Write a haiku about autumn.", "Leaves fall", frozenset()),
]
UNMATCHED = [
    ("<image>What colour is the bag?", "red", IMG),
    ("<video>Is the host smiling?", "yes", V | A),
    ("<audio>Is this a man or a woman?", "a woman", A),
]


def evidences(n: int, path: str) -> list[TaskEvidence]:
    rows = UNMATCHED if path == "default" else PROMPTS
    out = []
    for i in range(n):
        user, answer, media = rows[i % len(rows)]
        task = "ocr" if path == "field" else None
        if path != "templated":  # every prompt distinct; templated: prompts repeat, answers differ
            user = f"{user} ({i})"
        out.append(TaskEvidence(f"pool/part{i % 8}.jsonl", None, task, user, f"{answer} ({i})", media))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    taxonomy = load_taxonomy()
    print(f"{args.records} records per path, median of {args.repeats}")
    for path in ("field", "mapping", "rule", "templated", "default"):
        items = evidences(args.records, path)
        times = []
        for _ in range(args.repeats):
            assigner = TaskAssigner(
                taxonomy,
                ["pool/part*.jsonl=ocr"] if path == "mapping" else (),
                # one default per modality of UNMATCHED: a task takes only the modalities it lists
                default_task=["short_caption", "video+audio=selling_points", "audio=asr"] if path == "default" else None,
            )
            assign = assigner.assign
            start = time.process_time()
            for evidence in items:
                assign(evidence)
            times.append(time.process_time() - start)
            assert assigner.unassigned_error() is None
        seconds = statistics.median(times)
        print(f"  {path:8s} {seconds:6.3f} s   {seconds / args.records * 1e6:6.2f} us/record")


if __name__ == "__main__":
    main()
