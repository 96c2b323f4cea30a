"""The message log: what was sent, to which chat, when, with the channel's message id.

One ``LoggedMessage`` per part the provider accepted (a split text: one per part), read per
chat with ``MessageLog.history`` (newest first, paged with ``before``).

**Exactly once, by construction.** The journal-native log (``JournalMessageLog``) keeps
its entries in the journal itself, beside the outbox: an entry is one more operation of
the very commit that records the send ``sent`` (``outbox.mark_sent``: inline delivery,
the sweeper's delivery, an ambiguous send the channel says went out). A commit lands
whole or not at all, so

- a crash between the provider call and that commit leaves neither the ``sent`` mark nor
  the entry: the send is in flight, and the ambiguity policy settles it (``unknown`` under
  ``skip``: nothing logged; sent again under ``resend``: logged when that attempt is
  recorded ``sent``);
- a send recorded ``sent`` is never delivered, nor recorded ``sent``, again (a replay is
  answered from the outbox), so its entry is never written twice; and the entry's key is
  a function of the send (chat, the time it was recorded sent, idempotency key, part), so
  even a rewrite of the same settlement lands on the same entry.

That holds on every journal that implements the SPI's atomic ``commit``: memory, file,
sqlite, postgres, redis, and the Kafka worker's table (whose changelog carries the
entry and the ``sent`` mark in the same partition: one transaction under ``exactly_once``,
consecutive records handed to the producer together under ``at_least_once``). There a
producer batch can fill up between the two, so the entry goes first: a kill between them
leaves the entry alone, and the recovery, finding the send in flight and its entry
(``MessageLog.find``), records it ``sent`` from the entry (``Delivery._found_in_log``).

**Keys.** ``<scope>/log/<chat, percent-encoded>/<sent µs, 17 digits>/<the send's key
(part 1's), percent-encoded>/<part, 4 digits>`` (``ScopeKeys.log_of``): a chat's log is
one prefix of the journal, in time order. ``history`` is one ``DurableKv.scan`` of that
prefix: a key range on sqlite, postgres and the Kafka worker's RocksDB (what it reads
grows with the chat's entries); the memory and file journals filter their in-memory keys,
and Redis filters the scope's hash on the server (what they read grows with the scope).

**Retention.** An entry's ``purge`` score is its send time plus ``message_log.retention``
(default: the journal's ``retention``; ``0`` keeps it), and the engine's retention pass
deletes it like a finished record. What is stored: the text (unless
``message_log.texts`` is off) and a summary of the media (kind, mime type, file name,
size), never the media's bytes or its URL (a signed URL is a credential).

Sends that bypass the journal (too large, not JSON, ``fail_open`` during an outage) are not
journaled, so they are not logged either (``outboxBypassed`` counts them).
"""

from __future__ import annotations

import base64
import bisect
import logging
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import quote, urlsplit

import msgspec

from botmesh.state.keys import ScopeKeys, part_base
from botmesh.state.kv import DurableKv, Entry, Op, handover

__all__ = [
    "JournalMessageLog",
    "LoggedMedia",
    "LoggedMessage",
    "MessageLog",
    "entry_key",
    "logged_message",
]

log = logging.getLogger("botmesh.message_log")

Json = dict[str, Any]

#: How a send's media was given: a URL, a local path, inline bytes, or a channel's token.
MediaKind = Literal["url", "path", "data", "id"]


