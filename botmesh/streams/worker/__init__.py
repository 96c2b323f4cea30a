"""The Kafka worker's runtime on librdkafka (confluent-kafka) and rocksdict, being built
beside ``botmesh.streams.faust_app``, which runs the worker until the switch (issue 38).

Its floor plan, a module a concern (built: the first four; to build: the rest):

- ``clients``: the librdkafka settings of the worker's consumer and its one producer
  (murmur2 keys, acks=all and idempotence, cooperative-sticky, static membership,
  read_committed; one ``transactional.id`` a worker under ``exactly_once``);
- ``changelog``: the journal's ``ChangelogPort`` on that producer (acked, or committed,
  records written to RocksDB in one batch a wake-up; a fence is a ``FencedError``);
- ``restore``: a journal partition's RocksDB brought up to its changelog's end, bounded by
  the high watermark, read ``read_committed``;
- ``consumer``: the one consumer, driven from a thread of its own; the side topics
  (requests, control) co-partitioned with the inbound in its rebalance callbacks;
- ``checkpoint``: what must be durable before an offset is acknowledged (the journal's
  flush, then the offsets: a consumer commit, or the transaction);
- to build: the loop (batches through ``botmesh.streams.runner.InboundRunner``, the
  in-flight limit, pause and resume), the membership fence (a member id the coordinator
  lists, asked every quarter of the session timeout), dead letters and receipts in the
  transaction, the retry tiers on librdkafka, readiness and metrics.
"""
