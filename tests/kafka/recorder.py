"""The provider's far end for the Kafka kill tests: an HTTP server in the test process that
records every send a worker made, whatever happened to the worker afterwards.

``Recorder`` listens on 127.0.0.1 (an ephemeral port) in a thread of the test process. The
worker's provider (``tests.kafka.bot:http_provider``, ``$BOTMESH_TEST_RECORDER`` = its
``url``) POSTs each send to it as JSON ``{"chat_id", "text", "key", "pid"}`` and returns
only after the recorder answered ``200 {"message_id": ...}``; so a send the recorder holds
is a send the channel accepted, even when the worker was SIGKILLed before it journaled the
result. A killed worker cannot take a recorded call back: the recorder outlives every
worker of a test and counts the effects (duplicates, calls per worker pid). ``GET
<url>?key=K`` answers whether a send keyed ``K`` arrived (200 with its message id, else
404), as a channel that resolves ambiguous sends would (``tests.kafka.flow_bot``).

``post_send`` is the client side (used by the provider, in the worker process): plain
asyncio streams, one connection per send; a time limit on connecting, and once the request
is written a wait for the answer (a late answer under load is not a failed send: retried,
it would be counted twice).

``Tally`` follows the other evidence of a test while it runs (the receipts on
``<prefix>.sent`` and the records on ``<prefix>.inbound.dlq``) and says, per inbound id,
whether it is accounted for: its reply is at the recorder, or its send settled ``dead`` or
``unknown`` (a receipt says so), or the inbound itself is in the DLQ.

``traffic`` makes a test's inbounds (one in ``REFUSE_EVERY`` refused for good by the
provider); ``check_effects`` is the end of every kill test: 0 lost, 0 sends twice (the bot
runs with ``on_ambiguous="skip"``), no call for an inbound the test did not produce, a
receipt or a dead letter for every inbound; it prints and returns the figures.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from botmesh.state.messages import Inbound, Receipt
from botmesh.streams.clients import reader, wait_topic
from botmesh.streams.ops.tools import demo_records
from botmesh.topics import decode_inbound, decode_receipt
from tests.kafka.unknowns import check_unknown_sends, recorder_callers

__all__ = [
    "RECORDER_ENV",
    "SESSION_TIMEOUT",
    "Call",
    "HttpStatusError",
    "Recorder",
    "Refusal",
    "Tally",
    "check_effects",
    "describe_group",
    "post_send",
    "traffic",
    "wait_until",
]

#: The environment variable that gives the worker's provider the recorder's URL.
RECORDER_ENV = "BOTMESH_TEST_RECORDER"
_REPLY = re.compile(r"^echo (?P<id>\S+): ")

CHATS = 30
REFUSE_EVERY = 15  # one inbound in 15 says "refuse": its send ends dead (a final refusal)
SESSION_TIMEOUT = {
    "BOTMESH_SESSION_TIMEOUT": "6"
}  # Kafka's least: a dead member's partitions move soon


def traffic(run: str, n: int, start: int = 0) -> list[Inbound]:
    """``n`` inbounds over ``CHATS`` chats, ids ``<run>-<i>``; every ``REFUSE_EVERY``-th
    (counting from ``start``) is refused by the provider."""
    return [
        msgspec.structs.replace(r, text="refuse") if (start + i) % REFUSE_EVERY == 7 else r
        for i, r in enumerate(demo_records(n, CHATS, run=run))
    ]


@dataclass(frozen=True, slots=True)
class Call:
    """One send the recorder accepted."""

    chat_id: str
    text: str
    key: str | None  # the idempotency key, when the provider was given one
    pid: int  # the worker process that sent it
    at: float  # time.monotonic() in the test process when it arrived
    message_id: str

    @property
    def inbound_id(self) -> str | None:
        """The inbound the test bot answered with this send (``echo <id>: <text>``)."""
        match = _REPLY.match(self.text)
        return match["id"] if match else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a batch's sends arrive at once (the default backlog is 5)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A worker killed before it read the answer: the call is recorded all the same
        (that is the ambiguous window), nothing to report."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError):
            super().handle_error(request, client_address)


@dataclass(frozen=True, slots=True)
class Refusal:
    """One send the recorder refused, as a channel's API would: its status and when."""

    text: str
    status: int
    retry_after: float | None
    at: float  # time.monotonic() in the test process


class HttpStatusError(ValueError):
    """The recorder answered a status other than 200 (``retry_after``: its Retry-After)."""

    def __init__(self, status: int, retry_after: float | None, body: str) -> None:
        super().__init__(f"the recorder answered {status}: {body}")
        self.status = status
        self.retry_after = retry_after


