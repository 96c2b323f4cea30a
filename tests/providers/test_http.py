"""botmesh/providers/http.py against local aiohttp servers: the status mapping, Retry-After, the
media URL check, guarded media downloads (resolver, redirects, size), transport errors with
the secret redacted, timeouts, and one TCP connection for many calls."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from botmesh.providers.http import (
    HttpAnswer,
    HttpChannel,
    MediaUrlRefused,
    check_media_url,
    host_allowed,
    retry_after_of,
    status_error,
)
from botmesh.state.errors import ProviderError, RateLimitedError, SendError
from tests.providers.serve import serving

TOKEN = "123456:AAE-sEcReT_tOkEn"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Fake:
    """A local server: ``base`` URL, the paths it was asked for, the connections used."""

    base: str
    paths: list[str] = field(default_factory=list)
    peers: set[Any] = field(default_factory=set)
    headers: list[dict[str, str]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])


@pytest.fixture
async def fake() -> AsyncIterator[Fake]:
    """A server with the routes these tests need."""
    state = Fake(base="")
    release = asyncio.Event()

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        state.paths.append(request.path_qs)
        state.peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        state.headers.append(dict(request.headers))
        return await handler(request)

    async def status(request: web.Request) -> web.Response:
        code = int(request.match_info["code"])
        headers = {k[2:]: v for k, v in request.query.items() if k.startswith("h-")}
        return web.Response(status=code, text=request.query.get("body", "{}"), headers=headers)

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"got": await request.json(), "q": dict(request.query)})

    async def media(request: web.Request) -> web.Response:
        size = int(request.query.get("size", "5"))
        return web.Response(body=b"m" * size, content_type="image/png")

    async def chunked(request: web.Request) -> web.StreamResponse:
        size = int(request.query.get("size", "5"))
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for start in range(0, size, 4096):
            await resp.write(b"c" * min(4096, size - start))
        await resp.write_eof()
        return resp

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def loop(request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="late")

    app = web.Application(middlewares=[record])
    app.router.add_route("*", "/status/{code}", status)
    app.router.add_post("/echo", echo)
    app.router.add_get("/media", media)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/loop", loop)
    app.router.add_get("/hang", hang)
    async with serving(app) as base:
        state.base = base
        try:
            yield state
        finally:
            release.set()


@pytest.fixture
async def http() -> AsyncIterator[HttpChannel]:
    channel = HttpChannel(timeout=5, secrets=[TOKEN], allow_private_media=True)
    channel.name = "fakechan"
    try:
        yield channel
    finally:
        await channel.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- status_error ---------------------------------------------------------------------------


async def test_429_with_retry_after_seconds(http: HttpChannel, fake: Fake) -> None:
    answer = await http.request("GET", f"{fake.base}/status/429?h-Retry-After=7")
    err = status_error("fakechan", answer, "slow down")
    assert isinstance(err, RateLimitedError) and err.retryable
    assert err.retry_after == 7.0
    assert str(err) == "fakechan: HTTP 429: slow down"


async def test_429_with_retry_after_as_an_http_date(http: HttpChannel, fake: Fake) -> None:
    when = email.utils.formatdate(time.time() + 120, usegmt=True)
    answer = await http.request("GET", f"{fake.base}/status/429", params={"h-Retry-After": when})
    err = status_error("fakechan", answer, "slow down")
    assert isinstance(err, RateLimitedError)
    assert 100 < err.retry_after <= 120


async def test_429_falls_back_to_the_body_then_to_one_second(http: HttpChannel, fake: Fake) -> None:
    answer = await http.request("GET", f"{fake.base}/status/429?body=%7B%22retry_after%22:3.5%7D")
    body_says = answer.json()["retry_after"]
    err = status_error("fakechan", answer, "slow down", retry_after=body_says)
    assert isinstance(err, RateLimitedError) and err.retry_after == 3.5
    err = status_error("fakechan", answer, "slow down")
    assert isinstance(err, RateLimitedError) and err.retry_after == 1.0


@pytest.mark.parametrize("header", ["soon", "Fri, 99 Foo 2024 99:99:99 GMT", "inf", "nan", "1e999"])
async def test_429_with_a_bad_retry_after_uses_the_fallback(
    http: HttpChannel, fake: Fake, header: str
) -> None:
    answer = await http.request("GET", f"{fake.base}/status/429", params={"h-Retry-After": header})
    err = status_error("fakechan", answer, "slow down", retry_after=2.0)
    assert isinstance(err, RateLimitedError) and err.retry_after == 2.0


async def test_retry_after_header_name_is_case_insensitive(http: HttpChannel, fake: Fake) -> None:
    answer = await http.request("GET", f"{fake.base}/status/429?h-RETRY-AFTER=9")
    err = status_error("fakechan", answer, "slow down")
    assert isinstance(err, RateLimitedError) and err.retry_after == 9.0
    assert answer.headers.get("retry-after") == "9"


@pytest.mark.parametrize("code", [408, 425, 500, 502, 503, 504, 599])
async def test_retryable_statuses(http: HttpChannel, fake: Fake, code: int) -> None:
    answer = await http.request("POST", f"{fake.base}/status/{code}")
    assert answer.status == code and not answer.ok
    err = status_error("fakechan", answer, "busy")
    assert type(err) is SendError and err.retryable
    assert f"HTTP {code}" in str(err)


@pytest.mark.parametrize("code", [400, 401, 403, 404, 409, 413, 422, 451])
async def test_other_4xx_are_final(http: HttpChannel, fake: Fake, code: int) -> None:
    answer = await http.request("POST", f"{fake.base}/status/{code}")
    err = status_error("fakechan", answer, "refused")
    assert type(err) is SendError and not err.retryable
    assert str(err) == f"fakechan: HTTP {code}: refused"


async def test_an_answer_carries_status_headers_and_json(http: HttpChannel, fake: Fake) -> None:
    answer = await http.request("POST", f"{fake.base}/echo", json_body={"a": 1}, params={"b": "2"})
    assert answer.ok and answer.status == 200
    assert answer.json() == {"got": {"a": 1}, "q": {"b": "2"}}
    assert answer.headers["Content-Type"].startswith("application/json")
    assert HttpAnswer(200, {}, b"not json").json() is None
    assert HttpAnswer(204, {}).json() is None


# -- retry_after_of -------------------------------------------------------------------------


def test_retry_after_of() -> None:
    assert retry_after_of({"Retry-After": "12"}) == 12.0
    assert retry_after_of({"retry-after": "0.5"}) == 0.5
    assert retry_after_of({"RETRY-AFTER": "3"}) == 3.0
    assert retry_after_of({"Retry-After": "-4"}) == 0.0
    assert retry_after_of({}, 2.5) == 2.5
    assert retry_after_of({}) == 1.0
    assert retry_after_of({"Retry-After": ""}, 4.0) == 4.0
    assert retry_after_of({"Retry-After": "garbage"}, 4.0) == 4.0
    assert retry_after_of({"Retry-After": "inf"}) == 1.0
    assert retry_after_of({"Retry-After": "NaN"}, 6.0) == 6.0
    past = email.utils.formatdate(time.time() - 3600, usegmt=True)
    assert retry_after_of({"Retry-After": past}) == 0.0
    future = email.utils.formatdate(time.time() + 600, usegmt=True)
    assert 500 < retry_after_of({"Retry-After": future}) <= 600


# -- host_allowed / check_media_url ---------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "allowed", "ok"),
    [
        ("fbcdn.net", ["fbcdn.net"], True),
        ("scontent.xx.fbcdn.net", ["fbcdn.net"], True),
        ("SContent.FBCDN.net.", ["fbcdn.net"], True),
        ("cdn.discordapp.com", [".discordapp.com"], True),
        ("a.b", ["x.y", "A.B."], True),
        ("evilfbcdn.net", ["fbcdn.net"], False),
        ("fbcdn.net.evil.com", ["fbcdn.net"], False),
        ("net", ["fbcdn.net"], False),
        ("fbcdn.net", [], False),
        ("fbcdn.net", [""], False),
    ],
)
def test_host_allowed(host: str, allowed: list[str], ok: bool) -> None:
    assert host_allowed(host, allowed) is ok


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/a",
        "https://127.9.9.9/a",
        "https://10.1.2.3/a",
        "https://172.16.0.1/a",
        "https://192.168.1.1/a",
        "https://169.254.169.254/latest/meta-data/",
        "https://0.0.0.0/a",
        "https://100.64.0.1/a",
        "https://224.0.0.1/a",
        "https://255.255.255.255/a",
        "https://[::1]/a",
        "https://[::]/a",
        "https://[fe80::1]/a",
        "https://[fe80::1%25eth0]/a",
        "https://[fc00::1]/a",
        "https://[::ffff:127.0.0.1]/a",
        "https://[::ffff:169.254.169.254]/a",
        "https://[::ffff:7f00:1]/a",
        "https://[ff02::1]/a",
    ],
)
def test_check_media_url_refuses_private_literals(url: str) -> None:
    with pytest.raises(MediaUrlRefused, match="private or loopback"):
        check_media_url(url, hosts=None)
    assert check_media_url(url, hosts=None, allow_private=True) == url


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("http://cdn.example.com/a", "scheme 'http' is not allowed"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("ftp://cdn.example.com/a", "scheme 'ftp'"),
        ("cdn.example.com/a", "scheme ''"),
        ("https:///a", "no host"),
        ("https://user:pw@cdn.example.com/a", "credentials"),
        ("https://user@cdn.example.com/a", "credentials"),
        ("https://evil.com\\@cdn.example.com/a", "credentials"),
        ("https://evil.example/a", "not an allowed media host"),
        ("https://cdn.example.com.evil.example/a", "not an allowed media host"),
        ("https://[::1/a", "not a URL"),
    ],
)
def test_check_media_url_refusals(url: str, match: str) -> None:
    with pytest.raises(MediaUrlRefused, match=match):
        check_media_url(url, hosts=["cdn.example.com"])


def test_check_media_url_accepts() -> None:
    for url in (
        "https://cdn.example.com/a",
        "https://x.cdn.example.com/a?b=1",
        "https://8.8.8.8/a",
        "https://[2606:4700:4700::1111]/a",
        "https://[::ffff:8.8.8.8]/a",
    ):
        assert check_media_url(url, hosts=None) == url
    # A name is checked when it resolves (fetch_media), not here.
    assert check_media_url("https://localhost/a", hosts=None)
    assert check_media_url("http://cdn.example.com/a", hosts=None, schemes=("http", "https"))
    # hosts may be any iterable, and the refusal still names the list.
    with pytest.raises(MediaUrlRefused, match=r"\(a\.example, b\.example\)"):
        check_media_url("https://c.example/x", hosts=(h for h in ["a.example", "b.example"]))
    with pytest.raises(MediaUrlRefused, match="allowed: https"):
        check_media_url("http://c.example/x", hosts=None, schemes=(s for s in ["https"]))


# -- fetch_media ----------------------------------------------------------------------------


async def test_fetch_media(http: HttpChannel, fake: Fake) -> None:
    assert await http.fetch_media(f"{fake.base}/media?size=5") == b"mmmmm"


async def test_fetch_media_reads_a_large_body_whole(fake: Fake) -> None:
    """Several network chunks, with and without Content-Length."""
    channel = HttpChannel(allow_private_media=True, media_max_bytes=4 * 1024 * 1024)
    try:
        size = 3 * 1024 * 1024 + 17
        assert await channel.fetch_media(f"{fake.base}/media?size={size}") == b"m" * size
        assert await channel.fetch_media(f"{fake.base}/chunked?size={size}") == b"c" * size
    finally:
        await channel.close()


async def test_a_name_that_resolves_to_loopback_is_refused(fake: Fake) -> None:
    channel = HttpChannel(allow_private_media=False)
    try:
        # https passes the scheme check, "localhost" the literal check: the resolver refuses.
        with pytest.raises(MediaUrlRefused, match="'localhost' resolves to a private address"):
            await channel.fetch_media(f"https://localhost:{fake.port}/media")
        with pytest.raises(MediaUrlRefused, match="private or loopback"):
            await channel.fetch_media(f"https://127.0.0.1:{fake.port}/media")
        with pytest.raises(MediaUrlRefused, match="scheme 'http'"):
            await channel.fetch_media(f"{fake.base}/media")
    finally:
        await channel.close()
    assert fake.paths == []  # nothing ever reached the server


async def test_a_redirect_is_followed_only_where_the_check_passes(fake: Fake) -> None:
    # Private addresses allowed (the fake is on 127.0.0.1) but only that host: a redirect to
    # "localhost" (the same server, by another name) fails the host list.
    channel = HttpChannel(allow_private_media=True, media_hosts=("127.0.0.1",))
    try:
        assert await channel.fetch_media(f"{fake.base}/redirect?to=/media?size=3") == b"mmm"
        to = f"http://localhost:{fake.port}/media"
        with pytest.raises(MediaUrlRefused, match="'localhost' is not an allowed media host"):
            await channel.fetch_media(f"{fake.base}/redirect?to={to}")
        with pytest.raises(MediaUrlRefused, match="scheme 'file'"):
            await channel.fetch_media(f"{fake.base}/redirect?to=file:///etc/passwd")
        with pytest.raises(ProviderError, match="too many redirects"):
            await channel.fetch_media(f"{fake.base}/loop")
    finally:
        await channel.close()
    assert "/media?size=3" in fake.paths
    assert not any(p.startswith("/media") and p != "/media?size=3" for p in fake.paths)


async def test_credentials_are_not_sent_to_another_origin_on_redirect(fake: Fake) -> None:
    other = web.Application()
    seen: list[dict[str, str]] = []

    async def media(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(body=b"other")

    other.router.add_get("/media", media)
    channel = HttpChannel(allow_private_media=True)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with serving(other) as other_base:
            got = await channel.fetch_media(
                f"{fake.base}/redirect?to={other_base}/media", headers=auth
            )
        assert got == b"other"
        assert "Authorization" not in seen[0]
        # Same origin: the credentials go along.
        await channel.fetch_media(f"{fake.base}/redirect?to=/media", headers=auth)
        assert fake.headers[-1]["Authorization"] == f"Bearer {TOKEN}"
    finally:
        await channel.close()


@pytest.mark.parametrize("route", ["media", "chunked"])
async def test_media_max_bytes(fake: Fake, route: str) -> None:
    channel = HttpChannel(allow_private_media=True, media_max_bytes=10_000)
    try:
        assert len(await channel.fetch_media(f"{fake.base}/{route}?size=10000")) == 10_000
        with pytest.raises(ProviderError, match="media_max_bytes=10000"):
            await channel.fetch_media(f"{fake.base}/{route}?size=10001")
        with pytest.raises(ProviderError, match="media_max_bytes=10000"):
            await channel.fetch_media(f"{fake.base}/{route}?size=200000")
    finally:
        await channel.close()


async def test_media_download_errors(http: HttpChannel, fake: Fake) -> None:
    with pytest.raises(ProviderError, match="fakechan: media download: HTTP 404") as caught:
        await http.fetch_media(f"{fake.base}/status/404?token={TOKEN}")
    assert not isinstance(caught.value, SendError)
    with pytest.raises(ProviderError, match="media download failed") as caught:
        await http.fetch_media(f"http://127.0.0.1:{closed_port()}/file/bot{TOKEN}/a.jpg")
    assert TOKEN not in str(caught.value)
    with pytest.raises(MediaUrlRefused, match="no host"):
        await http.fetch_media("https:///a")


async def test_the_resolver_refuses_private_answers() -> None:
    from botmesh.providers.http import _PublicOnlyResolver

    resolver = _PublicOnlyResolver()
    try:
        with pytest.raises(MediaUrlRefused, match="private"):
            await resolver.resolve("localhost", 443)
    finally:
        await resolver.close()


# -- request --------------------------------------------------------------------------------


async def test_a_transport_error_is_retryable_and_redacted(
    http: HttpChannel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"http://127.0.0.1:{closed_port()}/bot{TOKEN}/sendMessage"
    with pytest.raises(SendError) as caught:
        await http.request("POST", url, json_body={"text": "hi"})
    err = caught.value
    assert err.retryable and type(err) is SendError
    assert TOKEN not in str(err) and "/bot***/sendMessage" in str(err)
    assert str(err).startswith("fakechan: POST ")
    assert err.__cause__ is None and err.__suppress_context__
    assert TOKEN not in caplog.text


async def test_a_percent_encoded_secret_is_redacted_too() -> None:
    secret = "s3cr:t/with+odd=chars"
    channel = HttpChannel(secrets=[secret])
    try:
        text = channel.redact("a s3cr%3At%2Fwith%2Bodd%3Dchars b s3cr:t/with+odd=chars")
        assert "s3cr" not in text and text == "a *** b ***"
    finally:
        await channel.close()


async def test_a_timeout_is_a_retryable_send_error(fake: Fake) -> None:
    channel = HttpChannel(timeout=0.2, secrets=[TOKEN])
    try:
        with pytest.raises(SendError) as caught:
            await channel.request("GET", f"{fake.base}/hang?t={TOKEN}")
    finally:
        await channel.close()
    assert caught.value.retryable
    assert "Timeout" in str(caught.value) and TOKEN not in str(caught.value)


async def test_one_connection_for_many_calls(http: HttpChannel, fake: Fake) -> None:
    for i in range(8):
        answer = await http.request("POST", f"{fake.base}/echo", json_body={"i": i})
        assert answer.ok
    await http.request("GET", f"{fake.base}/status/500")
    await http.request("GET", f"{fake.base}/status/429?h-Retry-After=1")
    assert len(fake.paths) == 10
    assert len(fake.peers) == 1
    # Concurrent calls open what they need, then keep reusing those connections.
    await asyncio.gather(*(http.request("GET", f"{fake.base}/status/204") for _ in range(4)))
    before = set(fake.peers)
    for _ in range(4):
        await http.request("GET", f"{fake.base}/status/204")
    assert fake.peers == before


async def test_close_is_idempotent_and_calls_reopen(http: HttpChannel, fake: Fake) -> None:
    await http.request("GET", f"{fake.base}/status/204")
    await http.close()
    await http.close()
    assert (await http.request("GET", f"{fake.base}/status/204")).status == 204
    assert len(fake.peers) == 2  # a new session after close


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout must be > 0"):
        HttpChannel(timeout=0)