class LoggedMedia(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the log keeps of a send's media: never its bytes, never its URL."""

    kind: MediaKind
    mime: str | None = None
    #: The file name given, else the last segment of the path or of the URL's path.
    name: str | None = None
    #: Inline bytes only: their size.
    size: int | None = None


class LoggedMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One part of a send the channel accepted, as the message log keeps it."""

    #: The part's idempotency key (``key``, ``key#2``… for a split text).
    key: str
    chat_id: str
    #: When the send was recorded ``sent`` (seconds since the epoch, the engine's clock).
    sent_at: float
    #: The channel's id of the message (``SendResult.message_id``).
    message_id: str | None = None
    #: The channel that carried it (the provider's ``name``; a fallback's channel when
    #: the send's fallback went out instead).
    channel: str | None = None
    part: int = 1
    parts: int = 1
    #: The text sent (``None``: no text, or ``message_log.texts`` off).
    text: str | None = None
    media: LoggedMedia | None = None
    #: The inbound whose handler made the send, when one did.
    inbound_id: str | None = None
    #: Provider calls it took (retries included).
    attempts: int = 1
    #: A crash left an earlier attempt's outcome unknown and it was sent again
    #: (``on_ambiguous="resend"``): the chat may have received it twice.
    ambiguous: bool = False
    #: The key its fallback went out under, when the fallback replaced it.
    fallback_key: str | None = None

    @property
    def position(self) -> str:
        """Its place in the chat's log (the entry key after the chat's prefix): the cursor
        ``history(before=...)`` pages from."""
        return position_of(self.sent_at, self.key, self.part)


def _micros(t: float) -> int:
    return max(round(t * 1_000_000), 0)


def position_of(sent_at: float, key: str, part: int) -> str:
    """``<sent µs, 17 digits>/<send's key, percent-encoded>/<part, 4 digits>``: sorts by
    time, then by send, then by part (a clock that does not move keeps a send's parts in
    order)."""
    return f"{_micros(sent_at):017d}/{quote(part_base(key, part), safe='')}/{part:04d}"


def entry_key(keys: ScopeKeys, message: LoggedMessage) -> str:
    """The journal key of a logged message: deterministic from the send."""
    return keys.log_of(message.chat_id) + message.position


def _media_of(raw: object) -> LoggedMedia | None:
    if not isinstance(raw, Mapping):
        return None
    mime = raw.get("mime")
    name = raw.get("name")
    size: int | None = None
    kind: MediaKind
    if raw.get("url"):
        kind = "url"
        name = name or posixpath.basename(urlsplit(str(raw["url"])).path) or None
    elif raw.get("path"):
        kind = "path"
        name = name or posixpath.basename(str(raw["path"])) or None
    elif raw.get("data") is not None:
        kind = "data"
        data = raw["data"]
        try:
            size = len(base64.b64decode(data)) if isinstance(data, str) else len(data)
        except (ValueError, TypeError):
            size = None
    else:
        kind = "id"
    return LoggedMedia(
        kind=kind,
        mime=str(mime) if mime else None,
        name=str(name) if name else None,
        size=size,
    )


def logged_message(
    value: Json, sent_at: float, *, channel: str | None, texts: bool
) -> LoggedMessage:
    """The log entry of an outbox record being recorded ``sent`` (``value``: that record)."""
    payload = value.get("payload") or {}
    spec = value.get("fallback")
    fallback_key: str | None = None
    parts = int(value.get("parts", 1))
    if isinstance(spec, Mapping) and spec.get("used"):
        fallback_key = str(spec["key"]) if spec.get("key") else None
        channel = str(spec.get("channel") or channel or "") or None
        # the first part of a fallback split in parts: the fallback's count, not the text's
        parts = int(spec.get("parts", 1 if value.get("part", 1) == 1 else parts))
    text = payload.get("text") if texts else None
    return LoggedMessage(
        key=value["key"],
        chat_id=payload["chat_id"],
        sent_at=sent_at,
        message_id=value.get("message_id"),
        channel=channel,
        part=int(value.get("part", 1)),
        parts=parts,
        text=text if isinstance(text, str) else None,
        media=_media_of(payload.get("media")),
        inbound_id=value.get("inbound_id"),
        attempts=max(int(value.get("attempts", 1)), 1),
        ambiguous=bool(value.get("ambiguous")),
        fallback_key=fallback_key,
    )


@runtime_checkable
class MessageLog(Protocol):
    """The message log port: its write side is the operations it adds to the commit that
    records a send ``sent`` (so the entry and the ``sent`` mark land together or not at
    all); its read side is a chat's history: ``history`` checks its arguments, the same
    for every store, and asks the store for one ``page``.

    Another store (a SQL table of its own, say) keeps the exactly-once property only when
    it is fed from the journal (following the entries or the receipts), never by a write
    of its own after the provider call: that write and the ``sent`` mark could not be
    atomic."""

    def entry_ops(self, value: Json, sent_at: float) -> Sequence[Op]:
        """The journal operations that log the send ``value`` (an outbox record being
        recorded ``sent`` at ``sent_at``); empty when nothing is logged."""
        ...

    async def history(
        self,
        chat_id: str,
        *,
        limit: int = 50,
        before: LoggedMessage | float | None = None,
    ) -> list[LoggedMessage]:
        """The chat's logged messages, newest first: up to ``limit``, sent before
        ``before`` (a message of an earlier page: the ones after it in this order; a time:
        the ones sent earlier)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"history(limit=...) must be a whole number >= 0, got {limit!r}")
        if limit == 0:
            return []
        return await self.page(chat_id, limit, _position_before(before))

    async def page(self, chat_id: str, limit: int, before: str | None) -> list[LoggedMessage]:
        """Up to ``limit`` (at least 1) of the chat's logged messages, newest first: those
        whose ``position`` sorts before ``before`` (``None``: from the newest)."""
        ...

    async def find(self, chat_id: str, key: str) -> LoggedMessage | None:
        """The entry of the send ``key`` in the chat's log, if any (read after a crash:
        it reads the chat's whole log)."""
        ...


