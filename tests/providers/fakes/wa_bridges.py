"""What the fakes of the three WhatsApp Web bridges share (``baileys``, ``evolution``,
``wppconnect`` in this package): answers scripted ahead of the real ones (a proxy's 429 with
``Retry-After``, a 5xx, any error body), the calls seen, the messages accepted, and the
WhatsApp numbers that exist; and ``refused``, for their tests.

Status webhooks: with ``webhook_url`` set, every accepted message gets its statuses posted
there once the send's answer is written, as the bridge forwards WhatsApp's acks (each
fake writes the body and the credential its bridge posts, ``status_post``): the bridge's
sent, delivered and read, one after the other (each post awaited). A number of
``fail_after_accept`` (digits; it need not be in ``numbers``) is accepted, then gets the
bridge's failure with that value as its code. ``status_copies`` posts each status that
many times (a retrying bridge); ``posted`` records ``(message id, status, HTTP status
answered)``; ``post_status`` posts one by hand; ``settle()`` waits for the posts under
way."""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from botmesh.providers.wa_bridges import BridgeProvider
from botmesh.state.errors import SendError
from botmesh.state.messages import Outbound
from tests.providers.fakes.status_posts import post_copies

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def refused(provider: BridgeProvider, message: Outbound) -> SendError:
    """The ``SendError`` that ``provider``, made for one test, raises sending ``message``
    (it is closed afterwards)."""
    try:
        with pytest.raises(SendError) as err:
            await provider.send(message)
    finally:
        await provider.close()
    return err.value


@dataclass
class Sent:
    """One message a fake accepted."""

    id: str
    #: The chat as the bridge resolved it (a JID).
    chat: str
    text: str | None = None
    caption: str | None = None
    #: ``image``, ``video``, ``audio``, ``document``, or ``None`` for a text.
    kind: str | None = None
    #: The media's bytes (decoded from base64), or its URL for a media the bridge fetches.
    media: bytes | str | None = None
    mime: str | None = None
    name: str | None = None
    #: The request body as it came.
    body: dict[str, Any] = field(default_factory=dict)


def digits(chat: str) -> str:
    """The number of a chat id (``5511…@s.whatsapp.net`` → ``5511…``)."""
    return re.sub(r"\D", "", chat.split("@", 1)[0])


class BridgeFake:
    """The shared part of a bridge fake. ``numbers`` are the WhatsApp accounts that exist
    (digits); subclasses add their routes in ``routes``."""

    def __init__(self, numbers: tuple[str, ...] = ("5511999990001", "5511999990002")) -> None:
        self.numbers = set(numbers)
        self.connected = True
        self.sent: list[Sent] = []
        self.calls: list[str] = []
        #: media an inbound message carried, by message id: ``(bytes, mime)``.
        self.media: dict[str, tuple[bytes, str]] = {}
        self._injected: deque[web.Response] = deque()
        self._seq = itertools.count(1)
        #: Where status webhooks are posted (``None``: nowhere).
        self.webhook_url: str | None = None
        #: Numbers (digits) whose messages are accepted, then fail with this code.
        self.fail_after_accept: dict[str, int | str] = {}
        #: How many times each status webhook is posted.
        self.status_copies = 1
        #: ``(message id, status, HTTP status the webhook URL answered)`` of every post.
        self.posted: list[tuple[str, str, int]] = []
        self._posting: set[asyncio.Task[None]] = set()

    # -- scripting ------------------------------------------------------------------------

    def fail_next(
        self,
        status: int,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        times: int = 1,
    ) -> None:
        """The next ``times`` calls get ``status`` with ``body`` (JSON; a ``str`` as text)."""
        for _ in range(times):
            if isinstance(body, str) or body is None:
                answer = web.Response(status=status, text=body or "", headers=headers)
            else:
                answer = web.json_response(body, status=status, headers=headers)
            self._injected.append(answer)

    def rate_limit(self, retry_after: str = "7") -> None:
        """The next call gets a proxy's 429 with ``Retry-After``."""
        self.fail_next(429, "Too Many Requests", headers={"Retry-After": retry_after})

    def texts(self) -> dict[str, list[str]]:
        """``chat -> [text or caption]`` of what was accepted."""
        out: dict[str, list[str]] = {}
        for m in self.sent:
            out.setdefault(m.chat, []).append(m.text or m.caption or "")
        return out

    def message_id(self) -> str:
        """A fresh WhatsApp message id (``3EB0`` and hex, as WhatsApp Web makes them)."""
        return f"3EB0{next(self._seq):04X}{secrets.token_hex(6).upper()}"

    def exists(self, number: str) -> bool:
        """Whether ``number`` (digits) has WhatsApp: in ``numbers`` or ``fail_after_accept``."""
        return number in self.numbers or number in self.fail_after_accept

    # -- status webhooks ------------------------------------------------------------------

    #: The bridge's names of sent, delivered and read, and of a failure.
    status_names: tuple[str, str, str, str] = ("sent", "delivered", "read", "failed")

    def status_post(
        self, sent: Sent, status: str, code: int | str | None
    ) -> tuple[dict[str, str], bytes]:  # pragma: no cover - abstract
        """The headers and body the bridge posts for status ``status`` of ``sent``."""
        raise NotImplementedError

    def sequence(self, chat: str) -> list[tuple[str, int | str | None]]:
        """The statuses an accepted message to ``chat`` gets, in order."""
        sent, delivered, read, failed = self.status_names
        code = self.fail_after_accept.get(digits(chat))
        if code is not None:
            return [(failed, code)]
        return [(sent, None), (delivered, None), (read, None)]

    async def post_status(self, sent: Sent, status: str, code: int | str | None = None) -> int:
        """Post one status webhook of ``sent`` to ``webhook_url`` (``status_copies`` times);
        the HTTP status of the last answer (0: the URL could not be reached)."""
        if self.webhook_url is None:
            raise RuntimeError(f"{type(self).__name__}.webhook_url is not set")
        headers, body = self.status_post(sent, status, code)
        return await post_copies(
            self.webhook_url,
            copies=self.status_copies,
            posted=self.posted,
            about=(sent.id, status),
            data=body,
            headers=headers,
        )

    async def _post_sequence(self, sent: Sent) -> None:
        for status, code in self.sequence(sent.chat):
            await self.post_status(sent, status, code)

    async def answer_then_post(
        self, request: web.Request, response: web.Response, sent: Sent
    ) -> web.Response:
        """Write the answer that accepted ``sent``, then start posting its statuses."""
        if self.webhook_url is None:
            return response
        await response.prepare(request)
        await response.write_eof()
        task = asyncio.create_task(self._post_sequence(sent))
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)
        return response

    async def settle(self) -> None:
        """Wait until every status sequence under way has been posted."""
        while self._posting:
            await asyncio.gather(*list(self._posting))

    # -- the app --------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._script], client_max_size=64 * 1024 * 1024)
        self.routes(app.router)
        return app

    def routes(self, router: web.UrlDispatcher) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @web.middleware
    async def _script(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.calls.append(f"{request.method} {request.path}")
        if self._injected:
            return self._injected.popleft()
        return await handler(request)
