"""Media references (botmesh/providers/media_refs.py): what each of the 13 channels journals, that
it reads back, that no credential, inline byte or thumbnail is ever journaled, and that a
tampered journal gives back nothing but ``MediaRefInvalid`` or a URL the download check
accepts."""

from __future__ import annotations

import base64
import copy
import json
import random
import re
from typing import Any

import pytest

from botmesh.providers.http import MediaUrlRefused, check_media_url
from botmesh.providers.media_refs import (
    CHANNELS,
    MediaRefInvalid,
    TokenAsIs,
    media_rules,
)
from botmesh.state.errors import ConfigError, ProviderError
from botmesh.state.messages import Media

KEY32 = base64.b64encode(bytes(range(32))).decode()
HASH32 = base64.b64encode(bytes(range(32, 64))).decode()
ENC32 = bytes(range(64, 96))
SHA = "ab" * 32
SECRET = "SeCrEt-9f8e7d"
INLINE = b"\x89PNG inline bytes never journaled"

#: A live inbound media per channel, as the adapters fill it, baited with what must never be
#: journaled (credentials, inline bytes, thumbnails, captions).
LIVE: dict[str, Media] = {
    "baileys": Media(
        provider="baileys",
        mime="image/jpeg",
        data=INLINE,
        extra={
            "url": f"https://mmg.whatsapp.net/v/t62.7118-24/1_2_3.enc?ccb=11-4&oh=01_Q5&oe=6A1B&_nc_sid=5e03e0&mms3=true&access_token={SECRET}",
            "directPath": "/v/t62.7118-24/1_2_3.enc?ccb=11-4&oh=01_Q5&oe=6A1B&_nc_sid=5e03e0",
            "mediaKey": KEY32,
            "fileSha256": HASH32,
            "fileEncSha256": ENC32,
            "fileLength": "48213",
            "mimetype": "image/jpeg",
            "jpegThumbnail": base64.b64encode(b"THUMBNAIL").decode(),
            "caption": f"caption {SECRET}",
            "contextInfo": {"quotedMessage": {"conversation": SECRET}},
            "key": {
                "remoteJid": "5511999999999@s.whatsapp.net",
                "id": "3EB0C767D097B7",
                "fromMe": False,
                "participant": None,
            },
            "type": "image",
        },
    ),
    "whatsapp": Media(
        provider="whatsapp",
        id="1049582035593051",
        mime="image/jpeg",
        url=f"https://lookaside.fbsbx.com/whatsapp_business/attachments/?mid=1&access_token={SECRET}",
        data=INLINE,
    ),
    "telegram": Media(
        provider="telegram",
        id="AgACAgQAAxkBAAIBY2Zx-_abc",
        mime="image/jpeg",
        name="photo.jpg",
        url=f"https://api.telegram.org/file/bot{SECRET}/photos/file_1.jpg",
        extra={"file_unique_id": "AQADx7ExG", "token": SECRET},
    ),
    "twilio": Media(
        provider="twilio",
        url=f"https://ACsid:{SECRET}@api.twilio.com/2010-04-01/Accounts/AC1/Messages/MM1/Media/ME1?Signature={SECRET}",
        mime="image/png",
    ),
    "messenger": Media(
        provider="messenger",
        url=f"https://scontent.xx.fbcdn.net/v/t1.15752-9/1_n.jpg?_nc_cat=1&ccb=1-7&_nc_sid=fc17b8&oh=03_Q7&oe=6A1B&access_token={SECRET}#frag",
        mime="image/jpeg",
    ),
    "instagram": Media(
        provider="instagram",
        url=f"https://lookaside.fbsbx.com/ig_messaging_cdn/?asset_id=1789&signature=AbCdEf-_1&appsecret_proof={SECRET}",
        mime="image/jpeg",
    ),
    "discord": Media(
        provider="discord",
        url=f"https://cdn.discordapp.com/attachments/11/22/cat.png?ex=6a1b&is=6a0a&hm=9f3c&token={SECRET}&",
        mime="image/png",
        name="cat.png",
    ),
    "evolution": Media(
        provider="evolution",
        mime="audio/ogg",
        data=INLINE,
        extra={
            "key": {"remoteJid": "5511999999999@s.whatsapp.net", "id": "BAE5F2C1", "fromMe": True},
            "base64": base64.b64encode(INLINE).decode(),
            "apikey": SECRET,
        },
    ),
    "wppconnect": Media(
        provider="wppconnect",
        id="false_5511999999999@c.us_3EB0C767D097B7",
        mime="image/jpeg",
        data=INLINE,
        extra={"session_token": SECRET},
    ),
    "gupshup": Media(
        provider="gupshup",
        url=f"https://filemanager.gupshup.io/wa/app1/wa/media/abc?download=false&apikey={SECRET}",
        mime="image/jpeg",
    ),
    "gohighlevel": Media(
        provider="gohighlevel",
        url=f"https://{SECRET}:x@storage.googleapis.com/msgsndr/loc/media/a.png",
        mime="image/png",
    ),
    "email": Media(
        provider="email",
        name="invoice.pdf",
        mime="application/pdf",
        data=INLINE,
        extra={
            "message_id": "CAF=abc.123@mail.example.com",
            "index": 1,
            "sha256": SHA.upper(),
            "imap_uid": 4821,
            "uidvalidity": 1700000000,
            "password": SECRET,
        },
    ),
    "tiktok": Media(
        provider="tiktok",
        mime="image/jpeg",
        extra={
            "conversation_id": "0:1:7310:7311",
            "message_id": "7312345678901234567",
            "index": 0,
            "type": "image",
            "access_token": SECRET,
        },
    ),
}

