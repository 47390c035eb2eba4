"""Data-parallel calibration under ``torch.distributed.run`` (torchrun).

llmcompressor runs ``oneshot`` data-parallel when a process group exists: each rank calibrates
its own samples, GPTQ sums the Hessians across ranks and spreads the per-layer solves over them,
and observers reduce their statistics. quantkit only has to start the ranks, give each a
stratified shard, and let rank 0 write. compressed-tensors' own ``init_dist`` assumes an
accelerator; on CPUs the group is started here with the gloo backend.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def relaunch_command(nproc: int, argv: list[str]) -> list[str]:
    """The same quantkit command line, started as ``nproc`` ranks on this machine."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "quantkit",
        *argv,
    ]


def init_distributed() -> DistContext | None:
    """Join the process group torchrun set up (nccl on CUDA, gloo on CPUs); None outside torchrun."""
    if not launched_by_torchrun():
        return None
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            backend = "nccl"
        else:
            backend = "gloo"
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    return DistContext(rank, world, dist.get_backend())


def shard_indices(labels: list[str], rank: int, world_size: int) -> list[int]:
    """This rank's samples: the strata's members dealt round-robin, one stratum after another
    with the deal going on where the last stopped, so every rank keeps the set's proportions,
    small strata spread out, and shards differ by one at most (no rank is left without a sample
    while there are as many as ranks: an empty rank would hang the others in their collectives)."""
    groups: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        groups.setdefault(label, []).append(index)
    dealt = [i for stratum in sorted(groups) for i in groups[stratum]]
    return sorted(i for position, i in enumerate(dealt) if position % world_size == rank)


def gather(value, context: DistContext | None) -> list:
    """``value`` from every rank (a list of one outside torchrun)."""
    if context is None:
        return [value]
    import torch.distributed as dist

    values = [None] * context.world_size
    dist.all_gather_object(values, value)
    return values


def barrier(context: DistContext | None) -> None:
    if context is not None:
        import torch.distributed as dist

        dist.barrier()


def broadcast_from_main(value, context: DistContext | None):
    """Rank 0's ``value`` on every rank (``value`` itself outside torchrun)."""
    if context is None:
        return value
    import torch.distributed as dist

    box = [value if context.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shard(samples: list, labels: list[str], context: DistContext | None) -> tuple[list, list[str]]:
    """This rank's samples and labels (all of them outside torchrun)."""
    if context is None:
        return samples, labels
    from quantkit.errors import InputError

    if len(samples) < context.world_size:
        raise InputError(
            f"{len(samples)} calibration sample(s) for {context.world_size} ranks: every rank needs at least one",
            hint="lower --nproc or pass more samples",
        )
    indices = shard_indices(labels, context.rank, context.world_size)
    return [samples[i] for i in indices], [labels[i] for i in indices]


def refuse_shared_weight_smoothing(recipe) -> None:
    """AWQ and SmoothQuant rescale each norm in place on every rank. With the model on CPUs the
    ranks share one copy of every weight (compressed-tensors' distributed CPU cache), so N ranks
    would divide each norm N times; on GPUs each rank scales its own copy."""
    if torch.cuda.is_available() or (recipe.method != "awq" and recipe.smoothquant_strength is None):
        return
    from quantkit.errors import InputError

    smoothing = "AWQ" if recipe.method == "awq" else "SmoothQuant"
    raise InputError(
        f"recipe {recipe.name!r} smooths with {smoothing}, which on CPUs would rescale the ranks' shared "
        "weights once per rank: several ranks on CPUs run GPTQ and observer recipes only",
        hint="drop --nproc, or use w4a16 / fp8 (or run on GPUs)",
    )
