"""The gate's statistics (quantkit.eval.gate) on per-item score arrays made here: the paired loss,
its seeded bootstrap interval, the three-way decision and what it says about items."""

from __future__ import annotations

import numpy as np
import pytest

from quantkit.eval import gate


def items(n: int, seed: int = 1) -> np.ndarray:
    """Per-item scores of an original model: items of very different difficulty (0.05 to 0.95)."""
    return np.random.default_rng(seed).uniform(0.05, 0.95, size=n)


def test_a_candidate_identical_to_the_original_passes_with_a_narrow_interval():
    original = items(60)
    record = gate.verdict_record(
        gate.measure(original, original.copy(), metric="m", items=range(60)).to_dict(), 0.1
    )
    assert record["loss"] == record["ci_low"] == record["ci_high"] == 0.0
    assert record["verdict"] == gate.PASSED


def test_the_interval_is_paired_so_item_difficulty_cancels_out():
    """A candidate a hair below the original on every item: the paired interval is narrow and
    passes 1.5 points; resampling the two models' items apart would be as wide as the items'
    difficulty spread (tens of points over 60 items) and leave it unresolved."""
    original = items(60)
    noise = np.random.default_rng(2).normal(0.0, 0.01, size=60)
    candidate = original - 0.003 + noise
    low, high = gate.paired_interval(original, candidate)
    assert high - low < 1.0, (low, high)
    assert low <= gate.paired_loss(original, candidate) <= high
    assert gate.decide(60, low, high, gate.DEFAULT_MAX_LOSS) == gate.PASSED


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [
        (-0.5, 1.4, gate.PASSED),  # the upper end within the budget
        (1.0, 2.0, gate.UNRESOLVED),  # the interval holds the budget: neither
        (1.6, 3.0, gate.FAILED),  # the lower end beyond it
        (1.5, 3.0, gate.UNRESOLVED),  # on the budget is within it
        (-1.0, 1.5, gate.PASSED),
    ],
)
def test_the_decision_compares_the_right_end_of_the_interval(low, high, verdict):
    assert gate.decide(30, low, high, 1.5) == verdict


def test_too_few_items_are_never_a_verdict():
    """Under MIN_ITEMS a resample often repeats one item: even an identical candidate is unresolved."""
    assert gate.MIN_ITEMS == 4  # n x n**-n under 2.5% first at 4 (4 x 4**-4 = 1.6%, 3 x 3**-3 = 11%)
    same = items(gate.MIN_ITEMS - 1)
    record = gate.verdict_record(gate.measure(same, same, metric="m", items=range(len(same))).to_dict(), 1.5)
    assert record["verdict"] == gate.UNRESOLVED and record["items_to_resolve"] == gate.MIN_ITEMS


def test_a_rerun_gives_the_same_bytes():
    original, candidate = items(25), items(25, seed=3)
    first = gate.measure(original, candidate, metric="m", items=[f"id{i}" for i in range(25)])
    again = gate.measure(original.copy(), candidate.copy(), metric="m", items=[f"id{i}" for i in range(25)])
    assert repr(first) == repr(again)
    assert gate.items_hash(["a", "b"]) != gate.items_hash(["b", "a"])


