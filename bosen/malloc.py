"""glibc allocator settings for processes that move megabyte-sized messages.

By default glibc serves allocations above 128 KiB with fresh mmaps and returns them at free, so every
large update or row message costs hundreds of page faults on both ends (measured: 100-250 minor
faults per MiB, ~1.5-2x of the 1 MiB ingest time). Messages are capped at 1 MiB of values, so
thresholds a little above that keep those buffers in the heap for reuse while bounding what a
process holds on to (32 MiB untrimmed). A no-op where glibc is absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def reuse_large_buffers(mmap_threshold: int = 4 << 20, trim_threshold: int = 32 << 20) -> bool:
    """Keep buffers up to ``mmap_threshold`` bytes in the heap; True if the setting took effect."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