#: What each channel's reference rebuilds (the ``Media`` fields the adapter downloads with).
REBUILT: dict[str, dict[str, Any]] = {
    "baileys": {
        "extra": {
            "url": "https://mmg.whatsapp.net/v/t62.7118-24/1_2_3.enc?ccb=11-4&oh=01_Q5&oe=6A1B&_nc_sid=5e03e0&mms3=true",
            "directPath": "/v/t62.7118-24/1_2_3.enc?ccb=11-4&oh=01_Q5&oe=6A1B&_nc_sid=5e03e0",
            "mediaKey": KEY32,
            "fileSha256": HASH32,
            "fileEncSha256": base64.b64encode(ENC32).decode(),
            "fileLength": 48213,
            "mimetype": "image/jpeg",
            "key": {
                "remoteJid": "5511999999999@s.whatsapp.net",
                "id": "3EB0C767D097B7",
                "fromMe": False,
            },
            "type": "image",
        }
    },
    "whatsapp": {"id": "1049582035593051"},
    "telegram": {"id": "AgACAgQAAxkBAAIBY2Zx-_abc", "extra": {"file_unique_id": "AQADx7ExG"}},
    "twilio": {"url": "https://api.twilio.com/2010-04-01/Accounts/AC1/Messages/MM1/Media/ME1"},
    "messenger": {
        "url": "https://scontent.xx.fbcdn.net/v/t1.15752-9/1_n.jpg?_nc_cat=1&ccb=1-7&_nc_sid=fc17b8&oh=03_Q7&oe=6A1B"
    },
    "instagram": {
        "url": "https://lookaside.fbsbx.com/ig_messaging_cdn/?asset_id=1789&signature=AbCdEf-_1"
    },
    "discord": {
        "url": "https://cdn.discordapp.com/attachments/11/22/cat.png?ex=6a1b&is=6a0a&hm=9f3c"
    },
    "evolution": {
        "extra": {
            "key": {"remoteJid": "5511999999999@s.whatsapp.net", "id": "BAE5F2C1", "fromMe": True}
        }
    },
    "wppconnect": {
        "id": "false_5511999999999@c.us_3EB0C767D097B7",
        "extra": {"message_id": "false_5511999999999@c.us_3EB0C767D097B7"},
    },
    "gupshup": {"url": "https://filemanager.gupshup.io/wa/app1/wa/media/abc?download=false"},
    "gohighlevel": {"url": "https://storage.googleapis.com/msgsndr/loc/media/a.png"},
    "email": {
        "extra": {
            "message_id": "CAF=abc.123@mail.example.com",
            "index": 1,
            "sha256": SHA,
            "imap_uid": 4821,
            "uidvalidity": 1700000000,
        }
    },
    "tiktok": {
        "extra": {
            "conversation_id": "0:1:7310:7311",
            "message_id": "7312345678901234567",
            "index": 0,
            "type": "image",
        }
    },
}


def journal(stored: dict[str, Any] | None) -> dict[str, Any]:
    """What a replay reads back: the reference through JSON, as the journal keeps it."""
    assert stored is not None
    back: dict[str, Any] = json.loads(json.dumps(stored))
    return back


def test_the_thirteen_channels_have_rules() -> None:
    assert sorted(CHANNELS) == sorted(LIVE)
    assert len(CHANNELS) == 13
    for channel in CHANNELS:
        assert not isinstance(media_rules(channel), TokenAsIs)


