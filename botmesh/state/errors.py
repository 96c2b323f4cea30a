"""The botmesh error tree.

Routing code reads the fields on these errors (``retryable``, ``retry_after``, ``key``,
``code``, ``reason``); it never parses messages. Every message says what the operator
does next. ``args`` stay meaningful so that every error pickles.

::

    BotmeshError
    ├── ConfigError                      bad option; names the field
    ├── InvalidKeyError                  an idempotency key botmesh cannot keep apart (``#``)
    ├── AppLoadError                     ``--app`` / ``--provider`` does not name what it should
    ├── BadRecord                        a record that cannot be decoded or built (``reason``)
    ├── FlowError                        about one chat's flow (``flow``, ``chat_id``)
    │   └── FlowInterrupt                raised inside a flow at its pending ``conv.ask``
    │       ├── FlowTimeout              no answer came within the ask's ``timeout``
    │       ├── FlowCancelled            the chat sent one of the flow's cancel commands
    │       └── FlowInvalidAnswer        ``max_tries`` answers were refused
    ├── DurabilityError                  the journal layer
    │   ├── JournalUnavailableError      the backend cannot be reached or written
    │   │   └── JournalWriteError        one write failed (EIO, ENOSPC, short write)
    │   ├── VersionConflictError         compare-and-set lost (someone wrote first)
    │   ├── JournalLockedError           another process or open() holds the journal
    │   ├── JournalCorruptError          unreadable journal file (code, file, line, offset)
    │   ├── RecordStateError             an operator action on a missing or busy record
    │   ├── FlowVersionError             a flow checkpoint of another version (also a FlowError)
    │   │   └── FlowDivergedError        a flow's code no longer replays its checkpoint
    │   └── FencedError                  a stale lease holder: stop, you are a zombie; never retry
    └── ProviderError                    a channel adapter failed
        ├── SendError                    a send failed; ``retryable`` says whether to retry
        │   ├── RateLimitedError         retryable, waits at least ``retry_after`` seconds
        │   ├── UnsupportedContentError  final
        │   ├── PayloadTooLargeError     final
        │   ├── OutsideSessionWindowError final
        │   └── RecipientUnreachableError final
        ├── SendDeferredError            inline retries ran out; the sweeper goes on (``key``)
        ├── SendExpiredError             not delivered by its deadline; journaled dead (``key``)
        ├── ProviderNotLeaderError       this replica may not call the transport
        └── MediaUnavailableError        ``reason`` names why (not-durable, provider-mismatch…)
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import ClassVar, Literal, TypeVar

__all__ = [
    "AppLoadError",
    "BadRecord",
    "BotmeshError",
    "ConfigError",
    "DurabilityError",
    "FencedError",
    "FlowCancelled",
    "FlowDivergedError",
    "FlowError",
    "FlowInterrupt",
    "FlowInvalidAnswer",
    "FlowTimeout",
    "FlowVersionError",
    "InvalidKeyError",
    "JournalCorruptError",
    "JournalLockedError",
    "JournalUnavailableError",
    "JournalWriteError",
    "MediaUnavailableError",
    "OutsideSessionWindowError",
    "PayloadTooLargeError",
    "ProviderError",
    "ProviderNotLeaderError",
    "RateLimitedError",
    "Reason",
    "RecipientUnreachableError",
    "RecordStateError",
    "SendDeferredError",
    "SendError",
    "SendExpiredError",
    "UnsupportedContentError",
    "VersionConflictError",
]


class Reason(StrEnum):
    """Why a record is dead: the ``reason`` header of a dead letter and the ``reason`` of a
    journaled error. Defined here once; the wire, the engine and the docs read it."""

    #: The inbound record has no value (a tombstone) or an empty one.
    EMPTY = "empty"
    #: The inbound value is not UTF-8 JSON.
    BAD_JSON = "bad-json"
    #: The inbound JSON is not an object.
    NOT_OBJECT = "not-object"
    #: ``v`` is missing or not a version this worker reads.
    UNKNOWN_VERSION = "unknown-version"
    #: ``chat_id`` is missing, null or empty.
    MISSING_CHAT_ID = "missing-chat-id"
    #: A field has the wrong type.
    WRONG_TYPE = "wrong-type"
    #: The inbound could not be journaled in ``inbox.max_attempts`` tries.
    JOURNAL_UNAVAILABLE = "journal-unavailable"
    #: The inbound (or the request's send) is too large to journal: the journal's record
    #: of it is over the producer's request limit (not retried).
    TOO_LARGE = "too-large"
    #: Processing the inbound failed in ``inbox.max_attempts`` tries (not a handler error).
    HANDLE_FAILED = "handle-failed"
    #: ``inbox.max_attempts`` runs were charged without completing (it crashed every run).
    ATTEMPTS_EXHAUSTED = "attempts-exhausted"
    #: The provider refused the send for good (a final error).
    SEND_REFUSED = "send-refused"
    #: The send failed ``outbox.retries + 1`` times.
    RETRIES_EXHAUSTED = "retries-exhausted"
    #: An earlier part of the same text is dead, so this part never goes out.
    PREVIOUS_PART_DEAD = "previous-part-dead"
    #: An earlier part of the same text became ``unknown``, so this part shares its fate.
    PREVIOUS_PART_UNKNOWN = "previous-part-unknown"
    #: The process stopped between calling the provider and recording the result.
    AMBIGUOUS = "ambiguous"
    #: The first part of the same text went out as its fallback, which replaces the text.
    SUPERSEDED_BY_FALLBACK = "superseded-by-fallback"
    #: The send was not delivered by its deadline (``deliver_within``, ``expires_at``).
    EXPIRED = "expired"
    #: The channel accepted the send, then reported it failed (a ``failed`` status webhook:
    #: WhatsApp 131047, Twilio 30003…); the channel's code is in the error.
    UNDELIVERED = "undelivered"
    #: An edit or a delete request names a send that cannot be changed: never journaled,
    #: not gone out (pending, in flight, dead…), or on a channel whose API cannot.
    NOT_EDITABLE = "not-editable"


class BotmeshError(Exception):
    """Root of every error botmesh raises on purpose."""


class InvalidKeyError(BotmeshError, ValueError):
    """An explicit idempotency key botmesh refuses; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(key, message)
        self.key = key
        self.message = message

    def __str__(self) -> str:
        return f"idempotency key {self.key!r}: {self.message}"


