"""Tiny and trained zoo models, their tasks and media (tests, the demo and benchmarks)."""

# The seed of held-out items of every skills suite: training steps draw seeds seed * 1_000_003 + step,
# far below it, so no held-out item was ever trained on.
EVAL_SEED = 999_999_937
