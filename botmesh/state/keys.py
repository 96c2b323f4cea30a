"""Journal keys and idempotency keys.

A bot's records live under its scope (``tenant:environment:bot:connection``, each part
percent-encoded): ``<scope>/in/<inbound id>``, ``<scope>/out/<idempotency key>``,
``<scope>/flow/<chat id>``, ``<scope>/turn/<chat id>``, ``<scope>/log/<chat>/…`` (the
message log, chat id percent-encoded) and ``<scope>/leader`` (``ScopeKeys``). So two bots
on one backend never see each other's records, and explicit keys are per bot.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from urllib.parse import quote, unquote

from botmesh.state.errors import InvalidKeyError
from botmesh.state.messages import Outbound

__all__ = [
    "CAMPAIGN_PREFIX",
    "FALLBACK_SUFFIX",
    "ScopeKeys",
    "campaign_key",
    "check_campaign",
    "check_explicit",
    "derived_key",
    "diverged_key",
    "fingerprint",
    "is_turn_key",
    "part_base",
    "part_key",
    "random_key",
    "record_group",
    "scope_id",
]


def scope_id(tenant_id: str, environment_id: str, bot_id: str, connection_id: str) -> str:
    """The bot's namespace in a shared backend (``durability.scope``)."""
    return ":".join(quote(p, safe="") for p in (tenant_id, environment_id, bot_id, connection_id))


@dataclass(frozen=True, slots=True)
class ScopeKeys:
    """Where the records of one scope live in the journal."""

    scope: str
    #: Every record of the scope (``<scope>/``).
    all: str
    #: Inbounds, by id (``<scope>/in/``).
    inbox: str
    #: Sends, by idempotency key (``<scope>/out/``).
    outbox: str
    #: Flow checkpoints, by chat id (``<scope>/flow/``).
    flow: str
    #: Chat turns, by chat id (``<scope>/turn/``).
    turn: str
    #: The provider session's leadership lease (``<scope>/leader``: one record).
    leader: str
    #: The message log: what was sent, per chat (``<scope>/log/``; see ``log_of``).
    log: str
    #: The sent sends, named by the channel's message ids (``<scope>/mid/``; ``mid_of``).
    mid: str = ""

    @classmethod
    def of(cls, scope: str) -> ScopeKeys:
        return cls(
            scope,
            f"{scope}/",
            f"{scope}/in/",
            f"{scope}/out/",
            f"{scope}/flow/",
            f"{scope}/turn/",
            f"{scope}/leader",
            f"{scope}/log/",
            f"{scope}/mid/",
        )

    def log_of(self, chat_id: str) -> str:
        """The message log of one chat (``<scope>/log/<chat id, percent-encoded>/``): the
        encoding keeps a ``/`` in a chat id from reaching into another chat's log."""
        return f"{self.log}{quote(chat_id, safe='')}/"

    def mid_of(self, message_id: str) -> str:
        """Where the send the channel accepted as ``message_id`` is named
        (``<scope>/mid/<message id, percent-encoded>``): a channel's status webhook names
        the message by that id (its chat may be written otherwise than the send's:
        ``whatsapp:+1…`` for ``+1…``, a JID for a number)."""
        return f"{self.mid}{quote(message_id, safe='')}"


def is_turn_key(key: str) -> bool:
    """Whether ``key`` is a chat turn's record (``<scope>/turn/<chat id>``). A scope is
    percent-encoded, so its first ``/`` ends it and the record's kind follows."""
    i = key.find("/")
    return i >= 0 and key.startswith("turn/", i + 1)


#: The sends of an inbound (``derived_key`` 0 to 7) stored with it (``record_group``).
GROUPED_SENDS = frozenset("01234567")
#: The parts of a send's text whose message log entries are stored with it.
GROUPED_PARTS = frozenset(f"{n:04d}" for n in range(1, 5))


