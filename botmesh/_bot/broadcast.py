"""``app.broadcast``: one send to many chats, as a campaign.

Each recipient's send is journaled for the background sweeper under
``campaign:<campaign id>:<chat id>`` (``botmesh.state.keys.campaign_key``): a broadcast
interrupted by a crash and started again sends no recipient twice and skips none, and the
sweeper delivers the sends at the pace the channel allows (docs/rate-limits.md). The
returned ``Campaign`` reads the campaign's progress from the journal and cancels what has
not gone out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator

from botmesh._bot.sends import SendOptions, outbound, timing_of
from botmesh.state.campaigns import CampaignStatus
from botmesh.state.errors import DurabilityError
from botmesh.state.keys import campaign_key, check_campaign
from botmesh.state.messages import Outbound, Receipt
from botmesh.state.operations import Operations

__all__ = ["Campaign", "broadcast", "checked", "recipients_of"]

#: Journal one send: (message, key, options) -> its receipt.
Enqueue = Callable[[Outbound, str, SendOptions], Awaitable[Receipt]]


class Campaign:
    """A broadcast: its id, its recipients, its progress and its cancellation.

    ``journaled`` counts the recipients whose send this run journaled or found journaled
    already (an earlier run's: answered from the journal, not sent again)."""

    def __init__(self, campaign: str, ops: Operations, chat_ids: list[str]) -> None:
        self.id = campaign
        self.recipients: tuple[str, ...] = tuple(chat_ids)
        self._ops = ops
        self._cancelled = False
        self.journaled = 0

    @property
    def cancelled(self) -> bool:
        """Whether this handle cancelled the campaign (its broadcast journals no more)."""
        return self._cancelled

    async def status(self) -> CampaignStatus:
        """Where the campaign's sends stand, read from the journal."""
        return await self._ops.campaign(self.id)

    async def cancel(self) -> CampaignStatus:
        """Cancel what has not gone out: the sends journaled and waiting, and the recipients
        this broadcast has not journaled yet (a later run sends them nothing). A send in
        flight goes on. The status after."""
        self._cancelled = True
        return await self._ops.cancel_campaign(self.id, self.recipients)

    async def wait(self, *, poll: float = 0.1) -> CampaignStatus:
        """Wait until no send of the campaign is pending; its status then (bound it with
        ``asyncio.timeout``)."""
        while True:
            status = await self.status()
            if status.pending == 0:
                return status
            await asyncio.sleep(poll)


async def broadcast(
    campaign: Campaign,
    enqueue: Enqueue,
    text: str | None,
    opts: SendOptions,
    *,
    concurrency: int,
) -> Campaign:
    """Journal the campaign's send to each of its recipients, ``concurrency`` at a time."""
    recipients: Iterator[str] = iter(campaign.recipients)

    async def journal_next() -> None:
        for chat_id in recipients:
            if campaign.cancelled:
                return
            message = outbound(chat_id, text, opts)
            await enqueue(message, campaign_key(campaign.id, chat_id), opts)
            campaign.journaled += 1

    if campaign.recipients:  # a bad send is refused once, before anything is journaled
        outbound(campaign.recipients[0], text, opts)
        timing_of(opts)
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(concurrency, max(len(campaign.recipients), 1))):
                group.create_task(journal_next())
    except BaseExceptionGroup as failed:  # the first error, as a send would raise it
        raise failed.exceptions[0] from None
    return campaign


def recipients_of(chat_ids: Iterable[str]) -> list[str]:
    """The recipients of a broadcast, each once, in the order given; refuses an empty or
    non-string chat id."""
    seen: dict[str, None] = {}
    for chat_id in chat_ids:
        if not isinstance(chat_id, str) or not chat_id.strip():
            raise ValueError(f"a broadcast's chat ids must be non-empty strings, got {chat_id!r}")
        seen.setdefault(chat_id, None)
    return list(seen)


def checked(campaign: str, concurrency: int, ops: Operations | None) -> Operations:
    """The journal a broadcast runs on, once its campaign id and concurrency are sound."""
    check_campaign(campaign)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be a whole number >= 1, got {concurrency!r}")
    if ops is None:
        raise DurabilityError(
            "a broadcast is journaled (each recipient keyed by the campaign, sent once): "
            "run the bot on a journal (botmesh.run(bot, provider, journal=...))"
        )
    return ops
