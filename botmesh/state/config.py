"""``DurabilityConfig``: the bot's durability policy, one frozen object per concern.

The policy is part of the bot's definition (``Bot("id", durability={...})``): retries,
backoff, ambiguity, divergence, leases, retention. Where the journal lives and which
instance holds the leases are the runtime's choice (``botmesh.run(..., journal=...,
instance_id=...)``, ``botmesh worker --journal ... --instance-id ...``), not options here.

Build it from a plain mapping (``DurabilityConfig.from_mapping({...})``, which is what
``Bot(durability={...})`` does) or directly. Durations are parsed once, here; every error
names the field (``outbox.lease``) and says what is accepted. Built directly, every object
(``DurabilityConfig``, ``InboxConfig``, ``OutboxConfig``, ``BackoffConfig``, ``LeaderConfig``)
runs the same checks in ``__post_init__``, with the same errors; a duration field takes
seconds (a number) or a duration (``"15s"``, a ``timedelta``), stored as seconds. A
``BackoffConfig`` built alone names its fields ``backoff.base``… (it does not know whose it is).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from botmesh.state.backoff import Backoff, Retries
from botmesh.state.durations import parse_duration
from botmesh.state.errors import ConfigError, Reason
from botmesh.state.pacing import ChannelLimits, Rate

__all__ = [
    "BackoffConfig",
    "DurabilityConfig",
    "InboxConfig",
    "LeaderConfig",
    "Limit",
    "MessageLogConfig",
    "OutboxConfig",
    "RateLimits",
    "parse_limit",
]

OnAmbiguous = Literal["skip", "resend"]
OnDiverged = Literal["send", "skip"]
ProviderSession = Literal["any", "leader"]

#: The shortest outbox lease the engine accepts (seconds).
MIN_OUTBOX_LEASE = 0.020


@dataclass(frozen=True, slots=True)
class BackoffConfig:
    """Exponential backoff between attempts."""

    #: Delay after the first failure, seconds (default 1 s; option ``base``).
    base: float = 1.0
    #: Longest delay, seconds (default 60 s; option ``cap``).
    cap: float = 60.0
    #: Random spread, a fraction of the delay in [0, 1] (default 0.2).
    jitter: float = 0.2

    def __post_init__(self) -> None:
        base = _seconds(self, "base", "backoff.base")
        cap = _seconds(self, "cap", "backoff.cap")
        _check_backoff(base, cap, self.jitter, "backoff")
        object.__setattr__(self, "jitter", float(self.jitter))

    def backoff(self) -> Backoff:
        return Backoff(self.base, self.cap, self.jitter)

    def retries(
        self, max_attempts: int, exhausted: Reason, refused: Reason = Reason.SEND_REFUSED
    ) -> Retries:
        return Retries(max_attempts, self.backoff(), exhausted, refused)

    @classmethod
    def from_value(cls, value: object, field: str) -> BackoffConfig:
        if isinstance(value, BackoffConfig):
            return value
        raw = _mapping(value, field)
        _known(raw, field, ("base", "cap", "jitter"))
        base = parse_duration(raw.get("base", "1s"), f"{field}.base")
        cap = parse_duration(raw.get("cap", "60s"), f"{field}.cap")
        jitter = raw.get("jitter", 0.2)
        _check_backoff(base, cap, jitter, field)
        return cls(base, cap, float(jitter))


#: A rate limit's setting: ``"default"`` (the channel's own), a ``Rate``, or ``None`` (off).
Limit = Rate | Literal["default"] | None

_LIMITS = ("channel", "chat", "group")
_OFF = {"off", "none", "no", "false"}


def parse_limit(value: object, field: str) -> Limit:
    """One limit's setting: ``"default"``, ``"off"`` (or ``None``, ``False``), or a rate
    (``"30/s"``, ``"20/min"``, a number per second); a ``ConfigError`` naming ``field``."""
    if value is None or value is False:
        return None
    if isinstance(value, str):
        word = value.strip().lower()
        if word == "default":
            return "default"
        if word in _OFF:
            return None
    return Rate.parse(value, field)


def _resolved(mine: Limit, declared: Rate | None) -> Rate | None:
    return declared if isinstance(mine, str) else mine


def _over(mine: Limit, base: Limit) -> Limit:
    return base if isinstance(mine, str) else mine


@dataclass(frozen=True, slots=True)
class RateLimits:
    """The rate limits a bot's sends are paced under (``botmesh.state.pacing``): for each
    of ``channel`` (the whole bot, or phone number), ``chat`` (one private chat) and
    ``group`` (one group chat), ``"default"`` (the limit the channel declares, if any), a
    rate (``"30/s"``, ``"20/min"``, a number per second) or ``None`` / ``"off"`` (none)."""

    channel: Limit = "default"
    chat: Limit = "default"
    group: Limit = "default"

    def __post_init__(self) -> None:
        for name in _LIMITS:
            parsed = parse_limit(getattr(self, name), f"outbox.rate_limits.{name}")
            object.__setattr__(self, name, parsed)  # frozen: set once, while being built

    def limits(self, declared: ChannelLimits) -> ChannelLimits:
        """The limits to keep on a channel that declares ``declared``."""
        return ChannelLimits(
            channel=_resolved(self.channel, declared.channel),
            chat=_resolved(self.chat, declared.chat),
            group=_resolved(self.group, declared.group),
        )

    def over(self, base: RateLimits) -> RateLimits:
        """These settings where they are not ``"default"``, else ``base``'s (the worker's
        ``BOTMESH_*RATE_LIMIT`` over the bot's ``outbox.rate_limits``)."""
        return RateLimits(
            channel=_over(self.channel, base.channel),
            chat=_over(self.chat, base.chat),
            group=_over(self.group, base.group),
        )

    @classmethod
    def from_value(cls, value: object, field: str = "outbox.rate_limits") -> RateLimits:
        """A ``RateLimits``, a mapping of ``channel`` / ``chat`` / ``group``, or one word
        for all three: ``"default"`` or ``"off"``."""
        if isinstance(value, RateLimits):
            return value
        if value is None or value is False or isinstance(value, str):
            word = "off" if not isinstance(value, str) else value.strip().lower()
            if word == "default" or word in _OFF:
                one = parse_limit(word, field)
                return cls(one, one, one)
            raise ConfigError(
                field,
                f"expected 'default', 'off' or a mapping of channel, chat and group (each "
                f"'default', 'off' or a rate such as '30/s'), got {value!r}",
            )
        raw = _mapping(value, field)
        _known(raw, field, _LIMITS)
        return cls(
            **{name: parse_limit(raw.get(name, "default"), f"{field}.{name}") for name in _LIMITS}
        )


