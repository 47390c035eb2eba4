"""How many samples each stratum gets: a floor for every non-empty stratum, the rest in proportion
to weight x available share, capped by what the stratum has, with largest-remainder rounding."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TypeVar

from quantkit.errors import InputError

Item = TypeVar("Item")


def allocate(
    available: dict[str, int], weights: dict[str, float], size: int, *, floor: int = 1
) -> dict[str, int]:
    """Split ``size`` samples over strata. Deterministic; ties break by stratum name.

    - Every stratum with samples gets ``min(floor, available)`` first, so nothing present is dropped.
    - The remainder goes in proportion to ``weight * available`` (the weight times the stratum's
      share of the pool), never more than a stratum has; what a capped stratum cannot take flows to
      the others.
    - When the pool holds ``size`` samples or fewer, every sample is taken.
    """
    strata = sorted(s for s, n in available.items() if n > 0)
    total = sum(available[s] for s in strata)
    if total <= size:
        return {s: available[s] for s in strata}
    if len(strata) > size:
        raise InputError(
            f"a set of {size} samples cannot cover the pool's {len(strata)} strata",
            hint=f"raise --size to at least {len(strata)}",
        )
    floor = max(1, floor)
    counts = {s: min(floor, available[s]) for s in strata}
    if sum(counts.values()) > size:  # the floor is too generous for this size: one each, then share
        counts = {s: 1 for s in strata}
    remaining = size - sum(counts.values())
    room = {s: available[s] - counts[s] for s in strata}
    active = [s for s in strata if room[s] > 0]
    while remaining > 0 and active:
        mass = {s: weights[s] * available[s] for s in active}
        total_mass = sum(mass.values())
        quota = {s: remaining * mass[s] / total_mass for s in active}
        capped = [s for s in active if quota[s] >= room[s]]
        if capped:
            for s in capped:
                counts[s] += room[s]
                remaining -= room[s]
                room[s] = 0
            active = [s for s in active if room[s] > 0]
            continue
        whole = {s: math.floor(quota[s]) for s in active}
        for s in active:
            counts[s] += whole[s]
        leftover = remaining - sum(whole.values())
        by_remainder = sorted(active, key=lambda s: (-(quota[s] - whole[s]), s))
        for s in by_remainder[:leftover]:
            counts[s] += 1
        remaining = 0
    return counts


def choose(items: Sequence[Item], count: int, *, seed: int, stratum: str) -> list[Item]:
    """A seeded random choice of ``count`` items; ``items`` must already be in a stable order.

    The generator is seeded per stratum, so adding a stratum does not reshuffle the others.
    """
    if count >= len(items):
        return list(items)
    rng = random.Random(f"{seed}|{stratum}")
    picked = sorted(rng.sample(range(len(items)), count))
    return [items[i] for i in picked]


def proportional(sizes: dict[str, int], count: int) -> dict[str, int]:
    """Split ``count`` in proportion to ``sizes`` (largest remainder), at least one per group.

    Used to subsample a set while keeping its proportions; ``count`` must be at least the number
    of groups and at most their total.
    """
    total = sum(sizes.values())
    quota = {s: count * n / total for s, n in sizes.items()}
    counts = {s: min(sizes[s], max(1, math.floor(q))) for s, q in quota.items()}
    while sum(counts.values()) > count:  # the minimum of one pushed us over: take from the most over quota
        s = max((s for s in counts if counts[s] > 1), key=lambda s: (counts[s] - quota[s], s))
        counts[s] -= 1
    while sum(counts.values()) < count:
        s = max((s for s in counts if counts[s] < sizes[s]), key=lambda s: (quota[s] - counts[s], s))
        counts[s] += 1
    return counts
