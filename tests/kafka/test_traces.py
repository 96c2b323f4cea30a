"""One trace from a webhook to its receipt, across a worker killed mid-turn: a real broker,
the real ``botmesh gateway`` and a real ``botmesh worker`` (processes), the Telegram adapter
talking to the fake Telegram API of ``tests/providers/fakes`` (in this process).

Both processes run with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointed at a small OTLP/HTTP
receiver in this test (an aiohttp app decoding the protobuf the SDK's exporter posts to
``/v1/traces``): the product's own path, no test-only exporter.

Two messages go to the gateway (Telegram webhooks):

1. a text: the gateway's ``SERVER`` span, the worker's ``botmesh.turn`` span (its child,
   from the record's ``traceparent`` header), the provider's ``sendMessage`` (a client span,
   the turn's child, its ``traceparent`` at the channel), the journal's awaited writes (the
   turn's children) and the receipt's ``traceparent`` header: one trace;
2. a photo: the handler downloads it through the adapter (``getFile``) and the fake holds
   that first ``getFile`` until the test has SIGKILLed the worker. The killed run's call
   reached the channel in the webhook's trace; the restarted worker's recovery pass finishes
   the message from the journal (no record there, so outside the trace: each of its calls a
   trace of its own); the record, redelivered, continues the webhook's trace in a new turn,
   which runs the handlers again (their calls the turn's children, in the trace) and answers
   the reply from the journal, its receipt republished with the turn's ``traceparent``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog, decode_receipt
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker, read_all
from tests.kill import Child, python
from tests.providers.fakes.telegram import FakeTelegram
from tests.providers.serve import Background

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
SECRET = "traces-webhook-secret"
CHAT = "1001"
INBOUND_ID = f"tg:{CHAT}:1"
PHOTO = bytes(range(256)) * 8
INTERNAL, SERVER, CLIENT, CONSUMER = 1, 2, 3, 5  # OTLP's Span.SpanKind values

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- the OTLP receiver ------------------------------------------------------------------------


@dataclass
class Span:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent: str
    attributes: dict[str, Any]


@dataclass
class Receiver:
    """``POST /v1/traces``: OTLP/HTTP protobuf, as the SDK's exporter posts it."""

    spans: list[Span] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        return app

    async def _export(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        for resource in message.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for s in scope.spans:
                    values = {a.key: _value(a.value) for a in s.attributes}
                    self.spans.append(
                        Span(
                            attrs.get("service.name", ""),
                            s.name,
                            s.kind,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            values,
                        )
                    )
        reply = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


# -- the channel, holding the first media download ----------------------------------------


@dataclass
class Holding:
    """Records the ``traceparent`` of every call the worker makes to the channel; holds the
    first ``getFile`` until ``release`` is set (the worker is killed meanwhile)."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    release: asyncio.Event | None = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        method = request.path.rsplit("/", 1)[-1] if request.path.startswith("/bot") else "file"
        self.calls.append((method, request.headers.get("traceparent", "")))
        if method == "getFile" and [m for m, _ in self.calls].count("getFile") == 1:
            if self.release is None:
                self.release = asyncio.Event()
            await self.release.wait()
        return await handler(request)

    def let_go(self) -> None:
        if self.release is None:
            self.release = asyncio.Event()
        self.release.set()


# -- the gateway process ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _post(url: str, headers: dict[str, str], body: bytes) -> int:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture
def gateway(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> Iterator[Callable[[dict[str, str]], str]]:
    children: list[Child] = []

    def start(env: dict[str, str]) -> str:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        argv = python(
            "-m",
            "botmesh",
            "gateway",
            "--channel",
            "telegram",
            "--port",
            str(port),
            "--bootstrap",
            kafka_bootstrap,
            "--prefix",
            topic_prefix,
            "--loglevel",
            "warning",
        )
        child = Child(argv, env=env, log=tmp_path / "gateway.log").start()
        children.append(child)
        deadline = time.monotonic() + WAIT_S
        while not _ready(url):
            assert child.alive(), (tmp_path / "gateway.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the gateway never became ready"
            time.sleep(0.1)
        return url

    yield start
    for child in children:
        child.stop()


def _webhook(n: int, file_id: str | None) -> bytes:
    """Telegram's update of message ``n``: a text, or a photo (``file_id``) with a caption."""
    message: dict[str, Any] = {
        "message_id": n,
        "date": int(time.time()),
        "chat": {"id": int(CHAT), "type": "private"},
        "from": {"id": int(CHAT), "is_bot": False, "first_name": "Ann"},
    }
    if file_id is None:
        message["text"] = f"hello {n}"
    else:
        message["photo"] = [{"file_id": file_id, "file_unique_id": "U1", "width": 9}]
        message["caption"] = f"a photo {n}"
    return json.dumps({"update_id": 900 + n, "message": message}).encode()


def _trace_of(traceparent: str) -> str:
    return traceparent.split("-")[1] if traceparent else ""


def _parent_of(traceparent: str) -> str:
    return traceparent.split("-")[2] if traceparent else ""


async def _until(what: str, ok: Callable[[], bool], alive: Callable[[], None]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ok():
        alive()
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting for {what}")
        await asyncio.sleep(0.1)


async def _receipts(
    bootstrap: str, topic: str, inbound_id: str, alive: Callable[[], None]
) -> list[Any]:
    """The records on ``topic`` of the receipts of ``inbound_id``, once there is one."""
    deadline = time.monotonic() + WAIT_S
    while True:
        records = [
            r
            for r in await read_all(bootstrap, topic)
            if decode_receipt(r.value).inbound_id == inbound_id
        ]
        if records:
            return records
        alive()
        assert time.monotonic() < deadline, f"no receipt of {inbound_id}"
        await asyncio.sleep(0.2)


def _traceparents(records: list[Any]) -> list[str]:
    return [v.decode() for r in records for k, v in (r.headers or ()) if k == "traceparent"]


async def test_one_trace_from_the_webhook_to_the_receipt_across_a_worker_killed_mid_turn(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    gateway: Callable[[dict[str, str]], str],
) -> None:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=PARTITIONS))
    receiver = Receiver()
    fake = FakeTelegram(TOKEN, chats=(CHAT,))
    file_id = fake.add_file(PHOTO, "image/jpeg")
    holding = Holding()
    channel_app = fake.app()
    channel_app.middlewares.append(holding.middleware)
    channel = Background(channel_app)
    collector = Background(receiver.app())
    with collector as otlp, channel as api:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        worker = Worker(
            kafka_bootstrap,
            topic_prefix,
            tmp_path / "worker",
            env={
                **otel,
                "TELEGRAM_BOT_TOKEN": TOKEN,
                "TELEGRAM_API_URL": api,
                "TELEGRAM_ALLOW_PRIVATE_MEDIA": "1",
            },
            provider="telegram",
            app="tests.kafka.channel_bot:bot",
        )
        worker.start()
        try:
            url = await asyncio.to_thread(gateway, {**otel, "TELEGRAM_WEBHOOK_SECRET": SECRET})
            headers = {
                "Content-Type": "application/json",
                "X-Telegram-Bot-Api-Secret-Token": SECRET,
            }

            def replies(n: int) -> Callable[[], bool]:
                return lambda: channel.call(lambda: len(fake.messages) == n)

            # 1. a text: webhook, turn, reply, receipt
            status = await asyncio.to_thread(_post, url + "/telegram", headers, _webhook(1, None))
            assert status == 200
            await _until("the first reply", replies(1), worker.check_alive)
            first = await _receipts(kafka_bootstrap, cat.sent, f"tg:{CHAT}:1", worker.check_alive)
            # 2. a photo: the worker is killed while the channel holds its download (the
            # calls counted before the webhook: the worker may call before the post returns)
            held = channel.call(lambda: len(holding.calls))
            status = await asyncio.to_thread(
                _post, url + "/telegram", headers, _webhook(2, file_id)
            )
            assert status == 200

            def holding_it() -> bool:
                return channel.call(lambda: [m for m, _ in holding.calls].count("getFile") == 1)

            await _until("the worker's first getFile", holding_it, worker.check_alive)
            worker.kill()  # mid-turn: the handler waits for the channel
            channel.call(holding.let_go)
            worker.start()
            await _until("the second reply", replies(2), worker.check_alive)
            await _receipts(kafka_bootstrap, cat.sent, f"tg:{CHAT}:2", worker.check_alive)
        finally:
            worker.close()
        # every receipt, the worker stopped (the first of message 2 may be the recovery's)
        second = await _receipts(kafka_bootstrap, cat.sent, f"tg:{CHAT}:2", lambda: None)
        calls = channel.call(lambda: list(holding.calls))

        def exported() -> list[Span]:
            return collector.call(lambda: list(receiver.spans))

        def complete() -> bool:
            spans = exported()
            turns = {s.span_id: s.trace_id for s in spans if s.name == "botmesh.turn"}
            traces = {s.trace_id for s in spans if s.service == "botmesh-gateway"}
            return (
                len(traces) == 2
                and set(turns.values()) == traces
                and any(s.kind == CLIENT and s.parent in turns for s in spans)
                and any(s.name == "botmesh.journal.write" and s.parent in turns for s in spans)
            )

        await _until("the spans", complete, lambda: None)
        spans = exported()

    webhooks = [s for s in spans if s.service == "botmesh-gateway" and s.kind == SERVER]
    assert [w.name for w in webhooks] == ["POST /telegram"] * 2
    assert all(w.attributes["http.response.status_code"] == 200 for w in webhooks)
    turns = [s for s in spans if s.name == "botmesh.turn"]
    assert all(t.kind == CONSUMER and t.service == "botmesh-worker" for t in turns)

    def children(span: Span) -> list[Span]:
        return [s for s in spans if s.parent == span.span_id]

    def turns_of(n: int) -> list[Span]:
        """Message ``n``'s turns: one, and one more for each time its record came again (a
        restart before its offset was committed: answered as a duplicate, nothing ran)."""
        return [t for t in turns if t.attributes["messaging.message.id"] == f"tg:{CHAT}:{n}"]

    # 1. gateway span, turn span, provider calls, journal writes and receipt: one trace
    hook = webhooks[0]
    assert {(t.trace_id, t.parent) for t in turns_of(1)} == {(hook.trace_id, hook.span_id)}
    (turn,) = [t for t in turns_of(1) if children(t)]
    kinds = {(s.kind, s.name) for s in children(turn)}
    assert (CLIENT, "POST") in kinds and (INTERNAL, "botmesh.journal.write") in kinds, kinds
    assert (_trace_of(_traceparents(first)[0]), _parent_of(_traceparents(first)[0])) == (
        turn.trace_id,
        turn.span_id,
    )
    send = [tp for m, tp in calls[:held] if m == "sendMessage"]
    assert [_trace_of(tp) for tp in send] == [turn.trace_id], "the trace reached the channel"

    # 2. across the kill: the killed run's call and the replayed turn, one trace
    hook = webhooks[1]
    trace = hook.trace_id
    assert turns_of(2), "the replayed turn"
    assert {(t.trace_id, t.parent) for t in turns_of(2)} == {(trace, hook.span_id)}
    after = calls[held:]
    assert after[0][0] == "getFile" and _trace_of(after[0][1]) == trace, after
    assert _parent_of(after[0][1]) not in {s.span_id for s in spans}, "the killed run's call"
    # The restarted worker's recovery pass finishes what the killed run left in flight, from
    # the journal (no record, so no headers: each of its calls a trace of its own); the
    # record, redelivered, continues its trace in a new turn, which runs the handlers again
    # and answers the reply from the journal: its calls and its receipt carry the trace.
    ours = [s for t in turns_of(2) for s in children(t)]
    assert all(s.trace_id == trace for s in ours)
    assert {_parent_of(tp) for _, tp in after[1:] if _trace_of(tp) == trace} <= {
        s.span_id for s in ours
    }
    traced = {w.trace_id for w in webhooks}
    others = [s for s in spans if s.kind == CLIENT and s.trace_id not in traced]
    assert all(not s.parent for s in others), others
    parents = _traceparents(second)
    assert {_trace_of(p) for p in parents} <= {trace}, parents
    if ours:  # the turn re-ran the handlers (it found the record done, not still held)
        assert {s.parent for s in ours} & {_parent_of(p) for p in parents}, parents
    assert all(TOKEN not in json.dumps(s.attributes) for s in spans), "no token in a span"
