"""Kafka's default key partitioner (murmur2), so every producer agrees on placement.

librdkafka's own default (``consistent_random``, CRC32) differs from the Java
client's. We configure librdkafka with ``murmur2_random`` and use this function in
the embedded log and wherever the engine must know a key's partition, so records
produced by Java, Python or the CLI for one run id all meet on one partition.
"""

from __future__ import annotations

__all__ = ["murmur2", "partition_for"]

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """32-bit murmur2 exactly as org.apache.kafka.common.utils.Utils.murmur2."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    full = length - length % 4
    for i in range(0, full, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
