"""The durable worker against bare baselines, same broker, same records, one run.

    .venv/bin/python bench/bench_worker.py [--quick] [--journal default|file|URL[@LEVEL]]...
                                           [-n N] [--rounds R] [--batch-size 500] [--keep]
                                           [--no-quix]
    .venv/bin/python bench/bench_worker.py --profile [-n N] [--journal ...]   under cProfile
    .venv/bin/python bench/bench_worker.py --restart-only K [--journal ...]   phase 3 only

``--quick`` takes about a minute and a half (N=4000, one round), the default a few minutes
(N=15000, three rounds, more restarts and chat counts). Every side consumes its own
4-partition input topic (records of ~200 B of JSON keyed by chat id, 50 chats or
``--chats``) and produces
one record per input with acks=all, in a child process:

- ``confluent``: a bare consume->produce loop on confluent-kafka, the client (librdkafka)
  the worker runs on (take what has come, up to 1,000 records -> ``produce`` each -> ``flush``:
  wait for the acks -> ``commit``), no decoding, no journal (``bench/_worker_baselines.py``);
- ``quix``: what a user would pick instead of botmesh, a stateful Quix Streams application
  (``bench/quix_side.py``, in its own venv ``.venv-quix``: ``make quix-venv``; quixstreams
  cannot share botmesh's confluent-kafka): per record, a stateful filter drops it if its
  ``id`` is in the Quix State of its key (RocksDB, backed by Quix's changelog topic), else
  stores the id, and a reply (JSON) is produced; at Quix's defaults: at-least-once, a
  checkpoint every 5 s (offsets, state and changelog), changelog topics on, the idempotent
  producer, plus acks=all, and ``auto_offset_reset="earliest"`` like the others. Its
  changelog is written at the checkpoint, after the replies: the throughput clock stops
  before most of it, so its CPU is also read after its next checkpoint. Without
  ``.venv-quix`` the bench stops with an error; ``--no-quix`` skips the side (and the ratio);
- ``worker``: ``botmesh worker --app botmesh.examples.echo_bot:bot --provider mock --instance-id
...``
  (``python -m botmesh``, as a user runs it, at its default log level) on the journal of
  ``--journal`` (one worker side per value, all in the same run): ``default`` (no option:
  the worker's default journal), ``file`` (a file journal with an append log in its data
  dir, the default before the journal on Kafka) or a URL; ``@LEVEL`` adds ``--loglevel``,
  ``+eos`` (before ``@LEVEL``) runs that worker ``exactly_once`` (``--guarantee``),
  ``+metrics`` serves ``/metrics`` (``--http-port 0``: its histograms fed on the hot path)
  and ``+json`` logs JSON (``BOTMESH_LOG_FORMAT=json``); a side with either is compared
  with the same worker without them in the same run (CPU per record, target a cost under
  5 %): ``--journal default --journal default+metrics+json``;
  ``unjournaled`` runs the worker on an in-memory journal, which the worker itself refuses
  (throughput and latency only): what a record costs around the journal (the consumer, the
  engine, the receipt), to tell the journal's share from the rest. Per record: inbound
  journaled, handler, send journaled before the mock provider is called and recorded
  after, receipt produced to ``<prefix>.sent`` and recorded published, inbound marked done;
- ``exactly_once``: ``--journal default --journal default+eos`` runs the worker under
  both guarantees in the same run, and prints the per-round median of exactly_once /
  at_least_once (target >= 0.85).

Every worker side runs the worker's runtime on librdkafka (``botmesh/streams/worker/``): its
environment is the bench's without any ``BOTMESH_`` variable. ``+rd``, which picked that
runtime when Faust's was the default, is still accepted and changes nothing.

Figures (ratios matter: the machine is noisy; every side runs in the same run):

1. throughput, records/s: each side warmed (one record through it), then N records (4N for
   the confluent loop and quix, so that their runs are not blips) produced at once; the clock
   runs from the first send to the last output record seen. ``--rounds`` rounds, sides interleaved;
   the median per side and of the per-round ratios worker/confluent (target >= 0.5) and
   worker/quix (an at_least_once worker: target >= 1).
   Per record: CPU of the child (all its threads: librdkafka's count) and of the broker (when
   it is the local ``kafka.sh`` one), from /proc, and the records each side wrote to its
   topics per inbound (a worker: receipts, changelog; quix: replies and its changelog,
   counted after its next checkpoint, when its CPU is read again, so that the state it
   writes there is in);
2. added latency: records paced at half the first worker's median rate, p50/p99/max from the
   send call to the output record (for a worker: the receipt) seen by the bench's consumer,
   every side at the same rate, and each side's minus the confluent loop's;
3. restart to first reply: SIGKILL a worker (a static group member: ``--instance-id``) while
   records trickle in (50/s), restart it with the same command, and time from the restart
   (and from the kill) to the first receipt the new process produced (target <= 5 s); then
   check that every trickled record got its receipt. A worker on the journal on Kafka is
   also restarted once on an empty data dir (its journal restored from the changelog);
4. a 50 ms provider (``bench._worker_baselines:slow_provider``): throughput against in-flight
   limit / latency, for a few chat counts. The worker's in-flight limit: its batches run
   side by side, their chats concurrently and each chat's records one after the other, with
   at most ``BOTMESH_IN_FLIGHT`` (1,000) records taken and not settled, so at most
   min(1,000, chats) sends are in flight; a ratio under 1 means each slot is held longer
   than the provider call (journal writes, batch boundaries), and the time a chat's record
   took is printed.

``--profile`` runs only a worker, in-process under ``cProfile`` (``bench/_worker_baselines.py
profile``), for N records, and prints where the time goes: by package, and the top functions
with calls, own and cumulative microseconds per record (cProfile counts every resumption of a
coroutine as a call; the wait in ``epoll`` is idle time; threads, such as the file journal's
fsyncs, are not profiled).

The bench's own clients (its producer, the consumers that tail the output topics, the end
offsets) are confluent-kafka's too.

Broker: ``KAFKA_BOOTSTRAP_SERVERS``, else the local Kafka of ``deploy/kafka/kafka.sh``
(``KAFKA_PORT``, ``KAFKA_DATA_DIR``; started and stopped here if it is not running).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]  # noqa: E402

from botmesh.state.errors import BadRecord  # noqa: E402
from botmesh.state.messages import Inbound  # noqa: E402
from botmesh.streams.config import KAFKA_JOURNAL, WorkerConfig  # noqa: E402
from botmesh.streams.provision import ensure_topics  # noqa: E402
from botmesh.topics import Catalog, chat_key, encode_inbound  # noqa: E402
from botmesh.topics.dead_letters import redact  # noqa: E402
from botmesh.topics.records import decode_inbound, decode_receipt  # noqa: E402

KAFKA_SH = REPO / "deploy" / "kafka" / "kafka.sh"
BASELINES = REPO / "bench" / "_worker_baselines.py"
QUIX_SIDE = REPO / "bench" / "quix_side.py"
#: The interpreter of the Quix side's own virtualenv (``make quix-venv``).
QUIX_PYTHON = REPO / ".venv-quix" / "bin" / "python"
PARTITIONS = 4
CHATS = 50
#: What the records are spread over this run (``--chats``).
SPREAD = {"chats": CHATS}
RECORD_BYTES = 200
PROVIDER_DELAY = 0.05
#: The worker's default ``BOTMESH_IN_FLIGHT``: records taken and not settled at most.
IN_FLIGHT = 1000
START_TIMEOUT = 120.0
TARGET_VS_LOOP = 0.5
TARGET_VS_QUIX = 1.0
#: Quix's default ``commit_interval``, s: offsets, state and changelog written so often
QUIX_CHECKPOINT = 5.0
TARGET_RESTART = 5.0
#: ``--journal unjournaled``: the worker on an in-memory journal (refused by the worker
#: itself; ``bench/_worker_baselines.py unjournaled``), throughput and latency only.
UNJOURNALED = "unjournaled"
#: The bot every worker side runs.
APP = "botmesh.examples.echo_bot:bot"
#: The baseline sides, by name: the bare confluent-kafka loop, the Quix Streams app.
LOOP = "confluent"
QUIX = "quix"
#: Target of worker/baseline, records/s (for quix: an at_least_once worker's).
TARGETS = {LOOP: TARGET_VS_LOOP, QUIX: TARGET_VS_QUIX}
#: Added to every child's environment (``child_env`` drops every ``BOTMESH_`` variable of
#: the bench's own first).
WORKER_ENV: dict[str, str] = {}


# -- records --------------------------------------------------------------------------------


def record(run: str, i: int, chats: int | None = None) -> tuple[str, bytes, bytes]:
    """Inbound record ``run-i`` of ~200 B in chat ``run-chat-<i % chats>`` (``--chats`` by
    default): (id, key, value)."""
    chats = chats or SPREAD["chats"]
    chat, rid = f"{run}-chat-{i % chats}", f"{run}-{i}"
    bare = encode_inbound(Inbound(chat_id=chat, id=rid, text="x", sender="bench", channel="b"))
    text = "x" * (1 + max(0, RECORD_BYTES - len(bare)))
    rec = Inbound(chat_id=chat, id=rid, text=text, sender="bench", channel="b")
    return rid, chat_key(chat), encode_inbound(rec)


def records(n: int, run: str, chats: int | None = None) -> list[tuple[str, bytes, bytes]]:
    return [record(run, i, chats) for i in range(n)]


def copied_id(value: bytes | None) -> str:
    return decode_inbound(value).id


def receipt_id(value: bytes | None) -> str:
    return decode_receipt(value).inbound_id or ""


def reply_id(value: bytes | None) -> str:
    """The inbound id a Quix side's reply answers (``in_reply_to``), "" if unreadable."""
    try:
        rid = json.loads(value or b"null")["in_reply_to"]
    except (ValueError, TypeError, KeyError):
        return ""
    return rid if isinstance(rid, str) else ""


