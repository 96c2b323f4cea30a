"""The ops console on a large journal: how long its index takes to read 100,000 journal
records, and then how long a chat's timeline takes to come back over HTTP.

    .venv/bin/python bench/bench_console.py [--records 100000] [--chats N] [--lookups 30]
                                            [--keep]

Target (issue 29): with a journal of 100,000 records indexed, a chat's timeline in under a
second. A benchmark, not a timed test: it prints the figures and PASS or MISS.

1. The broker: ``KAFKA_BOOTSTRAP_SERVERS`` when set; else a single node of
   ``deploy/kafka/kafka.sh`` of its own, on two free ports (``KAFKA_PORT``,
   ``KAFKA_CONTROLLER_PORT``) and a temporary data dir (``KAFKA_DATA_DIR``), stopped and
   deleted at the end; it never touches a broker already running.
2. Seed, straight to the topics (no worker), in a child process (so that the RSS read
   below is the console's): ``--records`` journal records on
   ``<prefix>.worker-journal-changelog``, half inbound records (``done``) and half their
   replies (``sent``, with a provider message id): one message in 20 to one busy chat
   (``chat-hot``: 5,000 journal records of 100,000), the others over ``--chats`` chats
   (default records / 100: about 48 messages and 48 replies a chat), encoded as the worker
   encodes them (``encode_entry`` of the journal's records, a purge score 7 days on), each
   in its chat's partition (murmur2 of the chat key, as the worker keys them); a receipt on
   ``<prefix>.sent`` for every reply (``encode_receipt``). Batches of 1 MB, acks=all (the
   producer of ``bench/bench_scale.py``).
3. Index: ``botmesh.console.Console`` (what ``botmesh console`` serves) started on
   127.0.0.1 and a free port, in this process; the time from its start until its
   follower has read every topic to its end, and the records per second; the process's RSS
   (``VmRSS``) before the console started and once the index is whole.
4. Lookup: ``GET /timeline?chat_id=<chat>`` over HTTP (one aiohttp connection, the page
   read whole) for ``--lookups`` chats spread over the range, each twice (the first
   request of a chat, and again); the median and the slowest, and their ratio to 1 s; then
   the busy chat's timeline the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from bench.bench_scale import delete_topics, partition_of, produce, vm_mib  # noqa: E402
from bench.bench_worker import KAFKA_SH, PARTITIONS  # noqa: E402
from botmesh.console import Console, ConsoleConfig, serving  # noqa: E402
from botmesh.state.keys import scope_id  # noqa: E402
from botmesh.state.kv import Entry  # noqa: E402
from botmesh.state.messages import Inbound, OutboxState, Receipt  # noqa: E402
from botmesh.state.records import encode_inbound  # noqa: E402
from botmesh.streams.journal_db import encode_entry  # noqa: E402
from botmesh.streams.provision import ensure_topics  # noqa: E402
from botmesh.streams.table_kv import changelog_topic  # noqa: E402
from botmesh.topics import Catalog, chat_key, encode_receipt  # noqa: E402

TARGET_S = 1.0
DAY = 86400.0
SCOPE = scope_id("default", "default", "bench-console", "default")
#: The busy chat, and one message in how many goes to it.
HOT, HOT_EVERY = "chat-hot", 20


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# -- the broker -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def broker() -> Iterator[str]:
    """``KAFKA_BOOTSTRAP_SERVERS``, else a broker of our own on free ports (stopped after)."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if given:
        yield given
        return
    data = Path(tempfile.mkdtemp(prefix="bench-console-kafka-"))
    port, controller = free_port(), free_port()
    env = {
        **os.environ,
        "KAFKA_PORT": str(port),
        "KAFKA_CONTROLLER_PORT": str(controller),
        "KAFKA_DATA_DIR": str(data),
    }
    print(f"broker: deploy/kafka/kafka.sh on 127.0.0.1:{port} (controller {controller}), {data}")
    try:
        subprocess.run([str(KAFKA_SH), "start"], env=env, check=True)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(KAFKA_SH), "stop"], env=env, check=False)
        shutil.rmtree(data, ignore_errors=True)