def test_the_items_to_resolve_do_resolve_it_at_the_spread_observed():
    """An unresolved task: as many items as the gate says, at the loss and spread observed (its
    items repeated), pass; one item fewer than a tenth of them does not."""
    rng = np.random.default_rng(4)
    original = rng.uniform(0.3, 0.9, size=30)
    candidate = original - rng.normal(0.005, 0.04, size=30)  # about half a point lost, spread 4 points
    record = gate.verdict_record(
        gate.measure(original, candidate, metric="m", items=range(30)).to_dict(), 1.5
    )
    assert record["verdict"] == gate.UNRESOLVED, record
    needed = record["items_to_resolve"]
    assert 30 < needed < 2000

    def at(n):
        repeated = gate.measure(np.resize(original, n), np.resize(candidate, n), metric="m", items=range(n))
        return gate.verdict_record(repeated.to_dict(), 1.5)["verdict"]

    assert at(needed) == gate.PASSED
    assert at(30 + (needed - 30) // 10) == gate.UNRESOLVED


def test_weights_make_points_of_answer_positions_or_percent_of_the_original():
    """Positions as weights: points of expected accuracy (the drift loss); the original's scores
    as weights: 100% - recovery (an --eval-tasks task)."""
    original, candidate, positions = [3.0, 1.0], [2.5, 1.0], [4, 6]
    assert gate.paired_loss(original, candidate, positions) == pytest.approx(100 * 0.5 / 10)
    assert gate.paired_loss(original, candidate, original) == pytest.approx(100 - 100 * 3.5 / 4.0)
    assert gate.paired_loss([0.0], [0.0], [0.0]) == 0.0  # nothing to lose


def test_a_budget_finer_than_one_item_is_unresolvable_up_front():
    """A 0-or-1 metric on 50 items moves 2 points per item: 1.5 cannot be resolved for a candidate
    that changes any answer; on 100 items it can."""
    reason = gate.unresolvable(50, 1.5, step_loss=100 / 50)
    assert reason and "about 67 items" in reason
    assert gate.unresolvable(100, 1.5, step_loss=100 / 100) is None
    assert gate.unresolvable(200, 1.5) is None  # a continuous score: only the count matters
    assert "fewer than the 4" in gate.unresolvable(3, 1.5)
    assert "only a candidate that changes no answer" in gate.unresolvable(500, 0.0, step_loss=0.2)


def test_one_pass_rule_and_default_everywhere():
    """The build, eval and the CLI take the rule and the default from quantkit.eval.gate."""
    import importlib

    from quantkit.build import DEFAULT_MAX_LOSS

    compare = importlib.import_module(
        "quantkit.eval.compare"
    )  # the package re-exports a function of that name

    assert DEFAULT_MAX_LOSS is gate.DEFAULT_MAX_LOSS and compare.DEFAULT_MAX_LOSS is gate.DEFAULT_MAX_LOSS
    assert gate.within(1.5, 1.5) and not gate.within(1.5001, 1.5)
    assert compare.judge(1.0, 0.985, True, 1.5)[2] and not compare.judge(1.0, 0.98, True, 1.5)[2]


@pytest.mark.parametrize("value", [gate.LOSS_RANGE[1] + 0.5, float("nan"), float("inf")])
def test_every_budget_is_checked_against_one_range(tmp_path, value):
    """`build --max-loss`, a target's max_loss, a fallback's task_loss_above and `eval --max-loss`
    refuse the same values (gate.in_loss_range), and a target without max_loss has the one default."""
    import yaml

    from quantkit.build import build_checkpoints, load_targets
    from quantkit.errors import InputError
    from quantkit.eval.run import check_inputs

    assert not gate.in_loss_range(value) and gate.in_loss_range(gate.LOSS_RANGE[1])
    with pytest.raises(InputError, match="--max-loss"):
        build_checkpoints(tmp_path / "model", tmp_path / "out", ["l40s"], max_loss=value)
    with pytest.raises(InputError, match="--max-loss"):
        check_inputs(tmp_path, [tmp_path], limit=None, backend="hf", max_loss=value, batch_size=1)
    fallback = {"recipe": "fp8-dynamic", "when": {"task_loss_above": value}, "why": "x"}
    target = {"name": "t", "hardware": ["gpu"], "recipe": "fp8", "why": "x"}
    for entry, field in (
        ({**target, "max_loss": value}, "max_loss"),
        ({**target, "fallbacks": [fallback]}, "when"),
    ):
        path = tmp_path / "targets.yaml"
        path.write_text(yaml.safe_dump({"version": 1, "targets": [entry]}))
        with pytest.raises(InputError, match=field):
            load_targets(path)
    path.write_text(yaml.safe_dump({"version": 1, "targets": [target]}))
    (loaded,) = load_targets(path).targets
    assert loaded.budget() == gate.DEFAULT_MAX_LOSS and loaded.budget(0.5) == 0.5
