"""The webhook gateway on a real broker, driven over real HTTP on 127.0.0.1: a signed webhook
becomes exactly one record on ``<prefix>.inbound`` (keyed by chat id) before the channel gets
its 200; bad signatures, replays and malformed bodies never reach the topic; a webhook the
channel retries is produced once, across a restart and across replicas; no broker → 503."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from botmesh._gateway import Gateway, GatewayConfig, serving
from botmesh.observability.metrics import metric_names
from botmesh.providers.slack import SlackWebhook
from botmesh.providers.webhooks import hmac_hex
from botmesh.providers.whatsapp import WhatsAppWebhook
from botmesh.state.messages import DeliveryState, DeliveryStatus, Inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics.catalog import Catalog
from botmesh.topics.records import chat_key, decode_inbound, decode_status
from tests.gateway.kit import (
    CONNECT_S,
    PROBE_TOKEN,
    SLACK_SECRET,
    ProbeWebhook,
    gateway_at,
    probe_body,
    probe_headers,
    read_topic,
    slack_headers,
    slack_message,
)
from tests.murmur2 import java_partition, murmur2

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def catalog(kafka_bootstrap: str, topic_prefix: str) -> Catalog:
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=2))
    return cat


async def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as r:
        return r.status, await r.text()


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return r.status, await r.text()


async def test_a_signed_slack_message_is_one_record_on_the_topic_before_the_200(
    kafka_bootstrap: str, catalog: Catalog
) -> None:
    async with gateway_at(kafka_bootstrap, catalog.prefix) as (gw, url):
        body = slack_message("Ev01", channel="C0CHAT", text="hi there")
        status, _ = await _post(f"{url}/slack", body, slack_headers(body))
        # read at once: the 200 came after the broker's ack, so the record is there already
        records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert status == 200
    assert len(records) == 1
    assert records[0].key == chat_key("C0CHAT")
    assert decode_inbound(records[0].value) == Inbound(
        id="Ev01",
        chat_id="C0CHAT",
        channel="slack",
        sender="U2147483697",
        text="hi there",
        ts=1355517523.000005,
        data={"team_id": "T123ABC456"},
    )
    assert gw.counts["slack"]["produced"] == 1


async def test_bad_signature_old_timestamp_and_malformed_never_reach_the_topic(
    kafka_bootstrap: str, catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    body = slack_message("Ev02")
    async with gateway_at(kafka_bootstrap, catalog.prefix) as (gw, url):
        wrong = await _post(f"{url}/slack", body, slack_headers(body, secret="not-the-secret"))
        unsigned = await _post(f"{url}/slack", body, {"Content-Type": "application/json"})
        old = await _post(f"{url}/slack", body, slack_headers(body, at=time.time() - 6 * 60))
        junk = b"{not json"
        malformed = await _post(f"{url}/slack", junk, slack_headers(junk))
        boom = b'{"messages": "boom"}'
        crashed = await _post(f"{url}/probe", boom, probe_headers(boom))
        records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert [wrong[0], unsigned[0], old[0]] == [401, 401, 401]
    assert [malformed[0], crashed[0]] == [400, 400]
    assert records == []
    assert gw.counts["slack"]["bad_signature"] == 3
    assert gw.counts["slack"]["malformed"] == 1
    assert gw.counts["probe"]["malformed"] == 1
    assert gw.counts["slack"]["produced"] == gw.counts["probe"]["produced"] == 0
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "bad signature" in logged and "KeyError" in logged
    assert SLACK_SECRET not in logged and "probe-secret" not in logged


async def test_url_verification_answers_the_challenge(
    kafka_bootstrap: str, catalog: Catalog
) -> None:
    body = json.dumps(
        {
            "token": "x",
            "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "type": "url_verification",
        }
    ).encode()
    async with gateway_at(kafka_bootstrap, catalog.prefix) as (_, url):
        ok = await _post(f"{url}/slack", body, slack_headers(body))
        forged = await _post(f"{url}/slack", body, slack_headers(body, secret="nope"))
        records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert ok == (200, "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P")
    assert forged[0] == 401
    assert records == []


async def test_the_same_event_three_times_and_after_a_restart_is_one_record(
    kafka_bootstrap: str, catalog: Catalog
) -> None:
    body = slack_message("Ev03", channel="C0DUP")
    async with gateway_at(kafka_bootstrap, catalog.prefix) as (gw, url):
        first = await _post(f"{url}/slack", body, slack_headers(body))
        again = [await _post(f"{url}/slack", body, slack_headers(body, retry=n)) for n in (1, 2)]
        assert gw.counts["slack"]["duplicates"] == 2
    async with gateway_at(kafka_bootstrap, catalog.prefix) as (gw2, url2):
        assert ("slack", "Ev03") in gw2.seen  # loaded from <prefix>.gateway.seen
        late = await _post(f"{url2}/slack", body, slack_headers(body, retry=3))
        records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert [first[0], *(s for s, _ in again), late[0]] == [200, 200, 200, 200]
    assert len(records) == 1 and decode_inbound(records[0].value).id == "Ev03"
    assert gw2.counts["slack"] == {
        "received": 1,
        "produced": 0,
        "duplicates": 1,
        "bad_signature": 0,
        "malformed": 0,
        "produce_failed": 0,
        "too_large": 0,
        "statuses": 0,
    }
    seen = await read_topic(kafka_bootstrap, catalog.gateway_seen)
    assert [r.key for r in seen] == [b"slack:Ev03"]


async def test_the_same_event_at_once_is_produced_once(
    kafka_bootstrap: str, catalog: Catalog
) -> None:
    body = probe_body(("p1", "chat-a"), ("p2", "chat-b"))
    async with gateway_at(kafka_bootstrap, catalog.prefix) as (gw, url):
        results = await asyncio.gather(
            *(_post(f"{url}/probe", body, probe_headers(body)) for _ in range(5))
        )
        records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert [s for s, _ in results] == [200] * 5
    assert sorted(decode_inbound(r.value).id for r in records) == ["p1", "p2"]
    assert gw.counts["probe"]["produced"] == 2
    assert gw.counts["probe"]["duplicates"] == 8


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # Kafka's own vectors: UtilsTest.testMurmur2 (clients/src/test/java/.../utils)
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_the_murmur2_reference_gives_kafka_s_own_hashes(data: bytes, expected: int) -> None:
    """``tests/murmur2.py``, the reference every partition test compares with."""
    assert murmur2(data) == expected


async def test_a_chat_goes_to_the_partition_java_puts_it_on(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """librdkafka's default partitioner (consistent_random) puts a key elsewhere than
    Java's producer (murmur2): the gateway's records of a chat must land where the other
    clients put that chat's records, or its turns would split."""
    cat = Catalog(topic_prefix)
    ensure_topics(kafka_bootstrap, cat.specs(partitions=7))
    chats = [f"chat-{n}" for n in range(60)] + ["C0CHAT", "+4915112345678", "ü-chat"]
    body = probe_body(*((f"m{n}", chat) for n, chat in enumerate(chats)))
    async with gateway_at(kafka_bootstrap, cat.prefix) as (_, url):
        status, _ = await _post(f"{url}/probe", body, probe_headers(body))
        records = await read_topic(kafka_bootstrap, cat.inbound)
    assert status == 200
    where = {decode_inbound(r.value).chat_id: r.partition for r in records}
    assert sorted(where) == sorted(chats)
    assert where == {c: java_partition(chat_key(c), 7) for c in chats}
    assert len(set(where.values())) == 7  # spread: a constant partition would pass nothing