# -- the seed ---------------------------------------------------------------------------------


def chat_records(
    cat: Catalog, chat: str, n: int, i: int, ts: float
) -> tuple[int, list[tuple[bytes, bytes]], tuple[bytes, bytes]]:
    """The journal records of the ``n``-th message of ``chat`` (global index ``i``) and its
    reply, and the reply's receipt: (partition, [(key, value)], (key, receipt))."""
    mid = f"b-{i}"
    key = f"{mid}:1"
    part = partition_of(chat)
    message = Inbound(
        id=mid, chat_id=chat, text=f"message {n} of {chat}", sender="u", channel="bench", ts=ts
    )
    purge = ts + 7 * DAY
    inbound = {
        "id": mid,
        "state": "done",
        "attempts": 1,
        "token": 1,
        "message": encode_inbound(message),
        "created": ts,
        "updated": ts + 0.002,
        "source": f"{cat.inbound}:{part}:{i}",
    }
    reply = {
        "key": key,
        "state": "sent",
        "attempts": 1,
        "token": 1,
        "payload": {"chat_id": chat, "text": f"echo: message {n} of {chat}"},
        "fp": uuid.uuid4().hex,
        "inbound_id": mid,
        "message_id": f"prov-{i}",
        "created": ts + 0.001,
        "updated": ts + 0.002,
        "published": True,
    }
    records = [
        (
            f"{SCOPE}/in/{mid}".encode(),
            encode_entry(Entry(f"{SCOPE}/in/{mid}", inbound, 3, None, purge)),
        ),
        (
            f"{SCOPE}/out/{key}".encode(),
            encode_entry(Entry(f"{SCOPE}/out/{key}", reply, 3, None, purge)),
        ),
    ]
    receipt = Receipt(
        key=key,
        chat_id=chat,
        message_id=f"prov-{i}",
        state=OutboxState.SENT,
        inbound_id=mid,
        ts=ts + 0.003,
    )
    return part, records, (chat_key(chat), encode_receipt(receipt))


async def seed(bootstrap: str, cat: Catalog, records: int, chats: int) -> tuple[int, int, float]:
    """Produce the journal and the receipts; (journal records, receipts, seconds)."""
    messages = records // 2
    now = time.time()
    journal: list[tuple[int, bytes, bytes, tuple[tuple[str, bytes], ...]]] = []
    receipts: list[tuple[int, bytes, bytes, tuple[tuple[str, bytes], ...]]] = []
    header = (("botmesh.writer", b"bench@1"),)
    per_chat: collections.Counter[str] = collections.Counter()
    for i in range(messages):
        hot = i % HOT_EVERY == 0
        chat = HOT if hot else f"chat-{(i - i // HOT_EVERY - 1) % chats}"
        per_chat[chat] += 1
        ts = now - DAY + DAY * i / max(messages, 1)
        part, pairs, (rkey, rvalue) = chat_records(cat, chat, per_chat[chat], i, ts)
        journal += [(part, k, v, header) for k, v in pairs]
        receipts.append((part, rkey, rvalue, ()))
    t0 = time.monotonic()
    n_journal, _ = await produce(bootstrap, changelog_topic(cat), iter(journal))
    n_receipts, _ = await produce(bootstrap, cat.sent, iter(receipts))
    return n_journal, n_receipts, time.monotonic() - t0


# -- the console ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lookup:
    chat: str
    seconds: float
    size: int


async def lookups(url: str, chats: Sequence[str]) -> list[Lookup]:
    out = []
    async with aiohttp.ClientSession() as session:
        for chat in chats:
            for _ in range(2):  # the first request of the chat, and again
                t0 = time.perf_counter()
                async with session.get(f"{url}/timeline", params={"chat_id": chat}) as r:
                    body = await r.read()
                    took = time.perf_counter() - t0
                    if r.status != 200 or b'data-testid="timeline-entry"' not in body:
                        raise SystemExit(f"/timeline?chat_id={chat}: {r.status}, no entries")
                out.append(Lookup(chat, took, len(body)))
    return out


