"""Keeping freed memory in a process that bulk-loads stores (glibc's malloc).

A catch-up writes each batch's rows through a WriteBatch whose buffer grows by
doubling, and RocksDB fills memtables of a few MiB in arena blocks. With glibc's
defaults, blocks above a (sliding) threshold are mmap'd and unmapped when freed,
and the top of the heap is trimmed: the next batch takes the same memory fresh
from the kernel, which zeroes every page of it again. Measured on a 2-vCPU
machine, two processes catching up two partitions each (250,000 facts a
partition): a quarter fewer page faults and 6-9 % less CPU and wall time
(BENCHMARKS.md, section 2).

This is for processes whose memory ends with the bulk load (the catch-up pool's,
a replay's): they keep what they freed for reuse instead of returning it, so
their RSS stays at its peak until they exit. The processor's own process does
not call it.
"""

from __future__ import annotations

import ctypes
import logging
import platform

__all__ = ["keep_freed_memory"]

logger = logging.getLogger(__name__)

# mallopt(3) parameters and the values set.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_SETTINGS = (
    (_M_MMAP_THRESHOLD, 1 << 30),  # blocks up to 1 GiB come from the heap, not mmap
    (_M_TRIM_THRESHOLD, 1 << 30),  # the heap's top is not returned below 1 GiB free
    (_M_TOP_PAD, 64 << 20),  # the heap grows 64 MiB at a time: fewer brk calls
)


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in this process (see the module doc).

    Returns whether it did: False, changing nothing, where the C library is not glibc.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = all(mallopt(parameter, value) == 1 for parameter, value in _SETTINGS)
    if not applied:
        logger.debug("glibc refused a mallopt setting; freed memory may still be returned")
    return applied