class Recorder:
    """``with Recorder() as rec:`` an HTTP server on 127.0.0.1 recording every POSTed send.

    Like a channel's API it can refuse a send: ``script(text, [(429, 2.0), (500, None)])``
    answers the next two sends of ``text`` with a 429 (``Retry-After: 2``) and a 500, then
    accepts; ``refuse(text)`` answers 400 to every send of ``text`` until ``allow(text)``.
    Each refusal is kept (``refusals``) with the recorder's own clock.

    ``limit(rate, burst)`` enforces a channel rate limit as a channel's API does: a token
    bucket refilled at ``rate`` a second, holding ``burst`` tokens at most (so an arrival
    jitter of ``(burst - 1) / rate`` seconds passes); a send that finds no token is
    answered 429 with the ``Retry-After`` until the next one, and counted (``limited``)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._calls: list[Call] = []
        self._script: dict[str, collections.deque[tuple[int, float | None]]] = {}
        self._refused: set[str] = set()
        self._refusals: list[Refusal] = []
        #: chat id -> (seconds, sends left to hold): see ``hold``
        self._holds: dict[str, list[float]] = {}
        self._released = threading.Event()
        #: (chat id, time.monotonic() the hold began, when it ended) of each held send
        self.held: list[tuple[str, float, float]] = []
        #: the channel rate limit (``limit``): tokens a second, most tokens, tokens now, when
        self._bucket: list[float] | None = None
        #: sends answered 429 because they were over ``limit``
        self.limited = 0
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                try:
                    body = json.loads(self.rfile.read(size))
                    text = str(body["text"])
                    chat_id = str(body["chat_id"])
                    key = body.get("key")
                    pid = int(body["pid"])
                except (ValueError, KeyError, TypeError) as exc:
                    self._answer(400, {"error": str(exc)})
                    return
                refusal = recorder._refusal(text) or recorder._over_limit(text)
                if refusal is not None:
                    status, retry_after = refusal
                    error = {"error": {"code": status, "message": f"refused with {status}"}}
                    self._answer(status, error, retry_after)
                    return
                call = recorder._add(chat_id, text, key, pid)
                recorder._maybe_hold(chat_id)
                self._answer(200, {"message_id": call.message_id})

            def do_GET(self) -> None:
                """``GET <url>?key=K``: the send keyed ``K``, if one arrived (what a channel
                that resolves ambiguous sends answers); 404 when none did."""
                keys = parse_qs(urlsplit(self.path).query).get("key", [])
                call = recorder.by_key(keys[0]) if keys else None
                if call is None:
                    self._answer(404, {"error": f"no send keyed {keys}"})
                else:
                    self._answer(200, {"message_id": call.message_id})

            def _answer(
                self, status: int, payload: dict[str, Any], retry_after: float | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", f"{retry_after:g}")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: the tests print their own figures

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def script(self, text: str, answers: Iterable[tuple[int, float | None]]) -> None:
        """Answer the next sends of ``text`` with these (status, Retry-After), then 200."""
        with self._lock:
            self._script.setdefault(text, collections.deque()).extend(answers)

    def limit(self, rate: float, burst: float = 1.0) -> None:
        """Refuse sends over ``rate`` a second (a token bucket of ``burst`` tokens, full at
        first) with 429 and a ``Retry-After``, as a channel's API does."""
        with self._lock:
            self._bucket = [rate, burst, burst, time.monotonic()]

    def _over_limit(self, text: str) -> tuple[int, float | None] | None:
        """``(429, retry after)`` when the send finds the bucket empty; else takes a token."""
        with self._lock:
            if self._bucket is None:
                return None
            rate, burst, tokens, then = self._bucket
            now = time.monotonic()
            tokens = min(burst, tokens + (now - then) * rate)
            if tokens >= 1.0:
                self._bucket[2:] = [tokens - 1.0, now]
                return None
            self._bucket[2:] = [tokens, now]
            self.limited += 1
            retry_after = round((1.0 - tokens) / rate, 3)
            self._refusals.append(Refusal(text, 429, retry_after, now))
            return 429, retry_after

    def hold(self, chat_id: str, seconds: float, sends: int = 1) -> None:
        """The next ``sends`` sends to ``chat_id`` are recorded when they arrive (the
        message is delivered) but answered only ``seconds`` later, as a channel's API that
        hangs: the provider call of that chat waits meanwhile. ``release`` answers at once."""
        with self._lock:
            self._holds[chat_id] = [seconds, sends]

    def release(self) -> None:
        """Answer every held send now (and hold no more)."""
        with self._lock:
            self._holds.clear()
        self._released.set()

    def _maybe_hold(self, chat_id: str) -> None:
        with self._lock:
            hold = self._holds.get(chat_id)
            if hold is None or hold[1] <= 0:
                return
            hold[1] -= 1
            seconds = hold[0]
        began = time.monotonic()
        self._released.wait(seconds)
        with self._lock:
            self.held.append((chat_id, began, time.monotonic()))

    def refuse(self, text: str) -> None:
        """Answer 400 to every send of ``text`` (a final refusal) until :meth:`allow`."""
        with self._lock:
            self._refused.add(text)

    def allow(self, text: str) -> None:
        with self._lock:
            self._refused.discard(text)

    def refusals(self) -> list[Refusal]:
        with self._lock:
            return list(self._refusals)

    def _refusal(self, text: str) -> tuple[int, float | None] | None:
        with self._lock:
            queued = self._script.get(text)
            if text in self._refused:
                answer: tuple[int, float | None] | None = (400, None)
            elif queued:
                answer = queued.popleft()
            else:
                return None
            assert answer is not None
            self._refusals.append(Refusal(text, answer[0], answer[1], time.monotonic()))
            return answer

    def _add(self, chat_id: str, text: str, key: str | None, pid: int) -> Call:
        with self._lock:
            call = Call(chat_id, text, key, pid, time.monotonic(), f"rec-{len(self._calls) + 1}")
            self._calls.append(call)
            self._lock.notify_all()
            return call

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/send"

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- what was recorded ----------------------------------------------------------------

    def calls(self) -> list[Call]:
        """Every send so far, in arrival order."""
        with self._lock:
            return list(self._calls)

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    def answered(self) -> set[str]:
        """The inbound ids whose reply reached the recorder."""
        return {c.inbound_id for c in self.calls() if c.inbound_id is not None}

    def duplicates(self, calls: Iterable[Call] | None = None) -> dict[str, int]:
        """Text -> number of calls, for every send the recorder got more than once."""
        counts = collections.Counter(c.text for c in (self.calls() if calls is None else calls))
        return {text: n for text, n in counts.items() if n > 1}

    def by_key(self, key: str) -> Call | None:
        """The first send recorded with idempotency key ``key``, if any."""
        with self._lock:
            return next((c for c in self._calls if c.key == key), None)

    def sends_from(self, pid: int, since: int = 0) -> int:
        """How many calls worker ``pid`` made among the calls from index ``since`` on."""
        with self._lock:
            return sum(1 for c in self._calls[since:] if c.pid == pid)

    def first_from(self, pid: int, since: int = 0) -> Call | None:
        """The first call worker ``pid`` made among the calls from index ``since`` on."""
        with self._lock:
            return next((c for c in self._calls[since:] if c.pid == pid), None)