@dataclass(frozen=True, slots=True)
class InboxConfig:
    """The inbound journal."""

    #: Processing lease, seconds (default 60 s), extended by a heartbeat while handlers run.
    lease: float = 60.0
    #: Runs charged before an inbound that keeps failing is dead-lettered (default 5).
    max_attempts: int = 5
    #: Backoff between failed attempts before the handlers (default 1 s … 60 s, jitter 0.2).
    backoff: BackoffConfig = field(default_factory=BackoffConfig)
    #: Journal a serializable media reference (default True). Media is journaled as a
    #: reference (url, path, or base64 bytes); provider rehydration is not implemented.
    media_refs: bool = True
    #: Serialize each chat's turns across replicas (see ``botmesh.state.turns``): ``None`` (the
    #: default) turns them on when the journal is shared (sqlite, postgres, redis) and not
    #: partitioned (the Kafka worker's partitions serialize a chat already); ``False``
    #: turns them off (sticky routing, for speed); ``True`` on any unpartitioned journal.
    chat_turns: bool | None = None
    #: How long an inbound waits for its chat's turn held by another replica before it is
    #: left journaled for the sweeper, seconds (default 10 s).
    turn_wait: float = 10.0

    def __post_init__(self) -> None:
        if _seconds(self, "lease", "inbox.lease") <= 0:
            raise ConfigError("inbox.lease", "must be above 0 (for example '60s')")
        if _int(self.max_attempts, "inbox.max_attempts") < 1:
            raise ConfigError("inbox.max_attempts", "must be at least 1")
        _nested(self.backoff, BackoffConfig, "inbox.backoff")
        _bool(self.media_refs, "inbox.media_refs")
        if self.chat_turns is not None:
            _bool(self.chat_turns, "inbox.chat_turns")
        _seconds(self, "turn_wait", "inbox.turn_wait")

    def retry_policy(self) -> Retries:
        """The decision for failures before the handlers (a journal outage, say)."""
        return self.backoff.retries(
            self.max_attempts, Reason.ATTEMPTS_EXHAUSTED, refused=Reason.HANDLE_FAILED
        )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> InboxConfig:
        _known(
            raw,
            "inbox",
            ("lease", "max_attempts", "backoff", "media_refs", "chat_turns", "turn_wait"),
        )
        turns = raw.get("chat_turns")
        return cls(
            lease=parse_duration(raw.get("lease", "60s"), "inbox.lease"),
            max_attempts=_int(raw.get("max_attempts", 5), "inbox.max_attempts"),
            backoff=BackoffConfig.from_value(raw.get("backoff", {}), "inbox.backoff"),
            media_refs=_bool(raw.get("media_refs", True), "inbox.media_refs"),
            chat_turns=None if turns is None else _bool(turns, "inbox.chat_turns"),
            turn_wait=parse_duration(raw.get("turn_wait", "10s"), "inbox.turn_wait"),
        )


