"""The ``botmesh`` command line (also ``python -m botmesh``), a module a command.

- ``main``: the root group (``--config``, ``--version``) with every command added, and
  ``main``, the console script, which turns errors into exit statuses;
- ``options``: the options many commands share (``--prefix``/``--bootstrap``, ``--json``,
  ``--timeout``, ``--wait``) and what they resolve to;
- ``exit``: the exit statuses and the worker's SIGTERM-before-start handling;
- ``load``: loading ``--app`` (a bot definition) and ``--provider`` (and the fallbacks);
- a command (or a command group) each: ``run`` (with ``stdin``, its runtime), ``worker``,
  ``topics``, ``produce``, ``send``, ``receipts``, ``dlq``, ``flows``, ``erase``,
  ``operator`` (``replay``, ``status``, ``metrics``), ``gateway``, ``console`` (the web
  console), ``completion``.

Each command module holds its Click options right above its body, and imports its Kafka-side
work when it runs: importing the command line loads no Kafka client. This file imports
nothing, so that ``python -m botmesh`` can set up the worker's SIGTERM handling
(``exit.stop_on_sigterm_until_started``) before the command line loads.
"""
