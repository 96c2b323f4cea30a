"""botmesh with SASL OAUTHBEARER (OIDC): the settings (``KAFKA_SASL_OAUTHBEARER_*``), read,
checked and handed to librdkafka (``sasl.oauthbearer.method=oidc``), a client secret that
never shows; then, against a broker whose ``SASL_PLAINTEXT`` and ``SASL_SSL`` listeners take
OAUTHBEARER only (``oauth_broker``: Kafka's unsecured validator, the scope ``kafka``
required, a local token endpoint that hands out unsigned JWTs for the client credentials
grant), every client kind of botmesh outside the worker: the CLI (``botmesh topics
create``/``list``: confluent-kafka's admin client), a produce and consume round trip
(``AsyncProducer``, ``reader``/``read_to_end``), the group's description (the admin
client, what the worker's membership check asks) and the removal of a static member
(``remove_members``: the Kafka protocol spoken by ``botmesh.streams.groups``, its own
OAUTHBEARER login with a token it fetched itself). A client the token endpoint refuses, a
token endpoint out of reach and a token without the scope the brokers require each fail
at the first contact with status 3 and a message naming the setting.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message

from botmesh.settings import read_config_file
from botmesh.streams.clients import read_to_end, reader, watermarks
from botmesh.streams.config import WorkerConfig
from botmesh.streams.connection import (
    KafkaAuthError,
    KafkaSettings,
    Secret,
    Security,
    _oauthbearer_refusal,
    confluent_options,
    list_topics,
)
from botmesh.streams.groups import describe_group, remove_members
from botmesh.streams.ops.tools import demo_records, end_offsets, produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.kafka.oauth_broker import (
    CLIENT_ID,
    CLIENT_SECRET,
    SCOPE,
    OAuthBroker,
    oauth_broker,
)
from tests.kafka.secure_broker import static_member
from tests.kafka.worker import WAIT_S

ROOT = Path(__file__).resolve().parents[2]
WRONG = "not-the-client-secret-4711"
SECRET = "oidc-secret-that-must-not-show"
PROTOCOLS = ["SASL_PLAINTEXT", "SASL_SSL"]

#: the tests that need the broker (``kafka``): one on fixed ports for the module, so its
#: tests go to one xdist worker (make test runs pytest-xdist with --dist loadgroup)
ON_BROKER = "oauthbearer-broker"


def oidc_env(tmp_path: Path, **more: str) -> dict[str, str]:
    secret = tmp_path / "client-secret"
    secret.write_text(SECRET + "\n")
    return {
        "KAFKA_BOOTSTRAP_SERVERS": "b1:9093",
        "KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "KAFKA_SASL_MECHANISM": "oauthbearer",
        "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "https://idp.example.com/oauth2/token?x=1",
        "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "bot",
        "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE": str(secret),
        "KAFKA_SASL_OAUTHBEARER_SCOPE": " kafka   read ",
        **more,
    }


def botmesh(
    *args: str, env: dict[str, str], timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """``botmesh ARGS`` with ``env`` on top of a clean environment (no KAFKA_* of ours)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "BOTMESH_"))}
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
    for secret in (CLIENT_SECRET, WRONG, SECRET):
        assert secret not in text, f"a client secret was printed:\n{text[-2000:]}"


# -- the settings (no broker) --------------------------------------------------------------------


