"""What the fakes of the three WhatsApp Web bridges share (``baileys``, ``evolution``,
``wppconnect`` in this package): answers scripted ahead of the real ones (a proxy's 429 with
``Retry-After``, a 5xx, any error body), the calls seen, the messages accepted, and the
WhatsApp numbers that exist; and ``refused``, for their tests."""

from __future__ import annotations

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
