"""Stage 1: read and validate a pool of training-format samples (quantkit.pool.read), each source
format mapped onto one record (quantkit.pool.formats, quantkit.pool.record)."""

from quantkit.pool.read import gc_paused, read_pool
from quantkit.pool.record import (
    PoolReadResult,
    PoolRecord,
    RecordJson,
    SkippedRecord,
    SourceStats,
    stratum_name,
)
from quantkit.pool.sizes import image_tokens

__all__ = [
    "PoolReadResult",
    "PoolRecord",
    "RecordJson",
    "SkippedRecord",
    "SourceStats",
    "gc_paused",
    "image_tokens",
    "read_pool",
    "stratum_name",
]
