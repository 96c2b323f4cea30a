"""The registry of journal backends every contract, conformance and crash test runs on.

A backend joins the suites with one entry in ``BACKENDS``. ``open(path)`` returns a fresh,
opened ``DurableKv`` whose data lives under ``path`` (a per-test temporary folder);
``persistent`` backends keep their data across ``reopen`` (a new instance on the same data,
as after a restart), the memory backend keeps its data by handing back the same instance
(the reference's "abandon the crashed bot, start a new one on the same backend").
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from botmesh.state.backends.file import open_file_kv
from botmesh.state.backends.shared_file import open_shared_file_kv
from botmesh.state.backends.sqlite import open_sqlite_kv
from botmesh.state.kv import DurableKv, MemoryKv
from tests import servers


@dataclass(frozen=True)
class BackendCase:
    name: str
    open: Callable[[Path], Awaitable[DurableKv]]
    #: True when the data survives a new instance opened on the same path.
    persistent: bool
    #: The server the backend needs (``"postgres"``, ``"redis"``): also the pytest marker
    #: every test that runs on it gets (see ``tests/conftest.py``); ``None``: no server.
    server: str | None = None
    #: How the journal's process dies (the crash harness): nothing more is written, and it
    #: returns the keys whose latest write did not survive. ``None``: every write a commit
    #: returned from survives (the journal writes through), and a crash is ``reopen``.
    abandon: Callable[[DurableKv], Awaitable[set[str]]] | None = None
    #: The context an inbound's turn runs in (the Kafka worker names its chat), by chat id.
    turn: Callable[[str], AbstractContextManager[None]] | None = None


class BackendHandle:
    """One test's backend: ``kv`` now, ``reopen()`` for a restart on the same data."""

    def __init__(self, case: BackendCase, path: Path) -> None:
        self.case = case
        self.path = path
        self.kv: DurableKv | None = None

    @property
    def name(self) -> str:
        return self.case.name

    async def open(self) -> DurableKv:
        self.kv = await self.case.open(self.path)
        return self.kv

    async def reopen(self) -> DurableKv:
        """Drop the current instance (closing it releases locks) and open the same data."""
        if not self.case.persistent and self.kv is not None:
            return self.kv
        if self.kv is not None:
            await self.kv.close()
        return await self.open()

    async def crash(self) -> tuple[DurableKv, set[str]]:
        """The process died: the same data opened again (``reopen``), and the keys whose
        latest write the crash lost (``BackendCase.abandon``; none for a journal that writes
        through)."""
        if self.case.abandon is None or self.kv is None:
            return await self.reopen(), set()
        lost = await self.case.abandon(self.kv)
        self.kv = None
        return await self.open(), lost

    def turn(self, chat: str) -> AbstractContextManager[None]:
        """The context an inbound of ``chat`` is handled in (``BackendCase.turn``)."""
        return contextlib.nullcontext() if self.case.turn is None else self.case.turn(chat)

    async def close(self) -> None:
        if self.kv is not None:
            await self.kv.close()


async def _memory(path: Path) -> DurableKv:
    kv = MemoryKv()
    await kv.open()
    return kv


def namespace(path: Path) -> str:
    """A name of its own for the data of ``path`` on a shared server (a table prefix, a key
    prefix): the same in every process that opens ``path``."""
    return "t" + hashlib.sha1(str(path).encode()).hexdigest()[:16] + "_"


async def _postgres(path: Path) -> DurableKv:
    from botmesh.state.backends.postgres import open_postgres_kv

    return await open_postgres_kv(
        servers.postgres_url(), table_prefix=namespace(path), max_connections=4
    )


async def _redis(path: Path) -> DurableKv:
    from botmesh.state.backends.redis import open_redis_kv

    return await open_redis_kv(servers.redis_url(), prefix=namespace(path).rstrip("_"))


BACKENDS: dict[str, BackendCase] = {
    "memory": BackendCase("memory", _memory, persistent=False),
    # -- more backends join here, one entry each --------------------------------------
    "file": BackendCase("file", open_file_kv, persistent=True),
    "file-log": BackendCase(
        "file-log", lambda p: open_file_kv(p, append_log=True), persistent=True
    ),
    "sqlite": BackendCase("sqlite", open_sqlite_kv, persistent=True),
    "shared-file": BackendCase("shared-file", open_shared_file_kv, persistent=True),
    "shared-file-log": BackendCase(
        "shared-file-log", lambda p: open_shared_file_kv(p, append_log=True), persistent=True
    ),
    "postgres": BackendCase("postgres", _postgres, persistent=True, server="postgres"),
    "redis": BackendCase("redis", _redis, persistent=True, server="redis"),
}
