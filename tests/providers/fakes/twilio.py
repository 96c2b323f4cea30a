"""A fake of Twilio's Messages API, as the adapter uses it.

- ``POST /2010-04-01/Accounts/{sid}/Messages.json`` (form ``To``, ``From``, ``Body``,
  ``MediaUrl``): 201 with the message resource (``sid`` ``SM`` + 32 hex, ``date_created`` in
  RFC 2822 as Twilio writes it), recorded in ``messages``;
- ``GET`` of the same path: the listing, newest first, filtered by ``To``, ``From`` and
  ``DateSent>`` (a day or an ISO time), ``PageSize`` per page, and Twilio's page shape
  (``messages``, ``next_page_uri`` with ``Page`` and ``PageToken``, ``page``, ``page_size``,
  ``first_page_uri``, ``previous_page_uri``, ``start``, ``end``, ``uri``);
- ``GET /2010-04-01/Accounts/{sid}/Messages/{MM}/Media/{ME}``: media with basic auth; with
  ``redirect_media`` it answers 307 to ``/cdn/{ME}`` (as Twilio redirects to its CDN), which
  records whether an ``Authorization`` header came along.

Every Accounts path checks basic auth (401, code 20003). Errors carry Twilio's body
``{"code", "message", "more_info", "status"}``: 21604 no To, 21602 no Body nor MediaUrl,
21617 over 1600 characters, 21620 a MediaUrl that is not http(s), 21211 a To that is not
``+digits`` (optionally ``whatsapp:``). ``script(to, code)`` makes every send to ``to`` fail
with ``code``; ``fail_next(code, …)`` fails the next sends (any To); ``list_error`` makes
the listing fail with that HTTP status.

Status callbacks: an accepted message gets its statuses posted, once its 201 is written, to
the ``StatusCallback`` of the request or else to ``webhook_url`` (a messaging service's
callback), as Twilio posts them: a form (``MessageSid``, ``SmsSid``, ``MessageStatus``,
``SmsStatus``, ``AccountSid``, ``From``, ``To``, ``ApiVersion``, ``ErrorCode`` when it
failed) signed ``X-Twilio-Signature`` (base64 HMAC-SHA1 under ``auth_token`` of the URL and
the sorted parameters). Default: ``queued``, ``sent``, ``delivered`` and, to a
``whatsapp:`` number, ``read``. A ``To`` in ``fail_after_accept`` gets ``queued``,
``sent`` then ``undelivered`` (a 63xxx WhatsApp code: ``failed``) with that ``ErrorCode``.
``status_copies``, ``posted``, ``post_status`` and ``settle()`` are as in the Graph fake.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from tests.providers.fakes.status_posts import post_copies

API = "/2010-04-01"

#: Twilio's HTTP status and message for the codes the fake produces.
ERRORS: dict[int, tuple[int, str]] = {
    20003: (401, "Authenticate"),
    20404: (404, "The requested resource was not found"),
    20429: (429, "Too Many Requests"),
    20500: (500, "Internal Server Error"),
    21211: (400, "The 'To' number is not a valid phone number."),
    21602: (400, "Message body is required."),
    21604: (400, "A 'To' phone number is required."),
    21610: (400, "Attempt to send to unsubscribed recipient"),
    21612: (400, "The 'To' phone number is not currently reachable via SMS"),
    21614: (400, "'To' number is not a valid mobile number"),
    21617: (400, "The concatenated message body exceeds the 1600 character limit."),
    21620: (400, "Invalid media URL(s)"),
    21623: (400, "Number of media files exceeds allowed limit"),
    63005: (400, "Channel did not accept given content."),
    63016: (
        400,
        "Failed to send freeform message because you are outside the allowed window. "
        "Please use a Template.",
    ),
}

_NUMBER = re.compile(r"^(whatsapp:)?\+[1-9]\d{6,14}$")


def new_sid(prefix: str) -> str:
    """A Twilio sid: two letters and 32 hex digits (34 characters)."""
    return prefix + secrets.token_hex(16)


def rfc2822(ts: float) -> str:
    """``Thu, 03 Dec 2026 15:08:40 +0000``, as Twilio writes dates."""
    return email.utils.format_datetime(datetime.fromtimestamp(ts, UTC).replace(microsecond=0))


@dataclass
class Failure:
    code: int
    status: int | None = None
    retry_after: str | None = None


@dataclass
class FakeTwilio:
    """The fake; ``app()`` is the aiohttp application to serve."""

    account_sid: str = field(default_factory=lambda: new_sid("AC"))
    auth_token: str = field(default_factory=lambda: secrets.token_hex(16))
    clock: Callable[[], float] = time.time
    redirect_media: bool = False
    #: Every message the API accepted (the resource as Twilio returns it), oldest first.
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: Media served: ``ME`` sid → (bytes, content type).
    media: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    #: For each ``/cdn/`` fetch, the Authorization header it carried (``None``: none).
    cdn_auth: list[str | None] = field(default_factory=list)
    list_error: int | None = None
    list_calls: int = 0
    scripted: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    #: Where status callbacks go when a send names no ``StatusCallback`` (``None``: nowhere).
    webhook_url: str | None = None
    #: ``To`` → Twilio error code: accepted, then ``undelivered`` / ``failed`` with it.
    fail_after_accept: dict[str, int] = field(default_factory=dict)
    #: How many times each status callback is posted.
    status_copies: int = 1
    #: ``(MessageSid, MessageStatus, HTTP status the callback URL answered)`` of every post.
    posted: list[tuple[str, str, int]] = field(default_factory=list)
    _callbacks: dict[str, str] = field(default_factory=dict)
    _posting: set[asyncio.Task[None]] = field(default_factory=set)

    # -- scripting ------------------------------------------------------------------------

    def script(self, to: str, code: int) -> None:
        """Every send to ``to`` fails with Twilio error ``code``."""
        self.scripted[to] = code

    def fail_next(
        self, code: int, *, status: int | None = None, retry_after: str | None = None
    ) -> None:
        """The next send fails with ``code`` (HTTP ``status``, default Twilio's)."""
        self.failures.append(Failure(code, status, retry_after))

    def add_media(self, data: bytes, mime: str) -> str:
        """Serve ``data``; returns its path (``/2010-04-01/Accounts/…/Media/ME…``)."""
        me = new_sid("ME")
        self.media[me] = (data, mime)
        return f"{API}/Accounts/{self.account_sid}/Messages/{new_sid('MM')}/Media/{me}"

    def record(self, to: str, from_: str, body: str, *, created: float, num_media: int = 0) -> str:
        """Put a message in the history as if it had been sent at ``created``."""
        sid = new_sid("SM")
        self.messages.append(
            {
                "account_sid": self.account_sid,
                "api_version": "2010-04-01",
                "body": body,
                "date_created": rfc2822(created),
                "date_sent": rfc2822(created),
                "date_updated": rfc2822(created),
                "direction": "outbound-api",
                "error_code": None,
                "error_message": None,
                "from": from_,
                "messaging_service_sid": None,
                "num_media": str(num_media),
                "num_segments": str(max(1, -(-len(body) // 153))),
                "price": None,
                "price_unit": "USD",
                "sid": sid,
                "status": "queued",
                "subresource_uris": {
                    "media": f"{API}/Accounts/{self.account_sid}/Messages/{sid}/Media.json"
                },
                "to": to,
                "uri": f"{API}/Accounts/{self.account_sid}/Messages/{sid}.json",
                "_ts": created,
            }
        )
        return sid

    def sent_to(self, to: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["to"] == to]

    # -- status callbacks -----------------------------------------------------------------

    def signature(self, url: str, params: dict[str, str]) -> str:
        """``X-Twilio-Signature`` of a post of ``params`` to ``url``."""
        payload = url + "".join(k + v for k, v in sorted(params.items()))
        digest = hmac.new(self.auth_token.encode(), payload.encode(), hashlib.sha1).digest()
        return base64.b64encode(digest).decode()

    async def post_status(
        self, message_id: str, recipient: str, status: str, *, code: int | None = None
    ) -> int:
        """Post one status callback of ``message_id`` (``status_copies`` times); the HTTP
        status of the last answer (0: the URL could not be reached)."""
        url = self._callbacks.get(message_id) or self.webhook_url
        if url is None:
            raise RuntimeError("FakeTwilio.webhook_url is not set")
        sent = next((m for m in self.messages if m["sid"] == message_id), None)
        params = {
            "AccountSid": self.account_sid,
            "ApiVersion": "2010-04-01",
            "From": str(sent["from"]) if sent else "",
            "MessageSid": message_id,
            "MessageStatus": status,
            "SmsSid": message_id,
            "SmsStatus": status,
            "To": recipient,
        }
        if code is not None:
            params["ErrorCode"] = str(code)
        if sent is not None:
            sent["status"], sent["error_code"] = status, code
        headers = {"X-Twilio-Signature": self.signature(url, params)}
        return await post_copies(
            url,
            copies=self.status_copies,
            posted=self.posted,
            about=(message_id, status),
            data=params,
            headers=headers,
        )

    def sequence(self, to: str) -> list[tuple[str, int | None]]:
        """The statuses an accepted message to ``to`` gets, in order."""
        code = self.fail_after_accept.get(to)
        if code is not None:
            last = "failed" if 63000 <= code < 64000 else "undelivered"
            return [("queued", None), ("sent", None), (last, code)]
        read = [("read", None)] if to.startswith("whatsapp:") else []
        return [("queued", None), ("sent", None), ("delivered", None), *read]

    async def _post_sequence(self, sid: str, to: str) -> None:
        for status, code in self.sequence(to):
            await self.post_status(sid, to, status, code=code)

    async def settle(self) -> None:
        """Wait until every status sequence under way has been posted."""
        while self._posting:
            await asyncio.gather(*list(self._posting))

    async def _answer_then_post(
        self, request: web.Request, response: web.Response, callback: str
    ) -> web.Response:
        """Write an accepted send's 201, then start posting its status callbacks."""
        if response.status != 201 or not (callback or self.webhook_url):
            return response
        sid, to = str(self.messages[-1]["sid"]), str(self.messages[-1]["to"])
        if callback:
            self._callbacks[sid] = callback
        await response.prepare(request)
        await response.write_eof()
        task = asyncio.create_task(self._post_sequence(sid, to))
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)
        return response

    # -- the API --------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(f"{API}/Accounts/{{sid}}/Messages.json", self._create)
        app.router.add_get(f"{API}/Accounts/{{sid}}/Messages.json", self._list)
        app.router.add_get(f"{API}/Accounts/{{sid}}/Messages/{{mm}}/Media/{{me}}", self._media)
        app.router.add_get("/cdn/{me}", self._cdn)
        return app

    def _error(self, code: int, status: int | None = None, **headers: str) -> web.Response:
        default_status, message = ERRORS[code]
        status = status or default_status
        return web.json_response(
            {
                "code": code,
                "message": message,
                "more_info": f"https://www.twilio.com/docs/errors/{code}",
                "status": status,
            },
            status=status,
            headers=headers,
        )

    def _authorized(self, request: web.Request) -> bool:
        want = base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode()
        return (
            request.headers.get("Authorization") == f"Basic {want}"
            and request.match_info["sid"] == self.account_sid
        )

    async def _create(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._error(20003)
        form = await request.post()
        to, from_ = str(form.get("To", "")), str(form.get("From", ""))
        body = str(form.get("Body", ""))
        media = [str(v) for v in form.getall("MediaUrl", [])]
        if self.failures:
            f = self.failures.pop(0)
            extra = {"Retry-After": f.retry_after} if f.retry_after else {}
            return self._error(f.code, f.status, **extra)
        if not to:
            return self._error(21604)
        if to in self.scripted:
            return self._error(self.scripted[to])
        if not _NUMBER.match(to):
            return self._error(21211)
        if not body and not media:
            return self._error(21602)
        if len(body) > 1600:
            return self._error(21617)
        if len(media) > 10:
            return self._error(21623)
        if any(not m.startswith(("http://", "https://")) for m in media):
            return self._error(21620)
        self.record(to, from_, body, created=self.clock(), num_media=len(media))
        response = web.json_response(_public(self.messages[-1]), status=201)
        return await self._answer_then_post(request, response, str(form.get("StatusCallback", "")))

    async def _list(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._error(20003)
        self.list_calls += 1
        if self.list_error is not None:
            return self._error(20500 if self.list_error >= 500 else 20404, self.list_error)
        q = request.query
        after = q.get("DateSent>")
        items = [
            m
            for m in reversed(self.messages)
            if ("To" not in q or m["to"] == q["To"])
            and ("From" not in q or m["from"] == q["From"])
            and (after is None or _day_or_time(after) <= m["_ts"])
        ]
        size = max(1, min(1000, int(q.get("PageSize", "50"))))
        page = int(q.get("Page", "0"))
        start = page * size
        chunk = items[start : start + size]
        base = {k: v for k, v in q.items() if k not in ("Page", "PageToken")}
        path = f"{API}/Accounts/{self.account_sid}/Messages.json"

        def uri(n: int) -> str:
            token = {"PageToken": f"PA{start + size}"} if n > 0 else {}
            return f"{path}?{urlencode({**base, 'Page': n, **token})}"

        more = start + size < len(items)
        return web.json_response(
            {
                "end": start + len(chunk) - 1 if chunk else start,
                "first_page_uri": uri(0),
                "messages": [_public(m) for m in chunk],
                "next_page_uri": uri(page + 1) if more else None,
                "page": page,
                "page_size": size,
                "previous_page_uri": uri(page - 1) if page > 0 else None,
                "start": start,
                "uri": f"{path}?{urlencode({**base, 'Page': page})}",
            }
        )

    async def _media(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return self._error(20003)
        me = request.match_info["me"]
        if me not in self.media:
            return self._error(20404)
        if self.redirect_media:
            raise web.HTTPTemporaryRedirect(f"/cdn/{me}")
        data, mime = self.media[me]
        return web.Response(body=data, content_type=mime)

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        self.cdn_auth.append(request.headers.get("Authorization"))
        me = request.match_info["me"]
        if me not in self.media:
            return web.Response(status=404)
        data, mime = self.media[me]
        return web.Response(body=data, content_type=mime)


def _public(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if not k.startswith("_")}


def _day_or_time(value: str) -> float:
    if len(value) == 10:
        return datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