@pytest.mark.parametrize("channel", sorted(LIVE))
def test_round_trip(channel: str) -> None:
    rules = media_rules(channel)
    live = LIVE[channel]
    stored = rules.serialize(live)
    assert stored is not None and stored["v"] == 1 and set(stored) == {"v", "data"}
    # What the journal keeps of the inbound: the reference, mime and name; never the rest.
    journaled = Media(provider=live.provider, mime=live.mime, name=live.name, ref=stored)
    media = rules.rehydrate(journal(stored), journaled)
    expected = {"url": None, "id": None, "extra": {}, **REBUILT[channel]}
    assert {"url": media.url, "id": media.id, "extra": media.extra} == expected
    assert (media.mime, media.name, media.provider) == (live.mime, live.name, channel)
    assert media.data is None and media.path is None
    assert media.ref is None and media.unavailable is None
    # A reference read back serializes to itself: replaying twice journals the same thing.
    assert rules.serialize(media) == stored


@pytest.mark.parametrize("channel", sorted(LIVE))
def test_the_journal_holds_no_credential_bytes_or_thumbnail(channel: str) -> None:
    text = json.dumps(media_rules(channel).serialize(LIVE[channel]))
    for bait in (
        SECRET,
        base64.b64encode(INLINE).decode(),
        "inline bytes",
        "THUMBNAIL",
        "jpegThumbnail",
        "caption",
        "contextInfo",
        "base64",
        "@api.twilio",
        "#frag",
    ):
        assert bait not in text, f"{channel} journaled {bait!r}: {text}"
    # No credential-named field or query parameter either.
    names = re.findall(r'"([A-Za-z_]+)":|[?&]([A-Za-z_-]+)=', text)
    found = {n.lower() for pair in names for n in pair if n}
    assert not found & {
        "access_token",
        "token",
        "apikey",
        "api_key",
        "password",
        "secret",
        "appsecret_proof",
        "session_token",
        "auth",
    }, found


def test_the_rebuilt_media_takes_nothing_from_the_record_but_mime_name_provider() -> None:
    rules = media_rules("whatsapp")
    stored = journal(rules.serialize(LIVE["whatsapp"]))
    tampered = Media(
        provider="whatsapp",
        mime="image/png",
        url="https://169.254.169.254/latest/meta-data/",
        id="../../me/messages",
        data=INLINE,
        path="/etc/passwd",
        extra={"url": "file:///etc/passwd"},
    )
    media = rules.rehydrate(stored, tampered)
    assert media == Media(provider="whatsapp", mime="image/png", id="1049582035593051")


# -- not durable --------------------------------------------------------------------------


def test_view_once_is_not_durable_unless_asked() -> None:
    once = Media(
        provider="baileys",
        extra={**LIVE["baileys"].extra, "view_once": True},
    )
    assert media_rules("baileys").serialize(once) is None
    rules = media_rules("baileys", view_once=True)
    stored = journal(rules.serialize(once))
    assert stored["data"]["view_once"] is True
    assert rules.rehydrate(stored, Media()).extra["view_once"] is True
    # Journaled while view_once was on, read back after it was turned off: not rebuilt.
    with pytest.raises(MediaRefInvalid, match="view-once"):
        media_rules("baileys").rehydrate(stored, Media())


@pytest.mark.parametrize(
    ("channel", "media"),
    [
        ("baileys", Media(extra={"directPath": "/v/t62/a.enc"})),  # no mediaKey
        ("baileys", Media(extra={"mediaKey": KEY32})),  # neither url nor directPath
        ("baileys", Media(extra={"mediaKey": "short", "directPath": "/v/a.enc"})),
        ("baileys", Media(extra={"mediaKey": KEY32, "url": "https://evil.example/a.enc"})),
        ("whatsapp", Media(url="https://lookaside.fbsbx.com/whatsapp_business/a")),
        ("whatsapp", Media(id="../me/messages")),
        ("telegram", Media(url="https://api.telegram.org/file/bot1/a.jpg")),
        ("telegram", Media(id="a/b")),
        ("twilio", Media(url="http://api.twilio.com/2010-04-01/Accounts/AC1/Media/ME1")),
        ("twilio", Media(url="https://media.example.com/ME1")),
        ("messenger", Media(url="https://evil.example/a.jpg")),
        ("messenger", Media(url="http://scontent.xx.fbcdn.net/a.jpg")),
        ("instagram", Media(url="https://127.0.0.1/a.jpg")),
        ("instagram", Media(url="https://fbcdn.net.evil.example/a.jpg")),
        ("discord", Media(url="https://media.example.com/a.png")),
        ("discord", Media(id="1234")),
        ("evolution", Media(data=INLINE, extra={"base64": "aGk="})),  # inline only
        ("evolution", Media(extra={"key": {"id": "BAE5"}})),  # no remoteJid
        ("wppconnect", Media(data=INLINE)),
        ("gupshup", Media(url="ftp://filemanager.gupshup.io/a")),
        ("gupshup", Media(url="https://10.0.0.7/a")),
        ("gohighlevel", Media(url="https://localhost/a.png")),
        ("gohighlevel", Media(data=INLINE)),
        ("email", Media(data=INLINE, extra={"message_id": "a@b", "index": 0})),  # no digest
        ("email", Media(extra={"message_id": "a@b", "index": 0, "sha256": "not-hex"})),
        ("tiktok", Media(extra={"conversation_id": "c1"})),  # no message id, no url
        ("tiktok", Media(url="https://evil.example/sticker.webp")),
    ],
)
def test_not_durable(channel: str, media: Media) -> None:
    assert media_rules(channel).serialize(media) is None


