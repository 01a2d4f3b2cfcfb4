"""On-disk artifacts of nmmc that outlive one run: the tuning result cache (:mod:`.cache`)."""

from .cache import (
    CACHE_FORMAT,
    CACHE_FORMAT_VERSION,
    CacheRecord,
    ResultCache,
    cache_key,
    cached_schedule,
    default_cache_dir,
    describe_key,
    new_record,
)

__all__ = [
    "CACHE_FORMAT",
    "CACHE_FORMAT_VERSION",
    "CacheRecord",
    "ResultCache",
    "cache_key",
    "cached_schedule",
    "default_cache_dir",
    "describe_key",
    "new_record",
]
