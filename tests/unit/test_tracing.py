"""``botmesh.observability.tracing``: off, it is a shared no-op that allocates nothing per
record (and with the extra missing it says which ``pip install`` turns it on); on, the W3C
headers go onto records and come back off them, and the worker's runner continues a
record's trace: the turn span a child of the record's ``traceparent``, the log lines and
the receipts carrying it. The spans go to an in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from yarl import URL

from botmesh import Bot, Context
from botmesh.journal import MemoryKv
from botmesh.observability import logs, tracing
from botmesh.state.messages import Inbound
from botmesh.streams.runner import InboundRunner, RawRecord
from botmesh.streams.sink import KafkaReceipts
from botmesh.testing import MockProvider
from botmesh.topics.records import decode_receipt, encode_inbound

ROOT = Path(__file__).resolve().parents[2]
RAW = RawRecord("p.inbound", 2, 40, b"42", b"{}")
ITEM = Inbound(id="m-1", chat_id="42", text="hello")


class Produced:
    """What the runner hands to the producer (role, key, value, headers), acked at once."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes, list[tuple[str, bytes]]]] = []

    async def __call__(
        self, role: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]
    ) -> asyncio.Future[None]:
        self.records.append((role, key, value, headers))
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ack.set_result(None)
        return ack


class Lines(logging.Handler):
    """JSON lines formatted as they are written (where the record's context is)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logs.JsonFormatter())
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


def _reset_global_provider() -> None:
    """OpenTelemetry lets a process set its tracer provider once: put it back to none (as
    its own test utilities do), so the rest of the suite runs without one."""
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER = None
    trace._TRACER_PROVIDER_SET_ONCE = Once()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, with a provider the program installed (as a bot module may): every span
    ends in the exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        assert tracing.configure("botmesh-test", environ={})
        yield exporter
    finally:
        from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

        AioHttpClientInstrumentor().uninstrument()
        tracing.ENABLED = False
        tracing._tracer = None
        provider.shutdown()
        _reset_global_provider()


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- off --------------------------------------------------------------------------------------


def test_off_by_default_nothing_is_imported_and_every_call_is_the_shared_no_op() -> None:
    out = _run(
        """
        import sys, tracemalloc
        from botmesh.observability import logs, tracing
        from botmesh.state.messages import Inbound
        from botmesh.streams.runner import RawRecord

        assert tracing.configure("botmesh-worker") is False and tracing.ENABLED is False
        raw = RawRecord("p.inbound", 0, 1, b"c", b"{}", [("traceparent", b"00-ab-cd-01")])
        item = Inbound(id="m", chat_id="c", text="t")
        assert tracing.record_span(raw, item) is tracing.NO_SPAN
        assert tracing.webhook_span("POST", "/x", {}) is tracing.NO_SPAN
        assert tracing.record_headers() is None and tracing.current_ids() is None
        assert logs.record_scope(raw, item)._inner is None
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for _ in range(10_000):
            with tracing.record_span(raw, item):
                tracing.journal_write(0.001)
        after = tracemalloc.take_snapshot()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename") if s.size_diff > 0)
        assert grown < 2048, grown  # not 10,000 of anything
        assert not [m for m in sys.modules if m.startswith("opentelemetry")]
        print("ok")
        """,
        {},
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_without_the_extra_tracing_asked_for_is_off_and_says_how_to_install_it() -> None:
    out = _run(
        """
        import logging, sys
        sys.modules["opentelemetry"] = None  # as if botmesh[otel] were not installed
        logging.basicConfig(level="WARNING", format="%(message)s")
        from botmesh.observability import tracing
        assert tracing.configure("botmesh-worker") is False and tracing.ENABLED is False
        print("off")
        """,
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
    )
    assert out.returncode == 0 and out.stdout.strip() == "off", out.stderr
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in out.stderr
    assert "pip install 'botmesh[otel]'" in out.stderr


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, False),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, True),
    ],
)
def test_the_environment_turns_it_on_with_the_sdk_s_provider(env: dict[str, str], on: bool) -> None:
    out = _run(
        """
        from opentelemetry import trace
        from botmesh.observability import tracing
        on = tracing.configure("botmesh-worker")
        provider = trace.get_tracer_provider()
        name = provider.resource.attributes["service.name"] if on else "-"
        print(on, name)
        """,
        env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ([str(on), "botmesh-worker"] if on else [str(on), "-"])


def test_an_exporter_that_is_not_installed_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER: no span exporter 'jaeger'"):
        tracing._sdk_provider("botmesh-worker", {"OTEL_TRACES_EXPORTER": "otlp,jaeger"})


def test_a_traced_url_keeps_no_token_id_or_query() -> None:
    url = URL("https://user:pw@api.telegram.org/bot123456:AAHdqTcv-x/sendMessage?token=s")
    assert tracing.safe_url(url) == "https://api.telegram.org/*/sendMessage"
    url = URL("http://127.0.0.1:8081/v21.0/1029384756/messages")
    assert tracing.safe_url(url) == "http://127.0.0.1:8081/v21.0/*/messages"


# -- on ---------------------------------------------------------------------------------------


def test_headers_carry_the_trace_onto_a_record_and_back(spans: InMemorySpanExporter) -> None:
    with tracing.webhook_span("POST", "/telegram", {}) as span:
        headers = tracing.record_headers()
        span.answered(200)
    assert headers is not None and [k for k, _ in headers] == ["traceparent"]
    (webhook,) = spans.get_finished_spans()
    assert webhook.kind == SpanKind.SERVER and webhook.name == "POST /telegram"
    assert webhook.attributes is not None
    assert webhook.attributes["http.response.status_code"] == 200
    version, trace_id, span_id, _ = headers[0][1].decode().split("-")
    assert (version, int(trace_id, 16), int(span_id, 16)) == (
        "00",
        webhook.context.trace_id,
        webhook.context.span_id,
    )
    back = trace.get_current_span(tracing.extract([("other", b"x"), *headers]))
    assert back.get_span_context().trace_id == webhook.context.trace_id
    assert back.get_span_context().span_id == webhook.context.span_id
    assert not trace.get_current_span(tracing.extract([])).get_span_context().is_valid


def test_a_webhook_answered_5xx_is_an_error_span(spans: InMemorySpanExporter) -> None:
    with tracing.webhook_span("POST", "/slack", {}) as span:
        span.answered(503)
    (webhook,) = spans.get_finished_spans()
    assert webhook.status.status_code == trace.StatusCode.ERROR


def test_a_record_s_span_continues_its_trace_and_a_record_without_starts_one(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.webhook_span("POST", "/telegram", {}):
        headers = tracing.record_headers() or []
    raw = RawRecord("p.inbound", 2, 40, b"42", b"{}", headers)
    with logs.record_scope(raw, ITEM):
        tracing.journal_write(0.002)
    with logs.record_scope(RAW, ITEM):
        pass
    webhook, write, turn, alone = spans.get_finished_spans()
    assert turn.name == "botmesh.turn" and turn.kind == SpanKind.CONSUMER
    assert turn.context.trace_id == webhook.context.trace_id
    assert turn.parent is not None and turn.parent.span_id == webhook.context.span_id
    assert write.name == "botmesh.journal.write" and write.parent is not None
    assert write.parent.span_id == turn.context.span_id
    assert write.end_time is not None and write.start_time is not None
    assert write.end_time - write.start_time == 2_000_000
    assert turn.attributes is not None and turn.attributes["messaging.kafka.offset"] == 40
    assert alone.parent is None and alone.context.trace_id != webhook.context.trace_id


async def test_the_runner_continues_the_trace_in_its_logs_and_its_receipts(
    spans: InMemorySpanExporter,
) -> None:
    """The real runtime under the runner with the worker's scope: the handler's log line
    and the reply's receipt carry the trace the record's ``traceparent`` header started."""
    bot = Bot("traced", durability={"poll": 0})
    log = logging.getLogger("tests.traced")

    @bot.on_message
    async def reply(ctx: Context) -> None:
        log.warning("handling")
        await ctx.reply("re")

    produced = Produced()
    runtime = bot.bind(
        MockProvider(), MemoryKv(), instance_id="w", receipts=KafkaReceipts(produced)
    )
    await runtime.start()
    try:
        runner = InboundRunner(runtime, produced)
        runner.scope = logs.record_scope
        with tracing.webhook_span("POST", "/telegram", {}):
            headers = tracing.record_headers() or []
        value = encode_inbound(Inbound(id="m-7", chat_id="42", text="hi"))
        lines = Lines()
        log.addHandler(lines)
        try:
            await asyncio.wait_for(
                runner.run_batch([RawRecord("p.inbound", 1, 7, b"42", value, headers)]), 30
            )
        finally:
            log.removeHandler(lines)
    finally:
        await runtime.stop()
    finished: list[ReadableSpan] = list(spans.get_finished_spans())
    webhook = finished[0]
    turn = next(s for s in finished if s.name == "botmesh.turn")
    trace_hex = f"{webhook.context.trace_id:032x}"
    assert turn.context.trace_id == webhook.context.trace_id
    (line,) = lines.lines
    assert line["trace_id"] == trace_hex and line["span_id"] == f"{turn.context.span_id:016x}"
    assert (line["chat_id"], line["message_id"], line["partition"], line["offset"]) == (
        "42",
        "m-7",
        1,
        7,
    )
    sent = [(value, h) for role, _, value, h in produced.records if role == "sent"]
    assert [decode_receipt(v).key for v, _ in sent] == ["m-7:1"]
    parents = [v.decode().split("-") for k, v in sent[0][1] if k == "traceparent"]
    assert [(p[1], int(p[2], 16)) for p in parents] == [(trace_hex, turn.context.span_id)]
