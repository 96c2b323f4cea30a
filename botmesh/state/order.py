"""Per-chat order of sends: one delivery of a chat at a time (``ChatOrder.chat_lock``), and,
with ``outbox.keep_chat_order``, the send that later sends to a chat wait behind
(``ChatOrder.tails``, rebuilt from the journal after a restart).
"""

from __future__ import annotations

import asyncio

from botmesh.state.config import OutboxConfig
from botmesh.state.keys import part_base, part_key
from botmesh.state.kv import DurableKv
from botmesh.state.messages import OutboxState
from botmesh.state.records import Json

__all__ = ["ChatOrder", "last_part"]


def last_part(value: Json) -> str:
    """The key of the last part of the send whose record is ``value``: the last part of
    its fallback's text once it switched to a fallback split in parts (``<key>~fallback#n``)."""
    spec = value.get("fallback")
    if isinstance(spec, dict) and spec.get("used") and int(spec.get("parts", 1)) > 1:
        return part_key(str(spec["key"]), int(spec["parts"]))
    return part_key(part_base(value["key"], value.get("part", 1)), value.get("parts", 1))


class ChatOrder:
    """Per-chat order: one delivery of a chat at a time (``chat_lock``), and, with
    ``outbox.keep_chat_order``, the send that later sends to a chat wait behind."""

    def __init__(self, kv: DurableKv, *, prefix: str, config: OutboxConfig) -> None:
        self._kv = kv
        self._prefix = prefix
        self._keep_order = config.keep_chat_order
        self._locks: dict[str, _ChatLock] = {}
        #: Chat id -> the key of the last part of the last send that later sends to the chat
        #: must wait behind (while a send of the chat waits for a retry).
        self.tails: dict[str, str] = {}

    def chat_lock(self, chat_id: str) -> _ChatLock:
        """Serializes the deliveries of one chat (inline retries, the sweeper)."""
        lock = self._locks.get(chat_id)
        if lock is None:
            lock = self._locks[chat_id] = _ChatLock(self._locks, chat_id)
        return lock

    def block(self, value: Json) -> None:
        """A send of this chat now waits for a retry: later sends to the chat queue behind
        its last part."""
        if not self._keep_order:
            return
        chat = value["payload"]["chat_id"]
        if chat not in self.tails:
            self.tails[chat] = last_part(value)

    def unblock(self, value: Json) -> None:
        """A send settled: if it was the tail of its chat, the chat is free again."""
        if self.tails:
            chat = value["payload"]["chat_id"]
            if self.tails.get(chat) == value["key"]:
                del self.tails[chat]

    async def rebuild_tails(self) -> None:
        """After a restart (and when this replica takes the provider session): the chats
        whose sends wait for a retry or behind one."""
        self.tails.clear()
        if not self._keep_order:
            return
        keys = await self._kv.range("due", self._prefix, float("inf"), limit=1_000_000)
        entries = await self._kv.get_many(keys)
        waiting = [
            entry.value
            for entry in entries.values()
            if entry.value.get("state") == OutboxState.FAILED
            or (
                entry.value.get("state") == OutboxState.PENDING
                and entry.value.get("after") is not None
            )
        ]
        # The tail is the end of the chain of ``after`` links (sends journaled in the same
        # clock tick share ``created``); the newest breaks a tie between chains.
        behind = {v["after"] for v in waiting if v.get("after") is not None}
        latest: dict[str, tuple[tuple[bool, float, int], Json]] = {}
        for v in waiting:
            last = last_part(v)
            rank = (last not in behind, v.get("created", 0.0), v.get("part", 1))
            chat = v["payload"]["chat_id"]
            if chat not in latest or rank > latest[chat][0]:
                latest[chat] = (rank, v)
        for _, v in latest.values():
            self.block(v)


class _ChatLock:
    """An ``asyncio.Lock`` that leaves its table when the last holder releases it, so the
    table only holds the chats being delivered to right now."""

    __slots__ = ("_chat", "_lock", "_table", "_users")

    def __init__(self, table: dict[str, _ChatLock], chat: str) -> None:
        self._table = table
        self._chat = chat
        self._lock = asyncio.Lock()
        self._users = 0

    async def __aenter__(self) -> None:
        self._users += 1
        try:
            await self._lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()
        self._leave()

    def _leave(self) -> None:
        self._users -= 1
        if self._users == 0 and self._table.get(self._chat) is self:
            del self._table[self._chat]
