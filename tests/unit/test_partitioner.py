"""murmur2 agrees with Kafka's Java client, and partition_for stays in range."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.transport.partitioner import murmur2, partition_for

# org.apache.kafka.common.utils.UtilsTest#testMurmur2 (signed Java ints).
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
    (b"", 275646681),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected & 0xFFFFFFFF


def test_partition_for_matches_kafka_positive_modulo() -> None:
    # Kafka: Utils.toPositive(murmur2(key)) % numPartitions
    assert partition_for(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert partition_for(b"foobar", 12) == (-790332482 & 0x7FFFFFFF) % 12


@given(st.binary(max_size=64))
def test_murmur2_is_an_unsigned_32_bit_value(data: bytes) -> None:
    assert 0 <= murmur2(data) <= 0xFFFFFFFF


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_for_stays_in_range(key: bytes, partitions: int) -> None:
    assert 0 <= partition_for(key, partitions) < partitions


@given(st.binary(max_size=64))
def test_one_partition_takes_every_key(key: bytes) -> None:
    assert partition_for(key, 1) == 0