class AppLoadError(BotmeshError):
    """``--app`` or ``--provider`` does not name what it should; the message names the
    module or attribute and the fix."""


class BadRecord(BotmeshError, ValueError):
    """A record that cannot be decoded or built: an inbound off the wire, or an ``Inbound``,
    ``Outbound`` or ``Media`` built in code with a bad field. ``reason`` is a stable code (the
    DLQ ``reason`` header), ``detail`` says what is wrong and how to fix the producer,
    ``field`` names the refused field when one is to blame (``chat_id``, ``media.url``)."""

    def __init__(self, reason: Reason, detail: str, field: str | None = None) -> None:
        super().__init__(reason, detail, field)
        self.reason = reason
        self.detail = detail
        self.field = field

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


class ConfigError(BotmeshError, ValueError):
    """An option was refused. ``field`` names it (for example ``outbox.lease``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class FlowError(BotmeshError):
    """About one chat's flow: ``flow`` and ``chat_id`` name the conversation."""

    def __init__(self, flow: str, chat_id: str, message: str) -> None:
        super().__init__(flow, chat_id, message)
        self.flow = flow
        self.chat_id = chat_id
        self.message = message

    def __str__(self) -> str:
        return f"flow {self.flow!r} in chat {self.chat_id!r}: {self.message}"


class FlowInterrupt(FlowError):
    """Raised inside a flow, at the ``conv.ask`` that waits: the flow may catch it (to say
    goodbye) or let it end the flow."""


class FlowTimeout(FlowInterrupt):
    """No answer came within the pending ask's ``timeout`` (fired by the sweeper)."""


class FlowCancelled(FlowInterrupt):
    """The chat sent one of the flow's ``cancel`` commands while it waited for an answer."""


class FlowInvalidAnswer(FlowInterrupt, ValueError):
    """``max_tries`` answers in a row were refused by ``validate`` or ``parse``."""


class DurabilityError(BotmeshError):
    """Something in the journal layer failed."""


