"""The exit statuses of the ``botmesh`` operator commands (``replay``, ``status``,
``metrics``, ``dlq``): the one place they are defined.

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

from enum import IntEnum

__all__ = ["Exit"]


class Exit(IntEnum):
    OK = 0
    REFUSED = 1
    USAGE = 2
    UNREACHABLE = 3
    NO_ANSWER = 4