def record_group(key: str) -> str | None:
    """The key of the record that holds ``key``'s on a journal that stores an inbound with
    what its turn wrote (the worker's changelog: one record a turn), else ``None`` (stored
    alone). Derived from the key alone, so a key's group never changes:

    - an inbound (``<scope>/in/<id>``) is its own group's key;
    - the first sends it made (``<scope>/out/<id>:<n>``, ``n`` < 8; not a part ``#k``, a
      fallback or a diverged send) go with it;
    - and so do their message log entries (``<scope>/log/<chat>/<time>/<send key>/<part>``,
      the first 4 parts).

    A key that merely looks derived (an explicit key ``x:1``) is stored with inbound ``x``'s
    group: only where it is stored changes, not what it holds."""
    i = key.find("/")
    if i < 0:
        return None
    scope, rest = key[:i], key[i + 1 :]
    kind, _, ident = rest.partition("/")
    if kind == "in":
        return key
    if kind == "log":
        parts = ident.split("/")
        if len(parts) != 4 or parts[3] not in GROUPED_PARTS:
            return None
        ident = unquote(parts[2])
    elif kind != "out":
        return None
    if "#" in ident or "~" in ident:
        return None
    base, sep, n = ident.rpartition(":")
    if not sep or n not in GROUPED_SENDS:
        return None
    return f"{scope}/in/{base}"


def derived_key(inbound_id: str, n: int) -> str:
    """The key of the ``n``-th send made while handling inbound ``inbound_id``."""
    return f"{inbound_id}:{n}"


def random_key() -> str:
    return uuid.uuid4().hex


def part_key(key: str, part: int) -> str:
    """``key`` for part 1, ``key#2``, ``key#3``… for the others."""
    return key if part == 1 else f"{key}#{part}"


def part_base(key: str, part: int) -> str:
    """The key of part 1 of the send whose part ``part`` is ``key``."""
    return key if part == 1 else key.rpartition("#")[0]


#: The suffix of a fallback's key (``<key>~fallback``; ``botmesh.state.fallback``).
FALLBACK_SUFFIX = "~fallback"


def check_explicit(key: str) -> str:
    """An explicit idempotency key, refused when botmesh could not keep it apart from the
    keys it makes itself: ``#`` would collide with the part keys of a split text
    (``key#2``), a ``~fallback`` ending with the key a send's fallback goes out under
    (``key~fallback``): at a channel that deduplicates by key (Discord's nonce, an email's
    ``Message-ID``) the fallback would be taken for the other send and never delivered."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(str(key), "must be a non-empty string")
    if "#" in key:
        raise InvalidKeyError(
            key,
            "must not contain '#': botmesh names the parts of a split text 'key#2', "
            "'key#3'…; use another separator (for example ':' or '/')",
        )
    if key.endswith(FALLBACK_SUFFIX):
        raise InvalidKeyError(
            key,
            f"must not end in {FALLBACK_SUFFIX!r}: botmesh sends the fallback of send 'k' "
            f"under 'k{FALLBACK_SUFFIX}'; end it otherwise (for example "
            f"{key[: -len(FALLBACK_SUFFIX)] + ':fallback'!r})",
        )
    if not key.isascii():
        _no_surrogate(key)
    return key


#: The keys of a campaign's sends start so: ``campaign:<campaign id>:<chat id>``.
CAMPAIGN_PREFIX = "campaign:"


def check_campaign(campaign: str) -> str:
    """A campaign id: non-empty, without ``:`` (its keys' separator) or ``#``."""
    if not isinstance(campaign, str) or not campaign.strip():
        raise InvalidKeyError(str(campaign), "a campaign id must be a non-empty string")
    if ":" in campaign or "#" in campaign:
        raise InvalidKeyError(
            campaign,
            "a campaign id must not contain ':' or '#' (its sends are keyed "
            "'campaign:<id>:<chat id>'); use '-', '_' or '.' instead",
        )
    return campaign


def campaign_key(campaign: str, chat_id: str) -> str:
    """The idempotency key of a campaign's send to ``chat_id``: the same on every run of
    the campaign, so a campaign started again sends no recipient twice."""
    return check_explicit(f"{CAMPAIGN_PREFIX}{check_campaign(campaign)}:{chat_id}")


def _no_surrogate(key: str) -> None:
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(
            key,
            f"holds a lone surrogate ({key[exc.start]!r} at index {exc.start}), which is not "
            "UTF-8 text; build the key from valid text",
        ) from None


def diverged_key(key: str, fp: str) -> str:
    """The key a diverged replay sends under with ``on_diverged="send"`` (deterministic, so
    a second identical replay is answered from the outbox)."""
    return f"{key}~{fp[:12]}"


def fingerprint(message: Outbound) -> str:
    """Chat + content of a send (before the before-send hooks)."""
    media = message.media
    doc = [
        message.chat_id,
        message.text,
        None
        if media is None
        else [
            media.url,
            media.path,
            hashlib.sha256(media.data).hexdigest() if media.data is not None else None,
            media.mime,
        ],
    ]
    raw = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:32]
