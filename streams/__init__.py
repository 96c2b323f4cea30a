"""The Kafka edge: the Faust app and its agents. The only package that imports Kafka or Faust.

Modules: ``streams.worker`` (the Faust app: ``build_app``, ``run_worker``), ``streams.config``
(``WorkerConfig`` and the worker's journal rule, no Faust), ``streams.runner`` (the inbound
path without Faust: ``InboundRunner``, ``KafkaReceipts``, the ``BotDefinition`` and
``RuntimeLike`` protocols), ``streams.provision`` (idempotent topic creation),
``streams.tools`` (demo traffic and the receipts tail). Import them directly; this package
imports nothing heavy itself.
"""
