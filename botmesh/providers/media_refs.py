"""Media references: what the inbox journals in place of an inbound's media, per channel,
and how it is validated and rebuilt when a replay reads it back (the reference's "Media on
replay").

``media_rules(channel, hosts=None)`` gives a channel's ``MediaRefRules``: ``serialize(media)``
returns ``{"v": 1, "data": {...}}`` (JSON; never credentials, never inline bytes, never a
thumbnail) or ``None`` (not durable); ``rehydrate(stored, media)`` validates ``stored`` and
returns the rebuilt ``Media`` (``id`` / ``url`` / ``extra`` from ``stored``; ``mime``,
``name`` and ``provider`` from ``media``; no ``data``, ``ref=None``), or raises
``MediaRefInvalid`` (a ``ProviderError``). ``hosts`` replaces the channel's allowed media
hosts (``media_ref_hosts``) where it has a list.

What each channel journals (``data``):

============ ==============================================================================
baileys      ``media``: url, directPath, mediaKey, fileSha256, fileEncSha256 (base64 of 32
             bytes), fileLength, mimetype; ``key``: remoteJid, id, fromMe, participant;
             ``type`` (image, video, …: Baileys derives the decryption keys from it). Never
             jpegThumbnail, caption or contextInfo. View-once media: not durable unless
             ``view_once=True``. The url must be https on ``whatsapp.net``.
whatsapp     ``id``: the Cloud API media id.
telegram     ``file_id`` (+ ``file_unique_id``). It only works with the same bot token.
twilio       ``url``: https on ``twilio.com`` (``api.twilio.com``), no query string.
messenger,   ``url``: https on ``fbcdn.net``, ``fbsbx.com``, ``cdninstagram.com``.
instagram
discord      ``url``: https on ``discordapp.com``, ``discordapp.net``; query: ``ex``, ``is``,
             ``hm`` only.
evolution    ``key``: the message key; the inline base64 is never journaled.
wppconnect   ``message_id``.
gupshup,     ``url``: the hosted http(s) URL, any public host.
gohighlevel
email        ``message_id``, ``index``, ``sha256`` (+ ``imap_uid``, ``uidvalidity``).
tiktok       ``conversation_id``, ``message_id`` (+ ``index``, ``type``), or a sticker
             ``url`` (https on ``tiktokcdn.com``, ``tiktokcdn-us.com``, ``tiktokcdn-eu.com``,
             ``ibyteimg.com``).
other        ``TokenAsIs``: url, path, id as they are (the url without credentials).
============ ==============================================================================

Credentials in URLs. ``user:pass@`` is stripped, and so is the fragment. Query parameters
that name a credential (``access_token``, ``token``, ``api_key``, ``key``, ``password``,
``secret``, ``signature``, ``sig``, ``auth``, any name ending in ``token``, ``secret`` or
``password``, …) are stripped when serializing and refused when read back, except the
CDNs' own URL signatures, which the URL needs to work and which grant nothing but that
one file: Meta CDNs keep ``oh``/``oe`` and ``lookaside.fbsbx.com``'s ``signature``; WhatsApp
(Baileys) CDN URLs keep ``oh``/``oe``; Discord keeps only ``ex``/``is``/``hm`` (every other
parameter is dropped); TikTok keeps ``x-signature``/``x-expires``; Twilio media URLs keep no
query at all.

Read back, a reference is refused (``MediaRefInvalid``) when ``v`` is not 1, when ``stored``
or ``data`` has a missing, extra or mistyped key, when a value is over its size or outside
its character set (ids are safe as URL path segments: no ``/``, ``?``, ``%``, ``#``, no
leading ``.``), or when a URL is not clean: a scheme or host not allowed, userinfo, a
credential parameter, a fragment, a port, a literal private/loopback/link-local address or
a host that is not a DNS name (``allow_private=True``, for tests against a local fake,
lifts the last three). A tampered journal therefore yields an error or a reference the
adapter can download with its usual checks, nothing else.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import unquote_plus, urlsplit

from botmesh.providers.http import MediaUrlRefused, check_media_url
from botmesh.state.errors import ConfigError, ProviderError
from botmesh.state.messages import Media

__all__ = ["CHANNELS", "MediaRefInvalid", "MediaRefRules", "TokenAsIs", "media_rules"]

#: The version of the references written here (``"v"``).
VERSION = 1

#: Longest URL journaled (characters).
URL_MAX = 2048

_FIX = "the media cannot be rebuilt on replay; ask the sender to send it again"


class MediaRefInvalid(ProviderError):
    """A stored media reference is invalid, from an unknown version, or tampered with."""


class MediaRefRules(Protocol):
    channel: str
    #: Hosts whose URLs are journaled and accepted back (``None``: any public host).
    hosts: tuple[str, ...] | None
    #: URL schemes accepted back.
    schemes: tuple[str, ...]

    def serialize(self, media: Media) -> dict[str, Any] | None: ...

    def rehydrate(self, stored: Mapping[str, Any], media: Media) -> Media: ...


# -- validation helpers ---------------------------------------------------------------------


class _Bad(Exception):
    """One field failed; ``_Rules`` turns it into ``MediaRefInvalid`` naming the channel."""


def _fields(
    value: Any, where: str, required: Iterable[str], optional: Iterable[str] = ()
) -> dict[str, Any]:
    """``value`` as a dict with exactly these string keys (the optional ones may be absent)."""
    if not isinstance(value, dict):
        raise _Bad(f"{where} is a {type(value).__name__}, not an object")
    req, opt = set(required), set(optional)
    unknown = [k for k in value if k not in req and k not in opt]
    if unknown:
        shown = ", ".join(repr(k)[:40] for k in unknown[:3])
        raise _Bad(f"{where} has unknown keys ({shown})")
    missing = sorted(req - value.keys())
    if missing:
        raise _Bad(f"{where} lacks {', '.join(missing)}")
    return value


def _text(value: Any, where: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{where} is a {type(value).__name__}, not a string")
    if not pattern.fullmatch(value):
        raise _Bad(f"{where} is not a valid value ({len(value)} characters)")
    return value


def _int(value: Any, where: str, low: int, high: int) -> int:
    if type(value) is not int:
        raise _Bad(f"{where} is a {type(value).__name__}, not an integer")
    if not low <= value <= high:
        raise _Bad(f"{where} is out of range ({low}..{high})")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"{where} is a {type(value).__name__}, not a boolean")
    return value


#: A channel token safe as a URL path segment or query value: no ``/ ? # %``, no leading dot.
_TOKEN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.:=-]{0,255}")
#: TikTok conversation and message ids: tokens, ``+`` included (its conversation ids carry
#: one); they travel as query parameters and JSON, never in a URL path.
_TIKTOK_ID = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.:=+-]{0,255}")
#: Telegram file ids (URL-safe base64).
_FILE_ID = re.compile(r"[A-Za-z0-9_-]{1,256}")
#: A WhatsApp JID: ``5511…@s.whatsapp.net``, ``…@g.us``, ``…@lid``, ``status@broadcast``.
_JID = re.compile(r"[A-Za-z0-9_.:-]{1,128}@[a-z0-9.-]{1,64}")
#: A WhatsApp message id.
_MSG_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.:-]{0,127}")
#: A WPPConnect message id: ``true_5511…@c.us_3EB0…`` (``@`` is safe in a path segment).
_WPP_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.:@-]{0,255}")
#: An RFC 5322 Message-ID, with or without its angle brackets (printable ASCII, no space).
_MESSAGE_ID = re.compile(r"[\x21-\x7e]{1,512}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_MIME = re.compile(
    r"[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,63}"
    r"(?:; ?[a-z0-9_-]{1,32}=[a-z0-9_.+-]{1,64}){0,4}",
    re.IGNORECASE,
)
#: A Baileys ``directPath`` (path and query on the WhatsApp CDN); never ``//``, ``@``, ``\``.
_DIRECT_PATH = re.compile(r"/(?!/)[A-Za-z0-9._~%/?&=+:,;-]{1,1023}")
_WORD = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_BAILEYS_TYPES = frozenset({"image", "video", "audio", "document", "sticker", "ptv", "gif"})
_U32 = 2**32 - 1
_SIZE_MAX = 2**53

# -- URLs -----------------------------------------------------------------------------------

#: Query parameter names that carry a credential (compared lower-case, without ``-``/``_``).
_CREDENTIAL_PARAMS = frozenset(
    {
        "accesstoken",
        "token",
        "authtoken",
        "apikey",
        "key",
        "password",
        "passwd",
        "pwd",
        "pass",
        "secret",
        "clientsecret",
        "appsecret",
        "appsecretproof",
        "authorization",
        "auth",
        "signature",
        "sig",
        "jwt",
        "bearer",
        "sessionid",
    }
)


def _param_key(piece: str) -> str:
    name = unquote_plus(piece.split("=", 1)[0])
    return name.lower().replace("-", "").replace("_", "")


def _credential_param(name: str) -> bool:
    """``name`` (a query parameter) looks like a credential."""
    key = _param_key(name)
    return key in _CREDENTIAL_PARAMS or key.endswith(("token", "secret", "password"))


#: A DNS name whose last label starts with a letter (refuses ``127.1``, ``0x7f.1``,
#: ``2130706433``, ``localhost``).
_HOSTNAME = re.compile(
    r"(?=.{1,253}$)(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?\.)+[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?"
)


class _UrlPolicy:
    """Which URLs a channel journals: schemes, hosts, query parameters."""

    def __init__(
        self,
        *,
        hosts: tuple[str, ...] | None,
        schemes: tuple[str, ...] = ("https",),
        params: frozenset[str] | None = None,
        signed: frozenset[str] = frozenset(),
        allow_private: bool = False,
    ) -> None:
        self.hosts = hosts
        self.schemes = ("https", "http") if allow_private else schemes
        #: Only these parameters are kept (``None``: any but credentials).
        self.params = params
        #: CDN signature parameters kept although their names look like credentials.
        self.signed = signed
        self.allow_private = allow_private

    def _keeps(self, piece: str) -> bool:
        if not piece:
            return False
        name = unquote_plus(piece.split("=", 1)[0])
        if self.params is not None:
            return name in self.params
        return name in self.signed or not _credential_param(name)

    def clean(self, url: str) -> str:
        """``url`` without userinfo, fragment and credential parameters (a fixpoint)."""
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        query = "&".join(p for p in parts.query.split("&") if self._keeps(p))
        return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")

    def check(self, url: Any, where: str) -> str:
        """``url`` when it is a clean URL this channel accepts back; raises ``_Bad``."""
        if not isinstance(url, str):
            raise _Bad(f"{where} is a {type(url).__name__}, not a string")
        if not 1 <= len(url) <= URL_MAX:
            raise _Bad(f"{where} is empty or over {URL_MAX} characters")
        if not url.isascii() or not url.isprintable() or " " in url or "\\" in url:
            raise _Bad(f"{where} has spaces, control or non-ASCII characters")
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port
            clean = self.clean(url)
        except ValueError as exc:
            raise _Bad(f"{where} is not a URL ({exc})") from None
        if clean != url:
            raise _Bad(f"{where} carries userinfo, a fragment or a parameter not allowed")
        if not self.allow_private:
            if port is not None:
                raise _Bad(f"{where} names a port")
            try:
                ipaddress.ip_address(host)
            except ValueError:
                if not _HOSTNAME.fullmatch(host):
                    raise _Bad(f"{where} has a host that is not a DNS name") from None
        try:
            check_media_url(
                url, hosts=self.hosts, allow_private=self.allow_private, schemes=self.schemes
            )
        except MediaUrlRefused as exc:
            raise _Bad(f"{where}: {exc}") from None
        return url

    def pack(self, url: Any) -> str | None:
        """``url`` cleaned, or ``None`` when it is not a URL this channel journals."""
        if not isinstance(url, str):
            return None
        try:
            return self.check(self.clean(url.strip()), "url")
        except (_Bad, ValueError):
            return None


def _hosts(hosts: Iterable[str] | None, default: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if hosts is None:
        return default
    if isinstance(hosts, str):
        raise ConfigError(
            "media_ref_hosts", f"give a list of host names, not one string ({hosts!r})"
        )
    out: list[str] = []
    for h in hosts:
        name = h.strip().strip(".").lower() if isinstance(h, str) else ""
        if not name or any(c in name for c in "/:@?#[] \\"):
            raise ConfigError(
                "media_ref_hosts",
                f"{h!r} is not a host name; give bare names such as 'fbcdn.net' (subdomains "
                "are included)",
            )
        out.append(name)
    return tuple(out)


# -- the rules ------------------------------------------------------------------------------


class _Rules:
    """The shared part: the ``{"v", "data"}`` envelope, and serialize = pack + the same
    validation as rehydrate, so every reference written is one that reads back."""

    hosts: tuple[str, ...] | None = None
    schemes: tuple[str, ...] = ("https",)

    def __init__(self, channel: str) -> None:
        self.channel = channel

    def _pack(self, media: Media) -> dict[str, Any] | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _unpack(self, data: Any) -> dict[str, Any]:  # pragma: no cover - abstract
        """``data`` validated, as the ``Media`` fields it rebuilds (url, id, extra)."""
        raise NotImplementedError

    def serialize(self, media: Media) -> dict[str, Any] | None:
        try:
            data = self._pack(media)
            if data is None:
                return None
            self._unpack(data)
        except _Bad:
            return None
        return {"v": VERSION, "data": data}

    def rehydrate(self, stored: Mapping[str, Any], media: Media) -> Media:
        try:
            if not isinstance(stored, Mapping):
                raise _Bad(f"the reference is a {type(stored).__name__}, not an object")
            envelope = _fields(dict(stored), "the reference", ("v", "data"))
            v = envelope["v"]
            if type(v) is not int or v != VERSION:
                raise _Bad(f"version {str(v)[:20]!r} is unknown (this botmesh reads {VERSION})")
            fields = self._unpack(envelope["data"])
        except _Bad as exc:
            raise MediaRefInvalid(f"{self.channel} media reference: {exc}; {_FIX}") from None
        except Exception as exc:  # belt and braces: a replay never crashes on a reference
            raise MediaRefInvalid(
                f"{self.channel} media reference: not valid ({type(exc).__name__}); {_FIX}"
            ) from None
        return Media(
            mime=media.mime,
            name=media.name,
            provider=media.provider or self.channel,
            **fields,
        )


class _MetaCloud(_Rules):
    """WhatsApp Cloud API: the media id (``GET /{id}`` gives a fresh URL)."""

    def _pack(self, media: Media) -> dict[str, Any] | None:
        return {"id": media.id} if media.id else None

    def _unpack(self, data: Any) -> dict[str, Any]:
        d = _fields(data, "data", ("id",))
        return {"id": _text(d["id"], "data.id", _TOKEN)}


class _Telegram(_Rules):
    """Telegram: the ``file_id`` (+ ``file_unique_id``)."""

    def _pack(self, media: Media) -> dict[str, Any] | None:
        if not media.id:
            return None
        data: dict[str, Any] = {"file_id": media.id}
        if media.extra.get("file_unique_id"):
            data["file_unique_id"] = media.extra["file_unique_id"]
        return data

    def _unpack(self, data: Any) -> dict[str, Any]:
        d = _fields(data, "data", ("file_id",), ("file_unique_id",))
        out: dict[str, Any] = {"id": _text(d["file_id"], "data.file_id", _FILE_ID)}
        if "file_unique_id" in d:
            uid = _text(d["file_unique_id"], "data.file_unique_id", _FILE_ID)
            out["extra"] = {"file_unique_id": uid}
        return out


class _HostedUrl(_Rules):
    """A channel whose media is a URL on its CDN (or any public host)."""

    def __init__(self, channel: str, policy: _UrlPolicy) -> None:
        super().__init__(channel)
        self.policy = policy
        self.hosts = policy.hosts
        self.schemes = policy.schemes

    def _pack(self, media: Media) -> dict[str, Any] | None:
        url = self.policy.pack(media.url)
        return {"url": url} if url else None

    def _unpack(self, data: Any) -> dict[str, Any]:
        d = _fields(data, "data", ("url",))
        return {"url": self.policy.check(d["url"], "data.url")}


def _key(value: Any, where: str) -> dict[str, Any]:
    """A WhatsApp message key (Baileys, Evolution)."""
    k = _fields(value, where, ("remoteJid", "id"), ("fromMe", "participant"))
    out: dict[str, Any] = {
        "remoteJid": _text(k["remoteJid"], f"{where}.remoteJid", _JID),
        "id": _text(k["id"], f"{where}.id", _MSG_ID),
    }
    if "fromMe" in k:
        out["fromMe"] = _bool(k["fromMe"], f"{where}.fromMe")
    if "participant" in k:
        out["participant"] = _text(k["participant"], f"{where}.participant", _JID)
    return out


def _pack_key(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        return None
    out = {k: value[k] for k in ("remoteJid", "id", "fromMe", "participant") if k in value}
    if out.get("participant") in (None, ""):
        out.pop("participant", None)
    if out.get("fromMe") is None:
        out.pop("fromMe", None)
    return out


def _valid(check: Callable[[Any, str], Any], value: Any, where: str) -> bool:
    try:
        check(value, where)
    except _Bad:
        return False
    return True


def _b64_32(value: Any) -> str | None:
    """32 bytes (raw, base64 or URL-safe base64 text, or Baileys' BufferJSON
    ``{"type": "Buffer", "data": <base64>}``) as canonical base64; else ``None``."""
    raw: bytes | None = None
    if isinstance(value, Mapping) and value.get("type") == "Buffer":
        value = value.get("data")
    if isinstance(value, bytes | bytearray):
        raw = bytes(value)
    elif isinstance(value, str) and len(value) <= 64:
        try:
            raw = base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError):
            return None
    if raw is None or len(raw) != 32:
        return None
    return base64.b64encode(raw).decode("ascii")


def _canonical_b64(value: Any, where: str) -> str:
    if not isinstance(value, str) or _b64_32(value) != value:
        raise _Bad(f"{where} is not the base64 of 32 bytes")
    return value


_BAILEYS_CONTENT = ("url", "directPath", "mediaKey", "fileSha256", "fileEncSha256")


class _Baileys(_Rules):
    """Baileys: the media content (no thumbnail, caption or quoted context) and the key."""

    def __init__(self, channel: str, policy: _UrlPolicy, *, view_once: bool) -> None:
        super().__init__(channel)
        self.policy = policy
        self.hosts = policy.hosts
        self.schemes = policy.schemes
        self.view_once = view_once

    def _pack(self, media: Media) -> dict[str, Any] | None:
        extra = media.extra
        once = extra.get("view_once") is True
        if once and not self.view_once:
            return None
        # Optional fields that do not validate are left out; the required ones decide.
        content: dict[str, Any] = {}
        url = self.policy.pack(extra.get("url") or media.url)
        if url is not None:
            content["url"] = url
        path = extra.get("directPath")
        if isinstance(path, str) and _DIRECT_PATH.fullmatch(path) and ".." not in path:
            content["directPath"] = path
        for name in ("mediaKey", "fileSha256", "fileEncSha256"):
            if (b64 := _b64_32(extra.get(name))) is not None:
                content[name] = b64
        length = extra.get("fileLength")
        if isinstance(length, str) and length.isdigit() and len(length) < 17:
            length = int(length)
        if type(length) is int and 0 <= length <= _SIZE_MAX:
            content["fileLength"] = length
        mimetype = extra.get("mimetype") or media.mime
        if isinstance(mimetype, str) and _MIME.fullmatch(mimetype):
            content["mimetype"] = mimetype
        data: dict[str, Any] = {"media": content}
        key = _pack_key(extra.get("key"))
        if key is not None and _valid(_key, key, "key"):
            data["key"] = key
        kind = extra.get("type")
        if isinstance(kind, str) and kind in _BAILEYS_TYPES:
            data["type"] = kind
        if once:
            data["view_once"] = True
        return data

    def _unpack(self, data: Any) -> dict[str, Any]:
        d = _fields(data, "data", ("media",), ("key", "type", "view_once"))
        m = _fields(
            d["media"], "data.media", ("mediaKey",), (*_BAILEYS_CONTENT, "fileLength", "mimetype")
        )
        if "url" not in m and "directPath" not in m:
            raise _Bad("data.media has neither url nor directPath")
        extra: dict[str, Any] = {}
        if "url" in m:
            extra["url"] = self.policy.check(m["url"], "data.media.url")
        if "directPath" in m:
            path = _text(m["directPath"], "data.media.directPath", _DIRECT_PATH)
            if ".." in path:
                raise _Bad("data.media.directPath climbs out of its folder")
            extra["directPath"] = path
        for name in ("mediaKey", "fileSha256", "fileEncSha256"):
            if name in m:
                extra[name] = _canonical_b64(m[name], f"data.media.{name}")
        if "fileLength" in m:
            extra["fileLength"] = _int(m["fileLength"], "data.media.fileLength", 0, _SIZE_MAX)
        if "mimetype" in m:
            extra["mimetype"] = _text(m["mimetype"], "data.media.mimetype", _MIME)
        if "key" in d:
            extra["key"] = _key(d["key"], "data.key")
        if "type" in d:
            kind = d["type"]
            if not isinstance(kind, str) or kind not in _BAILEYS_TYPES:
                raise _Bad(f"data.type is not one of {', '.join(sorted(_BAILEYS_TYPES))}")
            extra["type"] = kind
        if "view_once" in d:
            if d["view_once"] is not True:
                raise _Bad("data.view_once is not true")
            if not self.view_once:
                raise _Bad("view-once media is not durable under these rules (view_once=False)")
            extra["view_once"] = True
        return {"extra": extra}


class _Evolution(_Rules):
    """Evolution API: the message key (the inline base64 is never journaled)."""

    def _pack(self, media: Media) -> dict[str, Any] | None:
        key = _pack_key(media.extra.get("key"))
        return {"key": key} if key is not None else None

    def _unpack(self, data: Any) -> dict[str, Any]:
        d = _fields(data, "data", ("key",))
        return {"extra": {"key": _key(d["key"], "data.key")}}


class _WppConnect(_Rules):
    """WPPConnect: the messageId (rebuilt as ``id`` and ``extra["message_id"]``)."""

    def _pack(self, media: Media) -> dict[str, Any] | None:
        mid = media.id or media.extra.get("message_id")
        return {"message_id": mid} if mid else None

    def _unpack(self, data: Any) -> dict[str, Any]:
        d = _fields(data, "data", ("message_id",))
        mid = _text(d["message_id"], "data.message_id", _WPP_ID)
        return {"id": mid, "extra": {"message_id": mid}}


class _Email(_Rules):
    """Email: Message-ID + attachment index + SHA-256 digest (+ IMAP UID, UIDVALIDITY)."""

    _OPTIONAL = ("imap_uid", "uidvalidity")

    def _pack(self, media: Media) -> dict[str, Any] | None:
        e = media.extra
        if not all(e.get(k) is not None for k in ("message_id", "index", "sha256")):
            return None
        sha = e["sha256"]
        data: dict[str, Any] = {
            "message_id": e["message_id"],
            "index": e["index"],
            "sha256": sha.lower() if isinstance(sha, str) else sha,
        }
        data.update({k: e[k] for k in self._OPTIONAL if e.get(k) is not None})
        return data

    def _unpack(self, data: Any) -> dict[str, Any]:
        d = _fields(data, "data", ("message_id", "index", "sha256"), self._OPTIONAL)
        extra: dict[str, Any] = {
            "message_id": _text(d["message_id"], "data.message_id", _MESSAGE_ID),
            "index": _int(d["index"], "data.index", 0, 9999),
            "sha256": _text(d["sha256"], "data.sha256", _SHA256_HEX),
        }
        for k in self._OPTIONAL:
            if k in d:
                extra[k] = _int(d[k], f"data.{k}", 1, _U32)
        return {"extra": extra}


class _TikTok(_Rules):
    """TikTok: the media's coordinates in its conversation, or a sticker URL."""

    _OPTIONAL = ("index", "type")

    def __init__(self, channel: str, policy: _UrlPolicy) -> None:
        super().__init__(channel)
        self.policy = policy
        self.hosts = policy.hosts
        self.schemes = policy.schemes

    def _pack(self, media: Media) -> dict[str, Any] | None:
        e = media.extra
        if e.get("conversation_id") and e.get("message_id"):
            data: dict[str, Any] = {k: e[k] for k in ("conversation_id", "message_id")}
            data.update({k: e[k] for k in self._OPTIONAL if e.get(k) is not None})
            return data
        url = self.policy.pack(media.url)
        return {"url": url} if url else None

    def _unpack(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict) and "url" in data:
            d = _fields(data, "data", ("url",))
            return {"url": self.policy.check(d["url"], "data.url")}
        d = _fields(data, "data", ("conversation_id", "message_id"), self._OPTIONAL)
        extra: dict[str, Any] = {
            "conversation_id": _text(d["conversation_id"], "data.conversation_id", _TIKTOK_ID),
            "message_id": _text(d["message_id"], "data.message_id", _TIKTOK_ID),
        }
        if "index" in d:
            extra["index"] = _int(d["index"], "data.index", 0, 9999)
        if "type" in d:
            extra["type"] = _text(d["type"], "data.type", _WORD)
        return {"extra": extra}


