"""A fake of the Graph API serving the three Meta channels: WhatsApp Cloud API, Messenger
and Instagram (``/v21.0`` under the base URL, as on ``graph.facebook.com``).

- ``POST /v21.0/{phone_number_id}/messages`` (WhatsApp) and ``POST /v21.0/me/messages``
  (Messenger with the page token, Instagram with the Instagram token), JSON or multipart
  (Messenger's ``filedata``);
- ``POST /v21.0/{phone_number_id}/media`` (multipart upload) and ``GET /v21.0/{media_id}``
  (its ``url`` points at ``GET /lookaside/{media_id}`` on this server, which wants the
  WhatsApp Bearer token as the real ``lookaside.fbsbx.com`` does);
- ``GET /cdn/{name}``: public files, as a Messenger attachment URL on a Meta CDN.

Every Graph call wants ``Authorization: Bearer <token>`` (else 401, code 190
``OAuthException``). Behaviour: WhatsApp 131047 for a chat in ``closed_windows``, 131026
for a number not in ``numbers``, text over 4096 → code 100 with Meta's message; Messenger
and Instagram text over 2000 / 1000 → code 100, code 10 (subcode 2018278 / 2534022) for a
closed window, 551 for a user in ``unavailable``, 100 / 2018001 (2534014) for an unknown
id. ``fail_next(channel, code, ...)`` scripts the next answers (rate limits with or
without ``Retry-After``, 500s, code 2…), with the real status, type and message of the
code. Accepted messages are kept per channel in ``accepted``; Messenger and Instagram
``sender_action`` posts (``typing_on``…) in ``actions``.

Status webhooks (WhatsApp): with ``webhook_url`` set, every accepted WhatsApp message gets
its statuses posted there once the send's answer is written, as Meta posts them
(``object: whatsapp_business_account``, ``entry[].changes[].value.statuses[]`` with
``metadata.phone_number_id``), signed ``X-Hub-Signature-256: sha256=<HMAC-SHA256 of the
body under app_secret>``: ``sent``, ``delivered``, ``read``, one after the other (each post
awaited). A message to a number of ``fail_after_accept`` (which need not be in
``numbers``) is accepted, then gets ``sent`` and ``failed`` with that error code (Meta's
title, message and details). A template gets
the default sequence even to such a number, unless the number is in
``fail_after_accept_templates``. ``status_copies`` posts each status that many times (a
retrying channel); ``posted`` records ``(message id, status, HTTP status answered)``;
``post_status`` posts one by hand; ``settle()`` waits for the posts under way. With
``page_webhook_urls[channel]`` set, an accepted Messenger message gets its
``message_deliveries`` (``delivery.mids``) and an Instagram one its ``messaging_seen``
(``read.mid``) posted there, signed the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.providers.fakes.status_posts import post_copies

VERSION = "v21.0"

#: WhatsApp's errors of a ``failed`` status: code → (title, details), as Meta writes them.
STATUS_ERRORS: dict[int, tuple[str, str]] = {
    131026: (
        "Message undeliverable",
        "Unable to deliver message. Reasons can include: the recipient phone number is not "
        "a WhatsApp phone number; the recipient has not accepted our new Terms of Service "
        "and Privacy Policy; the recipient is using an old WhatsApp version.",
    ),
    131047: (
        "Re-engagement message",
        "Message failed to send because more than 24 hours have passed since the customer "
        "last replied to this number.",
    ),
    131049: (
        "This message was not delivered to maintain healthy ecosystem engagement.",
        "In order to maintain a healthy ecosystem engagement, the message failed to be delivered.",
    ),
    131050: (
        "User has stopped marketing messages",
        "Unable to deliver the message. This recipient has chosen to stop receiving "
        "marketing messages on WhatsApp from your business.",
    ),
    131000: ("Something went wrong", "Message failed to send due to an unknown error."),
}

#: Real Graph / Cloud API errors: code → (HTTP status, type, message).
ERRORS: dict[int, tuple[int, str, str]] = {
    1: (500, "OAuthException", "An unknown error has occurred."),
    2: (
        500,
        "OAuthException",
        "An unexpected error has occurred. Please retry your request later.",
    ),
    4: (400, "OAuthException", "(#4) Application request limit reached"),
    10: (
        400,
        "OAuthException",
        "(#10) This message is sent outside of allowed window. Learn more about the new "
        "policy here: https://developers.facebook.com/docs/messenger-platform/policy-overview",
    ),
    17: (400, "OAuthException", "(#17) User request limit reached"),
    32: (400, "OAuthException", "(#32) Page request limit reached"),
    100: (400, "OAuthException", "(#100) Invalid parameter"),
    190: (401, "OAuthException", "Invalid OAuth access token - Cannot parse access token"),
    551: (400, "OAuthException", "(#551) This person isn't available right now."),
    613: (400, "OAuthException", "(#613) Calls to this api have exceeded the rate limit."),
    1200: (500, "OAuthException", "(#1200) Temporary send message failure. Please try again later"),
    80007: (400, "OAuthException", "(#80007) Rate limit issues"),
    130429: (400, "OAuthException", "(#130429) Rate limit hit"),
    131000: (500, "OAuthException", "(#131000) Something went wrong"),
    131016: (503, "OAuthException", "(#131016) Service unavailable"),
    131026: (400, "OAuthException", "(#131026) Message Undeliverable"),
    131030: (400, "OAuthException", "(#131030) Recipient phone number not in allowed list"),
    131047: (400, "OAuthException", "(#131047) Re-engagement message"),
    131051: (400, "OAuthException", "(#131051) Unsupported message type"),
    131052: (400, "OAuthException", "(#131052) Media download error"),
    131053: (400, "OAuthException", "(#131053) Media upload error"),
    131056: (
        400,
        "OAuthException",
        "(#131056) (Business Account, Consumer Account) pair rate limit hit",
    ),
    132001: (404, "OAuthException", "(#132001) Template name does not exist in the translation"),
}

#: The longest text each channel takes.
TEXT_LIMITS = {"whatsapp": 4096, "messenger": 2000, "instagram": 1000}


@dataclass(frozen=True, slots=True)
class Accepted:
    """A message the fake accepted: its id, recipient and the request body."""

    channel: str
    id: str
    chat_id: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Scripted:
    status: int
    error: dict[str, Any]
    headers: dict[str, str]


@dataclass
class GraphFake:
    """The fake's state; ``app()`` serves it."""

    whatsapp_token: str = "EAAwa-fake-whatsapp-token-0001"
    page_token: str = "EAApage-fake-messenger-token-0002"
    instagram_token: str = "EAAig-fake-instagram-token-0003"
    phone_number_id: str = "106540352242922"
    #: WhatsApp numbers that exist (others: 131026).
    numbers: set[str] = field(default_factory=lambda: {"15551230001", "15551230002"})
    #: Messenger / Instagram scoped ids that exist (others: "No matching user found").
    users: set[str] = field(default_factory=lambda: {"24000000000000001", "17841400000000001"})
    #: Chats whose customer-service window is closed (any channel).
    closed_windows: set[str] = field(default_factory=set)
    #: WhatsApp message templates approved for the number: (name, language code). A
    #: template goes out whatever the window; an unknown one is refused with 132001.
    templates: set[tuple[str, str]] = field(default_factory=lambda: {("hello_world", "en_US")})
    #: Messenger / Instagram users who blocked the page (551).
    unavailable: set[str] = field(default_factory=set)
    #: Public files under ``/cdn/{name}``.
    cdn: dict[str, bytes] = field(default_factory=dict)
    accepted: dict[str, list[Accepted]] = field(default_factory=lambda: defaultdict(list))
    #: Uploaded or received WhatsApp media: id → (bytes, mime).
    media: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    #: Bytes ``/lookaside`` serves instead of the stored media (a corrupted CDN copy).
    corrupt: dict[str, bytes] = field(default_factory=dict)
    #: The ``Authorization`` header of each ``/lookaside`` download.
    downloads: list[str] = field(default_factory=list)
    #: The origin (``scheme://host:port``) of the media URLs ``GET /{media_id}`` gives;
    #: ``None``: this server as the caller reached it.
    media_origin: str | None = None
    #: Messenger / Instagram sender actions accepted: channel → [(scoped id, action)].
    actions: dict[str, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))
    #: Where WhatsApp status webhooks are posted (``None``: nowhere).
    webhook_url: str | None = None
    #: Where Messenger's deliveries and Instagram's reads are posted, by channel.
    page_webhook_urls: dict[str, str] = field(default_factory=dict)
    #: The app secret that signs them (``X-Hub-Signature-256``).
    app_secret: str = "graph-fake-app-secret-0004"
    #: Numbers whose messages are accepted, then fail with this WhatsApp error code.
    fail_after_accept: dict[str, int] = field(default_factory=dict)
    #: Numbers whose templates, too, fail after being accepted (with this code).
    fail_after_accept_templates: dict[str, int] = field(default_factory=dict)
    #: How many times each status webhook is posted.
    status_copies: int = 1
    #: ``(message id, status, HTTP status the webhook URL answered)`` of every post.
    posted: list[tuple[str, str, int]] = field(default_factory=list)
    _posting: set[asyncio.Task[None]] = field(default_factory=set)
    _script: dict[str, deque[Scripted]] = field(default_factory=lambda: defaultdict(deque))
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # -- scripting ------------------------------------------------------------------------

    def fail_next(
        self,
        channel: str,
        code: int,
        *,
        subcode: int | None = None,
        status: int | None = None,
        message: str | None = None,
        details: str | None = None,
        headers: dict[str, str] | None = None,
        transient: bool | None = None,
        times: int = 1,
    ) -> None:
        """The next ``times`` calls of ``channel`` answer Graph error ``code`` (its real
        status, type and message unless given)."""
        for _ in range(times):
            status_, body = _error(code, subcode=subcode, message=message, details=details)
            if transient is not None:
                body["error"]["is_transient"] = transient
            self._script[channel].append(Scripted(status or status_, body, dict(headers or {})))

    def add_media(self, data: bytes, mime: str) -> str:
        """Store a media (as a user's inbound media); its id."""
        media_id = str(900000000000000 + next(self._ids))
        self.media[media_id] = (data, mime)
        return media_id

    def texts(self, channel: str) -> dict[str, list[str]]:
        """``chat -> [text or caption of each accepted message]`` (an attachment without
        text counts as ``""``)."""
        out: dict[str, list[str]] = {}
        for a in self.accepted[channel]:
            body = a.body
            if channel == "whatsapp":
                part = body.get(str(body.get("type")), {})
                text = part.get("body") or part.get("caption") or ""
            else:
                text = (body.get("message") or {}).get("text") or ""
            out.setdefault(a.chat_id, []).append(str(text))
        return out

    # -- status webhooks ------------------------------------------------------------------

    def status_body(
        self, message_id: str, recipient: str, status: str, *, code: int | None = None
    ) -> dict[str, Any]:
        """A WhatsApp status webhook as Meta posts it."""
        item: dict[str, Any] = {
            "id": message_id,
            "status": status,
            "timestamp": str(int(time.time())),
            "recipient_id": recipient,
        }
        if status in ("sent", "delivered"):
            item["conversation"] = {"id": "CONVERSATION_ID", "origin": {"type": "service"}}
            item["pricing"] = {"billable": True, "pricing_model": "CBP", "category": "service"}
        if status == "failed":
            number = code or 131000
            title, details = STATUS_ERRORS.get(number, (f"Error {number}", f"Error {number}"))
            item["errors"] = [
                {
                    "code": number,
                    "title": title,
                    "message": title,
                    "error_data": {"details": details},
                    "href": "https://developers.facebook.com/docs/whatsapp/cloud-api/support/"
                    "error-codes/",
                }
            ]
        value = {
            "messaging_product": "whatsapp",
            "metadata": {
                "display_phone_number": "15550783881",
                "phone_number_id": self.phone_number_id,
            },
            "statuses": [item],
        }
        return {
            "object": "whatsapp_business_account",
            "entry": [
                {"id": "102290129340398", "changes": [{"value": value, "field": "messages"}]}
            ],
        }

    def signature(self, body: bytes) -> str:
        """``X-Hub-Signature-256`` of ``body``."""
        return "sha256=" + hmac.new(self.app_secret.encode(), body, hashlib.sha256).hexdigest()

    async def post_status(
        self, message_id: str, recipient: str, status: str, *, code: int | None = None
    ) -> int:
        """Post one status webhook to ``webhook_url`` (``status_copies`` times); the HTTP
        status of the last answer (0: the URL could not be reached)."""
        if self.webhook_url is None:
            raise RuntimeError("GraphFake.webhook_url is not set")
        body = json.dumps(self.status_body(message_id, recipient, status, code=code)).encode()
        headers = {"Content-Type": "application/json", "X-Hub-Signature-256": self.signature(body)}
        return await post_copies(
            self.webhook_url,
            copies=self.status_copies,
            posted=self.posted,
            about=(message_id, status),
            data=body,
            headers=headers,
        )

    def sequence(self, recipient: str, template: bool) -> list[tuple[str, int | None]]:
        """The statuses an accepted message to ``recipient`` gets, in order."""
        code = (self.fail_after_accept_templates if template else self.fail_after_accept).get(
            recipient
        )
        if code is not None:
            return [("sent", None), ("failed", code)]
        return [("sent", None), ("delivered", None), ("read", None)]

    async def _post_sequence(self, wamid: str, recipient: str, template: bool) -> None:
        for status, code in self.sequence(recipient, template):
            await self.post_status(wamid, recipient, status, code=code)

    async def _answer_then_post(
        self, request: web.Request, response: web.Response, body: dict[str, Any]
    ) -> web.Response:
        """Write an accepted WhatsApp send's answer, then start posting its statuses."""
        answer = json.loads(response.body or b"{}") if isinstance(response.body, bytes) else {}
        messages = answer.get("messages")
        if self.webhook_url is None or response.status != 200 or not messages:
            return response
        await response.prepare(request)
        await response.write_eof()
        wamid, to = str(messages[0]["id"]), str(body.get("to") or "")
        self._later(self._post_sequence(wamid, to, body.get("type") == "template"))
        return response

    def page_status_body(self, channel: str, mid: str, user: str) -> dict[str, Any]:
        """Messenger's ``message_deliveries`` (``delivery.mids``, a watermark) or
        Instagram's ``messaging_seen`` (``read.mid``) of one message, as Meta posts them."""
        now = int(time.time() * 1000)
        event: dict[str, Any] = {"sender": {"id": user}, "recipient": {"id": "PAGE"}}
        if channel == "instagram":
            event.update(timestamp=now, read={"mid": mid})
        else:
            event["delivery"] = {"mids": [mid], "watermark": now}
        entry = {"id": "PAGE", "time": now, "messaging": [event]}
        return {"object": "instagram" if channel == "instagram" else "page", "entry": [entry]}

    async def _post_page_status(self, channel: str, mid: str, user: str) -> None:
        body = json.dumps(self.page_status_body(channel, mid, user)).encode()
        headers = {"Content-Type": "application/json", "X-Hub-Signature-256": self.signature(body)}
        status = "read" if channel == "instagram" else "delivered"
        await post_copies(
            self.page_webhook_urls[channel],
            copies=self.status_copies,
            posted=self.posted,
            about=(mid, status),
            data=body,
            headers=headers,
        )

    def _later(self, post: Any) -> None:
        task = asyncio.create_task(post)
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)

    async def settle(self) -> None:
        """Wait until every status sequence under way has been posted."""
        while self._posting:
            await asyncio.gather(*list(self._posting))

    # -- the server -----------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(f"/{VERSION}/{{node}}/messages", self._messages)
        app.router.add_post(f"/{VERSION}/{{node}}/media", self._upload)
        app.router.add_get(f"/{VERSION}/{{media_id}}", self._media_info)
        app.router.add_get("/lookaside/{media_id}", self._download)
        app.router.add_get("/cdn/{name}", self._cdn)
        return app

    def _channel_of(self, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        return {
            self.whatsapp_token: "whatsapp",
            self.page_token: "messenger",
            self.instagram_token: "instagram",
        }.get(token or "")

    def _scripted(self, channel: str) -> web.Response | None:
        if not self._script[channel]:
            return None
        s = self._script[channel].popleft()
        return web.json_response(s.error, status=s.status, headers=s.headers)

    async def _messages(self, request: web.Request) -> web.Response:
        channel = self._channel_of(request)
        node = request.match_info["node"]
        if channel is None:
            return _reply(190)
        if (channel == "whatsapp") != (node == self.phone_number_id) or (
            channel != "whatsapp" and node != "me"
        ):
            return _reply(
                100,
                subcode=33,
                message=f"Unsupported post request. Object with ID '{node}' does not exist, "
                "cannot be loaded due to missing permissions, or does not support this operation",
            )
        scripted = self._scripted(channel)
        if scripted is not None:
            return scripted
        if channel == "whatsapp":
            body = await request.json()
            return await self._answer_then_post(request, self._whatsapp(body), body)
        return await self._messenger(channel, request)

    def _whatsapp(self, body: dict[str, Any]) -> web.Response:
        to = str(body.get("to") or "")
        kind = body.get("type")
        if body.get("messaging_product") != "whatsapp":
            return _wa(100, "The parameter messaging_product is required.")
        if kind == "text":
            text = (body.get("text") or {}).get("body") or ""
            if len(text) > TEXT_LIMITS["whatsapp"]:
                return _wa(
                    100,
                    "Param text['body'] must be at most 4096 characters long.",
                    message="(#100) Param text['body'] must be at most 4096 characters long.",
                )
        elif kind in ("image", "video", "audio", "document", "sticker"):
            item = body.get(kind) or {}
            if "id" in item and item["id"] not in self.media:
                return _wa(
                    100,
                    f"Param {kind}['id'] is not a valid whatsapp business account media "
                    "attachment ID",
                )
            if "link" in item and "/missing" in str(item["link"]):
                return _wa(131053, "Downloading media from weblink failed with http code 404")
            if "id" not in item and "link" not in item:
                return _wa(100, f"Param {kind} must contain id or link")
        elif kind == "template":
            template = body.get("template") or {}
            language = (template.get("language") or {}).get("code")
            if (template.get("name"), language) not in self.templates:
                return _wa(
                    132001,
                    f"template name ({template.get('name')}) does not exist in {language}",
                )
        else:
            return _wa(131051, f"Message type {kind!r} is not currently supported")
        if to not in self.numbers and to not in self.fail_after_accept:
            return _wa(131026, "Message Undeliverable.")
        if to in self.closed_windows and kind != "template":
            return _wa(
                131047,
                "Message failed to send because more than 24 hours have passed since the "
                "customer last replied to this number.",
            )
        wamid = f"wamid.HBgL{next(self._ids):020d}"
        self.accepted["whatsapp"].append(Accepted("whatsapp", wamid, to, body))
        return web.json_response(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": to, "wa_id": to}],
                "messages": [{"id": wamid}],
            }
        )

    async def _messenger(self, channel: str, request: web.Request) -> web.Response:
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            filedata = form.get("filedata")
            if not isinstance(filedata, web.FileField):
                return _reply(100, message="(#100) Upload attachment failure.")
            body: dict[str, Any] = {
                k: json.loads(str(form[k])) if k in ("recipient", "message") else str(form[k])
                for k in form
                if k != "filedata"
            }
            body["filedata"] = {
                "filename": filedata.filename,
                "content_type": filedata.content_type,
                "size": len(filedata.file.read()),
            }
        else:
            body = await request.json()
            if "sender_action" in body:
                return self._sender_action(channel, body)
        psid = str((body.get("recipient") or {}).get("id") or "")
        message = body.get("message") or {}
        instagram = channel == "instagram"
        if "text" in message and "attachment" in message:
            return _reply(100, message="(#100) Only one of text or attachment can be specified")
        if len(message.get("text") or "") > TEXT_LIMITS[channel]:
            return _reply(
                100,
                message="(#100) Length of param message[text] must be less than or equal to "
                f"{TEXT_LIMITS[channel]}",
            )
        if psid not in self.users:
            return _reply(
                100, subcode=2534014 if instagram else 2018001, message="No matching user found"
            )
        if psid in self.unavailable:
            return _reply(551, subcode=1545041)
        if psid in self.closed_windows:
            return _reply(10, subcode=2534022 if instagram else 2018278)
        mid = f"m_{channel[:2]}{next(self._ids):016d}"
        self.accepted[channel].append(Accepted(channel, mid, psid, body))
        answer = web.json_response({"recipient_id": psid, "message_id": mid})
        if channel in self.page_webhook_urls:  # its delivery (Instagram: its read) follows
            await answer.prepare(request)
            await answer.write_eof()
            self._later(self._post_page_status(channel, mid, psid))
        return answer

    def _sender_action(self, channel: str, body: dict[str, Any]) -> web.Response:
        """``{"recipient", "sender_action"}``: ``typing_on``, ``typing_off`` or ``mark_seen``,
        for a user the page may write to; ``{"recipient_id"}``."""
        psid = str((body.get("recipient") or {}).get("id") or "")
        action = body.get("sender_action")
        if "message" in body or action not in ("typing_on", "typing_off", "mark_seen"):
            return _reply(
                100,
                message="(#100) Param sender_action must be one of "
                "{MARK_SEEN, TYPING_ON, TYPING_OFF}",
            )
        if psid not in self.users:
            subcode = 2534014 if channel == "instagram" else 2018001
            return _reply(100, subcode=subcode, message="No matching user found")
        if psid in self.unavailable:
            return _reply(551, subcode=1545041)
        self.actions[channel].append((psid, str(action)))
        return web.json_response({"recipient_id": psid})

    async def _upload(self, request: web.Request) -> web.Response:
        if self._channel_of(request) != "whatsapp":
            return _reply(190)
        if request.match_info["node"] != self.phone_number_id:
            return _reply(100, subcode=33, message="Unsupported post request.")
        scripted = self._scripted("whatsapp")
        if scripted is not None:
            return scripted
        form = await request.post()
        upload = form.get("file")
        if form.get("messaging_product") != "whatsapp" or not isinstance(upload, web.FileField):
            return _wa(100, "Param messaging_product and file are required")
        mime = str(form.get("type") or upload.content_type)
        return web.json_response({"id": self.add_media(upload.file.read(), mime)})

    async def _media_info(self, request: web.Request) -> web.Response:
        if self._channel_of(request) != "whatsapp":
            return _reply(190)
        media_id = request.match_info["media_id"]
        if media_id not in self.media:
            return _reply(
                100,
                subcode=33,
                message=f"Unsupported get request. Object with ID '{media_id}' does not exist, "
                "cannot be loaded due to missing permissions, or does not support this operation",
            )
        data, mime = self.media[media_id]
        origin = self.media_origin or f"{request.scheme}://{request.host}"
        return web.json_response(
            {
                "messaging_product": "whatsapp",
                "url": f"{origin}/lookaside/{media_id}?ext=1&hash=ATuX",
                "mime_type": mime,
                "sha256": hashlib.sha256(data).hexdigest(),
                "file_size": str(len(data)),
                "id": media_id,
            }
        )

    async def _download(self, request: web.Request) -> web.Response:
        self.downloads.append(request.headers.get("Authorization", ""))
        if self._channel_of(request) != "whatsapp":
            return web.Response(status=401, text="Unauthorized")
        media_id = request.match_info["media_id"]
        found = self.media.get(media_id)
        if found is None:
            return web.Response(status=404)
        return web.Response(body=self.corrupt.get(media_id, found[0]), content_type=found[1])

    async def _cdn(self, request: web.Request) -> web.Response:
        data = self.cdn.get(request.match_info["name"])
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, content_type="application/octet-stream")


def _error(
    code: int,
    *,
    subcode: int | None = None,
    message: str | None = None,
    details: str | None = None,
) -> tuple[int, dict[str, Any]]:
    status, kind, text = ERRORS.get(code, (400, "OAuthException", f"(#{code}) Error"))
    err: dict[str, Any] = {
        "message": message or text,
        "type": kind,
        "code": code,
        "fbtrace_id": "AbCdEf012345_fake",
    }
    if subcode is not None:
        err["error_subcode"] = subcode
    if details is not None:
        err["error_data"] = {"messaging_product": "whatsapp", "details": details}
    if code in (1, 2, 1200, 131000, 131016):
        err["is_transient"] = True
    return status, {"error": err}


def _reply(code: int, *, subcode: int | None = None, message: str | None = None) -> web.Response:
    status, body = _error(code, subcode=subcode, message=message)
    return web.json_response(body, status=status)


def _wa(code: int, details: str, *, message: str | None = None) -> web.Response:
    status, body = _error(code, message=message, details=details)
    return web.json_response(body, status=status)