def test_oauthbearer_in_librdkafkas_dialect(tmp_path: Path) -> None:
    env = oidc_env(tmp_path, KAFKA_SASL_OAUTHBEARER_EXTENSIONS="logicalCluster=lkc-1,pool=p 1")
    s = KafkaSettings.from_env(env)
    sec = s.security
    assert (sec.protocol, sec.sasl_mechanism, sec.oauthbearer) == ("SASL_SSL", "OAUTHBEARER", True)
    assert sec.sasl_oauthbearer_client_secret == Secret(SECRET)  # the last newline dropped
    assert sec.sasl_oauthbearer_client_secret_source == "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE"
    assert sec.sasl_oauthbearer_scope == "kafka read"
    assert confluent_options(s) == {
        "bootstrap.servers": "b1:9093",
        "security.protocol": "SASL_SSL",
        "ssl.endpoint.identification.algorithm": "https",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example.com/oauth2/token?x=1",
        "sasl.oauthbearer.client.id": "bot",
        "sasl.oauthbearer.client.secret": SECRET,
        "sasl.oauthbearer.scope": "kafka read",
        "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,pool=p 1",
    }
    assert sec.describe() == (
        "SASL_SSL OAUTHBEARER as client bot (tokens from https://idp.example.com/oauth2/token)"
    )
    plain = KafkaSettings.from_env(
        oidc_env(
            tmp_path,
            KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
            KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL="http://127.0.0.1:8080/token",
            KAFKA_SASL_OAUTHBEARER_SCOPE="",
        )
    )
    rd = confluent_options(plain)
    assert "sasl.oauthbearer.scope" not in rd and "ssl.ca.location" not in rd
    assert rd["sasl.oauthbearer.token.endpoint.url"] == "http://127.0.0.1:8080/token"
    # in a configuration file too
    config = tmp_path / "botmesh.toml"
    config.write_text(
        '[kafka]\nsasl_mechanism = "OAUTHBEARER"\n'
        'sasl_oauthbearer_client_secret_file = "/run/secrets/oidc"\n'
    )
    assert read_config_file(config)["KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE"] == (
        "/run/secrets/oidc"
    )


def test_a_client_secret_never_shows(tmp_path: Path) -> None:
    env = oidc_env(tmp_path)
    s = KafkaSettings.from_env(env)
    config = WorkerConfig.from_env(env)
    for text in (repr(s), str(s), repr(s.security), repr(config), str(config.kafka)):
        assert SECRET not in text, text
    assert SECRET not in s.security.describe()
    assert config.kafka == s
    # librdkafka's word of a token endpoint that echoed what it got: the secret cut out
    refused = _oauthbearer_refusal(
        s, f"Failed to acquire SASL OAUTHBEARER token: bad client bot:{SECRET}", True
    )
    assert refused is not None and SECRET not in str(refused) and "***" in str(refused)
    # a setting refused: its message names the variable, never the secret
    bad = {**env, "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "http://idp.example.com/t"}
    with pytest.raises(ValueError) as caught:
        Security.from_env(bad)
    assert SECRET not in str(caught.value)
    out = botmesh("topics", "list", "--prefix", "p", env=bad)
    assert out.returncode == 2, out.stderr
    assert "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL" in out.stderr
    no_secret_in(out.stdout + out.stderr)


_OIDC = {
    "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "KAFKA_SASL_MECHANISM": "OAUTHBEARER",
    "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL": "https://idp/token",
    "KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "bot",
    "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": SECRET,
}


def _without(*names: str, **more: str) -> dict[str, str]:
    return {**{k: v for k, v in _OIDC.items() if k not in names}, **more}


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            _without("KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL"),
            "SASL_SSL with OAUTHBEARER needs KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL:",
        ),
        (
            _without("KAFKA_SASL_OAUTHBEARER_CLIENT_ID", "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET"),
            "needs KAFKA_SASL_OAUTHBEARER_CLIENT_ID, KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET (or "
            "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE)",
        ),
        (
            _without(KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL="http://idp.example.com/token"),
            "plain http to 'idp.example.com' would carry the client secret in clear; use https",
        ),
        (
            _without(KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL="https://bot:pw@idp/token"),
            "a user or password in the URL",
        ),
        (
            _without(KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL="idp.example.com/token"),
            "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL='idp.example.com/token': not a URL",
        ),
        (
            _without(KAFKA_SASL_USERNAME="u", KAFKA_SASL_PASSWORD="p"),
            "KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD set, but KAFKA_SASL_MECHANISM is OAUTHBEARER",
        ),
        (
            _without(
                KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
                KAFKA_SASL_USERNAME="u",
                KAFKA_SASL_PASSWORD="p",
            ),
            "but KAFKA_SASL_MECHANISM is SCRAM-SHA-512: set it to OAUTHBEARER, or unset them",
        ),
        (
            {"KAFKA_SASL_OAUTHBEARER_CLIENT_ID": "bot"},
            "KAFKA_SASL_OAUTHBEARER_CLIENT_ID set, but KAFKA_SECURITY_PROTOCOL is PLAINTEXT",
        ),
        (
            _without(KAFKA_SASL_OAUTHBEARER_EXTENSIONS="logicalCluster"),
            "KAFKA_SASL_OAUTHBEARER_EXTENSIONS: 'logicalCluster' is not key=value",
        ),
        (
            _without(KAFKA_SASL_OAUTHBEARER_EXTENSIONS="auth=Bearer x"),
            "(not 'auth')",
        ),
        (
            _without(KAFKA_SASL_OAUTHBEARER_SCOPE="kafka&admin"),
            "KAFKA_SASL_OAUTHBEARER_SCOPE='kafka&admin': scopes are printable ASCII words",
        ),
        (
            _without(KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE="/x"),
            "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET and KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE "
            "are both set",
        ),
        (
            _without(
                "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
                KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE="/no/such/file",
            ),
            "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE='/no/such/file': cannot read it",
        ),
    ],
)
def test_a_bad_oauthbearer_setting_is_refused_naming_it(env: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError) as caught:
        Security.from_env(env)
    assert says in str(caught.value)
    assert SECRET not in str(caught.value)