@dataclass(eq=False)
class JournalMessageLog(MessageLog):
    """The message log in the journal itself (see the module docstring)."""

    kv: DurableKv
    _: KW_ONLY
    #: The scope's keys: its log is ``keys.log_of(chat)`` for each chat.
    keys: ScopeKeys
    #: The channel of a send whose record names none (the provider's ``name``).
    channel: str | None
    #: Seconds an entry is kept after its send (``message_log.retention``); 0 keeps it.
    retention: float
    #: Whether sends are logged (``message_log.enabled``).
    enabled: bool = True
    #: Whether their texts are kept (``message_log.texts``).
    texts: bool = True

    def purge_at(self, sent_at: float) -> float | None:
        """When an entry sent at ``sent_at`` is deleted; ``None`` when it is kept."""
        return sent_at + self.retention if self.retention > 0 else None

    def entry_ops(self, value: Json, sent_at: float) -> Sequence[Op]:
        if not self.enabled:
            return ()
        message = logged_message(value, sent_at, channel=self.channel, texts=self.texts)
        entry: Json = msgspec.to_builtins(message)
        # no version check: the key is the send's own, so a rewrite writes the same entry
        return (
            handover(
                entry_key(self.keys, message), entry, expect=None, purge=self.purge_at(sent_at)
            ),
        )

    async def page(self, chat_id: str, limit: int, before: str | None) -> list[LoggedMessage]:
        prefix = self.keys.log_of(chat_id)
        entries = await self.kv.scan(prefix)  # key order: oldest first
        if before is not None:
            entries = entries[: bisect.bisect_left([e.key for e in entries], prefix + before)]
        return _messages(reversed(entries), limit)

    async def find(self, chat_id: str, key: str) -> LoggedMessage | None:
        if not self.enabled:
            return None
        entries = await self.kv.scan(self.keys.log_of(chat_id))
        found = _messages((e for e in entries if e.value.get("key") == key), 1)
        return found[0] if found else None


def _position_before(before: LoggedMessage | float | None) -> str | None:
    """The log position ``history(before=...)`` pages from: a message's own, or a time's
    (every message sent earlier sorts before it)."""
    if before is None:
        return None
    if isinstance(before, LoggedMessage):
        return before.position
    if isinstance(before, int | float) and not isinstance(before, bool):
        return f"{_micros(float(before)):017d}"
    raise TypeError(
        "history(before=...) takes a LoggedMessage of an earlier page or a time "
        f"(seconds since the epoch), got {type(before).__name__}"
    )


def _messages(entries: Iterable[Entry], limit: int) -> list[LoggedMessage]:
    """Up to ``limit`` readable messages of ``entries``, in their order."""
    found: list[LoggedMessage] = []
    for e in entries:
        try:
            found.append(msgspec.convert(e.value, LoggedMessage))
        except msgspec.ValidationError as exc:  # written by another version: skipped
            log.warning("message log entry %s unreadable, skipped: %s", e.key, exc)
            continue
        if len(found) == limit:
            break
    return found