@dataclass(frozen=True, slots=True)
class OutboxConfig:
    """The outbound journal."""

    #: Retries after the first attempt before a send is dead-lettered (default 5: 6 calls).
    retries: int = 5
    #: Backoff between send attempts; a ``RateLimitedError`` waits at least ``retry_after``.
    backoff: BackoffConfig = field(default_factory=BackoffConfig)
    #: How long ``ctx.reply`` / ``ctx.send`` retry inline before ``SendDeferredError``
    #: (seconds, default 15 s).
    inline_max: float = 15.0
    #: A send found in flight after a crash: ``"skip"`` marks it ``unknown`` (never a
    #: duplicate), ``"resend"`` sends it again (never lost). Default ``"skip"``.
    on_ambiguous: OnAmbiguous = "skip"
    #: A replay producing other content under the same derived key: ``"send"`` it under a
    #: new key (default) or ``"skip"`` it (answer from the recorded send).
    on_diverged: OnDiverged = "send"
    #: Payloads larger than this (JSON bytes, default 1 MiB) bypass the outbox, with a warning.
    max_payload_bytes: int = 1024 * 1024
    #: Lease of a send in flight, seconds (default 60 s, at least 20 ms).
    lease: float = 60.0
    #: Keep a chat's sends in order across a deferral (default True): while a send of a
    #: chat waits for a retry, later sends to that chat are journaled behind it and go out
    #: after it settled (an inline send then returns a receipt in state ``pending``).
    #: ``False`` lets later sends overtake a deferred one.
    keep_chat_order: bool = True
    #: The deadline of every send that does not give its own (``deliver_within=``,
    #: ``expires_at=``): seconds from when it is journaled (a scheduled send: from its
    #: time) after which a send not yet delivered dies ``expired`` instead of going out
    #: late. ``None`` (default): no deadline.
    deliver_within: float | None = None
    #: How many chats' due sends the background sweeper delivers at a time, each chat's
    #: in order (default 1: one send after another); more lets a campaign's sends overlap
    #: their provider calls and journal writes.
    sweep_at_once: int = 1
    #: The rate limits sends are paced under before they call the provider (default: the
    #: channel's declared ones; ``"off"``: none): ``{"channel": "30/s", "chat": "1/s",
    #: "group": "20/min"}``, each ``"default"``, ``"off"`` or a rate (docs/rate-limits.md).
    rate_limits: RateLimits = field(default_factory=RateLimits)

    def __post_init__(self) -> None:
        if _int(self.retries, "outbox.retries") < 0:
            raise ConfigError("outbox.retries", "must be 0 or more")
        _nested(self.backoff, BackoffConfig, "outbox.backoff")
        _seconds(self, "inline_max", "outbox.inline_max")
        if self.on_ambiguous not in ("skip", "resend"):
            raise ConfigError(
                "outbox.on_ambiguous", f"must be 'skip' or 'resend', got {self.on_ambiguous!r}"
            )
        if self.on_diverged not in ("send", "skip"):
            raise ConfigError(
                "outbox.on_diverged", f"must be 'send' or 'skip', got {self.on_diverged!r}"
            )
        if _int(self.max_payload_bytes, "outbox.max_payload_bytes") < 1:
            raise ConfigError("outbox.max_payload_bytes", "must be at least 1")
        lease = _seconds(self, "lease", "outbox.lease")
        if lease < MIN_OUTBOX_LEASE:
            raise ConfigError("outbox.lease", f"must be at least 20ms, got {lease * 1000:g}ms")
        _bool(self.keep_chat_order, "outbox.keep_chat_order")
        if _int(self.sweep_at_once, "outbox.sweep_at_once") < 1:
            raise ConfigError("outbox.sweep_at_once", "must be at least 1 (1: one at a time)")
        if self.deliver_within is not None:
            within = _seconds(self, "deliver_within", "outbox.deliver_within")
            if within <= 0:
                raise ConfigError(
                    "outbox.deliver_within",
                    "must be above 0 (for example '5m'), or None for no deadline",
                )
        if not isinstance(self.rate_limits, RateLimits):
            limits = RateLimits.from_value(self.rate_limits)
            object.__setattr__(self, "rate_limits", limits)  # frozen: set once, while built

    def retry_policy(self) -> Retries:
        """The one retry decision of a send, inline and in the background."""
        return self.backoff.retries(self.retries + 1, Reason.RETRIES_EXHAUSTED)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], inbox_backoff: BackoffConfig) -> OutboxConfig:
        """The ``outbox`` options; ``backoff`` defaults to the inbox's."""
        _known(raw, "outbox", tuple(f.name for f in dataclasses.fields(cls)))
        return cls(
            retries=_int(raw.get("retries", 5), "outbox.retries"),
            backoff=(
                BackoffConfig.from_value(raw["backoff"], "outbox.backoff")
                if "backoff" in raw
                else inbox_backoff
            ),
            inline_max=parse_duration(raw.get("inline_max", "15s"), "outbox.inline_max"),
            on_ambiguous=raw.get("on_ambiguous", "skip"),
            on_diverged=raw.get("on_diverged", "send"),
            max_payload_bytes=_int(
                raw.get("max_payload_bytes", 1024 * 1024), "outbox.max_payload_bytes"
            ),
            lease=parse_duration(raw.get("lease", "60s"), "outbox.lease"),
            keep_chat_order=_bool(raw.get("keep_chat_order", True), "outbox.keep_chat_order"),
            sweep_at_once=_int(raw.get("sweep_at_once", 1), "outbox.sweep_at_once"),
            deliver_within=(
                None
                if raw.get("deliver_within") is None
                else parse_duration(raw["deliver_within"], "outbox.deliver_within")
            ),
            rate_limits=RateLimits.from_value(raw.get("rate_limits", "default")),
        )


