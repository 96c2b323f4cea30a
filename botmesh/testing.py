"""Test your bot's crash recovery: ``crashable``, ``CrashableProvider``, ``MockProvider``.

``crashable(backend)`` wraps a journal (a ``DurableKv`` or a ``KvDurability``) and "kills
the process" at one precise journal write: ``crash_before(label)`` stops before the write
lands, ``crash_after(label)`` right after it landed. The crash raises ``SimulatedCrash``,
a ``BaseException`` that the engine never catches, and from then on the wrapper refuses
every call, as a dead process would. Abandon the crashed bot and start a new one on the
*unwrapped* backend with the same ``instance_id``::

    shared = MemoryDurability()
    a = crashable(shared)
    a.crash_before("outbox.mark_sent")   # the provider was called, the result never recorded
    bot_a = Bot(CrashableProvider(a), durability={"backend": a, "instance_id": "i1"})
    await bot_a.start()
    with pytest.raises(SimulatedCrash):
        await bot_a.handle(Inbound("m1", "chat", "hi"))
    bot_b = Bot(MockProvider(), durability={"backend": shared, "instance_id": "i1"})
    await bot_b.start()                  # recovers: the send is ambiguous -> unknown

Journal write labels (each is one ``DurableKv.commit``):

============================  ===========================================================
``inbox.journal``             a new inbound, journaled and claimed (before any handler)
``inbox.claim``               a replay (restart, expired lease, operator) takes the record
``inbox.heartbeat``           the lease is extended while handlers run
``inbox.mark_done``           the handlers settled
``inbox.mark_retry``          a failure before the handlers, retried after a backoff
``inbox.mark_dead``           max attempts charged: dead-lettered
``inbox.replay``              an operator's ``replay_inbound``
``outbox.journal``            an inline send, journaled in flight (about to call the provider)
``outbox.enqueue``            ``bot.enqueue``: journaled for the sweeper
``outbox.claim``              a retry, a later part, or a sweeper delivery takes the record
``outbox.heartbeat``          the lease is extended while the provider call runs
``outbox.mark_sent``          the provider's message id recorded
``outbox.mark_failed``        a retryable failure recorded (retried after a backoff)
``outbox.mark_dead``          a final failure, retries spent, or a dead earlier part
``outbox.mark_unknown``       an ambiguous send under ``on_ambiguous="skip"``
``outbox.release``            later parts of a deferred send released to the sweeper
``outbox.wait``               a part waits behind an earlier part (not an attempt)
``outbox.retry``              an operator's ``retry_send``
``outbox.discard``            an operator's ``outbox.discard``
``retention.purge``           done and sent records past retention deleted
============================  ===========================================================

The ambiguous window is between ``outbox.journal`` / ``outbox.claim`` landing and
``outbox.mark_sent`` / ``outbox.mark_failed`` / ``outbox.mark_dead`` landing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from providers.mock import MockProvider, SentCall
from state.clock import ManualClock
from state.durability import KvDurability
from state.kv import DurableKv, Entry, IndexName, Op
from state.messages import Outbound, SendResult
from state.ports import Provider

__all__ = [
    "WRITE_LABELS",
    "CrashableKv",
    "CrashableProvider",
    "ManualClock",
    "MockProvider",
    "SentCall",
    "SimulatedCrash",
    "crashable",
]

WRITE_LABELS: tuple[str, ...] = (
    "inbox.journal",
    "inbox.claim",
    "inbox.heartbeat",
    "inbox.mark_done",
    "inbox.mark_retry",
    "inbox.mark_dead",
    "inbox.replay",
    "outbox.journal",
    "outbox.enqueue",
    "outbox.claim",
    "outbox.heartbeat",
    "outbox.mark_sent",
    "outbox.mark_failed",
    "outbox.mark_dead",
    "outbox.mark_unknown",
    "outbox.release",
    "outbox.wait",
    "outbox.retry",
    "outbox.discard",
    "retention.purge",
)

When = Literal["before", "after"]


class SimulatedCrash(BaseException):
    """The simulated death of the process; a ``BaseException`` so nothing swallows it."""

    def __init__(self, when: str, label: str, commit: int, keys: tuple[str, ...] = ()) -> None:
        super().__init__(when, label, commit, keys)
        self.when = when
        self.label = label
        self.commit = commit
        #: The journal keys the crashing write touched (first: the record it was about).
        self.keys = keys

    def __str__(self) -> str:
        return f"simulated crash {self.when} {self.label!r} (commit #{self.commit})"


class CrashableKv:
    """A ``DurableKv`` that dies at a chosen write. ``crashed`` is set once it did."""

    def __init__(self, inner: DurableKv) -> None:
        self.inner = inner
        self.shared = bool(getattr(inner, "shared", False))
        self.commits = 0
        self.labels: list[str] = []
        self.crashed: SimulatedCrash | None = None
        self._points: dict[tuple[When, str], int] = {}
        self._at: tuple[int, When] | None = None

    def crash_before(self, label: str, occurrence: int = 1) -> None:
        """Die before the ``occurrence``-th write labelled ``label`` lands."""
        self._points[("before", label)] = occurrence

    def crash_after(self, label: str, occurrence: int = 1) -> None:
        """Die right after the ``occurrence``-th write labelled ``label`` landed."""
        self._points[("after", label)] = occurrence

    def crash_at(self, commit: int, when: When) -> None:
        """Die before or after the ``commit``-th write, whatever its label (1-based)."""
        self._at = (commit, when)

    def _die(self, when: When, label: str, ops: Sequence[Op]) -> None:
        self.crashed = SimulatedCrash(when, label, self.commits, tuple(op.key for op in ops))
        raise self.crashed

    def _alive(self) -> None:
        if self.crashed is not None:
            raise SimulatedCrash("dead", self.crashed.label, self.commits)

    def _hit(self, when: When, label: str) -> bool:
        if self._at is not None and self._at == (self.commits, when):
            return True
        n = self._points.get((when, label))
        return n is not None and self.labels.count(label) == n

    async def open(self) -> None:
        self._alive()
        await self.inner.open()

    async def close(self) -> None:
        self._alive()
        await self.inner.close()

    async def get(self, key: str) -> Entry | None:
        self._alive()
        return await self.inner.get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        self._alive()
        return await self.inner.get_many(keys)

    async def commit(self, ops: Sequence[Op], *, label: str = "") -> list[int]:
        self._alive()
        self.commits += 1
        self.labels.append(label)
        if self._hit("before", label):
            self._die("before", label, ops)
        versions = await self.inner.commit(ops, label=label)
        if self._hit("after", label):
            self._die("after", label, ops)
        return versions

    async def range(
        self, index: IndexName, prefix: str, until: float, limit: int = 100
    ) -> list[str]:
        self._alive()
        return await self.inner.range(index, prefix, until, limit)

    async def scan(self, prefix: str) -> list[Entry]:
        self._alive()
        return await self.inner.scan(prefix)


def crashable(backend: DurableKv | KvDurability) -> CrashableKv:
    """Wrap a journal so a test can kill the bot at a named write (see the module doc)."""
    inner = backend.kv if isinstance(backend, KvDurability) else backend
    return CrashableKv(inner)


class CrashableProvider:
    """A provider that dies with its crashable journal: once ``kv`` crashed, every send
    raises ``SimulatedCrash``. ``inner`` (a ``MockProvider`` by default) does the sends."""

    def __init__(self, kv: CrashableKv, inner: Provider | None = None) -> None:
        self.kv = kv
        self.inner: Provider = inner if inner is not None else MockProvider()
        self.name = self.inner.name
        self.text_limit = self.inner.text_limit

    async def send(self, message: Outbound) -> SendResult:
        if self.kv.crashed is not None:
            raise SimulatedCrash("dead", self.kv.crashed.label, self.kv.commits)
        return await self.inner.send(message)
