"""Java's murmur2 partitioner, written here from Kafka's Java code so that no Kafka client is
its own judge: the reference the gateway's, the worker's and librdkafka's partitions are
checked against (``tests/gateway/test_gateway_kafka.py`` checks it with Kafka's own vectors)."""

from __future__ import annotations


def murmur2(data: bytes) -> int:
    """Java's ``org.apache.kafka.common.utils.Utils.murmur2`` (the hash of Java's default
    partitioner), a signed 32-bit int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    body = length - length % 4
    for i in range(0, body, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * m) & mask
        k ^= k >> 24
        h = ((h * m) & mask) ^ ((k * m) & mask)
    tail = data[body:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h = ((h ^ tail[0]) * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """Where Java's producer puts a keyed record: ``toPositive(murmur2(key)) % partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
