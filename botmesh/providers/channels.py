"""The channel registry: a channel name → its provider class and its webhook class.

Classes are named as ``"module:Class"`` strings and imported only when asked for, so naming
a channel loads that channel's module and nothing else. Each class builds itself from the
environment with ``from_env(env)`` (credentials included), raising ``ConfigError`` that names
the missing or bad variable.

Used by ``botmesh gateway --channel NAME`` (the webhooks) and ``botmesh worker --provider
NAME`` (the sending adapter).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botmesh.providers.webhooks import ChannelWebhook
from botmesh.state.errors import ConfigError
from botmesh.state.ports import Provider

__all__ = [
    "CHANNELS",
    "Channel",
    "channel",
    "provider_from_env",
    "webhook_from_env",
]


@dataclass(frozen=True, slots=True)
class Channel:
    """One channel: ``provider`` and ``webhook`` are ``"module:Class"`` (``None``: none)."""

    name: str
    provider: str | None
    webhook: str | None


CHANNELS: Mapping[str, Channel] = {
    c.name: c
    for c in (
        Channel(
            "telegram",
            "botmesh.providers.telegram:TelegramProvider",
            "botmesh.providers.telegram:TelegramWebhook",
        ),
        Channel(
            "whatsapp",
            "botmesh.providers.whatsapp:WhatsAppProvider",
            "botmesh.providers.whatsapp:WhatsAppWebhook",
        ),
        Channel(
            "messenger",
            "botmesh.providers.messenger:MessengerProvider",
            "botmesh.providers.messenger:MessengerWebhook",
        ),
        Channel(
            "instagram",
            "botmesh.providers.instagram:InstagramProvider",
            "botmesh.providers.instagram:InstagramWebhook",
        ),
        Channel(
            "discord",
            "botmesh.providers.discord:DiscordProvider",
            "botmesh.providers.discord:DiscordWebhook",
        ),
        Channel(
            "twilio",
            "botmesh.providers.twilio:TwilioProvider",
            "botmesh.providers.twilio:TwilioWebhook",
        ),
        Channel(
            "email", "botmesh.providers.email:EmailProvider", "botmesh.providers.email:EmailWebhook"
        ),
        Channel(
            "gupshup",
            "botmesh.providers.gupshup:GupshupProvider",
            "botmesh.providers.gupshup:GupshupWebhook",
        ),
        Channel(
            "gohighlevel",
            "botmesh.providers.gohighlevel:GoHighLevelProvider",
            "botmesh.providers.gohighlevel:GoHighLevelWebhook",
        ),
        Channel(
            "tiktok",
            "botmesh.providers.tiktok:TikTokProvider",
            "botmesh.providers.tiktok:TikTokWebhook",
        ),
        Channel("slack", None, "botmesh.providers.slack:SlackWebhook"),
        Channel(
            "baileys",
            "botmesh.providers.baileys:BaileysProvider",
            "botmesh.providers.baileys:BaileysWebhook",
        ),
        Channel(
            "evolution",
            "botmesh.providers.evolution:EvolutionProvider",
            "botmesh.providers.evolution:EvolutionWebhook",
        ),
        Channel(
            "wppconnect",
            "botmesh.providers.wppconnect:WppConnectProvider",
            "botmesh.providers.wppconnect:WppConnectWebhook",
        ),
    )
}


def channel(name: str, option: str = "channel") -> Channel:
    """The registry entry of ``name`` (case and blanks ignored); ``ConfigError`` naming
    ``option`` and listing the known channels otherwise."""
    key = name.strip().lower()
    found = CHANNELS.get(key)
    if found is None:
        raise ConfigError(
            option,
            f"unknown channel {name!r}; known channels: {', '.join(sorted(CHANNELS))}",
        )
    return found


def _load(target: str, option: str) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            option,
            f"cannot import {module_name} for {target} ({exc}); this botmesh has no such "
            "adapter yet, or a dependency of it is missing",
        ) from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ConfigError(option, f"{module_name} has no {attr}; the registry names {target}")
    return cls


def webhook_from_env(name: str, env: Mapping[str, str]) -> ChannelWebhook:
    """The webhook of channel ``name``, built by its class's ``from_env(env)``."""
    entry = channel(name)
    if entry.webhook is None:
        raise ConfigError("channel", f"channel {entry.name!r} has no webhook adapter")
    webhook = _load(entry.webhook, "channel").from_env(env)
    if not isinstance(webhook, ChannelWebhook):
        raise ConfigError("channel", f"{entry.webhook} is not a ChannelWebhook")
    return webhook


def provider_from_env(name: str, env: Mapping[str, str]) -> Provider:
    """The sending adapter of channel ``name``, built by its class's ``from_env(env)``."""
    entry = channel(name, "provider")
    if entry.provider is None:
        with_provider = sorted(n for n, c in CHANNELS.items() if c.provider is not None)
        raise ConfigError(
            "provider",
            f"channel {entry.name!r} has no sending adapter (only its webhook, for the "
            f"gateway); channels with one: {', '.join(with_provider)}",
        )
    provider = _load(entry.provider, "provider").from_env(env)
    if not isinstance(provider, Provider):
        raise ConfigError("provider", f"{entry.provider} is not a Provider")
    return provider
