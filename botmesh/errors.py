"""Every error botmesh raises on purpose, in one tree (drawn in ``botmesh.state.errors``), for
example ``from botmesh.errors import SendDeferredError, JournalUnavailableError``."""

from botmesh.state import errors as _tree
from botmesh.state.errors import *  # noqa: F403 - the tree is re-exported whole, as it is defined

__all__ = _tree.__all__
