"""The exit statuses of the ``botmesh`` commands (``replay``, ``status``, ``metrics``,
``dlq``, ``flows``, ``erase``, a usage error in any): the one place they are defined.

======  ===============  ===============================================================
status  name             meaning
======  ===============  ===============================================================
0       ``OK``           done (``--dry-run``: the real run would go ahead)
1       ``REFUSED``      a precondition does not hold, nothing was changed: the group has
                         live members (``replay`` without ``--force``, and a ``--dry-run``
                         the real run would refuse); nothing matched, or a chat's owner
                         refused an action (``dlq``)
2       ``USAGE``        a bad argument, option, environment variable or bot definition
                         (a bad command line too)
3       ``UNREACHABLE``  the broker did not answer within ``--timeout``, refused this client
                         (TLS, SASL), or a topic of the prefix does not exist (a wrong
                         ``--prefix``, or no ``botmesh topics create`` yet)
4       ``NO_ANSWER``    no answer from the chat's owner within ``--wait`` (``dlq``,
                         ``flows``: no worker running?)
======  ===============  ===============================================================

``botmesh worker`` has two more, for its supervisor: 75 (a batch abandoned: restart it) and
70 (an internal error); 130 is Ctrl-C.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Sequence
from enum import IntEnum

__all__ = ["Exit", "command_of", "stop_on_sigterm_until_started"]


class Exit(IntEnum):
    OK = 0
    REFUSED = 1
    USAGE = 2
    UNREACHABLE = 3
    NO_ANSWER = 4


def command_of(argv: Sequence[str]) -> str:
    """The command a ``botmesh`` command line names (its first word that is not an option
    or the value of ``--config``)."""
    words = iter(argv)
    for word in words:
        if word == "--config":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return ""


@functools.cache  # once a process
def stop_on_sigterm_until_started() -> None:
    """SIGTERM while ``botmesh worker`` starts (its bot module being imported, the topics
    provisioned) ends it with status 0: nothing has been consumed yet. Python's default
    would end it by the signal (status 143, or -15 to a parent), which a supervisor takes
    for a crash. The worker's own handlers replace this one once its event loop runs; this
    stop has ``BOTMESH_STOP_TIMEOUT`` seconds too. Installed once, as early as the process
    can (``python -m botmesh`` does it before importing the command line: this module
    imports the standard library only), and says so with ``botmesh worker: starting``."""

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one: the stop goes on
        print(
            "botmesh worker: SIGTERM before the worker started consuming: stopped, "
            "nothing consumed",
            file=sys.stderr,
            flush=True,
        )
        try:
            limit = float(os.environ.get("BOTMESH_STOP_TIMEOUT", "").strip() or 30)
        except ValueError:
            limit = 30.0
        # the status of a stop past its limit (``botmesh.streams.worker.loop.EXIT_SOFTWARE``)
        timer = threading.Timer(limit, os._exit, (70,))
        timer.daemon = True
        timer.start()
        raise SystemExit(Exit.OK)

    signal.signal(signal.SIGTERM, stop)
    print("botmesh worker: starting", file=sys.stderr, flush=True)