def test_tiktok_sticker_url() -> None:
    rules = media_rules("tiktok")
    url = (
        "https://p16-sign.tiktokcdn-us.com/obj/sticker.webp?x-expires=1700000000&x-signature=Ab%2Fc"
    )
    stored = journal(rules.serialize(Media(url=url + f"&access_token={SECRET}")))
    assert stored == {"v": 1, "data": {"url": url}}
    assert rules.rehydrate(stored, Media()).url == url


def test_a_tiktok_conversation_id_with_a_plus_survives_a_replay() -> None:
    rules = media_rules("tiktok")
    extra = {"conversation_id": "0:1:Ab+Cd==", "message_id": "v2.m+1", "index": 0}
    stored = journal(rules.serialize(Media(provider="tiktok", extra=extra)))
    assert stored is not None and stored["data"]["conversation_id"] == "0:1:Ab+Cd=="
    assert rules.rehydrate(stored, Media()).extra == extra
    bad = {"v": 1, "data": {"conversation_id": "a/../b", "message_id": "m"}}
    with pytest.raises(MediaRefInvalid):
        rules.rehydrate(bad, Media())


def test_baileys_takes_buffer_json_and_a_directpath_alone() -> None:
    rules = media_rules("baileys")
    media = Media(
        extra={
            "directPath": "/v/t62.7117-24/a.enc?ccb=11-4",
            "mediaKey": {"type": "Buffer", "data": KEY32},
            "fileLength": 12,
        }
    )
    stored = journal(rules.serialize(media))
    assert stored["data"] == {
        "media": {
            "directPath": "/v/t62.7117-24/a.enc?ccb=11-4",
            "mediaKey": KEY32,
            "fileLength": 12,
        }
    }
    assert rules.rehydrate(stored, Media()).extra["mediaKey"] == KEY32


def test_wppconnect_message_id_from_extra() -> None:
    rules = media_rules("wppconnect")
    stored = journal(rules.serialize(Media(extra={"message_id": "true_1@c.us_ABC"})))
    assert rules.rehydrate(stored, Media()).id == "true_1@c.us_ABC"


# -- hosts= --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("channel", "default_url", "own_url"),
    [
        ("messenger", "https://scontent.xx.fbcdn.net/a.jpg", "https://cdn.example.com/a.jpg"),
        ("instagram", "https://scontent.cdninstagram.com/a.jpg", "https://cdn.example.com/a.jpg"),
        (
            "discord",
            "https://cdn.discordapp.com/attachments/1/2/a.png",
            "https://cdn.example.com/a",
        ),
        (
            "twilio",
            "https://api.twilio.com/2010-04-01/Accounts/AC1/Media/ME1",
            "https://cdn.example.com/a",
        ),
        ("tiktok", "https://p16.tiktokcdn.com/a.webp", "https://cdn.example.com/a.webp"),
        ("gupshup", "https://filemanager.gupshup.io/a", "https://cdn.example.com/a"),
        ("gohighlevel", "https://storage.googleapis.com/a.png", "https://cdn.example.com/a.png"),
    ],
)
def test_hosts_replace_the_list(channel: str, default_url: str, own_url: str) -> None:
    default, own = media_rules(channel), media_rules(channel, hosts=["cdn.example.com"])
    assert own.hosts == ("cdn.example.com",)
    assert own.serialize(Media(url=default_url)) is None
    stored = journal(own.serialize(Media(url=own_url)))
    assert own.rehydrate(stored, Media()).url == own_url
    # A reference journaled under the default list is refused under the new one.
    with pytest.raises(MediaRefInvalid, match="not an allowed media host"):
        own.rehydrate(journal(default.serialize(Media(url=default_url))), Media())
    if default.hosts is not None:
        with pytest.raises(MediaRefInvalid):
            default.rehydrate(stored, Media())


