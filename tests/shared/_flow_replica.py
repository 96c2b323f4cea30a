"""One replica of the shared-journal flow kill test (``tests/shared/test_flow_replicas.py``):
the five-question flow of ``tests/kafka/flow_bot.py`` in the in-process runtime on a
shared journal, fed inbounds on stdin (run by module, not collected).

    python -m tests.shared._flow_replica BACKEND PATH NAME DIR

NAME is the replica's instance id. Leases are 1 s and the sweeper runs every 100 ms, so a
dead replica's records are taken over soon. The channel (``Channel``, the one thing faked)
appends every send it accepts to ``DIR/sent.log`` as one JSON line ``{"replica", "key",
"chat", "text"}`` (fsynced before the call returns: the channel's own record, shared by
the replicas), waiting ``DELAY`` s before and after, so that a SIGKILL lands inside sends;
it answers whether an ambiguous key is in that log (``botmesh.state.ports.AmbiguityResolver``), so
``on_ambiguous="skip"`` never has to guess. It prints ``SENDING <key>`` as a call starts
(the test's moment to kill), and the delivery's log lines (``botmesh.delivery`` at INFO:
one per answer about an ambiguous send).

stdin commands, one a line:

- ``in <id> <chat> <text>``: handle that inbound (a task of its own; prints ``OUT <id>
  <outcome>``, or ``ERR <id> <error>`` when ``handle`` raised)
- ``wait <id>``: print ``DONE <id>`` once the journal has that inbound done (whoever did it)
- ``end``: wait for the tasks, sweep until nothing is pending, print ``IDLE``; at the next
  line print ``SUMMARY <json>`` (metrics, errors, the journal's inbox, outbox and flows)
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from botmesh import Bot, ErrorEvent, Inbound
from botmesh.state.messages import Outbound, SendResult
from tests.backends import BACKENDS
from tests.kafka import flow_bot
from tests.shared._replica import settle

LEASE = "1s"
DELAY = 0.05


def _append(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _find(path: Path, key: str) -> dict[str, Any] | None:
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        record: dict[str, Any] = json.loads(line)
        if record["key"] == key:
            return record
    return None


class Channel:
    """The fake channel: accepts every keyed send into the shared log, and can tell
    whether a key is there."""

    name = "flow-replicas"
    text_limit: int | None = None

    def __init__(self, folder: Path, replica: str) -> None:
        self.log = folder / "sent.log"
        self.replica = replica

    async def send(self, message: Outbound) -> SendResult:
        raise AssertionError("the core sends keyed (send_keyed) to this channel")

    async def send_keyed(self, message: Outbound, key: str) -> SendResult:
        print(f"SENDING {key}", flush=True)
        await asyncio.sleep(DELAY)
        line = {"replica": self.replica, "key": key, "chat": message.chat_id, "text": message.text}
        await asyncio.to_thread(_append, self.log, json.dumps(line))
        await asyncio.sleep(DELAY)
        return SendResult(f"{self.replica}-{key}")

    async def resolve_ambiguous(
        self, message: Outbound, key: str, since: float
    ) -> SendResult | None:
        found = await asyncio.to_thread(_find, self.log, key)
        return None if found is None else SendResult(f"{found['replica']}-{key}")


def make_bot() -> Bot:
    """The flow bot of the Kafka test, with 1 s leases and a 100 ms sweeper."""
    bot = Bot(
        "flow-replicas",
        durability={
            "poll": "100ms",
            "inbox": {"lease": LEASE, "max_attempts": 20, "backoff": {"base": "50ms", "jitter": 0}},
            "outbox": {
                "lease": LEASE,
                "on_ambiguous": "skip",
                "backoff": {"base": "50ms", "jitter": 0},
            },
        },
    )
    bot.flow("five", persistent=True)(flow_bot.five_questions)
    bot.on_message(flow_bot.start)
    return bot


async def main(backend: str, path: str, name: str, folder: str) -> None:
    # the delivery's answers about ambiguous sends, one line each (counted by the test)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("botmesh.delivery").setLevel(logging.INFO)
    kv = await BACKENDS[backend].open(Path(path))
    errors: list[str] = []
    bot = make_bot()
    bot.on(ErrorEvent, lambda e: errors.append(f"{e.where}: {type(e.error).__name__}"))
    tasks: set[asyncio.Task[None]] = set()
    async with bot.bind(Channel(Path(folder), name), kv, instance_id=name) as app:
        d = app.durability
        assert d is not None

        async def handle(mid: str, chat: str, text: str) -> None:
            try:
                outcome = await app.handle(Inbound(id=mid, chat_id=chat, text=text))
            except Exception as exc:
                print(f"ERR {mid} {type(exc).__name__}", flush=True)
                return
            print(f"OUT {mid} {outcome}", flush=True)

        async def wait(mid: str) -> None:
            while True:
                record = await d.inbox.get(mid)
                if record is not None and record.state == "done":
                    print(f"DONE {mid}", flush=True)
                    return
                await asyncio.sleep(0.05)

        print("ready", flush=True)
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            words = line.split()
            if not words or words[0] == "end":
                break
            if words[0] == "in":
                task = asyncio.create_task(handle(words[1], words[2], words[3]))
            else:
                task = asyncio.create_task(wait(words[1]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        await settle(d)
        print("IDLE", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        summary = {
            "metrics": d.metrics(),
            "errors": errors,
            "outbox": {r.key: r.state for r in await d.outbox.list()},
            "inbox": {r.id: r.state for r in await d.inbox.list()},
            "flows": {f.chat_id: [f.status, f.steps] for f in await d.flows()},
        }
    await kv.close()
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
