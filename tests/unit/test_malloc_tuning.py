"""A bulk-loading process keeps the memory it frees (processor.restore.malloc_tuning)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="mallopt settings exist only in glibc"
)

_BLOCK_MIB = 64
# Resident memory kept after freeing one big block, in a fresh interpreter.
_KEPT_AFTER_FREE = f"""
import os, sys
from processor.restore.malloc_tuning import keep_freed_memory
if sys.argv[1] == "tuned" and not keep_freed_memory():
    sys.exit("not applied")
def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
before = resident()
block = bytearray({_BLOCK_MIB} << 20)  # zeroed: every page touched
del block
print((resident() - before) >> 20)
"""


def _kept_mib(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _KEPT_AFTER_FREE, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(done.stdout)


def test_a_freed_block_stays_resident_for_reuse_once_tuned() -> None:
    assert _kept_mib("tuned") >= _BLOCK_MIB * 3 // 4


def test_by_default_a_freed_block_goes_back_to_the_kernel() -> None:
    assert _kept_mib("default") <= _BLOCK_MIB // 4
