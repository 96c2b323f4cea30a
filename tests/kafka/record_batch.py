"""Kafka's record batch (format v2, magic 2) written by hand, and a Produce request carrying
one, for the tests that need bytes on the broker no client of ours writes (a header key that
is not UTF-8) or a reference for a size no client of ours judges (``record_size``).

The layout is the protocol guide's "Record Batch" (https://kafka.apache.org/protocol): the
batch's header (61 bytes: base offset, length, leader epoch, magic, CRC-32C of everything
after the CRC, attributes, last offset delta, base and max timestamps, producer id and epoch,
base sequence, record count), then each record as varints (zigzag) and bytes.

``produce_raw`` speaks the wire protocol itself: ApiVersions v0 (to say clearly when the
broker has no Produce v8), then Produce v8, the newest version that is not flexible (v9 on
brings compact strings and tagged fields). Kafka 4.0 removed Produce v0-v2 (KIP-896; 4.4.0's
``ProduceRequestData`` serves 3-13), v3 being the first that carries a v2 batch at all, and v8
is the first whose answer says why a batch was refused (``error_message``, record errors).
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka.admin import AdminClient

#: A header: its key (any bytes: the broker does not check them) and its value.
Header = tuple[bytes, bytes | None]
#: A record: key, value (``None``: null) and headers.
Record = tuple[bytes | None, bytes | None, Sequence[Header]]

#: The batch's header before its records: base offset 8, batch length 4, partition leader
#: epoch 4, magic 1, CRC 4, attributes 2, last offset delta 4, base timestamp 8, max
#: timestamp 8, producer id 8, producer epoch 2, base sequence 4, record count 4.
BATCH_HEADER = 61
MAGIC = 2

PRODUCE, API_VERSIONS = 0, 18
PRODUCE_VERSION = 8
#: Produce errors after which nothing was appended and a fresh leader lookup may help:
#: UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER,
#: NOT_ENOUGH_REPLICAS.
_RETRIABLE = frozenset({3, 5, 6, 19})


# ------------------------------------------------------------------------------- CRC-32C


def _crc32c_table() -> tuple[int, ...]:
    """The byte table of CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C of ``data`` (Kafka's batch checksum; ``crc32c(b"123456789") == 0xE3069283``)."""
    crc = 0xFFFFFFFF
    table = _CRC32C
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# ------------------------------------------------------------------------------- encoding


def varint(n: int) -> bytes:
    """``n`` as Kafka's varint / varlong: zigzag, then 7 bits a byte, low bits first."""
    zigzag = (n << 1) ^ (n >> 63)
    out = bytearray()
    while zigzag > 0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint / varlong at ``data[at:]`` and where what follows it starts."""
    zigzag, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        zigzag |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (zigzag >> 1) ^ -(zigzag & 1), at


def _field(data: bytes | None) -> bytes:
    """A length-prefixed field of a record: length varint, bytes (``None``: length -1)."""
    return varint(-1) if data is None else varint(len(data)) + data


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
) -> bytes:
    """One record: length varint, attributes int8 (0), timestampDelta varlong, offsetDelta
    varint, key, value, header count varint, each header's key and value."""
    body = b"".join(
        [
            b"\x00",
            varint(timestamp_delta),
            varint(offset_delta),
            _field(key),
            _field(value),
            varint(len(headers)),
            *(varint(len(name)) + name + _field(data) for name, data in headers),
        ]
    )
    return varint(len(body)) + body


def encode_batch(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    timestamp: int = 0,
    crc: Callable[[bytes], int] = crc32c,
) -> bytes:
    """A batch of ``records`` (offset deltas 0, 1, ...; every record at ``timestamp``, ms):
    no compression, create time, not transactional, no producer id (-1), leader epoch -1 (the
    broker sets it). ``crc`` computes the checksum: its value does not change the batch's size
    (a test of sizes alone may pass one that skips the work)."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    body = b"".join(
        encode_record(i, 0, key, value, headers) for i, (key, value, headers) in enumerate(records)
    )
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            0,  # attributes
            len(records) - 1,  # last offset delta
            timestamp,  # base timestamp
            timestamp,  # max timestamp
            -1,  # producer id
            -1,  # producer epoch
            -1,  # base sequence
            len(records),
        )
        + body
    )
    length = 4 + 1 + 4 + len(after_crc)  # from the leader epoch to the end
    head = struct.pack(">qiibI", base_offset, length, -1, MAGIC, crc(after_crc))
    return head + after_crc


# ------------------------------------------------------------------------------- Produce


class ProduceError(RuntimeError):
    """The broker refused the batch (``code``: Kafka's error code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"Produce refused, error code {code}: {message}")
        self.code = code


def produce_raw(
    bootstrap: str, topic: str, partition: int, records: Sequence[Record], *, timeout: float = 30.0
) -> int:
    """Write ``records`` as one batch to ``topic[partition]`` with a Produce v8 request of our
    own (acks=-1) to the partition's leader (PLAINTEXT); returns the batch's base offset.
    Raises :class:`ProduceError` on an error code (after retrying, until ``timeout``, the
    ones that mean nothing was appended and the leader may have moved)."""
    batch = encode_batch(records, timestamp=int(time.time() * 1000))
    deadline = time.monotonic() + timeout
    while True:
        leader = _leader(bootstrap, topic, partition, timeout)
        try:
            return _produce_to(leader, topic, partition, batch, timeout)
        except ProduceError as exc:
            if exc.code not in _RETRIABLE or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _leader(bootstrap: str, topic: str, partition: int, timeout: float) -> tuple[str, int]:
    """The host and port of the partition's leader (confluent-kafka's metadata request)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    deadline = time.monotonic() + timeout
    while True:
        md: Any = admin.list_topics(topic, timeout=timeout)
        info = md.topics.get(topic)
        if info is not None and info.error is None and partition in info.partitions:
            leader = info.partitions[partition].leader
            if leader in md.brokers:
                broker = md.brokers[leader]
                return str(broker.host), int(broker.port)
        if time.monotonic() > deadline:
            raise ProduceError(5, f"no leader for {topic}[{partition}] within {timeout} s")
        time.sleep(0.2)


def _produce_to(
    leader: tuple[str, int], topic: str, partition: int, batch: bytes, timeout: float
) -> int:
    with socket.create_connection(leader, timeout=timeout) as sock:
        sock.settimeout(timeout)
        _check_produce_version(sock)
        body = (
            struct.pack(">hhi", -1, -1, int(timeout * 1000))  # no transactional id, acks=-1
            + struct.pack(">i", 1)
            + _string(topic)
            + struct.pack(">i", 1)
            + struct.pack(">ii", partition, len(batch))
            + batch
        )
        answer = _Reader(_call(sock, PRODUCE, PRODUCE_VERSION, 2, body))
    # Produce v8's answer: [topic name, [partition index, error code, base offset, log
    # append time, log start offset, [record errors], error message]], throttle time
    if answer.int32() != 1 or answer.string() != topic or answer.int32() != 1:
        raise ProduceError(-1, f"an answer about another topic than {topic}[{partition}]")
    index, code, base_offset = answer.int32(), answer.int16(), answer.int64()
    answer.int64()  # log append time
    answer.int64()  # log start offset
    said = [f"record {answer.int32()}: {answer.string()}" for _ in range(answer.int32())]
    said.append(answer.string() or "")
    if index != partition:
        raise ProduceError(-1, f"an answer about partition {index}, not {partition}")
    if code != 0:
        raise ProduceError(code, "; ".join(s for s in said if s) or "(no message)")
    return base_offset


def _check_produce_version(sock: socket.socket) -> None:
    """ApiVersions v0: the broker's Produce versions must reach ``PRODUCE_VERSION`` (their
    minimum is no guide: Kafka 4.x lists 0 though it serves 3 on, KAFKA-18659)."""
    answer = _Reader(_call(sock, API_VERSIONS, 0, 1, b""))
    code = answer.int16()
    if code != 0:
        raise ProduceError(code, "ApiVersions refused")
    versions = {}
    for _ in range(answer.int32()):
        key, low, high = answer.int16(), answer.int16(), answer.int16()
        versions[key] = (low, high)
    low, high = versions.get(PRODUCE, (0, -1))
    if not max(low, 3) <= PRODUCE_VERSION <= high:
        raise ProduceError(35, f"the broker serves Produce v{low}-v{high}, not v{PRODUCE_VERSION}")


def _call(sock: socket.socket, api: int, version: int, correlation: int, body: bytes) -> bytes:
    """One request (header v1: api key, version, correlation id, client id) and its answer's
    body (after the response header v0: the correlation id)."""
    request = struct.pack(">hhi", api, version, correlation) + _string("botmesh-tests") + body
    sock.sendall(struct.pack(">i", len(request)) + request)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    answer = _recv_exact(sock, size)
    (got,) = struct.unpack(">i", answer[:4])
    if got != correlation:
        raise ProduceError(-1, f"answer to correlation id {got}, not {correlation}")
    return answer[4:]


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf.extend(chunk)
    return bytes(buf)


class _Reader:
    """Big-endian fields of an answer, read in order."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def _take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def int64(self) -> int:
        return self._take(">q")

    def string(self) -> str | None:
        """A nullable string (int16 length, -1: null)."""
        n = self._take(">h")
        if n < 0:
            return None
        text = self.data[self.at : self.at + n].decode()
        self.at += n
        return text