def test_hosts_replace_the_baileys_cdn() -> None:
    media = Media(extra={"url": "https://wa.example.com/a.enc", "mediaKey": KEY32})
    assert media_rules("baileys").serialize(media) is None
    assert media_rules("baileys", hosts=("wa.example.com",)).serialize(media) is not None


@pytest.mark.parametrize("hosts", ["fbcdn.net", ["https://fbcdn.net"], ["fbcdn.net/x"], [""], [3]])
def test_bad_hosts_are_a_config_error(hosts: Any) -> None:
    with pytest.raises(ConfigError, match="media_ref_hosts"):
        media_rules("messenger", hosts=hosts)


def test_allow_private_is_for_local_fakes() -> None:
    url = "http://127.0.0.1:8081/media/1"
    assert media_rules("twilio", hosts=["127.0.0.1"]).serialize(Media(url=url)) is None
    rules = media_rules("twilio", hosts=["127.0.0.1"], allow_private=True)
    assert rules.rehydrate(journal(rules.serialize(Media(url=url))), Media()).url == url


# -- read back: refused ---------------------------------------------------------------------


@pytest.mark.parametrize("channel", sorted(LIVE))
@pytest.mark.parametrize(
    "envelope",
    [
        {"v": 2},
        {"v": 0},
        {"v": "1"},
        {"v": True},
        {"v": 1.0},
        {"v": None},
        {"extra": 1},
        {"data": None},
        {"data": []},
        {"data": "x"},
        {"data": {}},
    ],
    ids=repr,
)
def test_unknown_version_and_bad_envelopes(channel: str, envelope: dict[str, Any]) -> None:
    rules = media_rules(channel)
    stored = {**journal(rules.serialize(LIVE[channel])), **envelope}
    with pytest.raises(MediaRefInvalid) as caught:
        rules.rehydrate(stored, Media())
    assert channel in str(caught.value)
    assert isinstance(caught.value, ProviderError)


