"""The journal SPI: ``DurableKv``, a versioned key-value store with two sorted indexes.

Every backend (memory, file, sqlite, postgres, redis, rocksdb, the Kafka worker's
changelogged table) implements this one small protocol; ``botmesh.state.engine.Engine``
builds the inbox, the outbox and the leases on top of it. Keys are strings; values are JSON
objects (``dict`` of JSON values), copied on the way in and out so that callers never share
mutable state with the store.

Versions: a key that does not exist has version 0. Every committed put of a key sets its
version to the previous version + 1 (a delete then a put starts again at 1).

The two sorted indexes, ``due`` and ``purge``, map a key to a float score (seconds since
the epoch in practice). ``due`` says when the sweeper must look at a record next (a retry
that becomes due, a lease that expires); ``purge`` says when a finished record may be
deleted (retention). A key is in an index only while its last put gave that index a score.

Atomicity, per method:

- ``get`` / ``get_many``: each returned entry is one committed version (``get_many`` is
  not a snapshot across keys unless a backend documents it).
- ``commit``: all of its operations apply, or none does. A ``Put`` marked ``handover`` may
  be kept without a copy (see ``Put``). Each operation's ``expect`` is
  checked against the committed version, and the whole commit fails with
  ``VersionConflictError`` (naming the first conflicting key) when any check fails. When
  ``commit`` returns, the write is durable to the degree the backend promises (the file
  backend: fsynced when asked; the memory backend: in memory only). The ``label`` names
  the journal write (``inbox.journal``, ``outbox.mark_sent``…) for crash tests and logs.
- ``range``: keys whose score in the index is ``<= until``, ascending by score then key,
  limited to ``prefix``; each key was in the index at some committed version (a caller
  re-reads the entry and re-checks before acting).
- ``scan``: every committed entry under ``prefix`` at the moment of the call, key order.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from botmesh.state.errors import JournalUnavailableError, VersionConflictError
from botmesh.state.messages import OutboxState
from botmesh.state.records import InboxState

__all__ = [
    "INDEXES",
    "Delete",
    "DurableKv",
    "Entry",
    "IndexName",
    "MemoryKv",
    "Op",
    "Partitioned",
    "Put",
    "apply_ops",
    "handover",
]

IndexName = Literal["due", "purge"]
INDEXES: tuple[IndexName, IndexName] = ("due", "purge")

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Entry:
    """One committed version of a key."""

    key: str
    value: JsonObject
    version: int
    due: float | None = None
    purge: float | None = None


@dataclass(frozen=True, slots=True)
class Put:
    """Write ``value`` under ``key`` if its version is ``expect`` (0: the key must not exist;
    ``None``: no check). ``due`` / ``purge`` set or clear the key's index scores.

    ``handover=True`` hands the value to the store: the caller built it for this write and
    never changes it, nor anything inside it, afterwards. An in-process store may then keep
    it as it is instead of copying it (the engine hands over every value it writes). Values
    read back are copies either way."""

    key: str
    value: JsonObject
    expect: int | None
    due: float | None = None
    purge: float | None = None
    handover: bool = False


def handover(
    key: str,
    value: JsonObject,
    expect: int | None,
    due: float | None = None,
    purge: float | None = None,
) -> Put:
    """A ``Put`` that hands ``value`` over to the store (see ``Put.handover``)."""
    return Put(key, value, expect, due, purge, True)


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove ``key`` if its version is ``expect`` (``None``: no check)."""

    key: str
    expect: int | None


Op = Put | Delete


@runtime_checkable
class DurableKv(Protocol):
    """The journal SPI. See the module docstring for each method's atomicity."""

    async def open(self) -> None:
        """Acquire resources (files, locks, connections). Idempotent."""

    async def close(self) -> None:
        """Release them; later calls fail. Idempotent."""

    async def get(self, key: str) -> Entry | None: ...

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]: ...

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        """Apply ``ops`` atomically; return the new version of each op's key (0 for a delete)."""
        ...

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]: ...

    async def scan(self, prefix: str) -> list[Entry]: ...


@runtime_checkable
class Partitioned(Protocol):
    """A journal split in partitions that go with the chats (the Kafka worker's table
    journal): a record's follow-up writes (a replayed inbound's sends) belong in the record's
    partition. ``near(key)`` is a context manager the engine wraps around the work on one
    record it found by a scan (the sweeper's visits, an operator's replay or retry);
    ``across_partitions()`` is the one it wraps around work on the records of several
    partitions at once (receipts recorded published): each key is read and written in the
    partition that holds it, whatever partition the caller is working in.

    A partition has one writer, the instance that owns it: the records it can see are its
    own to finish, and a lease held there by another instance (or an earlier boot) is an
    orphan, reclaimed at once (its holder lost the partition and cannot write it any more;
    a send it had in flight is resolved by the ambiguity policy)."""

    def near(self, key: str) -> contextlib.AbstractContextManager[None]: ...

    def across_partitions(self) -> contextlib.AbstractContextManager[None]: ...