#: How long ``post_send`` waits for the recorder's answer once the request is written: a
#: hang guard only (the recorder always answers; under load it may take seconds).
ANSWER_LIMIT_S = 60.0


async def post_send(
    url: str, payload: dict[str, Any], limit: float, *, answer_limit: float = ANSWER_LIMIT_S
) -> dict[str, Any]:
    """POST ``payload`` as JSON to ``url``; the decoded JSON answer of a 200, else raises
    ``OSError`` / ``TimeoutError`` / ``ValueError``.

    ``limit`` bounds the connection: a POST that could not connect never reached the
    recorder, so the provider's retry of it is a first call. Once the request is written the
    recorder may have recorded it, so the answer is awaited (up to ``answer_limit``, a hang
    guard) instead of timing out after ``limit``: a retry then would be counted as a second
    call of the send, a duplicate the worker never made (the recorder answering late under
    load, not a failed send)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = json.dumps(payload).encode()
    head = (
        f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()

    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), limit)

    async def exchange() -> bytes:
        writer.write(head + body)
        await writer.drain()
        return await reader.read()

    try:
        raw = await asyncio.wait_for(exchange(), answer_limit)
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    fields = status_line.split()
    head_text, _, content = rest.partition(b"\r\n\r\n")
    if len(fields) < 2 or fields[1] != b"200":
        if len(fields) < 2 or not fields[1].isdigit():
            raise ValueError(f"the recorder answered {status_line!r}")
        retry_after = None
        for line in head_text.decode(errors="replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "retry-after":
                retry_after = float(value.strip())
        raise HttpStatusError(int(fields[1]), retry_after, content.decode(errors="replace"))
    answer = json.loads(content)
    if not isinstance(answer, dict):
        raise ValueError(f"the recorder answered {content!r}")
    return answer


@dataclass
class Tally:
    """The receipts and dead letters of one test's topics, followed while the test runs."""

    bootstrap: str
    sent_topic: str
    dlq_topic: str
    receipts: list[Receipt] = field(default_factory=list)
    dead_lettered: set[str] = field(default_factory=set)
    _task: asyncio.Task[None] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    async def start(self) -> Tally:
        """Follow both topics from their beginning (read_committed): a thread reads, and
        hands each batch over to the event loop (the figures change on the loop only)."""
        parts = {
            t: await asyncio.to_thread(_partitions, self.bootstrap, t)
            for t in (self.sent_topic, self.dlq_topic)
        }
        consumer = reader(
            self.bootstrap,
            "botmesh-tests-tally",
            {"isolation.level": "read_committed", "enable.partition.eof": False},
        )
        consumer.assign(
            [TopicPartition(t, p, OFFSET_BEGINNING) for t, ps in parts.items() for p in ps]
        )
        self._stop.clear()
        loop = asyncio.get_running_loop()
        self._task = asyncio.ensure_future(asyncio.to_thread(self._follow, consumer, loop))
        # the thread ends with the task, even one cancelled without ``close`` (a test torn down)
        self._task.add_done_callback(lambda _: self._stop.set())
        return self

    def _follow(self, consumer: Consumer, loop: asyncio.AbstractEventLoop) -> None:
        """On the reader thread, until ``close``: decode each batch, then add it on the loop."""
        try:
            while not self._stop.is_set():
                receipts: list[Receipt] = []
                dead: set[str] = set()
                for m in consumer.consume(2000, 0.2):
                    err = m.error()
                    if err is not None:
                        if err.fatal():
                            raise KafkaException(err)
                        continue
                    if m.topic() == self.sent_topic:
                        receipts.append(decode_receipt(m.value()))
                    else:
                        dead.add(decode_inbound(m.value()).id)
                if (receipts or dead) and not self._stop.is_set():
                    loop.call_soon_threadsafe(self._take, receipts, dead)
        finally:
            consumer.close()

    def _take(self, receipts: list[Receipt], dead: set[str]) -> None:
        self.receipts.extend(receipts)
        self.dead_lettered |= dead

    async def close(self) -> None:
        if self._task is not None:
            self._stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def check(self) -> None:
        """Raise what the follower raised, if it stopped."""
        if self._task is not None and self._task.done():
            self._task.result()
            raise AssertionError("the receipts follower stopped")

    def states(self) -> dict[str, set[str]]:
        """Inbound id -> the states its receipts carry (``sent``, ``dead``, ``unknown``)."""
        out: dict[str, set[str]] = collections.defaultdict(set)
        for r in self.receipts:
            out[r.inbound_id or ""].add(str(r.state))
        return out

    def settled_without_reply(self) -> set[str]:
        """Inbound ids whose send settled ``dead`` or ``unknown`` (by their receipts)."""
        return {i for i, s in self.states().items() if s & {"dead", "unknown"}}

    def again(self, ids: set[str]) -> int:
        """Receipts of the sends of ``ids`` beyond one a send (read_committed): what a
        reader of the receipts topic sees more than once (``at_least_once`` may publish a
        receipt again after a crash; ``exactly_once`` never)."""
        mine = [r.key for r in self.receipts if r.inbound_id in ids]
        return len(mine) - len(set(mine))

    def unknown(self) -> set[str]:
        return {i for i, s in self.states().items() if "unknown" in s}

    def accounted(self, recorder: Recorder) -> set[str]:
        """Inbound ids accounted for: replied at the recorder, settled ``dead`` or
        ``unknown``, or dead-lettered."""
        return recorder.answered() | self.settled_without_reply() | self.dead_lettered

    async def until_accounted(
        self,
        recorder: Recorder,
        ids: set[str],
        check: Callable[[], None],
        limit: float,
        *,
        receipts: bool = True,
    ) -> None:
        """Wait until every id of ``ids`` is accounted for and (``receipts``) has a receipt
        or a dead letter; ``check`` raises when a worker died."""
        deadline = time.monotonic() + limit
        while True:
            missing = ids - self.accounted(recorder)
            if receipts:
                missing |= ids - set(self.states()) - self.dead_lettered
            if not missing:
                return
            check()
            self.check()
            if time.monotonic() > deadline:
                unanswered = sorted(missing - self.accounted(recorder))
                raise AssertionError(
                    f"{len(missing)} of {len(ids)} inbounds unaccounted for after {limit}s, "
                    f"e.g. {sorted(missing)[:5]}; with no reply at the channel: "
                    f"{unanswered[:5]}, with no receipt: {sorted(missing - set(unanswered))[:5]}"
                )
            await asyncio.sleep(0.05)