# -- against the broker --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthBroker]:
    with oauth_broker(tmp_path_factory.mktemp("oauthbearer")) as started:
        yield started


def _fetched(broker: OAuthBroker, since: int, *, by_urllib: bool) -> list[dict[str, Any]]:
    """The tokens handed out since request ``since``: to librdkafka (it sends no
    User-Agent) or to the protocol client of ``botmesh.streams.groups`` (urllib's)."""
    return [
        r
        for r in broker.endpoint.requests[since:]
        if r["status"] == 200 and r["client"] == CLIENT_ID and r["scope"] == SCOPE
        if str(r["agent"]).startswith("Python-urllib") == by_urllib
    ]


@pytest.mark.kafka
@pytest.mark.xdist_group(ON_BROKER)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_cli_creates_and_lists_topics(
    broker: OAuthBroker, topic_prefix: str, protocol: str
) -> None:
    env = broker.env(protocol)
    since = len(broker.endpoint.requests)
    cat = Catalog(topic_prefix)

    def listed() -> dict[str, int | None]:
        out = botmesh("topics", "list", "--prefix", topic_prefix, "--json", env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        no_secret_in(out.stdout + out.stderr)
        return {t["name"]: t["partitions"] for t in json.loads(out.stdout)["topics"]}

    before = listed()
    assert before[cat.inbound] is None and set(before.values()) == {None}
    created = botmesh(
        "topics", "create", "--prefix", topic_prefix, "--partitions", "2", "--json", env=env
    )
    assert created.returncode == 0, created.stderr[-3000:]
    assert cat.inbound in json.loads(created.stdout)["created"]
    after = listed()
    assert after.keys() == before.keys() and set(after.values()) == {2}
    no_secret_in(created.stdout + created.stderr)
    assert len(_fetched(broker, since, by_urllib=False)) >= 3  # each command got a token
    # the brokers checked it: the principal is the token's subject
    log = broker.server_log.read_text(errors="replace")
    assert f"Successfully validated token with principal {CLIENT_ID}" in log


@pytest.mark.kafka
@pytest.mark.xdist_group(ON_BROKER)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_produce_and_consume_round_trip(
    broker: OAuthBroker, topic_prefix: str, protocol: str
) -> None:
    settings = broker.settings(protocol)
    cat = Catalog(topic_prefix)
    await asyncio.to_thread(ensure_topics, settings, cat.specs(partitions=2))  # admin client
    records = demo_records(6, 3, run=protocol)
    await produce_inbound(settings, cat.inbound, records)  # AsyncProducer
    assert sum((await end_offsets(settings, cat.inbound)).values()) == 6

    def read() -> list[Message]:
        got: list[Message] = []
        consumer = reader(settings, f"{topic_prefix}.reader")
        try:
            spans = watermarks(consumer, [(cat.inbound, 0), (cat.inbound, 1)])
            read_to_end(consumer, spans, got.append)
        finally:
            consumer.close()
        return got

    got = await asyncio.to_thread(read)
    assert sorted(json.loads(m.value() or b"")["id"] for m in got) == sorted(r.id for r in records)


@pytest.mark.kafka
@pytest.mark.xdist_group(ON_BROKER)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_the_group_is_described_and_a_static_member_removed(
    broker: OAuthBroker, topic_prefix: str, protocol: str
) -> None:
    """``describe_group`` (the admin client: what the worker's membership check asks) and
    ``remove_members`` (LeaveGroup v3 over botmesh's own OAUTHBEARER login, with a token
    it fetched itself), with SASL extensions sent along."""
    env = broker.env(protocol, KAFKA_SASL_OAUTHBEARER_EXTENSIONS="traceId=t1,tenant=botmesh")
    settings = KafkaSettings(broker.bootstrap(protocol), Security.from_env(env))
    cat = Catalog(topic_prefix)
    ensure_topics(settings, cat.specs(partitions=2))
    group = f"{cat.prefix}.static"
    # no such group yet (the broker's first group request creates __consumer_offsets: its
    # coordinator may take a while to load on a busy machine)
    assert describe_group(settings, group, timeout=60.0).state == "dead"
    info = await asyncio.to_thread(static_member, settings, group, cat.inbound)
    assert info.group == group and info.state in ("stable", "empty", "completing_rebalancing")
    assert [m.instance_id for m in info.members] == ["static-1"]
    assert info.members[0].partitions == {cat.inbound: [0, 1]}
    since = len(broker.endpoint.requests)
    assert await remove_members(settings, group, info.members, wait_s=WAIT_S) == ["static-1"]
    assert describe_group(settings, group).members == []
    # the protocol client fetched its own token (urllib's), at most once: it keeps it
    assert len(_fetched(broker, since, by_urllib=True)) <= 1


@pytest.mark.kafka
@pytest.mark.xdist_group(ON_BROKER)
async def test_a_refused_client_fails_at_start_naming_the_setting(
    broker: OAuthBroker, topic_prefix: str, tmp_path: Path
) -> None:
    env = broker.env("SASL_SSL", secret=WRONG)
    for args in (
        ("topics", "create", "--prefix", topic_prefix),
        ("status", "--prefix", topic_prefix),
        ("worker", "--app", "tests.kafka.bot:bot", "--prefix", topic_prefix,
         "--data-dir", str(tmp_path / "data")),
    ):  # fmt: skip
        out = botmesh(*args, env=env)
        assert out.returncode == 3, (args, out.stderr[-3000:])
        assert "no OAUTHBEARER token from the token endpoint" in out.stderr
        assert "invalid_client" in out.stderr
        assert "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE" in out.stderr
        assert "Traceback" not in out.stderr
        no_secret_in(out.stdout + out.stderr)
    wrong = broker.settings("SASL_SSL", secret=WRONG)
    with pytest.raises(KafkaAuthError, match="KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE"):
        list_topics(wrong, timeout=10)
    # the protocol client asks the token endpoint itself: refused there, named the same way
    with pytest.raises(KafkaAuthError) as refused:
        await remove_members(wrong, f"{topic_prefix}.g", [], wait_s=WAIT_S)
    assert "refused the client KAFKA_SASL_OAUTHBEARER_CLIENT_ID='botmesh-worker'" in str(
        refused.value
    )
    assert "invalid_client" in str(refused.value) and WRONG not in str(refused.value)

    # a token endpoint out of reach (nothing listens on 29815)
    away = broker.settings(
        KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL="http://127.0.0.1:29815/oauth2/token"
    )
    with pytest.raises(KafkaAuthError, match="no OAUTHBEARER token from the token endpoint"):
        list_topics(away, timeout=10)
    with pytest.raises(KafkaAuthError, match="KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL"):
        await remove_members(away, f"{topic_prefix}.g", [], wait_s=WAIT_S)

    # a token without the scope the brokers require: the brokers refuse it
    unscoped = broker.settings(scope=None)
    with pytest.raises(KafkaAuthError) as caught:
        list_topics(unscoped, timeout=10)
    assert "refused the OAUTHBEARER token" in str(caught.value)
    assert "insufficient_scope" in str(caught.value)
    assert "KAFKA_SASL_OAUTHBEARER_SCOPE" in str(caught.value)
    with pytest.raises(KafkaAuthError, match="refused the OAUTHBEARER token"):
        await remove_members(unscoped, f"{topic_prefix}.g", [], wait_s=WAIT_S)