@pytest.mark.parametrize("channel", sorted(LIVE))
@pytest.mark.parametrize("stored", [None, [], "v1", 1, {"v": 1}, {"data": {}}], ids=repr)
def test_not_an_envelope(channel: str, stored: Any) -> None:
    with pytest.raises(MediaRefInvalid):
        media_rules(channel).rehydrate(stored, Media())


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every value under ``node`` (dict keys only)."""
    out: list[tuple[Any, ...]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((*path, k))
            out.extend(_leaves(v, (*path, k)))
    return out


def _set(node: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


def _dicts(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path] if isinstance(node, dict) else []
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_dicts(v, (*path, k)))
    return out


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        node = node[k]
    return node


@pytest.mark.parametrize("channel", sorted(LIVE))
def test_every_unknown_key_is_refused(channel: str) -> None:
    rules = media_rules(channel)
    stored = journal(rules.serialize(LIVE[channel]))
    for where in _dicts(stored):
        bad = copy.deepcopy(stored)
        _get(bad, where)["jpegThumbnail"] = "x"
        with pytest.raises(MediaRefInvalid, match="unknown keys"):
            rules.rehydrate(bad, Media())


@pytest.mark.parametrize("channel", sorted(LIVE))
def test_every_wrong_type_is_refused(channel: str) -> None:
    rules = media_rules(channel)
    stored = journal(rules.serialize(LIVE[channel]))
    for path in _leaves(stored):
        value = _get(stored, path)
        wrong = [None, [], 1.5, {"x": 1}, *([1] if isinstance(value, str | bool) else ["1"])]
        for w in wrong:
            bad = copy.deepcopy(stored)
            _set(bad, path, w)
            with pytest.raises(MediaRefInvalid):
                rules.rehydrate(bad, Media())


#: The keys a reference cannot do without (besides ``v`` and ``data``); every other key of
#: the LIVE references is optional.
REQUIRED: dict[str, set[tuple[str, ...]]] = {
    "baileys": {
        ("data", "media"),
        ("data", "media", "mediaKey"),
        ("data", "key", "remoteJid"),
        ("data", "key", "id"),
    },
    "whatsapp": {("data", "id")},
    "telegram": {("data", "file_id")},
    "evolution": {("data", "key"), ("data", "key", "remoteJid"), ("data", "key", "id")},
    "wppconnect": {("data", "message_id")},
    "email": {("data", "message_id"), ("data", "index"), ("data", "sha256")},
    "tiktok": {("data", "conversation_id"), ("data", "message_id")},
    **{c: {("data", "url")} for c in ("twilio", "messenger", "instagram", "discord")},
    **{c: {("data", "url")} for c in ("gupshup", "gohighlevel")},
}


@pytest.mark.parametrize("channel", sorted(LIVE))
def test_required_and_optional_keys(channel: str) -> None:
    rules = media_rules(channel)
    stored = journal(rules.serialize(LIVE[channel]))
    required = REQUIRED[channel] | {("v",), ("data",)}
    for path in _leaves(stored):
        bad = copy.deepcopy(stored)
        del _get(bad, path[:-1])[path[-1]]
        if path in required:
            with pytest.raises(MediaRefInvalid):
                rules.rehydrate(bad, Media())
        else:
            rules.rehydrate(bad, Media())  # optional: still reads back
    # Baileys needs one of url and directPath.
    if channel == "baileys":
        bad = copy.deepcopy(stored)
        del bad["data"]["media"]["url"], bad["data"]["media"]["directPath"]
        with pytest.raises(MediaRefInvalid, match="neither url nor directPath"):
            rules.rehydrate(bad, Media())


#: URLs a tampered journal may hold; none is ever accepted back by a channel with a host list.
HOSTILE_URLS = [
    "http://scontent.xx.fbcdn.net/a.jpg",
    "https://127.0.0.1/a",
    "https://169.254.169.254/latest/meta-data/iam/",
    "https://[::1]/a",
    "https://[::ffff:127.0.0.1]/a",
    "https://[fe80::1]/a",
    "https://10.0.0.1/a",
    "https://localhost/a",
    "https://2130706433/a",
    "https://0x7f.0.0.1/a",
    "https://127.1/a",
    "https://user:pass@scontent.xx.fbcdn.net/a",
    "https://scontent.xx.fbcdn.net@evil.example/a",
    "https://evil.example\\@scontent.xx.fbcdn.net/a",
    "https://evil.example#@scontent.xx.fbcdn.net/a",
    "https://scontent.xx.fbcdn.net:22/a",
    "https://scontent.xx.fbcdn.net/a#frag",
    "https://scontent.xx.fbcdn.net/a?access_token=x",
    "https://scontent.xx.fbcdn.net/a?token=x",
    "https://scontent.xx.fbcdn.net/a?X-Auth-Token=x",
    "file:///etc/passwd",
    "gopher://scontent.xx.fbcdn.net/a",
    "//scontent.xx.fbcdn.net/a",
    "scontent.xx.fbcdn.net/a",
    "https://evil.example/a",
    "https://fbcdn.net.evil.example/a",
    "https://evilfbcdn.net/a",
    " https://scontent.xx.fbcdn.net/a",
    "https://scontent.xx.fbcdn.net/a\n",
    "https://scontent.xx.fbcdn.net/\x00a",
    "https://ѕcontent.xx.fbcdn.net/a",  # a Cyrillic s
    "https://scontent.xx.fbcdn.net/" + "a" * 5000,
    "https://[::1",
    "",
]


@pytest.mark.parametrize("url", HOSTILE_URLS, ids=range(len(HOSTILE_URLS)))
@pytest.mark.parametrize("channel", ["messenger", "instagram", "discord", "twilio", "tiktok"])
def test_hostile_urls_are_refused(channel: str, url: str) -> None:
    hosts = ["fbcdn.net"] if channel not in ("messenger", "instagram") else None
    rules = media_rules(channel, hosts=hosts)
    with pytest.raises(MediaRefInvalid) as caught:
        rules.rehydrate({"v": 1, "data": {"url": url}}, Media())
    assert len(str(caught.value)) < 400
    assert "x" * 100 not in str(caught.value)


#: Legitimate on a channel that takes any public http(s) host (gupshup, gohighlevel).
ANY_HOST_OK = {
    "http://scontent.xx.fbcdn.net/a.jpg",
    "https://evil.example/a",
    "https://fbcdn.net.evil.example/a",
    "https://evilfbcdn.net/a",
}


@pytest.mark.parametrize("url", [u for u in HOSTILE_URLS if u not in ANY_HOST_OK])
@pytest.mark.parametrize("channel", ["gupshup", "gohighlevel"])
def test_hostile_urls_on_any_host_channels(channel: str, url: str) -> None:
    with pytest.raises(MediaRefInvalid):
        media_rules(channel).rehydrate({"v": 1, "data": {"url": url}}, Media())


@pytest.mark.parametrize("url", sorted(ANY_HOST_OK))
def test_any_public_host_on_gupshup(url: str) -> None:
    assert media_rules("gupshup").rehydrate({"v": 1, "data": {"url": url}}, Media()).url == url


def test_baileys_directpath_cannot_leave_the_cdn() -> None:
    rules = media_rules("baileys")
    base = journal(rules.serialize(LIVE["baileys"]))
    for path in ("//evil.example/a", "/a/../../b", "/@evil.example", "v/a.enc", "/a#x", "/a b"):
        bad = copy.deepcopy(base)
        bad["data"]["media"]["directPath"] = path
        with pytest.raises(MediaRefInvalid, match="directPath"):
            rules.rehydrate(bad, Media())


# -- a tampered journal, at random ------------------------------------------------------------

_POOL: list[Any] = [
    *HOSTILE_URLS,
    "https://scontent.xx.fbcdn.net/ok.jpg",
    "https://cdn.discordapp.com/attachments/1/2/a.png?ex=1&is=2&hm=3",
    "https://api.twilio.com/2010-04-01/Accounts/AC1/Media/ME1",
    "https://mmg.whatsapp.net/v/a.enc",
    "https://filemanager.gupshup.io/a",
    "https://p16.tiktokcdn.com/a.webp",
    "../../../etc/passwd",
    "a/b",
    "a?b",
    "%2e%2e",
    ".",
    "..",
    "x" * 100_000,
    KEY32,
    SHA,
    "5511@s.whatsapp.net",
    "ABC",
    0,
    -1,
    2**64,
    True,
    False,
    None,
    1.5,
    float("nan"),
    [],
    ["https://scontent.xx.fbcdn.net/ok.jpg"],
    {},
    {"url": "https://127.0.0.1/"},
]


def _random_text(rng: random.Random) -> str:
    alphabet = "abcXYZ019_-.:/?#@%&=+ \\\x00\n[]ѕ"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))


def _mutate(stored: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    bad = copy.deepcopy(stored)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(5)
        leaves = _leaves(bad)
        if op == 0 and leaves:  # replace a value
            _set(bad, rng.choice(leaves), copy.deepcopy(rng.choice(_POOL)))
        elif op == 1 and leaves:  # a random string
            _set(bad, rng.choice(leaves), _random_text(rng))
        elif op == 2:  # a key added
            dicts = _dicts(bad)
            if dicts:
                _get(bad, rng.choice(dicts))[rng.choice(["url", "x", "id", "data", "v"])] = (
                    rng.choice(_POOL)
                )
        elif op == 3 and leaves:  # a key removed
            path = rng.choice(leaves)
            del _get(bad, path[:-1])[path[-1]]
        elif leaves:  # a string value altered in place
            path = rng.choice(leaves)
            value = _get(bad, path)
            if isinstance(value, str):
                extra = rng.choice([s for s in _POOL if isinstance(s, str)])[:200]
                _set(bad, path, rng.choice([value + extra, extra + value, value[::-1]]))
    return bad


def _assert_downloadable(channel: str, media: Media) -> None:
    """What a rehydrated media may hold: URLs the download check takes with the channel's
    hosts, ids safe as a URL path segment, no bytes."""
    rules = media_rules(channel)
    assert media.data is None and media.path is None and media.ref is None
    urls = [media.url] if media.url is not None else []
    if channel == "baileys":
        if "url" in media.extra:
            urls.append(media.extra["url"])
        if "directPath" in media.extra:
            urls.append("https://mmg.whatsapp.net" + media.extra["directPath"])
    for url in urls:
        try:
            check_media_url(url, hosts=rules.hosts, schemes=rules.schemes)
        except MediaUrlRefused as exc:  # pragma: no cover - the failure this test looks for
            pytest.fail(f"{channel}: a tampered reference gave back {url!r}: {exc}")
        assert len(url) <= 2048
    # Ids end up in API paths and queries: no separator, no encoding, no dot segment.
    key = media.extra.get("key") or {}
    ids = [media.id, key.get("remoteJid"), key.get("id"), key.get("participant")]
    ids += [media.extra.get(k) for k in ("file_unique_id", "conversation_id")]
    if channel != "email":  # a Message-ID is matched against a header, never put in a path
        ids.append(media.extra.get("message_id"))
    for token in ids:
        if token is None:
            continue
        assert isinstance(token, str) and 0 < len(token) <= 512, (channel, token)
        assert not re.search(r"[/?#%\s\\]", token), (channel, token)
        assert not token.startswith("."), (channel, token)
    for name in ("index", "fileLength", "imap_uid", "uidvalidity"):
        if name in media.extra:
            assert type(media.extra[name]) is int and media.extra[name] >= 0


@pytest.mark.parametrize("channel", sorted(LIVE))
def test_a_tampered_journal_is_harmless(channel: str) -> None:
    rules = media_rules(channel)
    stored = journal(rules.serialize(LIVE[channel]))
    rng = random.Random(f"media-refs:{channel}")
    refused = accepted = 0
    for _ in range(600):
        bad = _mutate(stored, rng)
        try:
            media = rules.rehydrate(bad, Media(provider=channel))
        except MediaRefInvalid:
            refused += 1
            continue
        accepted += 1
        _assert_downloadable(channel, media)
    # The mutations reached both outcomes: the test exercised the checks, not just one branch.
    assert refused > 100
    assert accepted > 0


def test_tampered_url_channels_never_reach_a_private_address() -> None:
    """Every hostile URL, under every URL channel's default rules: refused or public."""
    for channel in ("twilio", "messenger", "instagram", "discord", "gupshup", "gohighlevel"):
        rules = media_rules(channel)
        for url in _POOL:
            try:
                media = rules.rehydrate({"v": 1, "data": {"url": url}}, Media())
            except MediaRefInvalid:
                continue
            _assert_downloadable(channel, media)


