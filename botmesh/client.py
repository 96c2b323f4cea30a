"""A bot on Kafka, from another service: ``request_send`` asks the worker that owns a chat
to send to it (a cron job, a billing service, an operator's script).

The request goes to ``<prefix>.requests``, keyed by the chat id, so it lands in the chat's
partition; the worker journals it under its idempotency key and delivers it in the chat's
order, and its receipt comes on ``<prefix>.sent``. Importing this module loads the Kafka
client (``confluent-kafka``); ``botmesh`` itself does not.
"""

from botmesh.streams.ops.tools import request_send

__all__ = ["request_send"]
