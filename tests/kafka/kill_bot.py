"""The bot of the channel kill test (``tests/kafka/test_channel_kills.py``), run by a real
worker on a real channel adapter:

    botmesh worker --app tests.kafka.kill_bot:bot --provider discord

It replies ``echo <inbound id>: <text>`` once per message (key ``<inbound id>:1``), so each
message at the channel's fake names its inbound. Its outbox policy is ``on_ambiguous="skip"``
on purpose: a send found in flight after a SIGKILL that the channel cannot resolve is marked
``unknown`` and never sent again, so without the channel's answer a send that never reached
the channel would be lost, and the test would see it.
"""

from __future__ import annotations

from botmesh import Bot, Context

__all__ = ["bot", "reply_text"]

bot = Bot("channel-kills", durability={"outbox": {"on_ambiguous": "skip"}})


def reply_text(inbound_id: str, text: str | None) -> str:
    """The one reply to an inbound (unique per inbound, so a message at the fake is traceable)."""
    return f"echo {inbound_id}: {text}"


@bot.on_message
async def echo(ctx: Context) -> None:
    await ctx.reply(reply_text(ctx.inbound_id, ctx.text))
