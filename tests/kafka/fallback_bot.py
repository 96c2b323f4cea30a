"""The bot of the Kafka fallback test: it answers every message on WhatsApp with a text whose
fallback is the approved template ``hello_world``, so a chat whose 24-hour window is closed
gets the template instead (``tests/kafka/test_fallback.py``)::

    botmesh worker --app tests.kafka.fallback_bot:bot --provider whatsapp
"""

from __future__ import annotations

from botmesh import Bot, Context, Fallback

__all__ = ["bot"]

bot = Bot("fallback-e2e")


@bot.on_message
async def answer(ctx: Context) -> None:
    await ctx.reply(f"re: {ctx.text}", fallback=Fallback.template("hello_world", "en_US"))
