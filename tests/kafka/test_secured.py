"""botmesh on a secured cluster: a broker with a ``SASL_SSL`` listener (``secure_broker``: a
CA and a broker certificate made with openssl, SCRAM users made with Kafka's own tool).

Every client kind goes through it: the worker (its consumer and its producer, the journal's
changelog reads, the retry tiers, the admin code that provisions and
checks the topics and the group), the operator commands (``status``, ``dlq``, ``replay``:
confluent-kafka's admin client, consumer and producer; the removal of a static member,
spoken by ``botmesh.streams.groups`` itself), the tools a test or a user calls
(``produce_inbound``, ``end_offsets``, ``tail_receipts``, ``request_send``). A wrong
password, an unknown CA and a plaintext client each fail at once with status 3 and a message
naming the setting to fix; no password is ever printed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from botmesh.streams.connection import (
    KafkaAuthError,
    KafkaSettings,
    list_topics,
)
from botmesh.streams.groups import describe_group, remove_members
from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound, request_send
from botmesh.streams.provision import ensure_topics, existing_topics
from botmesh.topics import Catalog
from tests.gateway.kit import gateway_at, probe_body, probe_headers, read_topic
from tests.kafka.secure_broker import (
    PASSWORD,
    PLAIN_PASSWORD,
    SecureBroker,
    secure_broker,
    static_member,
)
from tests.kafka.worker import WAIT_S, Worker, collect, wait_line

# One SASL_SSL broker on fixed ports for the module: in a parallel run its tests share one
# worker (make test runs pytest-xdist with --dist loadgroup).
pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("sasl-ssl-broker")]

ROOT = Path(__file__).resolve().parents[2]
WRONG = "not-the-password-4711"


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    with secure_broker(tmp_path_factory.mktemp("sasl-ssl")) as broker:
        yield broker


def botmesh(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``botmesh ARGS`` with ``env`` on top of a clean environment (no KAFKA_* of ours)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    return subprocess.run(
        [sys.executable, "-m", "botmesh", *args],
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def no_secret_in(text: str) -> None:
    for secret in (PASSWORD, PLAIN_PASSWORD, WRONG):
        assert secret not in text, f"a password was printed:\n{text[-2000:]}"


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_every_client_kind_connects_with_each_mechanism(
    secure: SecureBroker, topic_prefix: str, mechanism: str
) -> None:
    settings = secure.settings(mechanism)
    cat = Catalog(f"{topic_prefix}{mechanism[-3:]}")
    ensure_topics(settings, cat.specs(partitions=2))  # confluent-kafka's admin client
    assert cat.inbound in existing_topics(settings)
    records = demo_records(3, 2, run=mechanism)
    await produce_inbound(settings, cat.inbound, records)  # confluent-kafka's producer
    assert sum((await end_offsets(settings, cat.inbound)).values()) == 3  # a consumer
    await request_send(settings, cat.prefix, "c1", "hi")
    assert sum((await end_offsets(settings, cat.requests)).values()) == 1
    no_secret_in(repr(settings))


async def test_the_worker_answers_through_sasl_ssl(
    secure: SecureBroker, topic_prefix: str, tmp_path: Path
) -> None:
    env = secure.env("SCRAM-SHA-512")
    settings = secure.settings("SCRAM-SHA-512")
    worker = Worker(
        secure.bootstrap, topic_prefix, tmp_path, env=env, kafka=settings, loglevel="info"
    )
    try:
        worker.start()  # it creates the topics itself, through the listener
        wait_line(worker, "ready: owns partitions")
        cat = Catalog(topic_prefix)
        start = await end_offsets(settings, cat.sent)
        records = demo_records(20, 4, run="tls")
        await produce_inbound(settings, cat.inbound, records)
        seen = await collect(worker, cat.sent, start, {r.id for r in records})
        assert {s.receipt.state for s in seen} == {"sent"}
        line = wait_line(worker, "runtime started")
        assert f"SASL_SSL SCRAM-SHA-512 as {env['KAFKA_SASL_USERNAME']}" in line
        assert worker.stop() == 0
    finally:
        worker.close()
    no_secret_in("\n".join(worker.lines()))

    # the operator commands, through the same listener
    status = botmesh("status", "--prefix", topic_prefix, "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert f'"{cat.inbound}"' in status.stdout
    dlq = botmesh("dlq", "list", "--prefix", topic_prefix, env=env)
    assert dlq.returncode in (0, 1), dlq.stderr  # 1: nothing matched
    assert "cannot reach" not in dlq.stderr
    replay = botmesh("replay", "--to-earliest", "--dry-run", "--prefix", topic_prefix, env=env)
    assert replay.returncode in (0, 1), replay.stderr  # 1: the group still lists the member
    assert "cannot reach" not in replay.stderr
    for out in (status, dlq, replay):
        no_secret_in(out.stdout + out.stderr)


def test_a_wrong_password_fails_at_start_naming_the_setting(
    secure: SecureBroker, topic_prefix: str, tmp_path: Path
) -> None:
    env = secure.env("SCRAM-SHA-512", password=WRONG)
    for args in (
        ("worker", "--app", "tests.kafka.bot:bot", "--prefix", topic_prefix,
         "--data-dir", str(tmp_path / "data")),
        ("status", "--prefix", topic_prefix),
        ("topics", "create", "--prefix", topic_prefix),
    ):  # fmt: skip
        out = botmesh(*args, env=env)
        assert out.returncode == 3, (args, out.stderr[-2000:])
        assert "refused the login" in out.stderr and "KAFKA_SASL_PASSWORD_FILE" in out.stderr
        assert "Traceback" not in out.stderr
        no_secret_in(out.stdout + out.stderr)
    with pytest.raises(KafkaAuthError, match="KAFKA_SASL_PASSWORD_FILE"):
        list_topics(secure.settings(password=WRONG), timeout=10)


def test_an_unknown_ca_fails_at_start_naming_the_setting(
    secure: SecureBroker, topic_prefix: str, tmp_path: Path
) -> None:
    env = secure.env("SCRAM-SHA-512", ca=secure.other_ca)
    for args in (
        ("worker", "--app", "tests.kafka.bot:bot", "--prefix", topic_prefix,
         "--data-dir", str(tmp_path / "data")),
        ("status", "--prefix", topic_prefix),
    ):  # fmt: skip
        out = botmesh(*args, env=env)
        assert out.returncode == 3, (args, out.stderr[-2000:])
        assert "not signed by a CA in KAFKA_SSL_CAFILE" in out.stderr
        assert str(secure.other_ca) in out.stderr
        no_secret_in(out.stdout + out.stderr)


async def test_a_plaintext_client_is_refused_by_the_listener(
    secure: SecureBroker, topic_prefix: str
) -> None:
    out = botmesh(
        "status", "--prefix", topic_prefix, env={"KAFKA_BOOTSTRAP_SERVERS": secure.bootstrap}
    )
    assert out.returncode == 3, out.stderr
    assert "KAFKA_SECURITY_PROTOCOL is PLAINTEXT" in out.stderr
    plaintext = KafkaSettings(secure.bootstrap)
    with pytest.raises(KafkaAuthError, match="KAFKA_SECURITY_PROTOCOL"):
        list_topics(plaintext, timeout=10)
    with pytest.raises(KafkaAuthError, match="KAFKA_SECURITY_PROTOCOL"):
        await asyncio.wait_for(
            produce_inbound(plaintext, "any", demo_records(1, 1)), timeout=WAIT_S
        )


async def test_the_gateway_produces_through_sasl_ssl(
    secure: SecureBroker, topic_prefix: str
) -> None:
    settings = secure.settings("SCRAM-SHA-256")
    cat = Catalog(topic_prefix)
    ensure_topics(settings, cat.specs(partitions=2))
    async with gateway_at(settings, topic_prefix) as (_, url):
        body = probe_body(("g1", "chat-g"))
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/probe", data=body, headers=probe_headers(body)) as reply,
        ):
            assert reply.status == 200, await reply.text()
    records = await read_topic(settings, cat.inbound)
    assert [r.key for r in records] == [b"chat-g"]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_a_static_member_is_removed_through_sasl_ssl(
    secure: SecureBroker, topic_prefix: str, mechanism: str
) -> None:
    """``remove_members`` (``replay --force``, the worker's membership watch) speaks
    LeaveGroup v3 itself, over TLS with each SASL mechanism."""
    settings = secure.settings(mechanism)
    cat = Catalog(f"{topic_prefix}{mechanism[-3:]}")
    ensure_topics(settings, cat.specs(partitions=2))
    group = f"{cat.prefix}.static"
    info = await asyncio.to_thread(static_member, settings, group, cat.inbound)
    assert [m.instance_id for m in info.members] == ["static-1"]
    wrong = secure.settings(mechanism, password=WRONG)
    with pytest.raises(KafkaAuthError, match="KAFKA_SASL_PASSWORD_FILE"):
        await remove_members(wrong, group, info.members, wait_s=WAIT_S)
    assert [m.instance_id for m in describe_group(settings, group).members] == ["static-1"]
    assert await remove_members(settings, group, info.members, wait_s=WAIT_S) == ["static-1"]
    assert describe_group(settings, group).members == []