# -- other channels: the token as it is -------------------------------------------------------


def test_token_as_is_for_an_unknown_channel() -> None:
    rules = media_rules("slack")
    assert isinstance(rules, TokenAsIs) and rules.channel == "slack"
    media = Media(
        url=f"https://x:{SECRET}@files.slack.com/a.png?token={SECRET}&w=1#f",
        id="F123",
        data=INLINE,
        mime="image/png",
        provider="slack",
    )
    stored = journal(rules.serialize(media))
    assert stored == {"v": 1, "data": {"url": "https://files.slack.com/a.png?w=1", "id": "F123"}}
    back = rules.rehydrate(stored, Media(mime="image/png", provider="slack"))
    assert back == Media(
        url="https://files.slack.com/a.png?w=1", id="F123", mime="image/png", provider="slack"
    )
    assert rules.serialize(Media(data=INLINE)) is None
    assert media_rules("mock").serialize(Media(path="/tmp/a.png")) == {
        "v": 1,
        "data": {"path": "/tmp/a.png"},
    }


@pytest.mark.parametrize(
    "stored",
    [
        {"v": 2, "data": {"id": "F1"}},
        {"v": True, "data": {"id": "F1"}},
        {"v": 1, "data": {"id": 1}},
        {"v": 1, "data": {"data": "aGk="}},
        {"v": 1, "data": {}},
        {"v": 1, "data": {"id": "x" * 5000}},
        {"v": 1, "data": {"url": "https://u:p@files.slack.com/a"}},
        {"v": 1, "data": {"url": "https://files.slack.com/a?token=x"}},
        {"v": 1, "data": {"id": "F1"}, "x": 1},
        {"data": {"id": "F1"}},
        [],
    ],
    ids=repr,
)
def test_token_as_is_refuses(stored: Any) -> None:
    with pytest.raises(MediaRefInvalid, match="slack"):
        TokenAsIs("slack").rehydrate(stored, Media())