class TokenAsIs:
    """A channel without rules of its own: the media's token as it is (url, path, id),
    never its inline bytes; the url loses its userinfo and credential parameters. Read
    back, the values must be strings of sane size; the download checks the URL as usual."""

    hosts: tuple[str, ...] | None = None
    schemes: tuple[str, ...] = ("https", "http")

    _KEYS = ("url", "path", "id")
    _MAX = 4096

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._urls = _UrlPolicy(hosts=None, allow_private=True)

    def _url(self, url: str) -> str | None:
        try:
            return self._urls.clean(url) if "://" in url else url
        except ValueError:
            return None

    def serialize(self, media: Media) -> dict[str, Any] | None:
        data = {k: v for k in self._KEYS if isinstance(v := getattr(media, k), str) and v}
        if "url" in data:
            url = self._url(data["url"])
            if url:
                data["url"] = url
            else:
                del data["url"]
        if not data or any(len(v) > self._MAX for v in data.values()):
            return None
        return {"v": VERSION, "data": data}

    def rehydrate(self, stored: Mapping[str, Any], media: Media) -> Media:
        data = stored.get("data") if isinstance(stored, Mapping) else None
        ok = (
            isinstance(stored, Mapping)
            and set(stored) == {"v", "data"}
            and type(stored["v"]) is int
            and stored["v"] == VERSION
            and isinstance(data, dict)
            and data
            and all(
                k in self._KEYS and isinstance(v, str) and 0 < len(v) <= self._MAX
                for k, v in data.items()
            )
            and ("url" not in data or self._url(data["url"]) == data["url"])
        )
        if not ok or not isinstance(data, dict):
            raise MediaRefInvalid(
                f"{self.channel} media reference: stored value is not valid; {_FIX}"
            )
        return Media(
            mime=media.mime,
            name=media.name,
            provider=media.provider or self.channel,
            url=data.get("url"),
            path=data.get("path"),
            id=data.get("id"),
        )