@dataclass(frozen=True, slots=True)
class LeaderConfig:
    """The leadership lease of ``provider_session="leader"`` (see ``botmesh.state.leader``)."""

    #: Lease of the provider session, seconds (default 10 s). The leader renews it every
    #: third of it and stops calling the provider a quarter of it before it ends; a
    #: standby takes the session once it ended (a dead leader: one lease at most).
    lease: float = 10.0

    def __post_init__(self) -> None:
        lease = _seconds(self, "lease", "leader.lease")
        if lease < MIN_OUTBOX_LEASE * 5:
            raise ConfigError("leader.lease", f"must be at least 100ms, got {lease * 1000:g}ms")

    @classmethod
    def from_value(cls, value: object) -> LeaderConfig:
        if isinstance(value, LeaderConfig):
            return value
        raw = _mapping(value, "leader")
        _known(raw, "leader", ("lease",))
        return cls(lease=parse_duration(raw.get("lease", "10s"), "leader.lease"))


@dataclass(frozen=True, slots=True)
class MessageLogConfig:
    """The message log: what was sent, per chat (``botmesh.state.message_log``)."""

    #: Log every part the channel accepted, in the commit that records it sent (default
    #: True). ``False`` logs nothing new (what is logged stays until its retention).
    enabled: bool = True
    #: How long an entry is kept, seconds; ``None`` (the default) follows the journal's
    #: ``retention``; 0 keeps entries for good.
    retention: float | None = None
    #: Keep the text of each message (default True); ``False`` keeps only the rest (chat,
    #: time, channel, message id, media summary).
    texts: bool = True

    def __post_init__(self) -> None:
        _bool(self.enabled, "message_log.enabled")
        _bool(self.texts, "message_log.texts")
        if self.retention is not None:
            _seconds(self, "retention", "message_log.retention")

    @classmethod
    def from_value(cls, value: object) -> MessageLogConfig:
        if isinstance(value, MessageLogConfig):
            return value
        raw = _mapping(value, "message_log")
        _known(raw, "message_log", ("enabled", "retention", "texts"))
        retention = raw.get("retention")
        return cls(
            enabled=_bool(raw.get("enabled", True), "message_log.enabled"),
            retention=(
                None if retention is None else parse_duration(retention, "message_log.retention")
            ),
            texts=_bool(raw.get("texts", True), "message_log.texts"),
        )


