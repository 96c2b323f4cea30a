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
- a group's members: ``GROUP_PREFIX`` + the group's key, value = the keys of the members
  its last record held (JSON list), so that the next record of the group, which replaces
  it whole, deletes those it no longer holds (see "Group records" below);
- the offset key (``__faust\\0offset__``, the name data dirs of earlier releases have):
  the changelog offset persisted so far;
- ``FORMAT_KEY``: the layout's version, once every record has its index entries.

Journal keys start with their scope (percent-encoded), never with a NUL byte, so an index
entry never falls in the key range of a record prefix.

Every write (the journal's acked records, the restore's batches) goes through ``write``: a
record's old index entries are removed and its new ones added in the same atomic batch as
the record and the offset, so the indexes always agree with the records on disk.

**Group records.** The changelog holds an inbound and what its turn wrote (its first sends,
their message log entries: ``botmesh.state.keys.record_group``) in one record, keyed by the
inbound's key: value ``{"g": [[key, <that key's value>], ...]}`` (``encode_group``), a
tombstone when none of them is left. A group's record holds every member it has, so each
record replaces the group whole: a member the last one held and this one does not is
deleted. That keeps the log compaction-safe: compaction keeps a key's last record, and a
group's last record says everything of its members. A member too large to share the
record is listed with ``null``: it is stored alone, in a record of its own key, which the
group's record leaves as it is (and a later group record that leaves the member out still
deletes it). A member deleted also gets a tombstone of its own key, for a record of it
stored alone (or left by a worker before groups). In the database the members are stored
one by one, as records of their own (reads and indexes do not know groups), with the
group's member list.
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
    "GROUP_PREFIX",
    "INDEX_PREFIX",
    "JournalDb",
    "JournalView",
    "decode",
    "decode_entry",
    "encode_entry",
    "encode_group",
    "group_members",
    "index_key",
    "is_group",
    "sortable",
]

log = logging.getLogger("botmesh.journal")

#: The database's own keys start with NUL (a journal key never does).
INTERNAL = b"\x00"
#: Every index entry's key starts here.
INDEX_PREFIX = INTERNAL + b"i"
#: A group's member list (``GROUP_PREFIX`` + the group's key).
GROUP_PREFIX = INTERNAL + b"g"
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


class _Group(msgspec.Struct, frozen=True):
    """A group record: each member's key and value (``encode_entry``'s bytes, as they are;
    ``None``: the member is stored alone, in a record of its own key)."""

    g: list[tuple[str, msgspec.Raw]]


_scores = msgspec.json.Decoder(_Scores).decode
_stored = msgspec.json.Decoder(_Stored).decode
_group = msgspec.json.Decoder(_Group).decode
_members = msgspec.json.Decoder(list[str]).decode
_encode = msgspec.json.Encoder().encode
_NO_SCORES = _Scores()
_NULL = msgspec.Raw(b"null")
#: How a group record's value starts (a single record's starts ``{"v":``).
_GROUP_START = b'{"g":'


def is_group(value: bytes | None) -> bool:
    """Whether a changelog value is a group record (``encode_group``)."""
    return value is not None and value.startswith(_GROUP_START)


def encode_group(members: Iterable[tuple[str, bytes | None]]) -> bytes:
    """The changelog value of a group record: each member's key and value
    (``encode_entry``'s; ``None`` for a member stored alone: too large to share a record),
    every member the group has (see the module docstring)."""
    return _encode(
        _Group([(key, _NULL if value is None else msgspec.Raw(value)) for key, value in members])
    )


