"""Synthetic media and skills tasks made on the spot from a seed: the serve probes of ``verify``, the
held-out items of the skills eval, and the zoo's training data and demo pools."""

# The seed of held-out items of every skills suite: training steps draw seeds seed * 1_000_003 + step,
# far below it, so no held-out item was ever trained on.
EVAL_SEED = 999_999_937