@dataclass(frozen=True, slots=True)
class DurabilityConfig:
    """The durability policy of a bot: ``Bot("id", durability=DurabilityConfig(...) | {...})``."""

    #: Dispatch an inbound even when the journal cannot record it (default False: fail
    #: closed; the runtime sees ``JournalUnavailableError`` and the message is not acked).
    fail_open: bool = False
    inbox: InboxConfig = field(default_factory=InboxConfig)
    outbox: OutboxConfig = field(default_factory=OutboxConfig)
    #: Period of the background sweeper, seconds (default 1 s). ``0`` runs no background
    #: sweeper: call ``app.durability.sweep_once()`` yourself (tests, external schedulers).
    poll: float = 1.0
    #: How long ``done`` / ``sent`` records are kept, seconds (default 7 days); 0 keeps them.
    retention: float = 7 * 86400.0
    #: Which replicas may call the provider: ``"any"`` (default) or ``"leader"``, for a
    #: transport that allows one live session (a WhatsApp Web socket): the replica holding
    #: the leadership lease in the shared journal delivers every send; a standby journals
    #: its sends and leaves them to the leader (``ProviderNotLeaderError``, never charged).
    provider_session: ProviderSession = "any"
    #: The leadership lease (``provider_session="leader"`` only).
    leader: LeaderConfig = field(default_factory=LeaderConfig)
    #: The message log (``botmesh.state.message_log``): on, retention, texts.
    message_log: MessageLogConfig = field(default_factory=MessageLogConfig)

    @property
    def message_log_retention(self) -> float:
        """How long message log entries are kept, seconds (0: for good): the log's own
        ``retention``, else the journal's."""
        own = self.message_log.retention
        return self.retention if own is None else own

    def __post_init__(self) -> None:
        # the nested objects checked their own fields when they were built
        _bool(self.fail_open, "fail_open")
        _nested(self.inbox, InboxConfig, "inbox")
        _nested(self.outbox, OutboxConfig, "outbox")
        _nested(self.leader, LeaderConfig, "leader")
        _seconds(self, "poll", "poll")
        _seconds(self, "retention", "retention")
        if self.provider_session not in ("any", "leader"):
            raise ConfigError(
                "provider_session",
                f"must be 'any' or 'leader', got {self.provider_session!r}",
            )
        _nested(self.message_log, MessageLogConfig, "message_log")

    def replace(self, **changes: Any) -> DurabilityConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> DurabilityConfig:
        """Read the options of ``Bot(durability={...})``; names as in this class."""
        raw = _mapping(raw, "durability")
        for moved, arg, flag in (
            ("backend", "journal", "--journal"),
            ("instance_id", "instance_id", "--instance-id"),
        ):
            if moved in raw:
                raise ConfigError(
                    moved,
                    "the runtime chooses this, not the bot: pass "
                    f"botmesh.run(bot, provider, {arg}=...) or `botmesh worker {flag} ...`",
                )
        _known(
            raw,
            "",
            (
                "fail_open",
                "inbox",
                "outbox",
                "poll",
                "retention",
                "provider_session",
                "leader",
                "message_log",
            ),
        )
        inbox = InboxConfig.from_mapping(_mapping(raw.get("inbox", {}), "inbox"))
        outbox = OutboxConfig.from_mapping(_mapping(raw.get("outbox", {}), "outbox"), inbox.backoff)
        return cls(
            fail_open=_bool(raw.get("fail_open", False), "fail_open"),
            inbox=inbox,
            outbox=outbox,
            poll=parse_duration(raw.get("poll", "1s"), "poll"),
            retention=parse_duration(raw.get("retention", "7d"), "retention"),
            provider_session=raw.get("provider_session", "any"),
            leader=LeaderConfig.from_value(raw.get("leader", {})),
            message_log=MessageLogConfig.from_value(raw.get("message_log", {})),
        )

    @classmethod
    def of(cls, value: object) -> DurabilityConfig:
        """``None`` (the defaults), a mapping of options, or a ``DurabilityConfig``."""
        if value is None:
            return cls()
        if isinstance(value, DurabilityConfig):
            return value
        if isinstance(value, Mapping):
            return cls.from_mapping(value)
        raise ConfigError(
            "durability",
            f"expected a mapping of options or a DurabilityConfig, got {type(value).__name__}",
        )


