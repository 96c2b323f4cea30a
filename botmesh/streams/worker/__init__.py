"""The Kafka worker's runtime on librdkafka (confluent-kafka) and rocksdict, being built
beside ``botmesh.streams.faust_app``, which runs the worker until the switch: the clients'
settings (``clients``), the journal's changelog (``changelog``) and its restore
(``restore``)."""
