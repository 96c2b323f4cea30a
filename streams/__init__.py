"""The Kafka edge: the Faust app and its agents. The only package that imports Kafka or Faust.

Modules: ``streams.worker`` (the Faust app: ``WorkerConfig``, ``build_app``, ``run_worker``),
``streams.runner`` (the inbound path: ``BotLike``, ``InboundRunner``), ``streams.provision``
(idempotent topic creation), ``streams.tools`` (demo traffic and the receipts tail). Import
them directly; this package imports nothing heavy itself.
"""
