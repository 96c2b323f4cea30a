"""The options every send takes, and the ``Outbound`` they make."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, TypedDict

from botmesh.state.errors import BadRecord, Reason
from botmesh.state.fallback import Fallback
from botmesh.state.messages import Media, Outbound
from botmesh.state.timing import Timing

__all__ = ["SendOptions", "outbound", "timing_of"]


class SendOptions(TypedDict, total=False):
    """The keyword options of every send (``ctx.reply``, ``ctx.send``, ``ctx.enqueue``,
    ``app.send``, ``app.enqueue``, ``conv.say``)."""

    #: A media reference (URL, path or inline bytes) sent with the text, or instead of it.
    media: Media | None
    #: The send's name (no ``#``); default ``<inbound id>:<n>`` in a handler, else random.
    idempotency_key: str | None
    #: Channel options passed to the provider as they are (``parse_mode``, ``reply_to``…).
    options: Mapping[str, Any] | None
    #: What goes out instead, once, when the channel refuses the send with an error it
    #: names (by default outside WhatsApp's 24-hour window): ``botmesh.Fallback``.
    fallback: Fallback | None
    #: Send it at this time, not before (a timezone-aware ``datetime``, or epoch seconds):
    #: journaled now, delivered by the background sweeper at its time.
    at: datetime | float | None
    #: Send it this long from now, not before (seconds or a ``timedelta``); as ``at``.
    delay: float | timedelta | None
    #: Its deadline, from its time (or from now): not delivered by then, it dies
    #: ``expired`` instead of going out late (seconds or a ``timedelta``).
    deliver_within: float | timedelta | None
    #: Its deadline as a time (a timezone-aware ``datetime``, or epoch seconds).
    expires_at: datetime | float | None


def outbound(chat_id: str, text: str | None, opts: SendOptions) -> Outbound:
    """The message a send of ``text`` with ``opts`` to ``chat_id`` makes; refuses a send
    with neither text nor media, and channel options that are not a mapping."""
    media = opts.get("media")
    if text is None and media is None:
        raise ValueError("a send needs text or media")
    options = opts.get("options")
    if options is not None and not isinstance(options, Mapping):
        raise BadRecord(
            Reason.WRONG_TYPE,
            "a send's field 'options' must be a dict of channel options (for example "
            f"{{'parse_mode': 'HTML'}}) or None, got {type(options).__name__} "
            f"{repr(options)[:60]}",
            "options",
        )
    channel = {k: v for k, v in options.items() if k != "idempotency_key"} if options else {}
    return Outbound(chat_id, text, media, channel)


def timing_of(opts: SendOptions) -> Timing | None:
    """When a send with ``opts`` may and must go out (``None``: now, no deadline of its
    own); refuses a naive ``datetime`` and a value of the wrong type, naming the option."""
    given = {
        "at": _instant(opts.get("at"), "at"),
        "delay": _seconds(opts.get("delay"), "delay"),
        "expires_at": _instant(opts.get("expires_at"), "expires_at"),
        "deliver_within": _seconds(opts.get("deliver_within"), "deliver_within"),
    }
    if all(v is None for v in given.values()):
        return None
    return Timing(**given)


def _instant(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(
                f"'{name}' is a naive datetime (no timezone), which names no one instant; "
                "give an aware one, e.g. datetime(2026, 12, 8, 9, 0, tzinfo=ZoneInfo("
                "'Europe/Paris')) or datetime.now(UTC) + timedelta(hours=1)"
            )
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TypeError(
        f"'{name}' must be a timezone-aware datetime or epoch seconds, got "
        f"{type(value).__name__} {value!r}"
    )


def _seconds(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TypeError(
        f"'{name}' must be seconds or a timedelta, got {type(value).__name__} {value!r}"
    )