async def wait_until(
    cond: Callable[[], bool],
    what: str,
    *,
    check: Callable[[], None] = lambda: None,
    limit: float = 120.0,
    poll: float = 0.05,
) -> float:
    """Wait until ``cond()`` holds (``check()`` raises when a worker died); the seconds it
    took. ``limit`` is a hang guard: past it the wait fails, naming ``what``."""
    t0 = time.monotonic()
    while not cond():
        check()
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"not after {limit}s: {what}")
        await asyncio.sleep(poll)
    return time.monotonic() - t0


def check_effects(
    recorder: Recorder, tally: Tally, ids: set[str], *, killed: Sequence[int] | None = None
) -> dict[str, int]:
    """The end of every test: 0 lost, 0 duplicates, no send from nowhere; the figures. With
    ``killed`` (the pids the test SIGKILLed), the sends the receipts say ``unknown`` are no
    more than those kills left in flight (``tests.kafka.unknowns.check_unknown_sends``)."""
    calls = recorder.calls()
    lost = ids - tally.accounted(recorder)
    dupes = recorder.duplicates()
    unknown = tally.unknown()
    stray = [c for c in calls if c.inbound_id not in ids]
    no_receipt = ids - set(tally.states()) - tally.dead_lettered
    out = {
        "messages": len(ids),
        "provider calls": len(calls),
        "duplicates": sum(n - 1 for n in dupes.values()),
        "lost": len(lost),
        "unknown": len(unknown & ids),
        "unknown never sent": len((unknown & ids) - recorder.answered()),
        "dead": len({i for i, s in tally.states().items() if "dead" in s} & ids),
        "dead-lettered": len(tally.dead_lettered & ids),
        "receipts": len(tally.receipts),
        "receipts again": tally.again(ids),
    }
    print(f"\n  effects: {out}")
    dupe_ids = {c.inbound_id for c in calls if c.text in dupes}
    t0 = calls[0].at if calls else 0.0
    example = {
        text: [(c.pid, f"{c.at - t0:.1f}s") for c in calls if c.text == text]
        for text in sorted(dupes)[:5]
    }
    assert dupes == {}, (
        f"{len(dupes)} sends reached the provider more than once "
        f"({len(dupe_ids & unknown)} of them reported unknown), e.g. (worker pid, time): "
        f"{example}"
    )
    assert lost == set(), f"{len(lost)} inbounds lost, e.g. {sorted(lost)[:5]}"
    assert stray == [], f"provider calls for no inbound of the test: {stray[:5]}"
    assert no_receipt == set(), f"{len(no_receipt)} inbounds without a receipt or dead letter"
    if killed is not None:
        settled = {f"{i}:1": {"state": "unknown"} for i in unknown & ids}
        check_unknown_sends(settled, recorder_callers(calls), killed, chats=CHATS)
    return out


def describe_group(bootstrap: str, group: str, topic: str) -> tuple[str, dict[str, list[int]]]:
    """The consumer group's state (``EMPTY``, ``STABLE``...) and, per member (its instance
    id, else its member id), the partitions of ``topic`` it holds."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    _COORDINATOR_MOVING = {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for attempt in range(20):
        [future] = admin.describe_consumer_groups([group]).values()
        try:
            description = future.result(30)
            break
        except KafkaException as exc:  # the coordinator loading, or moving: ask again
            error = exc.args[0]
            if error.code() not in _COORDINATOR_MOVING or attempt == 19:
                raise
            time.sleep(0.25)
    members = {
        m.group_instance_id or m.member_id: sorted(
            tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic
        )
        for m in description.members
    }
    return str(description.state.name), members


def _partitions(bootstrap: str, topic: str, within: float = 30.0) -> list[int]:
    """The partitions of ``topic``, once the broker's metadata lists them (a topic just
    created can be missing from it for a moment: seen on a broker just started)."""
    found = wait_topic(bootstrap, topic, within)
    if not found:
        raise AssertionError(f"topic {topic} has no partitions in the metadata after {within} s")
    return found
