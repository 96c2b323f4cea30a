"""The Kafka worker's runtime on librdkafka (confluent-kafka) and rocksdict.

Its floor plan, a module a concern:

- ``loop``: the worker's life (start, the batches through
  ``botmesh.streams.runner.InboundRunner``, the in-flight limit, the stop) and the
  membership fence (a member id the coordinator lists, asked every eighth of the session
  timeout);
- ``consumer``: the one consumer, driven from a thread of its own; the side topics
  (requests, control) co-partitioned with the inbound in its rebalance callbacks;
- ``checkpoint``: what must be durable before an offset is acknowledged (the journal's
  flush, then the offsets: a consumer commit, or the transaction);
- ``changelog``: the worker's one producer and the journal's ``ChangelogPort`` on it
  (acked, or committed, records written to RocksDB in one batch a wake-up; receipts, dead
  letters and parked retries through it too, in the transaction under ``exactly_once``; a
  fence is a ``FencedError``);
- ``restore``: a journal partition's RocksDB brought up to its changelog's end, bounded by
  the high watermark, read ``read_committed``;
- ``clients``: the librdkafka settings of the consumer and the producer (murmur2 keys,
  acks=all and idempotence, cooperative-sticky, static membership, read_committed; one
  ``transactional.id`` a worker under ``exactly_once``);
- ``observe``: what operators see (``/readyz``, the ``/metrics`` samples, the counters on
  ``<prefix>.metrics``).

A floor up, shared with the operator tools and the tests: the inbound path
(``botmesh.streams.runner``), the journal table (``botmesh.streams.table_kv``, on
``journal_db``; its write-behind, ``botmesh.streams.write_behind``), the dead letters
(``botmesh.streams.dead_letter_copies``), the sink of receipts and parked retries
(``botmesh.streams.sink``) and the retry tiers (``botmesh.streams.retry_tiers``).
"""