def group_members(value: bytes) -> list[tuple[bytes, bytes | None]]:
    """The members of a group record: (key, value) each, as a single record would be
    (``None``: stored alone, its own record holds it)."""
    return [
        (key.encode(), None if (b := bytes(raw)) == b"null" else b) for key, raw in _group(value).g
    ]


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

    def members(self, group: str) -> list[str]:
        """The keys the last record of ``group`` held (``record_group``), [] for none."""
        raw = self.db.get(GROUP_PREFIX + group.encode())
        return [] if raw is None else _members(raw)

    def write(
        self, records: Sequence[tuple[bytes, bytes | None]], offset: int | None = None
    ) -> None:
        """Write ``records`` (key, changelog value or ``None`` for a delete), in order, with
        their index entries and (when given) the changelog offset, in one atomic batch. A
        group record replaces its group: its members are written, and those the group's
        last record held and this one does not are deleted (a tombstone of a group's key
        deletes them all)."""
        if any(is_group(value) for _, value in records) or self._has_groups(records):
            records = self._ungrouped(records)
        self._write(records, offset)

    def _has_groups(self, records: Sequence[tuple[bytes, bytes | None]]) -> bool:
        """A tombstone among ``records`` is of a group's key (its member list is there)."""
        gone = [GROUP_PREFIX + key for key, value in records if value is None]
        return bool(gone) and any(raw is not None for raw in self.db.get(gone))

    def _ungrouped(
        self, records: Sequence[tuple[bytes, bytes | None]]
    ) -> list[tuple[bytes, bytes | None]]:
        """``records`` with each group record (or a group's tombstone) as the writes of its
        members, and of its member list, in order."""
        lists = list(dict.fromkeys(GROUP_PREFIX + key for key, _ in records))
        held: dict[bytes, bytes | None] = dict(zip(lists, self.db.get(lists), strict=True))
        out: list[tuple[bytes, bytes | None]] = []
        for key, value in records:
            where = GROUP_PREFIX + key
            before = held[where]
            if not is_group(value) and (value is not None or before is None):
                out.append((key, value))  # a record of one key
                continue
            members = group_members(value) if value is not None else []
            now = {m for m, _ in members}
            gone = [] if before is None else [m.encode() for m in _members(before)]
            out.extend((m, None) for m in gone if m not in now)
            if key not in now:
                out.append((key, None))  # the group's key held a record of its own
            out.extend((m, v) for m, v in members if v is not None)  # the rest: their own
            listed = _encode([m.decode() for m, _ in members]) if members else None
            held[where] = listed
            out.append((where, listed))
        return out

    def _write(
        self, records: Sequence[tuple[bytes, bytes | None]], offset: int | None = None
    ) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        # the versions replaced: the database's, read at once (one multi-get), then the
        # batch's own earlier writes
        keys = list(dict.fromkeys(key for key, _ in records))
        last: dict[bytes, bytes | None] = dict(zip(keys, self.db.get(keys), strict=True))
        for key, value in records:
            if key.startswith(INTERNAL):  # a group's member list: no index entries
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
                continue
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


class JournalView:
    """The journal as its changelog records say, applied in log order, for a reader of the
    changelog (the console, the operator's commands, the tests): a record of one key sets
    or deletes it; a group record replaces its group whole (see the module docstring).
    ``entries`` holds the latest entry of each key when ``keep`` (else only the groups'
    member lists are kept, and the caller keeps what ``apply`` returns)."""

    __slots__ = ("_groups", "entries", "keep")

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.entries: dict[str, Entry] = {}
        self._groups: dict[str, list[str]] = {}

    def apply(self, key: bytes, value: bytes | None) -> list[tuple[str, bytes | None]]:
        """Apply one changelog record; returns what it changed, in order: each key with its
        value as a record of its own would hold it (``decode``), ``None`` when deleted."""
        k = key.decode()
        changes: list[tuple[str, bytes | None]]
        if value is not None and value.startswith(_GROUP_START):
            members = [(m.decode(), v) for m, v in group_members(value)]
            now = {m for m, _ in members}
            changes = [(m, None) for m in self._groups.get(k, ()) if m not in now]
            if k not in now:
                changes.append((k, None))
            changes.extend((m, v) for m, v in members if v is not None)
            if members:
                self._groups[k] = [m for m, _ in members]
            else:
                self._groups.pop(k, None)
        elif value is None:
            changes = [(m, None) for m in self._groups.pop(k, ()) if m != k]
            changes.append((k, None))
        else:
            changes = [(k, value)]
        if self.keep:
            for m, raw in changes:
                if raw is None:
                    self.entries.pop(m, None)
                else:
                    self.entries[m] = decode(m, raw)
        return changes
