"""The options every send takes, and the ``Outbound`` they make."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from botmesh.state.errors import BadRecord, Reason
from botmesh.state.fallback import Fallback
from botmesh.state.messages import Media, Outbound

__all__ = ["SendOptions", "outbound"]


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
