"""The child process of the SIGKILL tests: a durable bot on a persistent journal.

``python -m tests.crash.child BACKEND PATH LOG MODE POLICY``; MODE is ``hang-in-handler``
(reply "a", print IN_HANDLER, hang), ``hang-after-send`` (the provider accepts "a", prints
SENT and hangs before the result is recorded) or ``recover`` (start, take the redelivery,
settle, print a JSON summary). Every accepted send is appended (fsynced) to LOG.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from botmesh import Bot, Context, Inbound
from botmesh.state.messages import Outbound, SendResult
from tests.backends import BACKENDS


class LoggingProvider:
    name = "child"
    text_limit: int | None = None

    def __init__(self, log: Path, hang_after_send: bool) -> None:
        self.log = log
        self.hang_after_send = hang_after_send

    async def send(self, message: Outbound) -> SendResult:
        # a blocking, fsynced append on purpose: the line must be on disk before we return
        with open(self.log, "a") as f:  # noqa: ASYNC230
            f.write(f"{message.text}\n")
            f.flush()
            os.fsync(f.fileno())
        if self.hang_after_send and message.text == "a":
            print("SENT", flush=True)
            await asyncio.sleep(3600)
        return SendResult(f"child-{os.getpid()}-{message.text}")


def make_bot(mode: str, policy: str) -> Bot:
    bot = Bot("kill", durability={"poll": 0, "outbox": {"on_ambiguous": policy}})

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await ctx.reply("a")
        if mode == "hang-in-handler":
            print("IN_HANDLER", flush=True)
            await asyncio.sleep(3600)
        await ctx.reply("b")

    return bot


async def main(backend: str, path: str, log: str, mode: str, policy: str) -> None:
    kv = await BACKENDS[backend].open(Path(path))
    provider = LoggingProvider(Path(log), mode == "hang-after-send")
    bot = make_bot(mode, policy)
    async with bot.bind(provider, kv, instance_id="k1") as app:
        # start() recovered what the killed process left; now the channel redelivers
        await app.handle(Inbound(id="m1", chat_id="chat", text="hi"))
        d = app.durability
        assert d is not None
        await d.drain()
        summary = {
            "metrics": d.metrics(),
            "outbox": {r.key: r.state for r in await d.outbox.list()},
            "inbox": {r.id: [r.state, r.attempts] for r in await d.inbox.list()},
            "message_ids": {r.key: r.message_id for r in await d.outbox.list()},
            # the message log, newest first: [key, message id]
            "log": [[m.key, m.message_id] for m in await bot.messages("chat")],
        }
    await kv.close()
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