# -- processes ------------------------------------------------------------------------------


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a live process (all its threads), 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker() -> tuple[str, bool, int | None]:
    """(bootstrap, started here, broker pid when it is the local kafka.sh one)."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if env:
        return env, False, None
    bootstrap = f"127.0.0.1:{os.environ.get('KAFKA_PORT', '9092')}"
    running = subprocess.run([str(KAFKA_SH), "status"], capture_output=True, check=False)
    started = running.returncode != 0
    if started:
        subprocess.run([str(KAFKA_SH), "start"], check=True)
    data = Path(os.environ.get("KAFKA_DATA_DIR", str(REPO / "deploy/kafka/.run/single")))
    try:
        pid: int | None = int((data.resolve() / "kafka.pid").read_text().strip())
    except (OSError, ValueError):
        pid = None
    return bootstrap, started, pid


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOTMESH_")}
    return {**env, "PYTHONUNBUFFERED": "1", "BOTMESH_CONSOLE_QUIET": "1", **WORKER_ENV, **extra}


def worker_command(*options: str, app: str = APP) -> list[str]:
    """``python -m botmesh worker --app APP OPTIONS``: the worker as a user runs it."""
    return [sys.executable, "-m", "botmesh", "worker", "--app", app, *options]


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a child the bench started, SIGKILL it after 60 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, cwd=REPO, env=env or child_env(), stdout=out, stderr=subprocess.STDOUT
        )


def log_tail(log: Path, lines: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- Kafka: confluent-kafka clients -------------------------------------------------------


@functools.cache
def admin_client(bootstrap: str) -> AdminClient:
    """One admin client per broker for the whole run (thread-safe; made once, not per call)."""
    return AdminClient({"bootstrap.servers": bootstrap})


def partitions_of(
    bootstrap: str, topic: str, want: int = PARTITIONS, within: float = 10.0
) -> list[int]:
    """The partitions of ``topic`` the broker lists; asked again for up to ``within`` s while
    fewer than ``want`` (a topic just created: its metadata can lag a moment)."""
    admin = admin_client(bootstrap)
    deadline = time.monotonic() + within
    while True:
        listed = admin.list_topics(topic, timeout=10.0).topics.get(topic)
        parts = sorted(listed.partitions) if listed is not None and listed.error is None else []
        if len(parts) >= want or time.monotonic() >= deadline:
            return parts
        time.sleep(0.1)


def high_watermarks(
    bootstrap: str, tps: Sequence[tuple[str, int]], within: float = 30.0
) -> dict[tuple[str, int], int]:
    """(topic, partition) -> its high watermark: the end of everything written, committed or
    not (``read_uncommitted``), as the sum of a side's writes wants it. A partition whose
    leader is not there yet (a topic just created) is asked again for up to ``within`` s."""
    admin = admin_client(bootstrap)
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    deadline = time.monotonic() + within
    ends: dict[tuple[str, int], int] = {}
    asked = [TopicPartition(t, p) for t, p in tps]
    while asked:
        futures = admin.list_offsets(dict.fromkeys(asked, latest), request_timeout=within)
        failed: list[tuple[TopicPartition, Exception]] = []
        for tp, future in futures.items():
            try:
                ends[(tp.topic, tp.partition)] = int(future.result(within).offset)
            except Exception as exc:
                failed.append((tp, exc))
        if failed and (
            not all(leader_moving(e) for _, e in failed) or time.monotonic() >= deadline
        ):
            tp, refused = failed[0]
            raise SystemExit(f"end offset of {tp.topic} partition {tp.partition}: {refused}")
        asked = [tp for tp, _ in failed]
        if asked:
            time.sleep(0.1)
    return ends


#: Errors an end offset asked again a moment later gets past (a topic just created).
_LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)


def leader_moving(exc: BaseException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and (err.retriable() or err.code() in _LEADER_MOVING)


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> high watermark of ``topic``."""

    def ask() -> dict[int, int]:
        parts = partitions_of(bootstrap, topic)
        ends = high_watermarks(bootstrap, [(topic, p) for p in parts])
        return {p: end for (_, p), end in ends.items()}

    return await asyncio.to_thread(ask)


