"""The wire: topic catalog (names from one prefix), record schemas and keying by chat id.

Pure data: no Kafka client, and of ours only ``state`` (the message model of
``botmesh.state.messages`` and the error tree of ``botmesh.state.errors``).
``botmesh.streams.provision`` creates the topics; the records are
``botmesh.state.messages.Inbound``, ``Receipt`` and ``DeliveryStatus`` and the send request
``SendRequest`` (defined here); refused ones raise ``botmesh.state.errors.BadRecord``.
"""

from botmesh.topics.catalog import (
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    PREFIX_ENV,
    RETRY_TIERS,
    TABLES,
    Catalog,
    TopicSpec,
    prefix_from_env,
)
from botmesh.topics.records import (
    SCHEMA_VERSION,
    SendRequest,
    chat_key,
    decode_inbound,
    decode_receipt,
    decode_request,
    decode_status,
    encode_inbound,
    encode_receipt,
    encode_request,
    encode_status,
    schema,
)

__all__ = [
    "DEFAULT_PARTITIONS",
    "DEFAULT_PREFIX",
    "PREFIX_ENV",
    "RETRY_TIERS",
    "SCHEMA_VERSION",
    "TABLES",
    "Catalog",
    "SendRequest",
    "TopicSpec",
    "chat_key",
    "decode_inbound",
    "decode_receipt",
    "decode_request",
    "decode_status",
    "encode_inbound",
    "encode_receipt",
    "encode_request",
    "encode_status",
    "prefix_from_env",
    "schema",
]
