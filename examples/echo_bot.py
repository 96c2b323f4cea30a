"""The echo bot of the demo: replies ``echo: <text>`` in the same chat.

Run it on Kafka with ``botmesh worker --app examples.echo_bot:bot`` (from the repository root).
``BOTMESH_ECHO_QUIET=1`` stops the console provider printing each reply.
"""

from __future__ import annotations

import os

from botmesh import Bot, ConsoleProvider, Context

bot = Bot(ConsoleProvider(quiet=os.environ.get("BOTMESH_ECHO_QUIET", "") == "1"), bot_id="echo")


@bot.on_message
async def echo(ctx: Context) -> None:
    await ctx.reply(f"echo: {ctx.text}")