# -- the table ------------------------------------------------------------------------------

_META_CDN = ("fbcdn.net", "fbsbx.com", "cdninstagram.com")
_DISCORD_CDN = ("discordapp.com", "discordapp.net")
_TWILIO = ("twilio.com",)
_WHATSAPP_CDN = ("whatsapp.net",)
_TIKTOK_CDN = ("tiktokcdn.com", "tiktokcdn-us.com", "tiktokcdn-eu.com", "ibyteimg.com")


def _url_rules(
    default: tuple[str, ...] | None,
    *,
    schemes: tuple[str, ...] = ("https",),
    params: frozenset[str] | None = None,
    signed: frozenset[str] = frozenset(),
) -> Callable[[str, tuple[str, ...] | None, bool, bool], MediaRefRules]:
    def make(
        channel: str, hosts: tuple[str, ...] | None, view_once: bool, private: bool
    ) -> MediaRefRules:
        del view_once
        policy = _UrlPolicy(
            hosts=hosts if hosts is not None else default,
            schemes=schemes,
            params=params,
            signed=signed,
            allow_private=private,
        )
        return _HostedUrl(channel, policy)

    return make


def _baileys(
    channel: str, hosts: tuple[str, ...] | None, view_once: bool, private: bool
) -> MediaRefRules:
    policy = _UrlPolicy(hosts=hosts if hosts is not None else _WHATSAPP_CDN, allow_private=private)
    return _Baileys(channel, policy, view_once=view_once)