async def test_a_retry_on_another_replica_is_recognised(
    kafka_bootstrap: str, catalog: Catalog
) -> None:
    body = slack_message("Ev04", channel="C0REP")
    async with (
        gateway_at(kafka_bootstrap, catalog.prefix) as (a, url_a),
        gateway_at(kafka_bootstrap, catalog.prefix) as (b, url_b),
    ):
        assert (await _post(f"{url_a}/slack", body, slack_headers(body)))[0] == 200
        async with asyncio.timeout(30):  # b tails the seen topic: eventually it knows
            while ("slack", "Ev04") not in b.seen:  # noqa: ASYNC110 - a set, no event
                await asyncio.sleep(0.05)
        assert (await _post(f"{url_b}/slack", body, slack_headers(body, retry=1)))[0] == 200
        records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert len(records) == 1
    assert a.counts["slack"]["produced"] == 1
    assert b.counts["slack"]["produced"] == 0 and b.counts["slack"]["duplicates"] == 1


def scraped(text: str) -> dict[tuple[str, tuple[str, ...]], float]:
    """A scrape read by ``prometheus_client``'s parser: (sample name, label values) -> value."""
    return {
        (sample.name, tuple(sample.labels.values())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_no_broker_gives_503_and_readyz_503(unused_tcp_port: int) -> None:
    closed = f"127.0.0.1:{unused_tcp_port}"
    body = slack_message("Ev05")
    async with gateway_at(closed, "nobroker", connect=False) as (gw, url):
        health = await _get(f"{url}/healthz")
        ready = await _get(f"{url}/readyz")
        status, _ = await _post(f"{url}/slack", body, slack_headers(body))
        metrics = scraped((await _get(f"{url}/metrics"))[1])
    assert health[0] == 200
    assert ready[0] == 503 and "Kafka" in ready[1]
    assert status == 503
    assert metrics[("botmesh_gateway_webhooks_total", ("slack", "produce_failed"))] == 1
    assert metrics[("botmesh_gateway_connected", ())] == 0
    assert gw.counts["slack"]["produced"] == 0


async def test_readyz_waits_for_the_inbound_topic(kafka_bootstrap: str, topic_prefix: str) -> None:
    cat = Catalog(topic_prefix)
    body = slack_message("Ev06")
    async with gateway_at(kafka_bootstrap, topic_prefix) as (_, url):
        before = await _get(f"{url}/readyz")
        refused = await _post(f"{url}/slack", body, slack_headers(body))
        ensure_topics(kafka_bootstrap, cat.specs(partitions=2))
        # a topic just created can be missing from the metadata the gateway is given for a
        # moment (CI: one 503 right after the create): ready once the broker lists it
        deadline = time.monotonic() + 30
        after = await _get(f"{url}/readyz")
        while after[0] == 503 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            after = await _get(f"{url}/readyz")
        accepted = await _post(f"{url}/slack", body, slack_headers(body, retry=1))
        records = await read_topic(kafka_bootstrap, cat.inbound)
    assert before[0] == 503 and cat.inbound in before[1] and "topics create" in before[1]
    assert refused[0] == 503
    assert after == (200, "ready\n")
    assert accepted[0] == 200 and len(records) == 1


async def test_a_failed_produce_is_503_and_not_remembered(
    kafka_bootstrap: str, catalog: Catalog
) -> None:
    """The broker refuses the record (stood in for by a failing send): 503, counted, not
    taken for produced, so the channel's retry produces it."""
    body = slack_message("Ev12")
    async with gateway_at(kafka_bootstrap, catalog.prefix) as (gw, url):
        real_send = gw._kafka.send
        failures = [RuntimeError("NotEnoughReplicasError")]

        async def failing_send(topic: str, key: bytes, value: bytes) -> Any:
            if topic == catalog.inbound and failures:
                raise failures.pop()
            return await real_send(topic, key, value)

        gw._kafka.send = failing_send  # type: ignore[method-assign]
        refused = await _post(f"{url}/slack", body, slack_headers(body))
        assert ("slack", "Ev12") not in gw.seen
        retried = await _post(f"{url}/slack", body, slack_headers(body, retry=1))
        records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert (refused[0], retried[0]) == (503, 200)
    assert gw.counts["slack"]["produce_failed"] == 1 and gw.counts["slack"]["produced"] == 1
    assert [decode_inbound(r.value).id for r in records] == ["Ev12"]


async def test_no_ack_in_time_is_503_and_the_late_ack_still_counts(
    kafka_bootstrap: str, catalog: Catalog
) -> None:
    """The ack does not come within the request timeout: 503 so the channel retries; when it
    comes after all, the retry is a duplicate, not a second record."""
    body = slack_message("Ev13")
    async with gateway_at(kafka_bootstrap, catalog.prefix, request_timeout=0.5) as (gw, url):
        real_send = gw._kafka.send
        release = asyncio.Event()

        async def slow_send(topic: str, key: bytes, value: bytes) -> Any:
            ack = await real_send(topic, key, value)
            if topic != catalog.inbound:
                return ack

            async def late() -> Any:
                await release.wait()
                return await ack

            return late()

        gw._kafka.send = slow_send  # type: ignore[method-assign]
        timed_out = await _post(f"{url}/slack", body, slack_headers(body))
        release.set()
        retried = await _post(f"{url}/slack", body, slack_headers(body, retry=1))
        records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert (timed_out[0], retried[0]) == (503, 200)
    assert gw.counts["slack"]["produce_failed"] == 1
    assert gw.counts["slack"]["produced"] == 1 and gw.counts["slack"]["duplicates"] == 1
    assert len(records) == 1


async def test_a_body_over_the_limit_is_413(kafka_bootstrap: str, catalog: Catalog) -> None:
    big = slack_message("Ev07", text="x" * 3000)

    async def chunks() -> object:
        yield big  # no Content-Length: the limit holds while reading

    async with gateway_at(kafka_bootstrap, catalog.prefix, max_body=2048) as (gw, url):
        sized = await _post(f"{url}/slack", big, slack_headers(big))
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/slack", data=chunks(), headers=slack_headers(big)) as r,
        ):
            streamed = r.status
        small = slack_message("Ev08")
        fits = await _post(f"{url}/slack", small, slack_headers(small))
        records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert (sized[0], streamed, fits[0]) == (413, 413, 200)
    assert gw.counts["slack"]["too_large"] == 2
    assert [decode_inbound(r.value).id for r in records] == ["Ev08"]


async def test_health_ready_and_metrics(kafka_bootstrap: str, catalog: Catalog) -> None:
    async with gateway_at(kafka_bootstrap, catalog.prefix) as (_, url):
        health = await _get(f"{url}/healthz")
        ready = await _get(f"{url}/readyz")
        ok = slack_message("Ev09")
        await _post(f"{url}/slack", ok, slack_headers(ok))
        await _post(f"{url}/slack", ok, slack_headers(ok, retry=1))
        await _post(f"{url}/slack", ok, slack_headers(ok, secret="bad"))
        await _post(f"{url}/slack", b"[]", slack_headers(b"[]"))
        two = probe_body(("m1", "c1"), ("m2", "c1"))
        await _post(f"{url}/probe", two, probe_headers(two))
        status, text = await _get(f"{url}/metrics")
    assert health == (200, "ok\n") and ready == (200, "ready\n")
    assert status == 200
    metrics = scraped(text)  # Prometheus' own parser: a malformed exposition raises
    slack = {
        labels[1]: n
        for (name, labels), n in metrics.items()
        if name == "botmesh_gateway_webhooks_total" and labels[0] == "slack"
    }
    assert slack == {
        "received": 4,
        "produced": 1,
        "duplicates": 1,
        "bad_signature": 1,
        "malformed": 1,
        "produce_failed": 0,
        "too_large": 0,
        "statuses": 0,
    }
    assert metrics[("botmesh_gateway_webhooks_total", ("probe", "produced"))] == 2
    assert metrics[("botmesh_gateway_connected", ())] == 1
    assert {name for name, _ in metrics} <= metric_names()
    assert metrics[("botmesh_gateway_seen_entries", ())] == 3


async def test_a_channel_with_a_get_handshake_and_a_form_body(
    kafka_bootstrap: str, catalog: Catalog
) -> None:
    probe = ProbeWebhook()
    hooks = {"probe": probe}
    async with gateway_at(
        kafka_bootstrap, catalog.prefix, hooks, public_url="https://hooks.example.com/"
    ) as (_, url):
        query = f"hub.mode=subscribe&hub.verify_token={PROBE_TOKEN}&hub.challenge=1158201444"
        hello = await _get(f"{url}/probe?{query}")
        refused = await _get(f"{url}/probe?hub.mode=subscribe&hub.verify_token=x&hub.challenge=1")
        form = b"Sid=SM123&From=%2B15551234567&Body=hi+there"
        headers = {**probe_headers(form), "Content-Type": "application/x-www-form-urlencoded"}
        posted = await _post(f"{url}/probe?x=1", form, headers)
        records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert hello == (200, "1158201444")
    assert refused[0] == 403
    assert posted == (200, '{"ok": 1}')
    (request,) = probe.seen  # the handshakes never reached verify
    assert request.url == "https://hooks.example.com/probe?x=1"
    assert request.form == {"Sid": "SM123", "From": "+15551234567", "Body": "hi there"}
    assert request.query == {"x": "1"}
    assert request.headers["x-probe-signature"] == headers["X-Probe-Signature"]
    assert len(records) == 1
    assert decode_inbound(records[0].value) == Inbound(
        id="SM123", chat_id="+15551234567", text="form", channel="probe"
    )


async def test_a_stop_finishes_the_request_in_flight(
    kafka_bootstrap: str, catalog: Catalog
) -> None:
    """A webhook is being produced when the gateway is told to stop: the gateway stops
    accepting connections, and the webhook still gets its record and its 200."""
    gateway = Gateway(
        {"slack": SlackWebhook(SLACK_SECRET)},
        GatewayConfig(bootstrap=kafka_bootstrap, prefix=catalog.prefix),
    )
    kafka = gateway._kafka
    real_send = kafka.send
    entered, release = asyncio.Event(), asyncio.Event()

    async def held_send(topic: str, key: bytes, value: bytes) -> Any:
        if topic == catalog.inbound:
            entered.set()
            await release.wait()
        return await real_send(topic, key, value)

    kafka.send = held_send  # type: ignore[method-assign]
    stop, up = asyncio.Event(), asyncio.Event()
    base: list[str] = []

    async def run() -> None:
        async with serving(gateway, "127.0.0.1", 0) as url:
            base.append(url)
            up.set()
            await stop.wait()

    server = asyncio.create_task(run())
    await up.wait()
    async with asyncio.timeout(CONNECT_S):
        await gateway.wait_connected()
    body = slack_message("Ev10")
    webhook = asyncio.create_task(_post(f"{base[0]}/slack", body, slack_headers(body)))
    await entered.wait()
    stop.set()
    host, port = base[0].removeprefix("http://").split(":")
    async with asyncio.timeout(10):  # the listening socket closes first
        while True:
            try:
                _, w = await asyncio.open_connection(host, int(port))
            except OSError:
                break
            w.close()
            await w.wait_closed()
            await asyncio.sleep(0.01)
    assert not webhook.done()
    release.set()
    assert (await webhook)[0] == 200
    await server
    records = await read_topic(kafka_bootstrap, catalog.inbound)
    assert [decode_inbound(r.value).id for r in records] == ["Ev10"]


def test_sigterm_stops_the_cli_gateway_cleanly(kafka_bootstrap: str, catalog: Catalog) -> None:
    env = {
        **os.environ,
        "SLACK_SIGNING_SECRET": SLACK_SECRET,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "botmesh",
            "gateway",
            "--channel",
            "slack",
            "--port",
            "0",
            "--prefix",
            catalog.prefix,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line + proc.stderr.read()  # type: ignore[union-attr]
        url = line.rsplit(" ", 1)[1].strip()

        async def drive() -> int:
            async with asyncio.timeout(CONNECT_S):
                while (await _get(f"{url}/readyz"))[0] != 200:  # noqa: ASYNC110 - over HTTP
                    await asyncio.sleep(0.1)
            body = slack_message("Ev11")
            return (await _post(f"{url}/slack", body, slack_headers(body)))[0]

        assert asyncio.run(drive()) == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    records = asyncio.run(read_topic(kafka_bootstrap, catalog.inbound))
    assert [decode_inbound(r.value).id for r in records] == ["Ev11"]


async def test_a_signed_status_webhook_is_produced_to_the_statuses_and_a_forged_one_is_not(
    kafka_bootstrap: str, catalog: Catalog
) -> None:
    secret = "gateway-statuses-app-secret"
    hook = WhatsAppWebhook(secret, "verify-me")
    body = json.dumps(
        {
            "object": "whatsapp_business_account",
            "entry": [
                {
                    "id": "WABA",
                    "changes": [
                        {
                            "field": "messages",
                            "value": {
                                "messaging_product": "whatsapp",
                                "metadata": {"phone_number_id": "PN1"},
                                "statuses": [
                                    {
                                        "id": "wamid.S1",
                                        "status": "failed",
                                        "timestamp": "1764677260",
                                        "recipient_id": "15551230002",
                                        "errors": [
                                            {"code": 131047, "title": "Re-engagement message"}
                                        ],
                                    }
                                ],
                            },
                        }
                    ],
                }
            ],
        }
    ).encode()
    signed = {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": "sha256=" + hmac_hex(secret, body),
    }
    forged = {**signed, "X-Hub-Signature-256": "sha256=" + hmac_hex("not-the-secret", body)}
    async with gateway_at(kafka_bootstrap, catalog.prefix, {"whatsapp": hook}) as (gw, url):
        refused, _ = await _post(f"{url}/whatsapp", body, forged)
        status, _ = await _post(f"{url}/whatsapp", body, signed)
        statuses = await read_topic(kafka_bootstrap, catalog.statuses)
        inbound = await read_topic(kafka_bootstrap, catalog.inbound)
    assert (refused, status) == (401, 200)
    assert inbound == []  # a status is no message
    [record] = statuses
    assert record.key == chat_key("15551230002")
    assert decode_status(record.value) == DeliveryStatus(
        chat_id="15551230002",
        message_id="wamid.S1",
        status=DeliveryState.FAILED,
        channel="whatsapp",
        ts=1764677260.0,
        code="131047",
        error="Re-engagement message",
    )
    assert gw.counts["whatsapp"]["statuses"] == 1 and gw.counts["whatsapp"]["bad_signature"] == 1