def anywhere(key: str) -> contextlib.AbstractContextManager[None]:
    """``near`` of an unpartitioned journal: nothing to choose."""
    return contextlib.nullcontext()


def unpartitioned() -> contextlib.AbstractContextManager[None]:
    """``across_partitions`` of an unpartitioned journal: nothing to choose."""
    return contextlib.nullcontext()


@dataclass(slots=True)
class _Table:
    """The plain data every in-process backend keeps: entries by key."""

    entries: dict[str, Entry] = field(default_factory=dict)


#: Leaf types shared, not copied (immutable): the JSON scalars and the record states.
_LEAVES = frozenset({str, int, float, bool, type(None), OutboxState, InboxState})


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value: dicts and lists rebuilt, scalars shared (they are
    immutable). Several times faster than ``copy.deepcopy``; anything else falls back to it.
    Leaves are checked inline, so a record costs one call per nested container."""
    t = type(value)
    if t is dict:
        leaves = _LEAVES
        return {k: v if type(v) in leaves else copy_json(v) for k, v in value.items()}
    if t is list:
        leaves = _LEAVES
        return [v if type(v) in leaves else copy_json(v) for v in value]
    if t in _LEAVES or isinstance(value, str | int | float):  # a StrEnum state: immutable
        return value
    return copy.deepcopy(value)


def apply_ops(entries: dict[str, Entry], ops: Sequence[Op]) -> list[int]:
    """Check every op against ``entries`` and, when all pass, apply them in place.

    Shared by the in-process backends (memory, file) so that they agree exactly on
    version and conflict semantics. Nothing is applied when a check fails.
    """
    if len(ops) == 1:  # the common case: one record
        op = ops[0]
        cur = entries.get(op.key)
        have = cur.version if cur is not None else 0
        if op.expect is not None and op.expect != have:
            raise VersionConflictError(op.key, op.expect, have)
        if isinstance(op, Put):
            value = op.value if op.handover else copy_json(op.value)
            entries[op.key] = Entry(op.key, value, have + 1, op.due, op.purge)
            return [have + 1]
        entries.pop(op.key, None)
        return [0]
    staged: dict[str, Entry | None] = {}

    def current(key: str) -> Entry | None:
        return staged[key] if key in staged else entries.get(key)

    versions: list[int] = []
    for op in ops:
        cur = current(op.key)
        have = cur.version if cur is not None else 0
        if op.expect is not None and op.expect != have:
            raise VersionConflictError(op.key, op.expect, have)
        if isinstance(op, Put):
            value = op.value if op.handover else copy_json(op.value)
            new = Entry(op.key, value, have + 1, op.due, op.purge)
            staged[op.key] = new
            versions.append(new.version)
        else:
            staged[op.key] = None
            versions.append(0)
    for key, maybe in staged.items():
        if maybe is None:
            entries.pop(key, None)
        else:
            entries[key] = maybe
    return versions


def copy_entry(entry: Entry) -> Entry:
    return Entry(entry.key, copy_json(entry.value), entry.version, entry.due, entry.purge)


def wants_range(index: str, limit: int) -> bool:
    """Check a ``range`` call's index (``ValueError`` for an unknown one); False when
    ``limit`` asks for nothing, so a backend need not ask its store."""
    if index not in INDEXES:
        raise ValueError(f"unknown index {index!r}")
    return limit > 0


def range_of(
    entries: Mapping[str, Entry], index: IndexName, prefix: str, until: float, limit: int
) -> list[str]:
    scored = (
        (score, key)
        for key, e in entries.items()
        if key.startswith(prefix) and (score := getattr(e, index)) is not None and score <= until
    )
    return [key for _, key in itertools.islice(sorted(scored), max(limit, 0))]


class MemoryKv:
    """An in-memory ``DurableKv``: survives nothing, but has the exact SPI semantics."""

    def __init__(self) -> None:
        self._table = _Table()
        self._closed = False

    async def open(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True

    def _check(self) -> None:
        if self._closed:
            raise JournalUnavailableError("memory journal is closed; open() it again")

    async def get(self, key: str) -> Entry | None:
        self._check()
        e = self._table.entries.get(key)
        return copy_entry(e) if e is not None else None

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        self._check()
        return {k: copy_entry(e) for k in keys if (e := self._table.entries.get(k)) is not None}

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        self._check()
        return apply_ops(self._table.entries, ops)

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]:
        self._check()
        return range_of(self._table.entries, index, prefix, until, limit)

    async def scan(self, prefix: str) -> list[Entry]:
        self._check()
        return [
            copy_entry(self._table.entries[k])
            for k in sorted(self._table.entries)
            if k.startswith(prefix)
        ]
