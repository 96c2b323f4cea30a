"""botmesh: durable chat bots on Apache Kafka.

A bot is a definition (``Bot``: handlers, flows, hooks, listeners, durability policy); a
runtime runs it: ``botmesh.run(bot, provider, journal=...)`` in this process, ``botmesh
worker --app module:bot`` on Kafka. The error tree is ``botmesh.errors``; the journal's names
(backends, records, the SPI) are in ``botmesh.journal``; the crash-test kit is
``botmesh.testing``. ``tests/test_exports.py`` holds this surface to ``__all__``.
"""

import importlib as _importlib
import typing as _typing

from botmesh._version import __version__

#: Each public name and the module it lives in. They load when first used, so importing
#: ``botmesh`` (or any of its subpackages, which imports this module first) costs nothing.
_WHERE = {
    "AmbiguousEvent": "botmesh.state.events",
    "Bot": "botmesh._bot.bot",
    "Campaign": "botmesh._bot.broadcast",
    "ConsoleProvider": "botmesh.providers.console",
    "Context": "botmesh._bot.context",
    "Conversation": "botmesh._bot.conversation",
    "DeadEvent": "botmesh.state.events",
    "DurabilityConfig": "botmesh.state.config",
    "ErasedEvent": "botmesh.state.events",
    "ErrorEvent": "botmesh.state.events",
    "Fallback": "botmesh.state.fallback",
    "FallbackEvent": "botmesh.state.events",
    "FlowCancelled": "botmesh.state.errors",
    "FlowEndedEvent": "botmesh.state.events",
    "FlowTimeout": "botmesh.state.errors",
    "Inbound": "botmesh.state.messages",
    "Media": "botmesh.state.messages",
    "Outbound": "botmesh.state.messages",
    "Outcome": "botmesh.state.inbox",
    "Provider": "botmesh.state.ports",
    "Receipt": "botmesh.state.messages",
    "Runtime": "botmesh._bot.runtime",
    "SendResult": "botmesh.state.messages",
    "SentEvent": "botmesh.state.events",
    "load_media_of": "botmesh._bot.media",
    "run": "botmesh._bot.bot",
}

if _typing.TYPE_CHECKING:
    from botmesh._bot.bot import Bot, run
    from botmesh._bot.broadcast import Campaign
    from botmesh._bot.context import Context
    from botmesh._bot.conversation import Conversation
    from botmesh._bot.media import load_media_of
    from botmesh._bot.runtime import Runtime
    from botmesh.providers.console import ConsoleProvider
    from botmesh.state.config import DurabilityConfig
    from botmesh.state.errors import FlowCancelled, FlowTimeout
    from botmesh.state.events import (
        AmbiguousEvent,
        DeadEvent,
        ErasedEvent,
        ErrorEvent,
        FallbackEvent,
        FlowEndedEvent,
        SentEvent,
    )
    from botmesh.state.fallback import Fallback
    from botmesh.state.inbox import Outcome
    from botmesh.state.messages import Inbound, Media, Outbound, Receipt, SendResult
    from botmesh.state.ports import Provider


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'botmesh' has no attribute {name!r}")
    value = getattr(_importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "AmbiguousEvent",
    "Bot",
    "Campaign",
    "ConsoleProvider",
    "Context",
    "Conversation",
    "DeadEvent",
    "DurabilityConfig",
    "ErasedEvent",
    "ErrorEvent",
    "Fallback",
    "FallbackEvent",
    "FlowCancelled",
    "FlowEndedEvent",
    "FlowTimeout",
    "Inbound",
    "Media",
    "Outbound",
    "Outcome",
    "Provider",
    "Receipt",
    "Runtime",
    "SendResult",
    "SentEvent",
    "__version__",
    "load_media_of",
    "run",
]