class JournalUnavailableError(DurabilityError):
    """The journal backend could not be reached or written. Operator action: check the backend."""


class JournalWriteError(JournalUnavailableError):
    """One write failed (disk error, full disk, short write); the journal is still readable."""


class VersionConflictError(DurabilityError):
    """A compare-and-set found another version than expected: someone wrote the key first."""

    def __init__(self, key: str, expected: int | None, actual: int | None) -> None:
        super().__init__(key, expected, actual)
        self.key = key
        self.expected = expected
        self.actual = actual

    def __str__(self) -> str:
        return f"version conflict on {self.key!r}: expected {self.expected}, found {self.actual}"


class JournalLockedError(DurabilityError):
    """The journal is held by another live process (``pid``) or another open() in this one."""

    def __init__(self, path: str, pid: int | None, message: str) -> None:
        super().__init__(path, pid, message)
        self.path = path
        self.pid = pid
        self.message = message

    def __str__(self) -> str:
        return self.message


class JournalCorruptError(DurabilityError):
    """A journal file cannot be read back; it was left exactly as it was.

    ``code`` is stable (``SNAPSHOT_CORRUPT``, ``APPEND_LOG_CORRUPT``); ``line`` and ``offset``
    locate the first bad entry when known. Operator action: restore the file from a backup or
    move it aside.
    """

    def __init__(
        self,
        code: str,
        file: str,
        message: str,
        line: int | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(code, file, message, line, offset)
        self.code = code
        self.file = file
        self.message = message
        self.line = line
        self.offset = offset

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f" line {self.line}"
        if self.offset is not None:
            where += f" (byte offset {self.offset})"
        return (
            f"[{self.code}] {where}: {self.message}. "
            "Operator action: restore the file from a backup or move it aside."
        )


class RecordStateError(DurabilityError):
    """An operator action (replay, retry, discard) found no record, or one in a state it
    cannot act on. ``key`` names the record, ``state`` its state (``None``: missing)."""

    def __init__(self, key: str, state: str | None, message: str) -> None:
        super().__init__(key, state, message)
        self.key = key
        self.state = state
        self.message = message

    def __str__(self) -> str:
        return f"{self.key!r} ({self.state or 'missing'}): {self.message}"


class FlowVersionError(FlowError, DurabilityError):
    """A chat's flow checkpoint was written by another version of the flow (or by a flow no
    longer registered): it is not replayed against this code. The flow's
    ``on_incompatible`` decides (refuse, restart, drop); an operator can also
    ``restart_flow`` or ``drop_flow`` it."""


class FlowDivergedError(FlowVersionError):
    """The flow's code no longer takes the path its checkpoint recorded (another question
    at a recorded step, an end where an answer was recorded): its code changed without a
    ``version`` bump. Handled like a version mismatch (``on_incompatible``)."""


class FencedError(DurabilityError):
    """This holder's lease was taken over under a newer fencing token. Stop; never retry."""

    retryable = False

    def __init__(self, key: str, token: int, current: int | None) -> None:
        super().__init__(key, token, current)
        self.key = key
        self.token = token
        self.current = current

    def __str__(self) -> str:
        return (
            f"fenced on {self.key!r}: holding token {self.token}, the record is at "
            f"{self.current}; another worker owns it now"
        )


class ProviderError(BotmeshError):
    """A channel adapter failed."""


class SendError(ProviderError):
    """A send failed. ``retryable`` is False for final errors, which dead-letter at once."""

    retryable: bool = True

    def __init__(self, message: str = "", *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class RateLimitedError(SendError):
    """The channel asked us to slow down; the next attempt waits at least ``retry_after`` s.

    ``retry_after`` is made sane when the error is built (``floor_of``), so that no value
    a channel or an adapter gives can break the retry decision or park a send forever:
    ``None``, NaN, a negative number or a non-number asks for no wait (the normal backoff
    applies); a wait longer than ``MAX_RETRY_AFTER`` (one day), infinity included, is cut
    to ``MAX_RETRY_AFTER``. The retry decision applies the same rule to the attribute.
    """

    retryable = True
    #: The longest wait a channel's ``retry_after`` imposes, seconds (one day).
    MAX_RETRY_AFTER: ClassVar[float] = 86400.0

    def __init__(self, message: str = "rate limited", *, retry_after: float | None = 0.0) -> None:
        super().__init__(message)
        self.args = (message,)
        self.retry_after = self.floor_of(retry_after)

    @classmethod
    def floor_of(cls, value: object) -> float:
        """``value`` as a wait in seconds by the rule above (never raises)."""
        if isinstance(value, bool) or value is None:
            return 0.0
        try:
            seconds = float(value)  # type: ignore[arg-type]  # any object: refused below
        except OverflowError:  # an integer too large for a float: longer than any cap
            return cls.MAX_RETRY_AFTER
        except (TypeError, ValueError):
            return 0.0
        if math.isnan(seconds) or seconds <= 0.0:
            return 0.0
        return min(seconds, cls.MAX_RETRY_AFTER)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_rate_limited, (str(self), self.retry_after))


def _rebuild_rate_limited(message: str, retry_after: float) -> RateLimitedError:
    return RateLimitedError(message, retry_after=retry_after)


class UnsupportedContentError(SendError):
    """The channel cannot carry this content. Final."""

    retryable = False


class PayloadTooLargeError(SendError):
    """The channel refused the payload size. Final."""

    retryable = False


class OutsideSessionWindowError(SendError):
    """The channel's customer-service window is closed for this chat. Final."""

    retryable = False


class RecipientUnreachableError(SendError):
    """The recipient does not exist or blocked the bot. Final."""

    retryable = False


class SendDeferredError(ProviderError):
    """Inline retries ran out; the send is journaled under ``key`` and the sweeper retries it."""

    def __init__(self, key: str, cause: str = "") -> None:
        super().__init__(key, cause)
        self.key = key
        self.cause = cause

    def __str__(self) -> str:
        tail = f" (last error: {self.cause})" if self.cause else ""
        return f"send {self.key!r} deferred to the background sweeper{tail}"


class SendExpiredError(ProviderError):
    """The send was not delivered by its deadline (``deliver_within``, ``expires_at``): it
    is journaled dead with the reason ``expired`` (its dead letter and receipt follow) and
    never goes out. ``deadline`` is when it expired (epoch seconds)."""

    retryable = False

    def __init__(self, key: str, deadline: float, cause: str = "") -> None:
        super().__init__(key, deadline, cause)
        self.key = key
        self.deadline = deadline
        self.cause = cause

    def __str__(self) -> str:
        tail = f" (last error: {self.cause})" if self.cause else ""
        return f"send {self.key!r} expired: not delivered by its deadline{tail}"


class ProviderNotLeaderError(ProviderError):
    """This replica does not hold the provider session (``provider_session="leader"``): the
    provider was not called. ``leader`` names the instance holding it (``None``: nobody
    now), ``until`` is when its lease ends (epoch seconds; ``None``: unknown). Never
    charged as a failure: the send stays journaled and the leader delivers it."""

    retryable = True

    def __init__(self, leader: str | None, until: float | None) -> None:
        super().__init__(leader, until)
        self.leader = leader
        self.until = until

    def __str__(self) -> str:
        if self.leader is None:
            holder = "no replica holds the provider session now"
        else:
            holder = f"the provider session is held by {self.leader!r}"
            if self.until is not None:
                holder += f" (its lease ends at {self.until:.3f})"
        return (
            f"this replica is not the provider leader: {holder}; the send stays journaled "
            "and the leader delivers it"
        )


MediaUnavailableReason = Literal["not-durable", "provider-mismatch", "rehydrate-failed"]


class MediaUnavailableError(ProviderError):
    """A replayed message's media cannot be rebuilt; ``reason`` says why."""

    def __init__(self, reason: MediaUnavailableReason, message: str = "") -> None:
        super().__init__(reason, message)
        self.reason: MediaUnavailableReason = reason
        self.message = message


_E = TypeVar("_E", bound=BaseException)


def find_cause(exc: BaseException, kind: type[_E]) -> _E | None:
    """``exc`` if it is a ``kind``, else the first of its causes and contexts that is (8
    deep), else None."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """``exc`` is a ``kind``, or was raised from one."""
    return find_cause(exc, kind) is not None
