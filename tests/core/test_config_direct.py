"""A config built directly is checked as the mapping form is (defect 6 of the audit).

``DurabilityConfig.from_mapping({...})`` refused a bad option naming it; ``DurabilityConfig(...)``
and its nested objects (``InboxConfig``, ``OutboxConfig``, ``BackoffConfig``, ``LeaderConfig``)
built directly skipped most of those checks (a zero backoff base, a jitter of 2, a negative
poll or inline budget, a retry count given as a string). Now building any of them runs the
same checks, with the same ``ConfigError`` (same field, same words).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from botmesh import DurabilityConfig
from botmesh.errors import ConfigError
from botmesh.state.config import BackoffConfig, InboxConfig, LeaderConfig, OutboxConfig

Build = Callable[[], object]

#: (direct construction, the same option in the mapping form, the field both name: a
#: ``BackoffConfig`` built alone does not know whose it is, so only the mapping says whose)
SAME_AS_MAPPING: list[tuple[Build, dict[str, Any], str]] = [
    (
        lambda: BackoffConfig(jitter=2),
        {"inbox": {"backoff": {"jitter": 2}}},
        "backoff.jitter",
    ),
    (
        lambda: BackoffConfig(base=0.0),
        {"outbox": {"backoff": {"base": 0}}},
        "backoff.base",
    ),
    (
        lambda: InboxConfig(max_attempts=0),
        {"inbox": {"max_attempts": 0}},
        "inbox.max_attempts",
    ),
    (
        lambda: InboxConfig(max_attempts="5"),  # type: ignore[arg-type]
        {"inbox": {"max_attempts": "5"}},
        "inbox.max_attempts",
    ),
    (
        lambda: InboxConfig(lease=0.0),
        {"inbox": {"lease": "0s"}},
        "inbox.lease",
    ),
    (
        lambda: InboxConfig(media_refs="yes"),  # type: ignore[arg-type]
        {"inbox": {"media_refs": "yes"}},
        "inbox.media_refs",
    ),
    (
        lambda: InboxConfig(chat_turns=1),  # type: ignore[arg-type]
        {"inbox": {"chat_turns": 1}},
        "inbox.chat_turns",
    ),
    (
        lambda: OutboxConfig(lease=0.001),
        {"outbox": {"lease": "1ms"}},
        "outbox.lease",
    ),
    (
        lambda: OutboxConfig(retries=-1),
        {"outbox": {"retries": -1}},
        "outbox.retries",
    ),
    (
        lambda: OutboxConfig(retries="5"),  # type: ignore[arg-type]
        {"outbox": {"retries": "5"}},
        "outbox.retries",
    ),
    (
        lambda: OutboxConfig(on_ambiguous="maybe"),  # type: ignore[arg-type]
        {"outbox": {"on_ambiguous": "maybe"}},
        "outbox.on_ambiguous",
    ),
    (
        lambda: OutboxConfig(on_diverged="both"),  # type: ignore[arg-type]
        {"outbox": {"on_diverged": "both"}},
        "outbox.on_diverged",
    ),
    (
        lambda: OutboxConfig(max_payload_bytes=0),
        {"outbox": {"max_payload_bytes": 0}},
        "outbox.max_payload_bytes",
    ),
    (
        lambda: OutboxConfig(keep_chat_order="no"),  # type: ignore[arg-type]
        {"outbox": {"keep_chat_order": "no"}},
        "outbox.keep_chat_order",
    ),
    (
        lambda: LeaderConfig(lease=0.05),
        {"leader": {"lease": "50ms"}},
        "leader.lease",
    ),
    (
        lambda: DurabilityConfig(fail_open="yes"),  # type: ignore[arg-type]
        {"fail_open": "yes"},
        "fail_open",
    ),
    (
        lambda: DurabilityConfig(provider_session="all"),  # type: ignore[arg-type]
        {"provider_session": "all"},
        "provider_session",
    ),
    (
        lambda: DurabilityConfig(poll="often"),  # type: ignore[arg-type]
        {"poll": "often"},
        "poll",
    ),
]


@pytest.mark.parametrize(("build", "raw", "field"), SAME_AS_MAPPING)
def test_direct_construction_refuses_what_the_mapping_refuses(
    build: Build, raw: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as direct:
        build()
    with pytest.raises(ConfigError) as mapped:
        DurabilityConfig.from_mapping(raw)
    assert direct.value.field == field and mapped.value.field.endswith(field)
    assert direct.value.message == mapped.value.message


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: BackoffConfig(base=0.0), "backoff.base"),
        (lambda: BackoffConfig(base=2.0, cap=1.0), "backoff.cap"),
        (lambda: BackoffConfig(jitter=-0.1), "backoff.jitter"),
        (lambda: BackoffConfig(jitter=True), "backoff.jitter"),
        (lambda: BackoffConfig(cap=math.inf), "backoff.cap"),
        (lambda: InboxConfig(turn_wait=-1.0), "inbox.turn_wait"),
        (lambda: InboxConfig(lease=math.nan), "inbox.lease"),
        (lambda: InboxConfig(backoff={"base": "1s"}), "inbox.backoff"),  # type: ignore[arg-type]
        (lambda: OutboxConfig(inline_max=-1.0), "outbox.inline_max"),
        (lambda: OutboxConfig(backoff=None), "outbox.backoff"),  # type: ignore[arg-type]
        (lambda: DurabilityConfig(poll=-1.0), "poll"),
        (lambda: DurabilityConfig(retention=math.inf), "retention"),
        (lambda: DurabilityConfig(inbox={"lease": "1s"}), "inbox"),  # type: ignore[arg-type]
        (lambda: DurabilityConfig(outbox=OutboxConfig(lease=0.001)), "outbox.lease"),
        (lambda: DurabilityConfig().replace(poll=-5.0), "poll"),
    ],
)
def test_direct_construction_checks_ranges_and_types_naming_the_field(
    build: Build, field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.field == field, info.value


def test_direct_durations_take_seconds_or_duration_strings() -> None:
    c = DurabilityConfig(
        poll="250ms",  # type: ignore[arg-type]
        inbox=InboxConfig(lease=timedelta(seconds=30), backoff=BackoffConfig(base="2s", cap=90)),  # type: ignore[arg-type]
        outbox=OutboxConfig(lease=0.02, inline_max=0),
    )
    assert c.poll == 0.25 and c.inbox.lease == 30.0
    assert (c.inbox.backoff.base, c.inbox.backoff.cap) == (2.0, 90.0)
    assert c == DurabilityConfig.from_mapping(
        {
            "poll": "250ms",
            "inbox": {"lease": "30s", "backoff": {"base": "2s", "cap": "90s"}},
            "outbox": {"lease": "20ms", "inline_max": 0, "backoff": {"base": "1s"}},
        }
    )
    assert DurabilityConfig() == DurabilityConfig.from_mapping({})