async def run(bootstrap: str, plan: argparse.Namespace) -> int:
    cat = Catalog(f"benchcon{uuid.uuid4().hex[:6]}")
    chats = plan.chats or max(1, plan.records // 100)
    ensure_topics(bootstrap, cat.specs(partitions=PARTITIONS))
    try:
        seeded = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                __file__,
                "--seed",
                bootstrap,
                cat.prefix,
                str(plan.records),
                str(chats),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        print(seeded.stdout.strip())
        before = vm_mib(os.getpid(), "VmRSS")
        console = Console(ConsoleConfig(bootstrap=bootstrap, prefix=cat.prefix))
        t0 = time.monotonic()
        async with serving(console, "127.0.0.1", 0) as url:
            while not console.follower.at_end():
                if time.monotonic() - t0 > 600:
                    raise SystemExit(
                        f"the index is not at the end after 600 s: {console.follower.progress()}"
                    )
                await asyncio.sleep(0.05)
            index_s = time.monotonic() - t0
            read = sum(console.index.read.values())
            rss = vm_mib(os.getpid(), "VmRSS")
            print(
                f"index: {read:,} records ({console.index.read[changelog_topic(cat)]:,} "
                f"journal) in {index_s:.2f} s, {read / index_s:,.0f} records/s; "
                f"{console.index.chats:,} chats; RSS {before:.0f} MiB before, {rss:.0f} MiB "
                "with the index"
            )
            step = max(1, chats // plan.lookups)
            picked = [f"chat-{k}" for k in range(0, chats, step)][: plan.lookups]
            found = await lookups(url, picked)
            hot = await lookups(url, [HOT])
    finally:
        if not plan.keep:
            await delete_topics(bootstrap, cat.prefix)
    times = [x.seconds for x in found]
    median, worst = statistics.median(times), max(times)
    size = statistics.median(x.size for x in found)
    print(
        f"timeline: {len(found)} requests over {len(picked)} chats (~{plan.records // chats} "
        f"journal records each, pages of {size / 1024:.0f} KiB): median {median * 1000:.1f} ms, "
        f"slowest {worst * 1000:.1f} ms"
    )
    hot_s = max(x.seconds for x in hot)
    hot_n = console.index.read[changelog_topic(cat)] // HOT_EVERY
    print(
        f"the busy chat ({hot_n:,} journal records, a page of {hot[0].size / 1024:.0f} KiB): "
        f"{', '.join(f'{x.seconds * 1000:.0f} ms' for x in hot)}"
    )
    print(
        f"ratio to the {TARGET_S:.0f} s target: median {median / TARGET_S:.3f}, slowest "
        f"{worst / TARGET_S:.3f}, the busy chat {hot_s / TARGET_S:.3f}  "
        f"{verdict(max(worst, hot_s) < TARGET_S)}"
    )
    return 0  # a miss is printed, as the other benchmarks do; not an error


def seed_main(bootstrap: str, prefix: str, records: int, chats: int) -> int:
    """The child process of step 2."""
    n_journal, n_receipts, took = asyncio.run(seed(bootstrap, Catalog(prefix), records, chats))
    print(
        f"seeded {n_journal:,} journal records and {n_receipts:,} receipts over {chats:,} "
        f"chats in {took:.1f} s"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args_ = list(sys.argv[1:] if argv is None else argv)
    if args_[:1] == ["--seed"]:
        _, bootstrap, prefix, records, chats = args_
        return seed_main(bootstrap, prefix, int(records), int(chats))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=100_000, help="journal records")
    parser.add_argument("--chats", type=int, help="chats (default records / 100)")
    parser.add_argument("--lookups", type=int, default=30, help="chats whose timeline is read")
    parser.add_argument("--keep", action="store_true", help="keep the topics")
    args = parser.parse_args(args_)
    if args.records < 2 or args.lookups < 1:
        parser.error("--records must be >= 2 and --lookups >= 1")
    t0 = time.monotonic()
    try:
        with broker() as bootstrap:
            return asyncio.run(run(bootstrap, args))
    finally:
        print(f"(took {time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
