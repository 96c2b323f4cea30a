"""Backoff, splitter, keys and records: the pure parts of the engine."""

from __future__ import annotations

import random

from state.backoff import Backoff
from state.keys import derived_key, diverged_key, fingerprint, part_key, random_key, scope_id
from state.messages import Inbound, Media, Outbound
from state.records import decode_inbound, decode_outbound, encode_inbound, encode_outbound
from state.splitter import split_text


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
    assert random_key() != random_key()
    assert scope_id("t", "e", "b/x", "c:1") == "t:e:b%2Fx:c%3A1"
    a = fingerprint(Outbound("c", "hello"))
    assert a == fingerprint(Outbound("c", "hello", options={"x": 1}))  # chat + content only
    assert a != fingerprint(Outbound("c", "hellO")) and a != fingerprint(Outbound("d", "hello"))
    assert diverged_key("k", a).startswith("k~")


def test_records_round_trip_with_binary_as_base64() -> None:
    m = Inbound("i", "c", "t", media=Media(data=b"\x00\xff", mime="image/png"), data={"a": 1})
    raw = encode_inbound(m)
    assert raw["media"]["data"] == "AP8="
    assert decode_inbound(raw) == m
    o = Outbound("c", "t", Media(data=b"\x01\x02"), {"idempotency_key": "k", "silent": True})
    enc = encode_outbound(o)
    assert "idempotency_key" not in enc["options"] and enc["media"]["data"] == "AQI="
    assert decode_outbound(enc) == Outbound("c", "t", Media(data=b"\x01\x02"), {"silent": True})
    assert encode_inbound(m, media_refs=False)["media"] is None