def _seconds(owner: object, name: str, field: str) -> float:
    """The duration field ``name`` of a config object being built, in seconds, stored back
    as such: seconds given as a number, or a duration (``"15s"``, a ``timedelta``)."""
    value = getattr(owner, name)
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise ConfigError(field, f"must be a finite duration >= 0, got {value!r}")
    else:
        seconds = parse_duration(value, field)
    if value is not seconds:
        object.__setattr__(owner, name, seconds)  # frozen: set once, while being built
    return seconds


def _check_backoff(base: float, cap: float, jitter: object, field: str) -> None:
    """The checks of a backoff, built directly or read from a mapping (``field``: its name)."""
    if isinstance(jitter, bool) or not isinstance(jitter, int | float):
        raise ConfigError(f"{field}.jitter", f"expected a number in [0, 1], got {jitter!r}")
    if base <= 0:
        raise ConfigError(f"{field}.base", "must be above 0 (for example '1s')")
    if cap < base:
        raise ConfigError(f"{field}.cap", f"must be at least base ({base}s), got {cap}s")
    if not 0.0 <= float(jitter) <= 1.0:
        raise ConfigError(f"{field}.jitter", f"must be in [0, 1], got {jitter!r}")


def _nested(value: object, kind: type, field: str) -> None:
    if not isinstance(value, kind):
        raise ConfigError(
            field,
            f"expected a {kind.__name__}, got {type(value).__name__} (a mapping of options "
            "goes through DurabilityConfig.from_mapping, or Bot(durability={...}))",
        )


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(field, f"expected a mapping of options, got {type(value).__name__}")
    return value


def _known(raw: Mapping[str, Any], field: str, names: tuple[str, ...]) -> None:
    for name in raw:
        if name not in names:
            where = f"{field}.{name}" if field else str(name)
            raise ConfigError(where, f"unknown option; known here: {', '.join(names)}")


def _int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, f"expected a whole number, got {value!r}")
    return value


def _bool(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(field, f"expected true or false, got {value!r}")
    return value
