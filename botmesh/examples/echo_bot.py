"""The echo bot of the demo: replies ``echo: <text>`` in the same chat.

A definition only: where it runs chooses the provider and the journal.

- on Kafka: ``botmesh worker --app botmesh.examples.echo_bot:bot`` (from the repository root; the
  console provider by default, ``BOTMESH_CONSOLE_QUIET=1`` to count without printing; a
  file journal in the data dir);
- in this process: ``async with botmesh.run(bot, provider, journal="file:///...") as app``.
"""

from __future__ import annotations

from botmesh import Bot, Context

bot = Bot("echo")


@bot.on_message
async def echo(ctx: Context) -> None:
    await ctx.reply(f"echo: {ctx.text}")
