"""The exit statuses of the ``botmesh`` command: the one place they are defined.

======  ============  ==================================================================
status  name          meaning
======  ============  ==================================================================
0       ``OK``        done (``--dry-run``: the real run would go ahead)
1       ``REFUSED``   a precondition does not hold, nothing was changed: the group has
                      live members (``replay`` without ``--force``; a ``--dry-run`` that
                      the real run would refuse), a topic of the prefix does not exist
                      (``replay``, ``status``, ``metrics``)
2       ``USAGE``     a bad argument, option, environment variable or bot definition
                      (argparse's own status for a bad command line too)
3       ``UNREACHABLE``  the broker did not answer within ``--timeout``
======  ============  ==================================================================

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
