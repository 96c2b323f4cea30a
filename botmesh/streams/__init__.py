"""The Kafka edge. The only package that imports a Kafka client (confluent-kafka).

Its floor plan:

- ``worker``: the worker's runtime (its loop, its consumer, its producer and the journal's
  changelog on it, the restore, the checkpoint, what operators see);
- the parts the worker and the tools share, here: ``runner`` (the inbound path:
  ``InboundRunner``, the ``BotDefinition`` and ``RuntimeLike`` protocols; the records it
  takes, ``raw_record``), ``dead_letter_copies`` (a record that cannot be settled, copied
  to its DLQ, cut to fit), ``sink`` (``KafkaReceipts``: receipts, parked retries, the
  journal's dead records), ``table_kv`` and ``journal_db`` (the journal over a changelog,
  on disk), ``write_behind`` (the journal writes nothing waits for, and their flush),
  ``retry_tiers``, ``membership`` (joining the group), ``config`` (``WorkerConfig``),
  ``connection`` (TLS and SASL for every client), ``provision`` (idempotent topic
  creation), ``gateway`` (the webhook gateway's Kafka side);
- ``ops``: the operator's tools (status, replay, dead letters, demo traffic, the receipts
  tail), apart from the worker.

Import the modules directly; this package imports nothing heavy itself.
"""
