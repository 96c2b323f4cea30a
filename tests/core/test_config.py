"""DurabilityConfig: every option of the reference, its default, and errors naming fields."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from botmesh import Bot, DurabilityConfig
from botmesh.errors import ConfigError
from botmesh.state.durations import parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("250ms", 0.25),
        ("15s", 15.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("7d", 604800.0),
        ("1.5s", 1.5),
        (0, 0.0),
        (0.0, 0.0),
        (timedelta(minutes=2), 120.0),
    ],
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value, "f") == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["15", "15 sec", "-1s", "abc", True, None, [1], -5, 1500])
def test_bad_durations_name_the_field(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "outbox.inline_max")
    assert info.value.field == "outbox.inline_max"
    assert "outbox.inline_max" in str(info.value)


@pytest.mark.parametrize(("value", "shown"), [(5, '"5s" or "5ms"'), (0.25, '"0.25s" or "0.25ms"')])
def test_a_number_without_a_unit_is_refused_showing_the_units(value: float, shown: str) -> None:
    """``backoff={"base": 5}``: 5 ms or 5 s? Neither is guessed."""
    with pytest.raises(ConfigError) as info:
        DurabilityConfig.from_mapping({"inbox": {"backoff": {"base": value}}})
    assert info.value.field == "inbox.backoff.base"
    assert "without a unit" in str(info.value) and shown in str(info.value)


def test_defaults_follow_the_reference() -> None:
    c = DurabilityConfig.from_mapping({})
    assert c == DurabilityConfig() == DurabilityConfig.of(None) == Bot("b").config
    assert not hasattr(c, "backend") and not hasattr(c, "instance_id")  # the runtime's
    assert c.fail_open is False
    assert (c.inbox.lease, c.inbox.max_attempts, c.inbox.media_refs) == (60.0, 5, True)
    assert (c.inbox.backoff.base, c.inbox.backoff.cap, c.inbox.backoff.jitter) == (1.0, 60.0, 0.2)
    assert (c.outbox.retries, c.outbox.inline_max, c.outbox.lease) == (5, 15.0, 60.0)
    assert (c.outbox.on_ambiguous, c.outbox.on_diverged) == ("skip", "send")
    assert c.outbox.max_payload_bytes == 1024 * 1024
    assert c.outbox.keep_chat_order is True
    assert c.outbox.backoff == c.inbox.backoff
    assert (c.poll, c.retention) == (1.0, 7 * 86400.0)


def test_options_are_parsed_once() -> None:
    c = DurabilityConfig.from_mapping(
        {
            "fail_open": True,
            "inbox": {"lease": "30s", "max_attempts": 3, "backoff": {"base": "2s", "cap": "1m"}},
            "outbox": {
                "retries": 2,
                "inline_max": "500ms",
                "on_ambiguous": "resend",
                "lease": "20ms",
                "keep_chat_order": False,
            },
            "poll": "250ms",
            "retention": 0,
        }
    )
    assert c.inbox.lease == 30.0 and c.inbox.backoff.base == 2.0 and c.inbox.backoff.cap == 60.0
    assert c.outbox.backoff == c.inbox.backoff  # outbox.backoff defaults to inbox.backoff
    assert (c.outbox.retries, c.outbox.inline_max, c.outbox.lease) == (2, 0.5, 0.02)
    assert c.outbox.on_ambiguous == "resend" and c.poll == 0.25 and c.retention == 0.0
    assert c.fail_open is True and c.outbox.keep_chat_order is False
    assert c.outbox.retry_policy().max_attempts == 3  # retries after the first attempt
    with pytest.raises(AttributeError):
        c.poll = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"outbox": {"lease": "19ms"}}, "outbox.lease"),
        ({"outbox": {"lease": 10}}, "outbox.lease"),
        ({"outbox": {"on_ambiguous": "maybe"}}, "outbox.on_ambiguous"),
        ({"outbox": {"on_diverged": "both"}}, "outbox.on_diverged"),
        ({"outbox": {"retries": -1}}, "outbox.retries"),
        ({"outbox": {"retries": "5"}}, "outbox.retries"),
        ({"outbox": {"keep_chat_order": "no"}}, "outbox.keep_chat_order"),
        ({"outbox": {"max_payload_bytes": 0}}, "outbox.max_payload_bytes"),
        ({"inbox": {"max_attempts": 0}}, "inbox.max_attempts"),
        ({"inbox": {"lease": "0s"}}, "inbox.lease"),
        ({"inbox": {"backoff": {"jitter": 2}}}, "inbox.backoff.jitter"),
        ({"inbox": {"backoff": {"base": "2m", "cap": "1m"}}}, "inbox.backoff.cap"),
        ({"inbox": {"leese": "1s"}}, "inbox.leese"),
        ({"pol": "1s"}, "pol"),
        ({"poll": "often"}, "poll"),
        ({"fail_open": "yes"}, "fail_open"),
        ({"instance_id": ""}, "instance_id"),
    ],
)
def test_bad_options_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        DurabilityConfig.from_mapping(raw)
    assert info.value.field == field, info.value


def test_a_bad_durability_argument_is_refused_by_the_bot() -> None:
    with pytest.raises(ConfigError) as info:
        Bot("b", durability=42)  # type: ignore[arg-type]
    assert info.value.field == "durability"
    with pytest.raises(ConfigError) as info:
        Bot("b", durability={"backend": 3.5})
    assert info.value.field == "backend" and "botmesh.run" in str(info.value)
    with pytest.raises(ConfigError) as info:
        Bot("b", durability={"outbox": {"lease": "1ms"}})  # refused where it is given
    assert info.value.field == "outbox.lease"
