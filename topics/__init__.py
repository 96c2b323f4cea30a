"""The wire: topic catalog (names from one prefix), record schemas and keying by chat id.

Pure data: no Kafka client and nothing else of ours. ``streams.provision`` creates the topics.
"""

from topics.catalog import (
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX,
    PREFIX_ENV,
    RETRY_TIERS,
    TABLES,
    Catalog,
    TopicSpec,
    prefix_from_env,
)
from topics.records import (
    REASONS,
    SCHEMA_VERSION,
    BadRecord,
    InboundRecord,
    MediaRef,
    ReceiptRecord,
    chat_key,
    decode_inbound,
    decode_receipt,
    encode_inbound,
    encode_receipt,
    schema,
)

__all__ = [
    "DEFAULT_PARTITIONS",
    "DEFAULT_PREFIX",
    "PREFIX_ENV",
    "REASONS",
    "RETRY_TIERS",
    "SCHEMA_VERSION",
    "TABLES",
    "BadRecord",
    "Catalog",
    "InboundRecord",
    "MediaRef",
    "ReceiptRecord",
    "TopicSpec",
    "chat_key",
    "decode_inbound",
    "decode_receipt",
    "encode_inbound",
    "encode_receipt",
    "prefix_from_env",
    "schema",
]
