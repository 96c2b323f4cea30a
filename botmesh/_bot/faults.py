"""The fault kit behind ``botmesh.testing``: a journal that crashes or fails on cue, and
a provider that dies with it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from botmesh.providers.mock import MockProvider
from botmesh.state.errors import JournalUnavailableError
from botmesh.state.kv import DurableKv, Entry, IndexName, Op
from botmesh.state.messages import Outbound, SendResult
from botmesh.state.ports import Provider
from botmesh.state.writes import Write

__all__ = ["WRITE_LABELS", "CrashableProvider", "FaultyKv", "SimulatedCrash", "crashable"]

WRITE_LABELS: tuple[str, ...] = tuple(w.value for w in Write)

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


class FaultyKv:
    """A ``DurableKv`` that dies at a chosen write (``crashed`` is set once it did), or
    fails writes without dying (``fail``, ``down``)."""

    def __init__(self, inner: DurableKv) -> None:
        self.inner = inner
        self.shared = bool(getattr(inner, "shared", False))
        self.commits = 0
        self.labels: list[str] = []
        self.crashed: SimulatedCrash | None = None
        #: While True every commit raises ``JournalUnavailableError`` (an outage).
        self.down = False
        self._fails: dict[str, int] = {}
        self._points: dict[tuple[When, str], int] = {}
        self._at: tuple[int, When] | None = None

    def fail(self, label: str, times: int = 1) -> None:
        """The next ``times`` writes labelled ``label`` raise ``JournalUnavailableError``."""
        self._fails[label] = times

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
        # the record it was about first: a blind write (a message log entry, which goes
        # ahead of its send's record) never is that record
        about = sorted(ops, key=lambda op: getattr(op, "expect", 0) is None)
        self.crashed = SimulatedCrash(when, label, self.commits, tuple(op.key for op in about))
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
        left = self._fails.get(label, 0)
        if self.down or left:
            if left:
                self._fails[label] = left - 1
            raise JournalUnavailableError(f"journal down (test fault) at {label}")
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


def crashable(kv: DurableKv) -> FaultyKv:
    """Wrap a journal so a test can kill the bot at a named write, or make it fail (see the
    module doc)."""
    return FaultyKv(kv)


class CrashableProvider:
    """A provider that dies with its crashable journal: once ``kv`` crashed, every send
    raises ``SimulatedCrash``. ``inner`` (a ``MockProvider`` by default) does the sends."""

    def __init__(self, kv: FaultyKv, inner: Provider | None = None) -> None:
        self.kv = kv
        self.inner: Provider = inner if inner is not None else MockProvider()
        self.name = self.inner.name
        self.text_limit = self.inner.text_limit

    async def send(self, message: Outbound) -> SendResult:
        if self.kv.crashed is not None:
            raise SimulatedCrash("dead", self.kv.crashed.label, self.kv.commits)
        return await self.inner.send(message)
