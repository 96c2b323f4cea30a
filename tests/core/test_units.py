"""Backoff, the retry decision, splitter, keys and records: the pure parts of the engine."""

from __future__ import annotations

import random

import pytest

from botmesh.errors import InvalidKeyError, RateLimitedError, Reason, SendError
from botmesh.state.backoff import Backoff, GiveUp, Retries, Retry
from botmesh.state.keys import (
    check_explicit,
    derived_key,
    diverged_key,
    fingerprint,
    part_base,
    part_key,
    random_key,
    scope_id,
)
from botmesh.state.messages import Inbound, Media, Outbound
from botmesh.state.records import decode_inbound, decode_outbound, encode_inbound, encode_outbound
from botmesh.state.splitter import split_text


def test_backoff_is_exponential_capped_and_jittered() -> None:
    b = Backoff(1.0, 10.0, 0.0)
    assert [b.delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert b.delay(3, floor=30.0) == 30.0  # a retry_after floor wins
    j = Backoff(1.0, 60.0, 0.2)
    rng = random.Random(1)
    delays = [j.delay(3, rng) for _ in range(200)]
    assert all(3.2 <= d <= 4.8 for d in delays)
    assert len(set(delays)) > 100
    assert Backoff(1.0, 60.0, 0.0).delay(10_000) == 60.0


def test_the_one_retry_decision() -> None:
    r = Retries(3, Backoff(1.0, 60.0, 0.0), Reason.RETRIES_EXHAUSTED)
    assert r.decide(SendError("blip"), 1) == Retry(1.0)
    assert r.decide(SendError("blip"), 2) == Retry(2.0)
    assert r.decide(SendError("blip"), 3) == GiveUp(Reason.RETRIES_EXHAUSTED)
    assert r.decide(SendError("final", retryable=False), 1) == GiveUp(Reason.SEND_REFUSED)
    assert r.decide(RateLimitedError(retry_after=9.0), 1) == Retry(9.0)
    assert r.decide(RuntimeError("anything else"), 1) == Retry(1.0)  # retryable unless told


def test_splitter_is_deterministic_and_bounded() -> None:
    text = "one two three four five six seven eight nine ten " * 5
    parts = split_text(text, 23)
    assert parts == split_text(text, 23)
    assert "".join(parts) == text
    assert all(len(p) <= 23 for p in parts)
    assert split_text("short", 23) == ["short"]
    assert split_text("x" * 50, 20) == ["x" * 20, "x" * 20, "x" * 10]
    assert split_text("a" * 30, None) == ["a" * 30]


def test_keys() -> None:
    assert derived_key("in-1", 2) == "in-1:2"
    assert part_key("k", 1) == "k" and part_key("k", 3) == "k#3"
    assert part_base("k#3", 3) == "k" and part_base("k", 1) == "k"
    assert part_base("in#1:2#2", 2) == "in#1:2"  # an inbound id may hold '#'
    assert random_key() != random_key()
    assert scope_id("t", "e", "b/x", "c:1") == "t:e:b%2Fx:c%3A1"
    a = fingerprint(Outbound("c", "hello"))
    assert a == fingerprint(Outbound("c", "hello", options={"x": 1}))  # chat + content only
    assert a != fingerprint(Outbound("c", "hellO")) and a != fingerprint(Outbound("d", "hello"))
    assert diverged_key("k", a).startswith("k~")
    assert check_explicit("invoice:42") == "invoice:42"
    for bad in ("", "k#2", "#"):
        with pytest.raises(InvalidKeyError):
            check_explicit(bad)


def test_records_round_trip_with_binary_as_base64() -> None:
    m = Inbound(
        id="i",
        chat_id="c",
        text="t",
        media=Media(data=b"\x00\xff", mime="image/png"),
        data={"a": 1},
    )
    raw = encode_inbound(m)
    assert raw["media"]["data"] == "AP8="
    assert decode_inbound(raw) == m
    o = Outbound("c", "t", Media(data=b"\x01\x02"), {"silent": True})
    enc = encode_outbound(o)
    assert enc["media"]["data"] == "AQI=" and enc["options"] == {"silent": True}
    assert decode_outbound(enc) == o
