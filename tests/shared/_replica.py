"""One replica of the several-replicas tests: a durable bot (the in-process runtime) on a
shared journal, fed inbounds on stdin (run by module, not collected).

    python -m tests.shared._replica BACKEND PATH NAME DIR POLICY

NAME is the replica's instance id. Leases are 2 s and the sweeper runs every 100 ms, so a
dead or frozen replica's records are taken over quickly (and a replica the machine's
load keeps off the CPU for a second still renews its leases in time). Every handler run
is appended to ``DIR/handled.log`` and every send the channel accepted to
``DIR/sent.log`` (each line fsynced before the call returns: the channel's own record,
shared by every replica).

stdin commands, one a line:

- ``in <id> <chat>``: handle that inbound (in a task of its own; prints ``OUT <id> <outcome>``)
- ``wait <id>``: print ``DONE <id>`` once the journal has that inbound done (whoever did it)
- ``quiet``: print ``QUIET`` once nothing in the journal is left pending (see ``end``)
- ``end``: wait for the tasks, let the sweeper settle what is left pending (up to
  ``SETTLE_S``: a dead replica's records are due once their leases expired), print ``IDLE``; then,
  at the next line, print ``SUMMARY <json>`` (metrics, errors, the journal's records)

The provider holds a send whose text starts with ``hold:<this replica's name>/``: after the
channel accepted it, it prints ``SENT <text>`` and waits until the file ``DIR/thaw``
exists (forever, if the test kills this replica instead). An inbound's text is the prefix
of its first reply (``in m1 chat hold:r1`` -> reply ``hold:r1/m1/a``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from botmesh import Bot, Context, ErrorEvent, Inbound
from botmesh.state.messages import Outbound, OutboxState, SendResult
from botmesh.state.records import InboxState
from tests.backends import BACKENDS

LEASE = "2s"


def _append(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class ChannelProvider:
    """The fake channel: the only thing faked. Accepts every send, appends it to the log."""

    name = "replicas"
    text_limit: int | None = None

    def __init__(self, folder: Path, replica: str) -> None:
        self.folder = folder
        self.replica = replica

    async def send(self, message: Outbound) -> SendResult:
        text = message.text or ""
        await asyncio.to_thread(_append, self.folder / "sent.log", f"{self.replica} {text}")
        if text.startswith(f"hold:{self.replica}/"):
            print(f"SENT {text}", flush=True)
            while not (self.folder / "thaw").exists():  # noqa: ASYNC110 - a file, no event
                await asyncio.sleep(0.02)
        return SendResult(f"{self.replica}-{text}")


def make_bot(folder: Path, replica: str, policy: str) -> Bot:
    bot = Bot(
        "replicas",
        durability={
            "poll": "100ms",
            "inbox": {"lease": LEASE, "backoff": {"base": "0.05ms", "jitter": 0}},
            "outbox": {
                "lease": LEASE,
                "on_ambiguous": policy,
                "backoff": {"base": "0.05ms", "jitter": 0},
            },
        },
    )

    @bot.on_message
    async def handler(ctx: Context) -> None:
        await asyncio.to_thread(_append, folder / "handled.log", f"{replica} {ctx.inbound_id}")
        first = f"{ctx.text}/" if ctx.text else ""
        await ctx.reply(f"{first}{ctx.inbound_id}/a")
        await ctx.reply(f"{ctx.inbound_id}/b")

    return bot


async def main(backend: str, path: str, name: str, folder: str, policy: str) -> None:
    kv = await BACKENDS[backend].open(Path(path))
    errors: list[str] = []
    bot = make_bot(Path(folder), name, policy)
    bot.on(ErrorEvent, lambda e: errors.append(type(e.error).__name__))
    tasks: set[asyncio.Task[None]] = set()
    async with bot.bind(ChannelProvider(Path(folder), name), kv, instance_id=name) as app:
        d = app.durability
        assert d is not None

        async def handle(mid: str, chat: str, text: str) -> None:
            outcome = await app.handle(Inbound(id=mid, chat_id=chat, text=text))
            print(f"OUT {mid} {outcome}", flush=True)

        async def wait(mid: str) -> None:
            while True:
                record = await d.inbox.get(mid)
                if record is not None and record.state == "done":
                    print(f"DONE {mid}", flush=True)
                    return
                await asyncio.sleep(0.05)

        async def quiet() -> None:
            await settle(d)
            print("QUIET", flush=True)

        print("ready", flush=True)
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            words = line.split()
            if not words or words[0] == "end":
                break
            if words[0] == "in":
                text = words[3] if len(words) > 3 else ""
                task = asyncio.create_task(handle(words[1], words[2], text))
            elif words[0] == "quiet":
                task = asyncio.create_task(quiet())
            else:
                task = asyncio.create_task(wait(words[1]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        await settle(d)
        print("IDLE", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the others are idle too
        summary = {
            "metrics": d.metrics(),
            "errors": errors,
            "outbox": {r.key: r.state for r in await d.outbox.list()},
            "inbox": {r.id: r.state for r in await d.inbox.list()},
        }
    await kv.close()
    print("SUMMARY " + json.dumps(summary), flush=True)


#: The longest ``end`` waits for records still pending to settle (a hang guard: it returns
#: as soon as nothing is pending, a few leases after a kill).
SETTLE_S = 40.0  # below the 60 s the test waits for IDLE


async def settle(d: Any) -> None:
    """Sweep until nothing in the journal is left pending, or ``SETTLE_S`` passed: a record
    a dead replica left is due only once its lease expired, which can be after the inbound
    that holds it was marked done (its inbox lease, taken first, expires first)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        await d.drain()
        outbox = await d.outbox.list()
        inbox = await d.inbox.list()
        left = [r for r in outbox if r.state in (OutboxState.PENDING, OutboxState.FAILED)]
        left += [r for r in inbox if r.state == InboxState.PENDING]
        if not left or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
