"""The echo bot plus a record of every handler run: the bot of the Kafka end-to-end tests.

Each run appends ``<inbound id>\\n`` to the file named by ``BOTMESH_RECORD_FILE`` (flushed at
once), so a test can count how often each message was handled across worker restarts. A
message whose text is ``fail`` makes the handler raise (the Bot reports it on ``error`` and
the message counts as handled); one whose text is ``journal-down`` makes ``bot.handle`` itself
raise, as a journal outage would (the worker retries it, then dead-letters it).
"""

from __future__ import annotations

import os

from botmesh import Bot, Context, Inbound, MockProvider


class RecordingBot(Bot):
    async def handle(self, message: Inbound) -> None:
        if message.text == "journal-down":
            raise ConnectionError("journal unavailable (simulated)")
        await super().handle(message)


bot = RecordingBot(MockProvider(), bot_id="recording")
_path = os.environ.get("BOTMESH_RECORD_FILE", "")
_out = open(_path, "a", buffering=1) if _path else None  # noqa: SIM115 - open for the process life


@bot.on_message
async def record(ctx: Context) -> None:
    if _out is not None:
        _out.write(f"{ctx.message.id}\n")
    if ctx.text == "fail":
        raise RuntimeError("the handler failed on purpose")
    await ctx.reply(f"echo: {ctx.text}")
