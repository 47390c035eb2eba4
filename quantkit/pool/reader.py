"""Compatibility names: the pool reader is split into quantkit.pool.{sources, formats, parse,
jsonfile, tables, dedupe, read}; import from quantkit.pool or those modules."""

from quantkit.pool.dedupe import drop_duplicates
from quantkit.pool.parse import MediaProbe as _MediaProbe
from quantkit.pool.read import gc_paused, pool_files, read_pool
from quantkit.pool.record import PoolReadResult, PoolRecord, RecordError, SkippedRecord, stratum_name
from quantkit.pool.sizes import bucket_label, image_tokens, modality_name

__all__ = [
    "PoolReadResult",
    "PoolRecord",
    "RecordError",
    "SkippedRecord",
    "_MediaProbe",
    "bucket_label",
    "drop_duplicates",
    "gc_paused",
    "image_tokens",
    "modality_name",
    "pool_files",
    "read_pool",
    "stratum_name",
]
