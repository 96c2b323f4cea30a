"""The bot of the end-to-end channel tests, run by a real worker on a real channel adapter:

    botmesh worker --app tests.kafka.channel_bot:bot --provider telegram

For each message it downloads the media, if any, through the channel
(``load_media_of(ctx, throw_on_error=True)``) and replies ``echo <text> [<n> bytes <sha8>]``,
so the reply proves the bytes came back intact, also on a replay rebuilt from the journal.
A message whose text starts with ``crash-before`` makes the worker SIGKILL itself once, after
the download and before the reply (so does a message with media and no text: a channel whose
media carries no caption, as TikTok's images, cannot say it); ``crash-after``, once, after the
reply went out and before the inbound was marked done. ``$BOTMESH_TEST_CRASH_MARKER`` (a file
prefix) records that each happened. ``$BOTMESH_TEST_HANDLED`` gets one line per handler run:
``<inbound id> <media>`` where ``<media>`` is ``live``, ``rebuilt`` (from the journal's
reference) or ``none``.
"""

from __future__ import annotations

import hashlib
import os
import signal

from botmesh import Bot, Context, load_media_of
from botmesh.errors import MediaUnavailableError
from tests.kafka.marks import append

__all__ = ["bot"]

bot = Bot("channel-e2e")


def _once(what: str) -> bool:
    """True the first time ``what`` is asked for (a marker file remembers it)."""
    prefix = os.environ.get("BOTMESH_TEST_CRASH_MARKER", "")
    if not prefix:
        return False
    marker = f"{prefix}.{what}"
    if os.path.exists(marker):
        return False
    append(marker, "killed")
    return True


@bot.on_message
async def echo(ctx: Context) -> None:
    media = ctx.message.media
    data: bytes | None = None
    note = ""
    if media is not None:
        try:
            data = await load_media_of(ctx, throw_on_error=True)
        except MediaUnavailableError as exc:
            note = f" [media unavailable: {exc.reason}]"
        if data is not None:
            note = f" [{len(data)} bytes {hashlib.sha256(data).hexdigest()[:8]}]"
    how = "none" if media is None else ("rebuilt" if media.ref is not None else "live")
    handled = os.environ.get("BOTMESH_TEST_HANDLED", "")
    if handled:
        append(handled, f"{ctx.inbound_id} {how}")
    text = ctx.text or ""
    crash_before = text.startswith("crash-before") or (media is not None and not text)
    if crash_before and _once("before"):
        os.kill(os.getpid(), signal.SIGKILL)
    await ctx.reply(f"echo {text}{note}")
    if text.startswith("crash-after") and _once("after"):
        os.kill(os.getpid(), signal.SIGKILL)
