"""`quantkit verify`: audit a checkpoint, measure drift, prove vLLM loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from quantkit.cli._common import console
from quantkit.errors import CheckFailed


def verify(
    checkpoint: Annotated[Path, typer.Argument(help="Quantized checkpoint folder.", show_default=False)],
    reference: Annotated[
        Path | None, typer.Option(help="The original model folder: measure drift against it (needs --calib).")
    ] = None,
    calib: Annotated[
        Path | None,
        typer.Option(help="Calibration-set folder: held-out samples for drift come from its strata."),
    ] = None,
    vllm: Annotated[
        bool, typer.Option("--vllm", help="Load and run the checkpoint in vLLM (make vllm-env).")
    ] = False,
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="Start `vllm serve` on the checkpoint (127.0.0.1), send a text, image, audio and video "
            "request with the openai client and check the answers against vLLM's offline engine.",
        ),
    ] = False,
    port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="The --serve server's port on 127.0.0.1 (default: a free one)."),
    ] = None,
    num_samples: Annotated[int, typer.Option(min=1, help="Held-out samples for drift.")] = 16,
    max_kl: Annotated[float | None, typer.Option(min=0.0, help="Override the recipe's KL threshold.")] = None,
    min_top1: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="Override the recipe's top-1 agreement threshold.")
    ] = None,
    min_cosine: Annotated[
        float | None, typer.Option(min=-1.0, max=1.0, help="Override the recipe's logit-cosine threshold.")
    ] = None,
    report_path: Annotated[
        Path | None,
        typer.Option(
            "--report", help="Write the report here (default: verify.json in the checkpoint folder)."
        ),
    ] = None,
) -> None:
    """Check a quantized checkpoint and write verify.json in it (or where --report says).

    Always: the audit (quantization_config valid; every quantized tensor has the scheme's dtype and
    shape; every scale finite and positive; every ignore entry matches a module; only the
    language model quantized). With --reference and --calib: KL, top-1 agreement, logit cosine and
    greedy agreement per modality and per task, judged by the recipe's thresholds. With --vllm:
    vLLM generates for a text prompt (and image / audio where the model takes them) and transformers
    must agree; a scheme the local vLLM backend has no kernel for is reported as skipped.
    With --serve: `vllm serve` runs the checkpoint on 127.0.0.1 (a free port, or --port) in the
    vLLM environment; one text, image, audio and video request (base64 data URLs) goes through
    the openai client, greedy, and each answer (and its prompt, as the server rendered it) must
    have the very token ids vLLM's offline engine gives for the same messages (greedy decoding is
    deterministic). The server is stopped afterwards, on failure and on Ctrl-C too; the result also
    goes into the card. A scheme the local vLLM build has no kernel for is skipped there too, with
    vLLM's reason. --serve needs the vLLM environment (make vllm-env): without it, exit code 2.

    Exit code 0 when everything that ran passed, 1 when a check failed or the report could not
    be saved (a read-only checkpoint folder: the result is printed; pass --report PATH).

    Example:

        quantkit verify out/omni-w4a16 --reference models/omni --calib calib --vllm

        quantkit verify out/omni-fp8-dynamic --serve
    """
    from quantkit.verify import DriftThresholds, recipe_thresholds, verify_checkpoint

    thresholds = None
    if any(v is not None for v in (max_kl, min_top1, min_cosine)):
        base = recipe_thresholds(checkpoint) or DriftThresholds(float("inf"), 0.0, -1.0)
        thresholds = DriftThresholds(
            max_kl=max_kl if max_kl is not None else base.max_kl,
            min_top1=min_top1 if min_top1 is not None else base.min_top1,
            min_cosine=min_cosine if min_cosine is not None else base.min_cosine,
        )
    report = verify_checkpoint(
        checkpoint,
        reference=reference,
        calib=calib,
        vllm=vllm,
        thresholds=thresholds,
        num_samples=num_samples,
        report_path=report_path,
        serve=serve,
        serve_port=port,
    )
    print_verify_report(report)
    if report.saved_to is not None:
        console.print(f"wrote {report.saved_to}")
    else:
        console.print(
            f"[red]the report could not be saved:[/] {report.not_saved} (the result is above; "
            "pass --report PATH to write it elsewhere)"
        )
    if not report.passed:
        raise CheckFailed(
            "verification failed",
            path=checkpoint,
            hint=f"see the table above and {report.saved_to}" if report.saved_to else "see the table above",
        )
    if report.not_saved is not None:
        raise CheckFailed(
            "every check passed, but the report could not be saved",
            path=checkpoint,
            hint="pass --report PATH to write it elsewhere",
        )


def _colour(status: str) -> str:
    return {"passed": "green", "skipped": "yellow", "unavailable": "yellow"}.get(status, "red")


def _mark(passed: bool) -> str:
    return "[green]pass[/]" if passed else "[red]FAIL[/]"


def print_verify_report(report) -> None:
    audit = report.audit
    table = Table("check", "result", "detail", title=f"Audit of {report.checkpoint}")
    for check in audit.checks:
        table.add_row(check.name, _mark(check.passed), check.detail)
    console.print(table)
    if audit.language_model_bytes_16bit:
        console.print(
            f"language-model Linear weights: {audit.language_model_bytes_16bit / 2**20:.2f} MiB in 16-bit -> "
            f"{audit.language_model_bytes_stored / 2**20:.2f} MiB stored ({audit.size_ratio:.3f}x)"
        )
    if report.drift is not None:
        drift = report.drift
        table = Table(
            "group", "samples", "KL", "top-1", "cosine", "greedy agree", title="Drift vs the original"
        )
        for kind, groups in (
            ("all", [drift.overall]),
            ("modality", drift.by_modality),
            ("task", drift.by_task),
        ):
            for g in groups:
                name = g.name if kind == "all" else f"{kind}: {g.name}"
                table.add_row(
                    name,
                    str(g.samples),
                    f"{g.kl:.4f}",
                    f"{g.top1:.3f}",
                    f"{g.cosine:.4f}",
                    f"{g.greedy_prefix:.2f}",
                )
        console.print(table)
        for breach in drift.breaches:
            console.print(f"[red]threshold breached:[/] {breach}")
    if report.vllm is not None:
        check = report.vllm
        colour = _colour(check.status)
        console.print(f"vLLM: [{colour}]{check.status}[/] {check.reason}".rstrip())
        for prompt in check.prompts:
            console.print(
                f"  {prompt.name}: vLLM {prompt.vllm_tokens} / transformers {prompt.transformers_tokens}; "
                f"worst log-prob gap {prompt.worst_logprob_gap:.3f}"
            )
    if report.serve is not None:
        print_serve_check(report.serve)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")


def print_serve_check(check) -> None:
    colour = _colour(check.status)
    ready = f" (ready in {check.ready_seconds} s on port {check.port})" if check.ready_seconds else ""
    console.print(f"vLLM server: [{colour}]{check.status}[/]{ready} {check.reason}".rstrip())
    if check.answers:
        table = Table(
            "request", "prompt tokens", "same prompt", "served tokens", "offline tokens", "same",
            title="Served vs offline engine",
        )  # fmt: skip
        for answer in check.answers:
            table.add_row(
                answer.name,
                str(answer.served_prompt_tokens),
                _mark(answer.same_prompt),
                str(answer.served_tokens),
                str(answer.offline_tokens),
                _mark(answer.matches),
            )
        console.print(table)
