"""How the fakes post a status webhook: ``copies`` times (a channel retrying), each answer's
HTTP status recorded (0: the URL could not be reached)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

__all__ = ["post_copies"]


async def post_copies(
    url: str,
    *,
    copies: int,
    posted: list[tuple[str, str, int]],
    about: tuple[str, str],
    data: bytes | Mapping[str, str] | None = None,
    json: Any = None,
    headers: Mapping[str, str] | None = None,
) -> int:
    """Post ``data`` (or ``json``) to ``url`` ``copies`` times (at least once); each answer is
    appended to ``posted`` as ``(message id, status, HTTP status)`` (``about``: the message id
    and the status). Returns the last answer's HTTP status."""
    answered = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(max(1, copies)):
            try:
                async with session.post(
                    url, data=data, json=json, headers=dict(headers or {})
                ) as r:
                    answered = r.status
            except aiohttp.ClientError:
                answered = 0
            posted.append((*about, answered))
    return answered
