"""The Kafka edge. The only package that imports Kafka or Faust.

Its floor plan:

- the worker's parts that do not know Faust, here: ``runner`` (the inbound path:
  ``InboundRunner``, ``KafkaReceipts``, the ``BotDefinition`` and ``RuntimeLike``
  protocols), ``table_kv`` and ``journal_db`` (the journal over a changelog, on disk),
  ``retry_tiers``, ``membership`` (joining the group), ``config`` (``WorkerConfig``),
  ``connection`` (TLS and SASL for every client), ``provision`` (idempotent topic
  creation), ``gateway`` (the webhook gateway's Kafka side);
- ``faust_app``: everything that knows Faust (the app, the table, the workarounds);
- ``ops``: the operator's tools (status, replay, dead letters, demo traffic, the receipts
  tail), apart from the worker.

Import the modules directly; this package imports nothing heavy itself.
"""