@pytest.mark.parametrize("channel", [*sorted(LIVE), "slack"])
def test_serialize_never_raises_and_writes_only_what_reads_back(channel: str) -> None:
    """Whatever an adapter put in a Media, serialize gives None or a reference that reads
    back (the inbox must never crash on a live message)."""
    rules = media_rules(channel)
    rng = random.Random(f"serialize:{channel}")
    base = LIVE.get(channel, Media(url="https://files.example.com/a", id="F1"))
    written = 0
    for _ in range(400):
        fields: dict[str, Any] = {
            "url": base.url,
            "id": base.id,
            "extra": copy.deepcopy(base.extra),
        }
        for _ in range(rng.randint(1, 3)):
            target = rng.choice(["url", "id", "extra"])
            if target == "extra":
                paths = _leaves(fields["extra"])
                value = copy.deepcopy(rng.choice(_POOL))
                if paths and rng.random() < 0.7:
                    _set(fields["extra"], rng.choice(paths), value)
                else:
                    fields["extra"][rng.choice(["key", "type", "url", "x"])] = value
            else:
                value = rng.choice(_POOL)
                fields[target] = value if isinstance(value, str) else None
        media = Media(mime="image/png", provider=channel, **fields)
        stored = rules.serialize(media)
        if stored is None:
            continue
        written += 1
        back = rules.rehydrate(journal(stored), media)
        if channel in LIVE:
            _assert_downloadable(channel, back)
    assert written > 0
