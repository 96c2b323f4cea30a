"""Channel adapters. They implement ``botmesh.state.ports.Provider`` and never import a
Kafka client."""

from botmesh.providers.console import ConsoleProvider
from botmesh.providers.mock import MockProvider, SentCall

__all__ = ["ConsoleProvider", "MockProvider", "SentCall"]
