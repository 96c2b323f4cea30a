"""The bot of the Kafka delivery-outcome tests (``tests/kafka/test_delivery_outcomes.py``)::

    botmesh worker --app tests.kafka.outcomes_bot:bot --provider whatsapp   (or telegram)

Every message is answered with ``re: <text>``, whose fallback is the approved template
``hello_world`` (WhatsApp: a chat whose message fails with 131047 after the 200 gets the
template). ``go`` is answered ``working…`` under the key ``status-<chat>``; ``done`` edits
that send to ``done``.

Kills, each once (a marker file says it happened):

- ``BOTMESH_TEST_KILL_AT_SWITCH=<marker>:before|after``: SIGKILL right before, or right
  after, the journal write that records a send failed after its 200 and journals its
  fallback (``Delivery.record_delivery`` with the fallback's records);
- ``BOTMESH_TEST_CRASH_MARKER=<marker>``: SIGKILL once the batch that made ``done``'s
  edit settled (the journal's writes durable) and before its offsets are committed: the
  message comes again and its handler is replayed, the edit answered from the journal. (A
  kill between the edit's call and the journal write that records it is the ambiguous
  window: the edit is made again, as a send would be.)
"""

from __future__ import annotations

import os
import signal
from typing import Any

from botmesh import Bot, Context, Fallback
from tests.kafka.marks import append

__all__ = ["bot"]

bot = Bot("outcomes-e2e")


def _once(marker: str, what: str) -> None:
    """SIGKILL this process, unless the marker says it happened already."""
    if marker and not os.path.exists(marker):
        append(marker, what)
        os.kill(os.getpid(), signal.SIGKILL)


def _die_at_the_switch(spec: str) -> None:
    from botmesh.state.delivery import Delivery

    marker, _, when = spec.rpartition(":")
    real = Delivery.record_delivery

    async def record_delivery(self: Delivery, *args: Any, **kwargs: Any) -> Any:
        switch = bool(kwargs.get("extra"))
        if switch and when == "before":
            _once(marker, "before the switch")
        result = await real(self, *args, **kwargs)
        if switch and when == "after":
            _once(marker, "after the switch")
        return result

    Delivery.record_delivery = record_delivery  # type: ignore[method-assign]


#: Set once ``done``'s edit returned in this process.
_edited: list[str] = []


def _die_before_the_ack(marker: str) -> None:
    from botmesh.streams.runner import InboundRunner

    real = InboundRunner.run_batch

    async def run_batch(self: InboundRunner, records: Any) -> None:
        await real(self, records)
        if _edited:
            _once(marker, _edited[0])

    InboundRunner.run_batch = run_batch  # type: ignore[method-assign]


if os.environ.get("BOTMESH_TEST_KILL_AT_SWITCH"):
    _die_at_the_switch(os.environ["BOTMESH_TEST_KILL_AT_SWITCH"])
if os.environ.get("BOTMESH_TEST_CRASH_MARKER"):
    _die_before_the_ack(os.environ["BOTMESH_TEST_CRASH_MARKER"])


@bot.on_message
async def answer(ctx: Context) -> None:
    handled = os.environ.get("BOTMESH_TEST_HANDLED", "")
    if handled:  # every run of the handler (the test waits for a replay's)
        append(handled, ctx.inbound_id)
    status = f"status-{ctx.chat_id}"
    if ctx.text == "go":
        await ctx.typing()
        await ctx.reply("working…", idempotency_key=status)
    elif ctx.text == "done":
        await ctx.edit(status, "done")
        _edited.append(ctx.inbound_id)
    else:
        await ctx.reply(f"re: {ctx.text}", fallback=Fallback.template("hello_world", "en_US"))
