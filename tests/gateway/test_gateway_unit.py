"""The gateway without a broker: its settings, the seen set's bounds, and ``botmesh
gateway`` refusing to start without its channels' secrets (exit 2 naming the variable)."""

from __future__ import annotations

import re

import pytest

from botmesh._cli.main import main
from botmesh._gateway import Gateway, GatewayConfig, SeenSet
from botmesh.topics.catalog import Catalog
from tests.gateway.kit import webhooks


def test_the_seen_set_is_bounded_oldest_first() -> None:
    seen = SeenSet(3, ttl=100.0, clock=lambda: 1000.0)
    for i in range(5):
        seen.add(("c", str(i)), 990.0 + i)
    assert len(seen) == 3
    assert [("c", str(i)) in seen for i in range(5)] == [False, False, True, True, True]


def test_the_seen_set_forgets_what_is_older_than_its_ttl() -> None:
    now = [1000.0]
    seen = SeenSet(10, ttl=100.0, clock=lambda: now[0])
    seen.add(("c", "old"), 850.0)  # already past the ttl: not kept
    seen.add(("c", "new"), 950.0)
    assert ("c", "old") not in seen and ("c", "new") in seen
    now[0] = 1051.0
    assert ("c", "new") not in seen and len(seen) == 0


@pytest.mark.parametrize(
    ("option", "value", "why"),
    [
        ("max_body", 0, "--max-body"),
        ("request_timeout", 0.0, "--request-timeout"),
        ("seen_max", 0, "--seen-max"),
        ("public_url", "hooks.example.com", "--public-url"),
        ("prefix", "bad prefix", "bad topic prefix"),
    ],
)
def test_bad_settings_are_refused(option: str, value: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        GatewayConfig(bootstrap="127.0.0.1:9092", **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["metrics", "Bad Name", ""])
def test_channel_names_that_cannot_be_a_route_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="channel name"):
        Gateway({name: webhooks()["slack"]}, GatewayConfig(bootstrap="127.0.0.1:9092"))


def test_the_cli_exits_2_naming_a_missing_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SLACK_SIGNING_SECRET", raising=False)
    assert main(["gateway", "--channel", "slack", "--bootstrap", "127.0.0.1:1"]) == 2
    assert "SLACK_SIGNING_SECRET" in capsys.readouterr().err


def test_the_cli_exits_2_on_an_unknown_or_no_channel(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BOTMESH_GATEWAY_CHANNELS", "slack,icq")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    assert main(["gateway"]) == 2
    err = capsys.readouterr().err
    assert "unknown channel 'icq'" in err and "telegram" in err
    monkeypatch.delenv("BOTMESH_GATEWAY_CHANNELS")
    assert main(["gateway"]) == 2
    assert "--channel NAME" in capsys.readouterr().err


def test_secrets_are_not_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "--channel", "slack", "--slack-signing-secret", "x"]) == 2
    # click < 8.2 says "No such option: --x", later ones "No such option '--x'."
    assert re.search(r"No such option(: |\s*')--slack-signing-secret", capsys.readouterr().err)


def test_the_seen_topic_is_compacted_and_kept_as_long_as_the_inbound() -> None:
    cat = Catalog("acme")
    (spec,) = cat.gateway_specs(replication=3)
    inbound = next(s for s in cat.specs() if s.role == "inbound")
    assert spec.name == "acme.gateway.seen" and spec.role == "seen"
    assert (spec.partitions, spec.replication) == (1, 3)
    assert spec.config["cleanup.policy"] == "compact,delete"
    assert spec.config["retention.ms"] == inbound.config["retention.ms"]
    assert spec.config["min.insync.replicas"] == "2"
    assert spec.name not in cat.names()  # created by the gateway, not by every worker


def test_a_bad_replication_variable_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    monkeypatch.setenv("BOTMESH_REPLICATION", "three")
    assert main(["gateway", "--channel", "slack"]) == 2
    assert "BOTMESH_REPLICATION='three'" in capsys.readouterr().err
