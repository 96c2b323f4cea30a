"""One replica of the chat-turn tests: a durable bot on a shared journal (chat turns on, as
by default there), fed inbounds on stdin (run by module, not collected).

    python -m tests.shared._turn_replica BACKEND PATH NAME DIR

Leases are 1 s, the sweeper runs every 100 ms, a turn is waited for up to 5 s. The
handler proves that no two replicas run one chat at once: at entry it creates
``DIR/<chat>.busy`` with ``O_EXCL`` (an existing file is an overlap, appended to
``DIR/overlap.log``), holds for 30 ms, appends ``<replica> <id>`` to ``DIR/handled.log``,
replies, and removes the file. An inbound whose text is ``hold:<this replica>`` prints
``HOLDING <id>`` inside its turn and waits there until the test kills this replica.

stdin commands, one a line:

- ``in <id> <chat> [text]``: handle it in a task of its own (prints ``OUT <id> <outcome>``)
- ``end``: wait for the tasks, sweep until nothing is pending (up to 15 s), print
  ``SUMMARY <json>`` (metrics, the inbox's states) and exit
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from botmesh import Bot, Context, Inbound
from botmesh.state.messages import Outbound, SendResult
from botmesh.state.records import InboxState
from tests.backends import BACKENDS


def _append(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class Channel:
    name = "turns"
    text_limit: int | None = None

    async def send(self, message: Outbound) -> SendResult:
        return SendResult("ok")


def make_bot(folder: Path, replica: str) -> Bot:
    bot = Bot(
        "turns",
        durability={
            "poll": "100ms",
            "inbox": {"lease": "1s", "turn_wait": "5s", "backoff": {"base": "0.05ms", "jitter": 0}},
            "outbox": {"lease": "1s", "backoff": {"base": "0.05ms", "jitter": 0}},
        },
    )

    @bot.on_message
    async def handler(ctx: Context) -> None:
        busy = folder / f"{ctx.chat_id}.busy"
        try:
            fd = os.open(busy, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            _append(folder / "overlap.log", f"{replica} {ctx.inbound_id}")
            fd = -1
        try:
            if ctx.text == f"hold:{replica}":
                print(f"HOLDING {ctx.inbound_id}", flush=True)
                await asyncio.Event().wait()  # until killed
            await asyncio.sleep(0.03)
            _append(folder / "handled.log", f"{replica} {ctx.inbound_id}")
            await ctx.reply(f"{ctx.inbound_id}/a")
        finally:
            if fd >= 0:
                os.close(fd)
                busy.unlink()

    return bot


async def main(backend: str, path: str, name: str, folder: str) -> None:
    kv = await BACKENDS[backend].open(Path(path))
    tasks: set[asyncio.Task[None]] = set()
    async with make_bot(Path(folder), name).bind(Channel(), kv, instance_id=name) as app:
        d = app.durability
        assert d is not None

        async def handle(mid: str, chat: str, text: str) -> None:
            outcome = await app.handle(Inbound(id=mid, chat_id=chat, text=text))
            print(f"OUT {mid} {outcome}", flush=True)

        print("ready", flush=True)
        while True:
            words = (await asyncio.to_thread(sys.stdin.readline)).split()
            if not words or words[0] == "end":
                break
            text = words[3] if len(words) > 3 else ""
            task = asyncio.create_task(handle(words[1], words[2], text))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            await d.drain()
            if all(r.state != InboxState.PENDING for r in await d.inbox.list()):
                break
            await asyncio.sleep(0.1)
        summary = {
            "metrics": d.metrics(),
            "inbox": {r.id: r.state for r in await d.inbox.list()},
        }
    await kv.close()
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
