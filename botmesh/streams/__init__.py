"""The Kafka edge: the Faust app and its agents. The only package that imports Kafka or Faust.

Modules: ``botmesh.streams.worker`` (the Faust app: ``build_app``, ``run_worker``),
``botmesh.streams.config``
(``WorkerConfig`` and the worker's journal rule, no Faust), ``botmesh.streams.runner`` (the inbound
path without Faust: ``InboundRunner``, ``KafkaReceipts``, the ``BotDefinition`` and
``RuntimeLike`` protocols), ``botmesh.streams.provision`` (idempotent topic creation),
``botmesh.streams.tools`` (demo traffic and the receipts tail). Import them directly; this package
imports nothing heavy itself.
"""