#: Keyed records partitioned as Java's clients, the gateway and the worker do
#: (murmur2 of the key); librdkafka's own default (``consistent_random``, CRC32) differs.
PARTITIONER = {"partitioner": "murmur2_random"}


class Sender:
    """The bench's producer (acks=all, linger 5 ms, keys by murmur2): ``produce`` queues a
    record, ``flush`` waits for every ack so far (in a thread; a failed delivery ends the
    run)."""

    def __init__(self, bootstrap: str) -> None:
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **PARTITIONER}
        )
        self._failed: list[KafkaError] = []

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._failed.append(err)

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, on_delivery=self._delivered)
                break
            except BufferError:  # the local queue is full: serve the acks first
                self._producer.poll(0.05)
        self._producer.poll(0)

    async def flush(self) -> None:
        left = await asyncio.to_thread(self._producer.flush, 60.0)
        if left:
            raise SystemExit(f"bench producer: {left} records not acked within 60 s")
        if self._failed:
            raise SystemExit(f"bench producer: a delivery failed: {self._failed[0]}")

    def close(self) -> None:
        self._producer.flush(10.0)


def take(consumer: Consumer, most: int, timeout: float) -> list[Message]:
    """What the consumer has, up to ``most`` records, as soon as there is one;
    ``consume(most, timeout)`` alone waits out ``timeout`` unless ``most``
    came, which would add up to ``timeout`` to every record's latency."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(most - 1, 0)]


# -- output topics --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Seen:
    at: float  # monotonic, when the bench's consumer got it
    ts: float  # the record's timestamp (the producing process's wall clock), seconds
    id: str  # the inbound id it answers


class Tail:
    """Reads one output topic from its end for the whole run (a confluent-kafka consumer in
    a thread of its own, ``read_uncommitted``, no group); ``seen`` grows."""

    def __init__(self, bootstrap: str, topic: str, decode: Callable[[bytes | None], str]):
        self.bootstrap, self.topic, self.decode = bootstrap, topic, decode
        self.seen: list[Seen] = []
        self.changed = asyncio.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        start = await end_offsets(self.bootstrap, self.topic)
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"bench-tail-{uuid.uuid4().hex[:8]}",  # never joined: assigned
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",
                "fetch.wait.max.ms": 50,
            }
        )
        consumer.assign([TopicPartition(self.topic, p, start[p]) for p in sorted(start)])
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, args=(consumer, loop), name=f"tail {self.topic}", daemon=True
        )
        self._thread.start()

    def _run(self, consumer: Consumer, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while not self._stop.is_set():
                batch = take(consumer, 5000, 0.1)
                now = time.monotonic()
                got = False
                for m in batch:
                    if m.error() is not None:  # end of a partition, a broker hiccup: read on
                        continue
                    try:
                        rid = self.decode(m.value())
                    except BadRecord:
                        rid = ""
                    self.seen.append(Seen(now, m.timestamp()[1] / 1000.0, rid))
                    got = True
                if got:
                    with contextlib.suppress(RuntimeError):  # the loop closed: the run is over
                        loop.call_soon_threadsafe(self.changed.set)
        finally:
            consumer.close()

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    async def collect(
        self,
        mark: int,
        want: Callable[[Seen], bool],
        n: int,
        proc: Callable[[], subprocess.Popen[bytes]],
        within: float,
    ) -> dict[str, Seen]:
        """The first sighting of each of ``n`` distinct ids ``want`` accepts in ``seen[mark:]``."""
        got: dict[str, Seen] = {}
        deadline = time.monotonic() + within
        cursor = mark
        while True:
            new = self.seen[cursor:]  # the tail's thread appends meanwhile: count what was read
            for s in new:
                if s.id not in got and want(s):
                    got[s.id] = s
            cursor += len(new)
            if len(got) >= n:
                return got
            if (rc := proc().poll()) is not None:
                raise SystemExit(f"{self.topic}: the process under test exited with status {rc}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"{self.topic}: {len(got)}/{n} output records after {within:g} s")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))


# -- sides ----------------------------------------------------------------------------------


@dataclass
class Side:
    name: str
    cat: Catalog
    cmd: list[str]
    log: Path
    decode: Callable[[bytes | None], str]
    env: dict[str, str] | None = None
    #: a throughput run of this side is ``scale`` times N records (the fast ones: not a blip)
    scale: int = 1
    #: prefixes of the topics outside ``cat`` it writes to (Quix: its changelog)
    also_writes: tuple[str, ...] = ()
    #: seconds between the checkpoints at which it writes its state after its outputs (Quix);
    #: 0: its writes are done by its last output
    checkpoint: float = 0.0
    proc: subprocess.Popen[bytes] | None = None
    tail: Tail | None = None
    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # child CPU s per record
    cpu_settled: list[float] = field(default_factory=list)  # the same, to after a checkpoint
    writes: list[float] = field(default_factory=list)  # records written per inbound
    broker_cpu: list[float] = field(default_factory=list)

    def alive(self) -> subprocess.Popen[bytes]:
        assert self.proc is not None
        return self.proc

    @property
    def output(self) -> Tail:
        assert self.tail is not None
        return self.tail

    def start(self) -> None:
        self.proc = spawn(self.cmd, self.log, self.env)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


class Bench:
    def __init__(self, bootstrap: str, broker_pid: int | None) -> None:
        self.bootstrap = bootstrap
        self.broker_pid = broker_pid
        self._producer: Sender | None = None

    async def __aenter__(self) -> Bench:
        self._producer = Sender(self.bootstrap)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._producer is not None:
            await asyncio.to_thread(self._producer.close)

    @property
    def producer(self) -> Sender:
        assert self._producer is not None
        return self._producer

    async def send_all(self, topic: str, recs: Sequence[tuple[str, bytes, bytes]]) -> None:
        """Produce ``recs`` (id, key, value) at once, then wait for their acks."""
        for _, key, value in recs:
            self.producer.produce(topic, key, value)
        await self.producer.flush()

    async def start(self, side: Side, warm_run: str) -> None:
        side.tail = Tail(self.bootstrap, side.cat.sent, side.decode)
        await side.tail.start()
        side.start()
        await self.warm(side, warm_run)

    async def warm(self, side: Side, run: str) -> None:
        mark = len(side.output.seen)
        await self.send_all(side.cat.inbound, records(1, run))
        try:
            await side.output.collect(
                mark, lambda s: s.id.startswith(f"{run}-"), 1, side.alive, START_TIMEOUT
            )
        except SystemExit:
            print(f"--- {side.name} log ({side.log}):\n{log_tail(side.log)}", file=sys.stderr)
            raise

    async def throughput(self, side: Side, n: int, run: str, chats: int | None = None) -> float:
        recs = records(n, run, chats)
        mark = len(side.output.seen)
        pid = side.alive().pid
        c0, b0 = cpu_seconds(pid), cpu_seconds(self.broker_pid)
        t0 = time.monotonic()
        producing = asyncio.ensure_future(self.send_all(side.cat.inbound, recs))
        got = await side.output.collect(
            mark, lambda s: s.id.startswith(f"{run}-"), n, side.alive, 60 + n / 50
        )
        t_last = max(s.at for s in got.values())
        await producing
        side.cpu.append((cpu_seconds(pid) - c0) / n)
        side.broker_cpu.append((cpu_seconds(self.broker_pid) - b0) / n)
        rate = n / (t_last - t0)
        side.rates.append(rate)
        return rate

    async def paced(
        self, topic: str, recs: Sequence[tuple[str, bytes, bytes]], rate: float
    ) -> dict[str, float]:
        """Send ``recs`` at ``rate`` per second; the monotonic send time per id."""
        sent_at: dict[str, float] = {}
        t0 = time.monotonic()
        for i, (rid, key, value) in enumerate(recs):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent_at[rid] = time.monotonic()
            self.producer.produce(topic, key, value)
        await self.producer.flush()
        return sent_at

    async def latency(self, side: Side, rate: float, seconds: float, run: str) -> list[float]:
        """Added latencies (s) of records paced at ``rate``, send call -> output seen."""
        recs = records(max(1, int(rate * seconds)), run)
        mark = len(side.output.seen)
        sent_at = await self.paced(side.cat.inbound, recs, rate)
        got = await side.output.collect(
            mark, lambda s: s.id in sent_at, len(recs), side.alive, 120.0
        )
        return sorted(s.at - sent_at[rid] for rid, s in got.items())

    async def restart(
        self, side: Side, rate: float, run: str, wipe: Path | None = None
    ) -> tuple[float, float, int]:
        """SIGKILL ``side`` while records trickle in, restart it (after deleting ``wipe``);
        (s from restart to the first output of the new process, s from the kill, trickled
        records, all answered)."""
        mark0 = len(side.output.seen)
        stop = asyncio.Event()
        sent: list[str] = []

        async def trickle() -> None:
            i = 0
            while not stop.is_set():
                rid, key, value = record(run, i)
                self.producer.produce(side.cat.inbound, key, value)
                sent.append(rid)
                i += 1
                await asyncio.sleep(1.0 / rate)

        trickling = asyncio.ensure_future(trickle())
        await side.output.collect(mark0, lambda s: s.id.startswith(f"{run}-"), 10, side.alive, 60.0)
        mark = len(side.output.seen)
        wall_kill, t_kill = time.time(), time.monotonic()
        side.alive().send_signal(signal.SIGKILL)
        side.alive().wait()
        if wipe is not None:
            shutil.rmtree(wipe)
        t_spawn = time.monotonic()
        side.start()
        first = await side.output.collect(
            mark, lambda s: s.ts >= wall_kill, 1, side.alive, START_TIMEOUT
        )
        t_first = min(s.at for s in first.values())
        await asyncio.sleep(1.0)
        stop.set()
        await trickling
        await self.producer.flush()
        total = len(sent)
        await side.output.collect(
            mark0, lambda s: s.id.startswith(f"{run}-"), total, side.alive, 120.0
        )
        return t_first - t_spawn, t_first - t_kill, total


# -- report ---------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return sorted(values)[k]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def exactly_once_available() -> bool:
    return any(f.name == "guarantee" for f in dataclasses.fields(WorkerConfig))


#: A ``--journal`` value ending so (before ``@LEVEL``) runs its worker ``exactly_once``.
EOS_SUFFIX = "+eos"
#: exactly_once against at_least_once, same journal, same run (records/s).
TARGET_EOS_VS_ALO = 0.85


def is_eos(side: Side) -> bool:
    return "exactly_once" in side.cmd


#: A ``--journal`` value ending so (before ``@LEVEL``, in any order with ``+eos``) serves
#: ``/metrics`` (``--http-port 0``: the histograms fed) / logs JSON (``BOTMESH_LOG_FORMAT``).
METRICS_SUFFIX, JSON_SUFFIX = "+metrics", "+json"
#: Accepted (in any order with the others) and ignored: it ran a worker on the runtime on
#: librdkafka when Faust's was the default; every worker side runs on it now.
RD_SUFFIX = "+rd"
#: What metrics and JSON logs may cost on the hot path: CPU per record against the same
#: worker without them, same run.
TARGET_OBSERVED = 0.05
#: The side ``make bench`` compares with the plain worker.
DEFAULT_OBSERVED = f"default{METRICS_SUFFIX}{JSON_SUFFIX}"


def observed(side: Side) -> bool:
    return "--http-port" in side.cmd or bool(side.env and "BOTMESH_LOG_FORMAT" in side.env)


@dataclass(frozen=True, slots=True)
class Plan:
    n: int
    rounds: int
    latency_s: float
    restarts: int
    slow_chats: tuple[int, ...]
    slow_seconds: float
    #: only phase 3 (the restarts), for tuning a worker's start
    restart_only: bool = False


QUICK = Plan(n=4000, rounds=1, latency_s=6.0, restarts=1, slow_chats=(50, 200), slow_seconds=3.0)
FULL = Plan(
    n=15000,
    rounds=3,
    latency_s=15.0,
    restarts=2,
    slow_chats=(1, 10, 50, 200, 500),
    slow_seconds=5.0,
)


def worker_args(
    bootstrap: str, cat: Catalog, data_dir: Path, *, batch: int, instance: str, provider: str
) -> list[str]:
    return [
        "--bootstrap",
        bootstrap,
        "--prefix",
        cat.prefix,
        "--data-dir",
        str(data_dir),
        "--partitions",
        str(PARTITIONS),
        "--batch-size",
        str(batch),
        "--provider",
        provider,
        "--instance-id",
        instance,
    ]


def catalog(name: str, bootstrap: str) -> Catalog:
    cat = Catalog(name)
    ensure_topics(bootstrap, cat.specs(partitions=PARTITIONS))
    return cat


def journal_url(cmd: Sequence[str]) -> str:
    """The journal a worker command line runs on."""
    given = cmd[cmd.index("--journal") + 1] if "--journal" in cmd else None
    return WorkerConfig(journal=given).journal_url


def journal_option(value: str, data_dir: Path) -> tuple[str, list[str]]:
    """(label, worker options) of a ``--journal`` value: ``default`` (no option), ``file``
    (the file journal in the data dir, append log: the worker's default before ``kafka``)
    or a journal URL; ``@LEVEL`` at the end adds ``--loglevel LEVEL`` (default: none, the
    worker's own default, info)."""
    spec, at, level = value.rpartition("@") if "@" in value else (value, "", "")
    logs = ["--loglevel", level] if at else []
    suffix = f"; --loglevel {level}" if at else ""
    while spec.endswith((EOS_SUFFIX, METRICS_SUFFIX, JSON_SUFFIX, RD_SUFFIX)):
        if spec.endswith(RD_SUFFIX):  # a no-op now: every worker runs on librdkafka
            spec = spec.removesuffix(RD_SUFFIX)
        elif spec.endswith(EOS_SUFFIX):  # the worker under exactly_once
            spec = spec.removesuffix(EOS_SUFFIX)
            logs += ["--guarantee", "exactly_once"]
            suffix += "; exactly_once"
        elif spec.endswith(METRICS_SUFFIX):  # /metrics served: the histograms fed
            spec = spec.removesuffix(METRICS_SUFFIX)
            logs += ["--http-port", "0"]
            suffix += "; /metrics served"
        else:  # the env var is set by the caller (``log_env``)
            spec = spec.removesuffix(JSON_SUFFIX)
            suffix += "; JSON logs"
    if spec == "default":
        label = "default: " + redact(WorkerConfig(data_dir=data_dir).journal_url)
        return label + suffix, logs
    url = f"file://{data_dir.resolve()}/journal?append_log=true" if spec == "file" else spec
    return redact(url) + suffix, ["--journal", url, *logs]


async def topic_writes(bootstrap: str, cat: Catalog, also: Sequence[str] = ()) -> int:
    """Records on every topic of ``cat`` but its inbound, and on the topics whose names start
    with one of ``also`` (the sum of the end offsets)."""

    def ask() -> int:
        topics = admin_client(bootstrap).list_topics(timeout=10.0).topics
        tps = [
            (name, p)
            for name, meta in topics.items()
            if name.startswith((f"{cat.prefix}.", *also)) and name != cat.inbound
            for p in meta.partitions
        ]
        return sum(high_watermarks(bootstrap, tps).values())

    return await asyncio.to_thread(ask)


def quix_version() -> str:
    """The quixstreams version of ``.venv-quix``; a SystemExit naming ``make quix-venv``."""
    if not QUIX_PYTHON.exists():
        raise SystemExit(
            f"bench_worker: no {QUIX_PYTHON.relative_to(REPO)} for the Quix Streams side: run "
            "`make quix-venv` (or pass --no-quix to run without it)"
        )
    done = subprocess.run(
        [str(QUIX_PYTHON), str(QUIX_SIDE), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"bench_worker: {QUIX_PYTHON.relative_to(REPO)} cannot import quixstreams (run "
            f"`make quix-venv`, or pass --no-quix):\n{done.stderr.strip()}"
        )
    return done.stdout.strip()


def baseline_sides(bootstrap: str, tmp: Path, tag: str, *, quix: bool) -> list[Side]:
    """The bare confluent-kafka loop and, with ``quix``, the Quix Streams app."""
    py = sys.executable
    lcat = catalog(f"bwcfk{tag}", bootstrap)
    sides = [
        Side(
            LOOP,
            lcat,
            [py, str(BASELINES), "confluent", bootstrap, lcat.inbound, lcat.sent, lcat.group],
            tmp / "confluent.log",
            copied_id,
            scale=4,
        ),
    ]
    if quix:
        qcat = catalog(f"bwqix{tag}", bootstrap)
        qstate = str(tmp / "quix-state")
        cmd = [str(QUIX_PYTHON), str(QUIX_SIDE), bootstrap, qcat.inbound, qcat.sent, qcat.group]
        qside = Side(
            QUIX,
            qcat,
            [*cmd, qstate],
            tmp / "quix.log",
            reply_id,
            scale=4,
            also_writes=(f"changelog__{qcat.group}--",),  # Quix's changelog topic naming
            checkpoint=QUIX_CHECKPOINT,
        )
        sides.append(qside)
    return sides


async def run_bench(
    bootstrap: str,
    broker_pid: int | None,
    tmp: Path,
    plan: Plan,
    *,
    batch: int,
    journals: Sequence[str],
    quix: str | None,
) -> None:
    """``quix``: the quixstreams version of the Quix side, None to run without it."""
    tag = uuid.uuid4().hex[:6]
    baselines = [] if plan.restart_only else baseline_sides(bootstrap, tmp, tag, quix=bool(quix))
    workers: list[Side] = []
    data_dirs: dict[str, Path] = {}
    print(
        f"broker {bootstrap}; {PARTITIONS} partitions; records ~{RECORD_BYTES} B JSON over "
        f"{SPREAD['chats']} chats; N={plan.n}; rounds {plan.rounds}; logs in {tmp}"
    )
    if quix and not plan.restart_only:
        print(
            f"quix: quixstreams {quix} (.venv-quix): dedupe by id in RocksDB state with its "
            "changelog; at-least-once, checkpoint every 5 s, acks=all (Quix's defaults but acks "
            "and auto_offset_reset=earliest)"
        )
    elif not plan.restart_only:
        print(
            "quix: NOT RUN (--no-quix): the worker/quix ratio is not measured in this run",
            flush=True,
        )
    for i, spec in enumerate(journals):
        cat = catalog(f"bwwrk{i}{tag}", bootstrap)
        data = tmp / f"worker{i}"
        name = "worker" if len(journals) == 1 else f"worker{i + 1}"
        args = worker_args(
            bootstrap, cat, data, batch=batch, instance=f"bench-{i}-{tag}", provider="mock"
        )
        if spec == UNJOURNALED:
            label = "memory:// (bench only: the worker's path around a journal costing ~0)"
            cmd = [sys.executable, str(BASELINES), "unjournaled", "--app", APP, *args]
        else:
            label, options = journal_option(spec, data)
            cmd = worker_command(*args, *options)
        flags = spec.partition("@")[0]
        extra = {"BOTMESH_LOG_FORMAT": "json"} if JSON_SUFFIX in flags else {}
        env = child_env(**extra)
        side = Side(name, cat, cmd, tmp / f"{name}.log", receipt_id, env)
        workers.append(side)
        data_dirs[name] = data
        print(f"{name}: journal {label}; batch {batch}; provider mock (no delay)")
        print(f"  {' '.join(side.cmd[1:])}")
    sides = [*baselines, *workers]
    async with Bench(bootstrap, broker_pid) as bench:
        try:
            for k, side in enumerate(sides):
                t = time.monotonic()
                await bench.start(side, f"warm{k}{tag}")
                print(
                    f"  {side.name}: started, first record through in {time.monotonic() - t:.1f} s"
                )
            if not plan.restart_only:
                med = await throughputs(bench, baselines, workers, plan, tag)
                rate = med[workers[0].name] / 2
                await latencies(bench, sides, rate, plan, tag)
                for side in baselines:
                    side.stop()
            print("\n3. restart to first reply (SIGKILL, same --instance-id, 50 records/s)")
            for side in workers:
                if BASELINES.name in " ".join(side.cmd):  # unjournaled: forgets at a restart
                    side.stop()
                    continue
                for k in range(plan.restarts):
                    from_spawn, from_kill, total = await bench.restart(side, 50.0, f"r{k}{tag}")
                    print(
                        f"  {side.name} restart {k + 1}: first reply {from_spawn:5.2f} s after "
                        f"the restart ({from_kill:5.2f} s after the kill; target <= "
                        f"{TARGET_RESTART:g} s: {verdict(from_spawn <= TARGET_RESTART)}); all "
                        f"{total} trickled records answered"
                    )
                if journal_url(side.cmd) == KAFKA_JOURNAL:
                    held = await topic_writes(bench.bootstrap, side.cat)
                    from_spawn, from_kill, total = await bench.restart(
                        side, 50.0, f"rw{tag}", wipe=data_dirs[side.name]
                    )
                    print(
                        f"  {side.name} restart on an empty data dir (its journal restored from "
                        f"the changelog, {held} records on its topics): first reply "
                        f"{from_spawn:5.2f} s after the restart; all {total} trickled records "
                        "answered"
                    )
                side.stop()
            if plan.restart_only:
                return
            print(
                f"\n4. provider latency {PROVIDER_DELAY * 1e3:.0f} ms (in-flight limit = min("
                f"BOTMESH_IN_FLIGHT {IN_FLIGHT}, chats): batches run side by side, their chats "
                "concurrently, each chat's records one after the other)"
            )
            for i, (spec, side) in enumerate(zip(journals, workers, strict=True)):
                if spec == UNJOURNALED:
                    continue
                await slow_provider(
                    bench,
                    bootstrap=bootstrap,
                    tmp=tmp,
                    cat=catalog(f"bwslo{i}{tag}", bootstrap),
                    name=f"{side.name}/slow",
                    journal=spec,
                    batch=batch,
                    plan=plan,
                    top=med[side.name],
                    tag=f"{i}{tag}",
                )
        finally:
            for side in sides:
                side.stop()
                if side.tail is not None:
                    await side.tail.stop()


async def throughputs(
    bench: Bench, baselines: Sequence[Side], workers: Sequence[Side], plan: Plan, tag: str
) -> dict[str, float]:
    sides = [*baselines, *workers]
    print(
        "\n1. throughput, records/s (CPU ms per record: the child, the broker; records written "
        "per inbound; quix: its CPU to after its next checkpoint)"
    )
    for r in range(plan.rounds):
        row = []
        for k, side in enumerate(sides):
            w0 = await topic_writes(bench.bootstrap, side.cat, side.also_writes)
            n = plan.n * side.scale
            c0 = cpu_seconds(side.alive().pid)
            rate = await bench.throughput(side, n, f"t{r}s{k}{tag}")
            # the last marks and receipts; a checkpointing side: its next checkpoint
            await asyncio.sleep(side.checkpoint + 1.0 if side.checkpoint else 0.5)
            w = (await topic_writes(bench.bootstrap, side.cat, side.also_writes) - w0) / n
            side.writes.append(w)
            extra = ""
            if side.checkpoint:
                side.cpu_settled.append((cpu_seconds(side.alive().pid) - c0) / n)
                extra = f"; {side.cpu_settled[-1] * 1e3:.2f}"
            row.append(
                f"{side.name} {rate:6.0f} ({side.cpu[-1] * 1e3:.2f}, "
                f"{side.broker_cpu[-1] * 1e3:.2f}, {w:.1f} w{extra})"
            )
        print(f"  round {r + 1}: " + "  ".join(row))
    med = {s.name: statistics.median(s.rates) for s in sides}
    for side in sides:
        settled = (
            f" ({statistics.median(side.cpu_settled) * 1e3:.2f} to after its next checkpoint)"
            if side.cpu_settled
            else ""
        )
        print(
            f"  {side.name:<12} median {med[side.name]:7.0f} records/s   CPU "
            f"{statistics.median(side.cpu) * 1e3:.2f} ms/record{settled}, broker "
            f"{statistics.median(side.broker_cpu) * 1e3:.2f} ms/record; "
            f"{statistics.median(side.writes):.1f} records written/inbound"
        )
    eos = [w for w in workers if is_eos(w)]
    alo = [w for w in workers if not is_eos(w)]
    if eos and alo:
        ratio = statistics.median(e / a for e, a in zip(eos[0].rates, alo[0].rates, strict=True))
        print(
            f"  {eos[0].name} (exactly_once)/{alo[0].name} (at_least_once) {ratio:5.2f}  "
            f"(target >= {TARGET_EOS_VS_ALO}: {verdict(ratio >= TARGET_EOS_VS_ALO)})"
        )
    elif exactly_once_available():
        print(
            f"  exactly_once: not measured (add a worker side --journal default{EOS_SUFFIX} "
            "beside an at_least_once one)"
        )
    plain = [w for w in workers if not observed(w)]
    for side in workers:
        if observed(side) and plain:  # what /metrics (and JSON logs) cost, same run
            base = next((p for p in plain if is_eos(p) == is_eos(side)), plain[0])
            ratio = statistics.median(w / b for w, b in zip(side.rates, base.rates, strict=True))
            cost = statistics.median(o / b for o, b in zip(side.cpu, base.cpu, strict=True)) - 1
            print(
                f"  {side.name}/{base.name} {ratio:5.2f} records/s, CPU/record {cost:+.1%} (median "
                f"of the rounds' ratios)  "
                f"(target: a cost under {TARGET_OBSERVED:.0%}: {verdict(cost < TARGET_OBSERVED)})"
            )
    for side in workers:
        for base in baselines:
            ratio = statistics.median(w / b for w, b in zip(side.rates, base.rates, strict=True))
            label = f"{side.name}/{base.name.replace('/', '-')}"
            target = TARGETS[base.name]
            if base.name == QUIX and is_eos(side):
                judged = "no target: exactly_once against Quix's at-least-once"
            else:
                judged = f"target >= {target:g}: {verdict(ratio >= target)}"
            print(f"  {label:<20} {ratio:5.2f}  ({judged})")
    if workers and not any(base.name == QUIX for base in baselines):
        print("  worker/quix: NOT MEASURED (--no-quix)")
    return med


async def latencies(bench: Bench, sides: Sequence[Side], rate: float, plan: Plan, tag: str) -> None:
    print(
        f"\n2. added latency, send call -> output seen, paced at {rate:.0f} records/s "
        f"(half the first worker's median) for {plan.latency_s:g} s"
    )
    lat: dict[str, list[float]] = {}
    for k, side in enumerate(sides):
        lat[side.name] = v = await bench.latency(side, rate, plan.latency_s, f"l{k}{tag}")
        print(
            f"  {side.name:<12} p50 {ms(pct(v, 0.5))}  p99 {ms(pct(v, 0.99))}  "
            f"max {ms(max(v))}  ({len(v)} records)"
        )
    base = lat[LOOP]
    for side in sides:
        if side.name == LOOP:
            continue
        v = lat[side.name]
        print(
            f"  {side.name} minus the {LOOP} loop: p50 {ms(pct(v, 0.5) - pct(base, 0.5))}  "
            f"p99 {ms(pct(v, 0.99) - pct(base, 0.99))}"
        )


async def slow_provider(
    bench: Bench,
    *,
    bootstrap: str,
    tmp: Path,
    cat: Catalog,
    name: str,
    journal: str,
    batch: int,
    plan: Plan,
    top: float,
    tag: str,
) -> None:
    data = tmp / name.replace("/", "-")
    options = journal_option(journal, data)[1]
    args = worker_args(
        bootstrap,
        cat,
        data,
        batch=batch,
        instance=f"bench-slow-{tag}",
        provider="bench._worker_baselines:slow_provider",
    )
    env = child_env(BENCH_PROVIDER_DELAY=str(PROVIDER_DELAY))
    cmd = worker_command(*args, *options)
    side = Side(name, cat, cmd, tmp / f"{name.replace('/', '-')}.log", receipt_id, env=env)
    try:
        await bench.start(side, f"warmslo{tag}")
        for chats in plan.slow_chats:
            limit = min(IN_FLIGHT, chats)
            bound = limit / PROVIDER_DELAY
            expect = min(bound, top)
            n = int(min(max(expect * plan.slow_seconds, 10 * limit, 100), 6000))
            rate = await bench.throughput(side, n, f"s{chats}{tag}", chats=chats)
            print(
                f"  {name} {chats:4d} chats: {rate:6.0f} records/s; limit/latency = {limit}/"
                f"{PROVIDER_DELAY:g} s = {bound:5.0f}/s, ratio {rate / bound:.2f} (against "
                f"min(that, top rate {top:.0f}/s): {rate / expect:.2f}); a chat's record took "
                f"{limit / rate * 1e3:.0f} ms (N={n})"
            )
    finally:
        side.stop()
        if side.tail is not None:
            await side.tail.stop()


# -- profile --------------------------------------------------------------------------------


def package_of_call(filename: str, func: str) -> str:
    """``package_of``, C functions (cProfile's ``~``) told apart: librdkafka's (the
    confluent-kafka client), the wait in ``epoll``, the rest."""
    if filename != "~":
        return package_of(filename)
    if "cimpl." in func:
        return "confluent_kafka (C)"
    return "waiting (epoll)" if "epoll" in func else "builtins"


def package_of(filename: str) -> str:
    path = filename.replace("\\", "/")
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            rest = path.split(marker, 1)[1]
            if marker != "site-packages/":
                rest = rest.split("/", 1)[1] if "/" in rest else rest
                return "stdlib:" + rest.split("/", 1)[0].removesuffix(".py")
            return rest.split("/", 1)[0].removesuffix(".py")
    if path.startswith(str(REPO)):
        return path[len(str(REPO)) + 1 :].split("/", 1)[0]
    return path if path.startswith("<") else "other"


def print_profile(path: Path, n: int, top: int = 30) -> None:
    stats = pstats.Stats(str(path))
    table = stats.stats  # type: ignore[attr-defined]
    by_pkg: dict[str, float] = {}
    total = 0.0
    for (filename, _, func), (_, _, tt, _, _) in table.items():
        pkg = package_of_call(filename, func)
        by_pkg[pkg] = by_pkg.get(pkg, 0.0) + tt
        total += tt
    print(f"  profiled time {total:.2f} s over {n} records = {total / n * 1e6:.0f} us/record")
    print("  by package (own time):")
    for pkg, tt in sorted(by_pkg.items(), key=lambda kv: -kv[1])[:14]:
        print(f"    {pkg:<28} {tt / n * 1e6:8.1f} us/record  {tt / total:6.1%}")
    rows = sorted(table.items(), key=lambda kv: -kv[1][2])[:top]
    print(f"  top {top} functions by own time (calls/record, own us/record, cumulative us/record):")
    for (filename, line, func), (_, nc, tt, ct, _) in rows:
        where = f"{package_of_call(filename, func)}:{Path(filename).name}:{line}({func})"
        print(f"    {nc / n:7.2f} {tt / n * 1e6:8.1f} {ct / n * 1e6:9.1f}  {where}")
    wanted = ("fsync", "write", "send", "put", "handle", "run_batch", "commit", "flush")
    rows = sorted(table.items(), key=lambda kv: -kv[1][3])
    print("  selected functions by cumulative time (calls/record, cumulative us/record):")
    shown = 0
    for (filename, line, func), (_, nc, _, ct, _) in rows:
        pkg = package_of(filename)
        if pkg in {"state", "streams", "botmesh", "providers"} or any(w == func for w in wanted):
            print(
                f"    {nc / n:7.2f} {ct / n * 1e6:9.1f}  {pkg}:{Path(filename).name}:{line}({func})"
            )
            shown += 1
            if shown >= 30:
                break


async def run_profile(bootstrap: str, tmp: Path, n: int, *, batch: int, journal: str) -> None:
    tag = uuid.uuid4().hex[:6]
    cat = catalog(f"bwprof{tag}", bootstrap)
    out = tmp / "worker.prof"
    label, options = journal_option(journal, tmp / "prof")
    args = worker_args(
        bootstrap, cat, tmp / "prof", batch=batch, instance=f"bench-prof-{tag}", provider="mock"
    )
    cmd = [sys.executable, str(BASELINES), "profile", str(out), "--app", APP]
    side = Side("worker/cProfile", cat, [*cmd, *args, *options], tmp / "prof.log", receipt_id)
    print(f"worker under cProfile: batch {batch}, journal {label}, N={n}, broker {bootstrap}")
    async with Bench(bootstrap, None) as bench:
        try:
            await bench.start(side, f"warmprof{tag}")
            rate = await bench.throughput(side, n, f"p{tag}")
            print(f"  {rate:.0f} records/s under cProfile; CPU {side.cpu[-1] * 1e3:.2f} ms/record")
        finally:
            side.stop()
            if side.tail is not None:
                await side.tail.stop()
    if not out.exists():
        raise SystemExit(f"no profile written ({out}); see {side.log}")
    print_profile(out, n + 1)  # the warm-up record is in the profile too


# -- main -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a run of under ~2 minutes")
    parser.add_argument("-n", type=int, help="records per throughput run")
    parser.add_argument("--rounds", type=int, help="throughput rounds (sides interleaved)")
    parser.add_argument("--batch-size", type=int, default=500, help="the worker's batch size")
    parser.add_argument("--profile", action="store_true", help="the worker under cProfile only")
    parser.add_argument(
        "--restart-only",
        type=int,
        metavar="K",
        help="only the restarts to first reply, K per worker (and one on an empty data dir)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs and data dirs")
    parser.add_argument(
        "--no-quix",
        action="store_true",
        help="run without the Quix Streams side (no .venv-quix needed; no worker/quix ratio)",
    )
    parser.add_argument(
        "--slow-chats",
        help="chat counts of the 50 ms provider runs (quick: 50; else 1,10,50,500)",
    )
    parser.add_argument(
        "--journal",
        action="append",
        help="a worker side per value: default (the worker's default journal), file (a file "
        "journal in its data dir, append log) or a journal URL, with +eos, +metrics, +json; "
        "repeatable (default: default, default+eos, default+metrics+json; one side for "
        "--profile)",
    )
    parser.add_argument(
        "--chats",
        type=int,
        default=CHATS,
        help=f"chats the throughput and latency records are spread over (default {CHATS})",
    )
    args = parser.parse_args(argv)
    SPREAD["chats"] = args.chats
    plan = QUICK if args.quick else FULL
    plan = dataclasses.replace(plan, n=args.n or plan.n, rounds=args.rounds or plan.rounds)
    if args.restart_only:
        plan = dataclasses.replace(plan, restarts=args.restart_only, restart_only=True)
    if args.slow_chats:
        chats = tuple(int(c) for c in args.slow_chats.split(","))
        plan = dataclasses.replace(plan, slow_chats=chats)
    quix = None
    if not (args.profile or args.restart_only or args.no_quix):
        quix = quix_version()  # before the broker: exits naming `make quix-venv` if missing
    bootstrap, started, broker_pid = broker()
    tmp = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    t0 = time.monotonic()
    journals = args.journal or (
        ["default"] if args.profile else ["default", f"default{EOS_SUFFIX}", DEFAULT_OBSERVED]
    )
    job: Coroutine[object, object, None]
    if args.profile:
        job = run_profile(bootstrap, tmp, plan.n, batch=args.batch_size, journal=journals[0])
    else:
        job = run_bench(
            bootstrap, broker_pid, tmp, plan, batch=args.batch_size, journals=journals, quix=quix
        )
    try:
        asyncio.run(job)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        print(f"\n(took {time.monotonic() - t0:.0f} s)")
        if started:
            subprocess.run([str(KAFKA_SH), "stop"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
