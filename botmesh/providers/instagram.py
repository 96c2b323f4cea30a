"""Instagram messaging (Instagram accounts linked to a Facebook Page): the Messenger
Platform's API, so ``InstagramProvider`` and ``InstagramWebhook`` are Messenger's with
another name, limit and ``object``.

Endpoint: ``POST /me/messages`` on ``graph.facebook.com`` with the **Page** access token of
the Page the Instagram account is linked to (``INSTAGRAM_ACCESS_TOKEN``); ``me`` is that
Page and ``recipient.id`` an Instagram-scoped id (IGSID). This needs no account id, so
``INSTAGRAM_ACCOUNT_ID`` is not read. (The newer "Instagram API with Instagram Login"
posts to ``graph.instagram.com/{ig_id}/messages`` with an Instagram user token: point
``INSTAGRAM_API_URL`` at ``https://graph.instagram.com/v21.0`` to use it with a token whose
``me`` is the Instagram account.)

Texts are at most 1000 characters. Inbound attachments (``image``, ``video``, ``audio``,
``file``, ``share``, ``story_mention``, ``ig_reel``…) keep their CDN URL
(``cdninstagram.com``, ``fbcdn.net``, ``fbsbx.com``).
"""

from __future__ import annotations

from typing import ClassVar

from botmesh.providers.messenger import MessengerProvider, MessengerWebhook

__all__ = ["InstagramProvider", "InstagramWebhook"]


class InstagramProvider(MessengerProvider):
    """Sends as the Instagram account linked to a Page (the Page's access token)."""

    name = "instagram"
    text_limit: int | None = 1000
    media_channel = "instagram"
    token_env: ClassVar[str] = "INSTAGRAM_ACCESS_TOKEN"
    env_prefix: ClassVar[str] = "INSTAGRAM"


class InstagramWebhook(MessengerWebhook):
    """``instagram`` webhooks (``messages``, ``messaging_postbacks``)."""

    channel: str = "instagram"
    env_prefix: ClassVar[str] = "INSTAGRAM"
    object: ClassVar[str] = "instagram"
