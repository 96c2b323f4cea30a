"""botmesh: durable chat bots on Apache Kafka.

A bot is a definition (``Bot``: handlers, flows, hooks, listeners, durability policy); a
runtime runs it: ``botmesh.run(bot, provider, journal=...)`` in this process, ``botmesh
worker --app module:bot`` on Kafka. The error tree is ``botmesh.errors``; the journal's names
(backends, records, the SPI) are in ``botmesh.journal``; the crash-test kit is
``botmesh.testing``. ``tests/test_exports.py`` holds this surface to ``__all__``.
"""

from botmesh._bot import Bot
from botmesh._flows import Conversation
from botmesh._media import load_media_of
from botmesh._runtime import Context, Runtime, run
from providers.console import ConsoleProvider
from state.config import DurabilityConfig
from state.errors import FlowCancelled, FlowTimeout
from state.events import AmbiguousEvent, DeadEvent, ErrorEvent, FlowEndedEvent, SentEvent
from state.inbox import Outcome
from state.messages import Inbound, Media, Outbound, Receipt, SendResult
from state.ports import Provider

__version__ = "0.1.0.dev0"

__all__ = [
    "AmbiguousEvent",
    "Bot",
    "ConsoleProvider",
    "Context",
    "Conversation",
    "DeadEvent",
    "DurabilityConfig",
    "ErrorEvent",
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
