"""The durable core: records, the error tree, the ``DurableKv`` and ``Provider`` ports, the
inbox and outbox state machines, leases and fencing, and the journal backends.

Imports nothing from Kafka (``tests/test_layering.py`` checks it).
"""