def _tiktok(
    channel: str, hosts: tuple[str, ...] | None, view_once: bool, private: bool
) -> MediaRefRules:
    del view_once
    policy = _UrlPolicy(hosts=hosts if hosts is not None else _TIKTOK_CDN, allow_private=private)
    return _TikTok(channel, policy)


def _plain(cls: type[_Rules]) -> Callable[[str, tuple[str, ...] | None, bool, bool], MediaRefRules]:
    def make(
        channel: str, hosts: tuple[str, ...] | None, view_once: bool, private: bool
    ) -> MediaRefRules:
        del hosts, view_once, private
        return cls(channel)

    return make


_TABLE: dict[str, Callable[[str, tuple[str, ...] | None, bool, bool], MediaRefRules]] = {
    "baileys": _baileys,
    "whatsapp": _plain(_MetaCloud),
    "telegram": _plain(_Telegram),
    "twilio": _url_rules(_TWILIO, params=frozenset()),
    "messenger": _url_rules(_META_CDN, signed=frozenset({"signature"})),
    "instagram": _url_rules(_META_CDN, signed=frozenset({"signature"})),
    "discord": _url_rules(_DISCORD_CDN, params=frozenset({"ex", "is", "hm"})),
    "evolution": _plain(_Evolution),
    "wppconnect": _plain(_WppConnect),
    "gupshup": _url_rules(None, schemes=("https", "http")),
    "gohighlevel": _url_rules(None, schemes=("https", "http")),
    "email": _plain(_Email),
    "tiktok": _tiktok,
}

#: The channels with rules of their own; any other gets ``TokenAsIs``.
CHANNELS = tuple(_TABLE)


def media_rules(
    channel: str,
    *,
    hosts: Iterable[str] | None = None,
    view_once: bool = False,
    allow_private: bool = False,
) -> MediaRefRules:
    """The rules of ``channel``; a channel with none gets the token as it is.

    ``hosts`` replaces the channel's list of media hosts (where it has one: baileys,
    twilio, messenger, instagram, discord, tiktok; gupshup and gohighlevel accept any
    public host unless given one). ``view_once=True`` journals Baileys view-once media
    (the reference's ``durableMedia: { viewOnce: true }``). ``allow_private=True`` accepts
    http, ports and private or loopback hosts: for tests against a local fake only.
    """
    make = _TABLE.get(channel.strip().lower())
    if make is None:
        return TokenAsIs(channel)
    return make(channel, _hosts(hosts, None), view_once, allow_private)
