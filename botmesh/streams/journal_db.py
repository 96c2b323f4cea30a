"""One journal partition's RocksDB database: its records and its two sorted indexes.

The worker keeps one RocksDB database per changelog partition. The journal
(``botmesh.streams.table_kv.TableKv``) reads its records there instead of holding them in
memory, so what a worker holds grows with what it has in flight, not with what it retains.

Layout of a database (raw bytes keys):

- a record: key = the journal key (UTF-8), value = the changelog value (``encode_entry``),
  exactly what the changelog holds, so a restore writes what the journal wrote;
- an index entry: ``INDEX_PREFIX`` + ``b"d"`` (``due``) or ``b"p"`` (``purge``) + the score as
  8 bytes that sort as the float does + the journal key, empty value. So the records due by
  a time are the first keys of the index, in (score, key) order: a sweeper pass reads what
  is due, not what is retained;
- the offset key (``__faust\\0offset__``, the name data dirs of earlier releases have):
  the changelog offset persisted so far;
- ``FORMAT_KEY``: the layout's version, once every record has its index entries.

Journal keys start with their scope (percent-encoded), never with a NUL byte, so an index
entry never falls in the key range of a record prefix.

Every write (the journal's acked records, the restore's batches) goes through ``write``: a
record's old index entries are removed and its new ones added in the same atomic batch as
the record and the offset, so the indexes always agree with the records on disk.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Container, Iterable, Iterator, Sequence
from typing import Any

import msgspec
import rocksdict

from botmesh.state.kv import Entry, IndexName

__all__ = [
    "FORMAT_KEY",
    "INDEX_PREFIX",
    "JournalDb",
    "decode_entry",
    "encode_entry",
    "index_key",
    "sortable",
]

log = logging.getLogger("botmesh.journal")

#: The database's own keys start with NUL (a journal key never does).
INTERNAL = b"\x00"
#: Every index entry's key starts here.
INDEX_PREFIX = INTERNAL + b"i"
#: Present once every record of the database has its index entries. A database a worker
#: of an earlier version wrote (records only) is indexed once when it is opened.
FORMAT_KEY = INTERNAL + b"format"
FORMAT = b"1"
_TAG: dict[str, bytes] = {"due": b"d", "purge": b"p"}
_SIGN = 1 << 63
_ALL = (1 << 64) - 1
_pack_d = struct.Struct(">d")
_pack_q = struct.Struct(">Q")


def sortable(score: float) -> bytes:
    """8 bytes that sort (as bytes) as ``score`` does (as a float)."""
    (n,) = _pack_q.unpack(_pack_d.pack(score))
    return _pack_q.pack(n ^ _ALL if n & _SIGN else n | _SIGN)


def _unsortable(raw: bytes) -> float:
    (n,) = _pack_q.unpack(raw)
    (x,) = _pack_d.unpack(_pack_q.pack(n & ~_SIGN if n & _SIGN else n ^ _ALL))
    return float(x)


def index_key(index: IndexName, score: float, key: bytes) -> bytes:
    return INDEX_PREFIX + _TAG[index] + sortable(score) + key


class _Scores(msgspec.Struct, frozen=True):
    """The index scores of a changelog value (its record is skipped, not built)."""

    d: float | None = None
    p: float | None = None


class _Stored(msgspec.Struct, frozen=True):
    v: int
    r: dict[str, Any]
    d: float | None = None
    p: float | None = None


_scores = msgspec.json.Decoder(_Scores).decode
_stored = msgspec.json.Decoder(_Stored).decode
_encode = msgspec.json.Encoder().encode
_NO_SCORES = _Scores()


def encode_entry(entry: Entry) -> bytes:
    """The changelog value of one committed version: ``{"v": version, "r": value, "d": due,
    "p": purge}`` as JSON."""
    return _encode(_Stored(entry.version, entry.value, entry.due, entry.purge))


def decode_entry(key: bytes, value: bytes | None) -> Entry | None:
    """One changelog record as an ``Entry`` (``None`` for a tombstone)."""
    return None if value is None else decode(key.decode(), value)


def decode(key: str, value: bytes) -> Entry:
    s = _stored(value)
    return Entry(key, s.r, s.v, s.d, s.p)


def _index_entries(key: bytes, value: bytes | None) -> list[bytes]:
    s = _NO_SCORES if value is None else _scores(value)
    found = []
    if s.d is not None:
        found.append(index_key("due", s.d, key))
    if s.p is not None:
        found.append(index_key("purge", s.p, key))
    return found


class JournalDb:
    """A journal partition's records and indexes in its RocksDB database (see the module
    docstring). Reads see what was written, never what is only in flight."""

    __slots__ = ("db", "offset_key")

    def __init__(self, db: Any, offset_key: bytes) -> None:
        self.db = db
        self.offset_key = offset_key

    @classmethod
    def open(cls, db: Any, offset_key: bytes) -> JournalDb:
        """The journal view of a partition's database, its records indexed first when a
        worker of an earlier version wrote them (once: then ``FORMAT_KEY`` says so)."""
        jdb = cls(db, offset_key)
        if db.get(FORMAT_KEY) != FORMAT:
            jdb._index_all()
        return jdb

    def _index_all(self) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        count = 0
        for key, value in self.db.items():
            if key.startswith(INTERNAL) or key == self.offset_key:
                continue
            for ik in _index_entries(key, value):
                batch.put(ik, b"")
            count += 1
            if count % 10_000 == 0:
                self.db.write(batch)
                batch = rocksdict.WriteBatch(raw_mode=True)
        batch.put(FORMAT_KEY, FORMAT)
        self.db.write(batch)
        if count:
            log.warning("journal database %s: %d records indexed", self.db.path(), count)

    def get(self, key: str) -> Entry | None:
        raw = self.db.get(key.encode())
        return None if raw is None else decode(key, raw)

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], offset: int | None = None
    ) -> None:
        """Write ``records`` (key, changelog value or ``None`` for a delete), in order, with
        their index entries and (when given) the changelog offset, in one atomic batch."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        # the versions replaced: the database's, read at once (one multi-get), then the
        # batch's own earlier writes
        keys = list(dict.fromkeys(key for key, _ in records))
        last: dict[bytes, bytes | None] = dict(zip(keys, self.db.get(keys), strict=True))
        for key, value in records:
            old = last[key]
            gone = _index_entries(key, old) if old is not None else []
            new = _index_entries(key, value)
            for ik in gone:
                if ik not in new:
                    batch.delete(ik)
            for ik in new:
                if ik not in gone:
                    batch.put(ik, b"")
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
            last[key] = value
        if offset is not None:
            batch.put(self.offset_key, str(offset).encode())
        self.db.write(batch)

    def range(
        self, index: IndexName, prefix: str, until: float, limit: int, skip: Container[str]
    ) -> list[tuple[float, str]]:
        """Up to ``limit`` (score, key) of the index, scores ``<= until``, keys under
        ``prefix`` and not in ``skip``, ascending."""
        found: list[tuple[float, str]] = []
        if limit <= 0:
            return found
        start = INDEX_PREFIX + _TAG[index]
        want = prefix.encode()
        for ik in self.db.keys(from_key=start):
            if not ik.startswith(start):
                break
            score = _unsortable(ik[3:11])
            if score > until:
                break
            raw = ik[11:]
            if not raw.startswith(want):
                continue
            key = raw.decode()
            if key in skip:
                continue
            found.append((score, key))
            if len(found) >= limit:
                break
        return found

    def scan(self, prefix: str, skip: Container[str]) -> Iterator[Entry]:
        """The records under ``prefix`` (not in ``skip``), in key order."""
        want = prefix.encode()
        items: Iterable[tuple[bytes, bytes]] = self.db.items(from_key=want)
        for raw, value in items:
            if not raw.startswith(want):
                break
            if raw.startswith(INTERNAL) or raw == self.offset_key:
                continue  # only with an empty prefix
            key = raw.decode()
            if key not in skip:
                yield decode(key, value)
