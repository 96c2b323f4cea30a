"""A campaign on Kafka: ``botmesh broadcast``'s producing and following.

``produce_campaign`` produces one send request per recipient on ``<prefix>.requests``
(``botmesh.topics.records.SendRequest``), keyed by the recipient's chat id so it lands in
the chat's partition, its id and idempotency key both ``campaign:<campaign>:<chat id>``: a
campaign produced again (after a crash, a timeout, an operator's second thought) sends no
recipient twice. Each request carries an ``at`` (the time given, else now), so its owner
journals it for the sweeper, which delivers it at the channel's pace and lets a cancel
(``botmesh broadcast cancel``: one ``cancel`` operator action per recipient) stop what has
not gone out.

``follow_campaign`` reads ``<prefix>.sent`` from its start and keeps, per recipient, the
state of the first part of its send, until every recipient has a settled one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from botmesh.state.campaigns import campaign_prefix
from botmesh.state.keys import campaign_key
from botmesh.state.messages import Media
from botmesh.streams.clients import metadata
from botmesh.streams.connection import Brokers
from botmesh.streams.ops.tools import check_requests_topic, produce_requests, tail_receipts
from botmesh.topics import Catalog
from botmesh.topics.control import ControlRequest
from botmesh.topics.records import SendRequest, decode_request, encode_request

__all__ = ["campaign_requests", "cancel_requests", "follow_campaign", "produce_campaign"]


def campaign_requests(
    campaign: str,
    chat_ids: Iterable[str],
    text: str | None,
    *,
    media: Media | None = None,
    options: Mapping[str, Any] | None = None,
    at: float | None = None,
    expires_at: float | None = None,
) -> list[SendRequest]:
    """One request per recipient (each once, in the order given), checked as the worker
    checks them: ``BadRecord`` (a ``ValueError``) names the first one it would refuse."""
    when = time.time() if at is None else at
    requests: list[SendRequest] = []
    for chat_id in dict.fromkeys(chat_ids):
        key = campaign_key(campaign, chat_id)
        request = SendRequest(
            id=key,
            chat_id=chat_id,
            text=text,
            media=media,
            key=key,
            options=dict(options) if options else {},
            at=when,
            expires_at=expires_at,
        )
        decode_request(encode_request(request))
        requests.append(request)
    return requests


async def produce_campaign(bootstrap: Brokers, cat: Catalog, requests: list[SendRequest]) -> float:
    """Produce a campaign's requests (acks=all, in order); the seconds it took. Raises
    ``LookupError`` when the requests topic does not exist, ``ConnectionError`` when the
    broker cannot be reached."""
    check_requests_topic(await metadata(bootstrap), cat)
    return await produce_requests(bootstrap, cat.requests, requests)


def cancel_requests(campaign: str, chat_ids: Iterable[str], by: str) -> list[ControlRequest]:
    """One ``cancel`` action per recipient of ``campaign`` (its owner cancels the send, or
    cancels its key ahead when the request has not reached it yet)."""
    return [
        ControlRequest(
            id=f"cancel:{campaign_key(campaign, chat_id)}:{time.time_ns()}",
            chat_id=chat_id,
            action="cancel",
            target=campaign_key(campaign, chat_id),
            by=by,
        )
        for chat_id in dict.fromkeys(chat_ids)
    ]


async def follow_campaign(
    bootstrap: Brokers,
    cat: Catalog,
    campaign: str,
    recipients: set[str],
    *,
    seen: Callable[[dict[str, str]], None] = lambda states: None,
    idle: float | None = None,
) -> dict[str, str]:
    """The settled state of each recipient's send (``sent``, ``dead``, ``unknown``,
    ``cancelled``), read from ``<prefix>.sent`` from its start, until every recipient has
    one or ``idle`` seconds pass without a receipt. ``seen(states)`` after each receipt."""
    prefix = campaign_prefix(campaign)
    states: dict[str, str] = {}
    if not recipients:
        return states
    async for got in tail_receipts(bootstrap, cat.sent, from_beginning=True, idle_timeout=idle):
        receipt = got.receipt
        if receipt.part != 1 or not receipt.key.startswith(prefix):
            continue
        chat = receipt.key[len(prefix) :]
        if chat in recipients:
            states[chat] = str(receipt.state)
            seen(states)
            if len(states) == len(recipients):
                break
    return states
