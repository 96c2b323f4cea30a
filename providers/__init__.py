"""Channel adapters. They implement ``state.ports.Provider`` and never import Kafka or Faust."""

from providers.console import ConsoleProvider
from providers.mock import MockProvider, SentCall

__all__ = ["ConsoleProvider", "MockProvider", "SentCall"]
