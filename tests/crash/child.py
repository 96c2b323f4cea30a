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

from botmesh import Bot, Inbound
from state.messages import Outbound, SendResult
from tests.backends import BACKENDS


class LoggingProvider:
    name = "child"
    text_limit = None

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


async def main(backend: str, path: str, log: str, mode: str, policy: str) -> None:
    kv = await BACKENDS[backend].open(Path(path))
    bot = Bot(
        LoggingProvider(Path(log), mode == "hang-after-send"),
        bot_id="kill",
        durability={
            "backend": kv,
            "instance_id": "k1",
            "poll": 0,
            "outbox": {"on_ambiguous": policy},
        },
    )

    @bot.on_message
    async def handler(ctx):  # type: ignore[no-untyped-def]
        await ctx.reply("a")
        if mode == "hang-in-handler":
            print("IN_HANDLER", flush=True)
            await asyncio.sleep(3600)
        await ctx.reply("b")

    await bot.start()  # recovery: replays what the killed process left
    await bot.handle(Inbound("m1", "chat", "hi"))  # the channel redelivers
    d = bot.durability
    assert d is not None
    await d.drain()
    summary = {
        "metrics": d.metrics(),
        "outbox": {r.key: r.state for r in await d.outbox.list()},
        "inbox": {r.id: [r.state, r.attempts] for r in await d.inbox.list()},
    }
    print(json.dumps(summary), flush=True)
    await bot.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
