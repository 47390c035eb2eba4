"""Stage 1: read and validate a pool of training-format samples."""

from quantkit.pool.reader import PoolReadResult, PoolRecord, SkippedRecord, image_tokens, read_pool

__all__ = ["PoolReadResult", "PoolRecord", "SkippedRecord", "image_tokens", "read_pool"]
