"""A send's fallback: what goes out instead when the channel refuses the send for a reason
a different message (or channel) can get around, sent exactly once.

The case it is for: WhatsApp (and Messenger, Instagram, Twilio's WhatsApp) refuses a free
text to a user who has not written in the last 24 hours (``OutsideSessionWindowError``);
an approved template may still go out. A send names its fallback::

    await ctx.reply("Your order shipped", fallback=Fallback.template("order_update", "en"))

The fallback is journaled with the send (on its first part). When an attempt fails with one
of the errors the fallback names (by default ``OutsideSessionWindowError``), the record
switches to the fallback in one journal write: its payload becomes the fallback's, and from
then on every attempt goes out under the fallback's own key, derived from the original's
(``<key>~fallback``), through the fallback's channel when it names one. A crash after the
switch resumes the fallback, never the original; the switch happens at most once (the
fallback's own failures are retried or dead-lettered like any send, never fall back again).
The receipt of the send carries ``fallback_key``: present, the fallback went out;
absent, the original did. The later parts of a split text whose first part fell back are
not sent (dead, reason ``superseded-by-fallback``): the fallback replaces the whole text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from botmesh.state import errors as _errors
from botmesh.state.errors import SendError
from botmesh.state.keys import FALLBACK_SUFFIX
from botmesh.state.messages import Outbound, no_surrogates
from botmesh.state.records import Json

__all__ = [
    "FALLBACK_SUFFIX",
    "Fallback",
    "Route",
    "fallback_key",
    "fallback_payload",
    "routed",
    "switches",
]


def _send_errors() -> frozenset[str]:
    names = (getattr(_errors, n, None) for n in _errors.__all__)
    return frozenset(c.__name__ for c in names if isinstance(c, type) and issubclass(c, SendError))


class Fallback(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What to send instead when the channel refuses a send with one of ``on``.

    ``text`` and ``options`` replace the send's (``options`` carries a channel's template:
    ``Fallback.template``); its media is dropped unless ``keep_media``. ``channel`` names
    another channel to send it through (a provider given to the runtime as a fallback
    channel: ``botmesh.run(..., fallbacks={name: provider})`` or the worker's
    ``BOTMESH_FALLBACK_PROVIDERS``), to ``chat_id`` there (default: the same chat id).
    """

    text: str | None = None
    options: dict[str, Any] = {}
    channel: str | None = None
    chat_id: str | None = None
    keep_media: bool = False
    #: The names of the errors that make the send fall back (``SendError`` subclasses).
    on: tuple[str, ...] = ("OutsideSessionWindowError",)

    def __post_init__(self) -> None:
        if self.text is not None and not isinstance(self.text, str):
            raise TypeError(f"Fallback.text must be a string, got {type(self.text).__name__}")
        if not isinstance(self.options, dict):
            raise TypeError("Fallback.options must be a dict (a channel's options)")
        no_surrogates(
            "a send's",
            {
                "fallback.text": self.text,
                "fallback.options": self.options or None,
                "fallback.chat_id": self.chat_id,
            },
        )
        if self.text is None and not self.options and not self.keep_media:
            raise ValueError(
                "Fallback: give a text, options (a template: Fallback.template(...)) or "
                "keep_media=True; an empty fallback would send nothing"
            )
        for what in ("channel", "chat_id"):
            value = getattr(self, what)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"Fallback.{what} must be a non-empty string or None")
        if not self.on:
            raise ValueError("Fallback.on names no error: it would never apply")
        known = _send_errors()
        unknown = [n for n in self.on if n not in known]
        if unknown:
            raise ValueError(
                f"Fallback.on: {', '.join(map(repr, unknown))} is not a send error; "
                f"known: {', '.join(sorted(known))}"
            )

    @classmethod
    def template(
        cls,
        name: str,
        language: str,
        components: Sequence[Mapping[str, Any]] = (),
        *,
        channel: str | None = None,
        chat_id: str | None = None,
    ) -> Fallback:
        """A WhatsApp message template (``options["template"]``: what the WhatsApp adapter
        sends as ``{"type": "template", ...}``), approved in WhatsApp Manager."""
        if not name or not language:
            raise ValueError("Fallback.template needs the template's name and language code")
        template: dict[str, Any] = {"name": name, "language": language}
        if components:
            template["components"] = [dict(c) for c in components]
        return cls(options={"template": template}, channel=channel, chat_id=chat_id)

    def to_json(self) -> Json:
        out: Json = msgspec.to_builtins(self)
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Fallback:
        return msgspec.convert(value, cls)


def fallback_key(key: str) -> str:
    """The key the fallback of send ``key`` goes out under."""
    return key + FALLBACK_SUFFIX


def switches(value: Json, exc: BaseException) -> Fallback | None:
    """The fallback a record switches to after ``exc``; ``None`` when it has none, it was
    used already, or ``exc`` is not one it names."""
    spec = value.get("fallback")
    if not isinstance(spec, dict) or spec.get("used"):
        return None
    names = {c.__name__ for c in type(exc).__mro__}
    fallback = Fallback.from_json({k: v for k, v in spec.items() if k != "used"})
    return fallback if names.intersection(fallback.on) else None


def fallback_payload(payload: Json, fallback: Fallback) -> Json:
    """The journaled payload of the fallback of a send whose payload is ``payload``. It
    keeps the send's chat id (the chat's order and locks follow the record); the
    recipient on another channel is applied when it goes out (``routed``)."""
    out: Json = {"chat_id": payload["chat_id"]}
    if fallback.text is not None:
        out["text"] = fallback.text
    if fallback.keep_media and payload.get("media") is not None:
        out["media"] = payload["media"]
    if fallback.options:
        out["options"] = dict(fallback.options)
    return out


class Route(msgspec.Struct, frozen=True):
    """Where one attempt of a send goes: under ``key``, as ``message``, through ``channel``
    (``None``: the bot's own provider). ``op`` (``edit``, ``delete``) makes it a change of
    the channel's message ``target`` (``botmesh.state.edits``), not a send."""

    key: str
    message: Outbound
    channel: str | None = None
    op: str | None = None
    target: str | None = None


def routed(value: Json, message: Outbound) -> Route:
    """The route of an attempt of the record ``value`` whose payload decodes to
    ``message``: the send itself, or its fallback once the record switched to it."""
    spec = value.get("fallback")
    op = value.get("op")
    if op is not None:
        return Route(value["key"], message, None, str(op), str(value.get("target")))
    if not isinstance(spec, dict) or not spec.get("used"):
        return Route(value["key"], message)
    to = spec.get("chat_id")
    if to:
        message = msgspec.structs.replace(message, chat_id=to)
    return Route(str(spec.get("key") or fallback_key(value["key"])), message, spec.get("channel"))
