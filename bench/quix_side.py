"""The Quix Streams side of ``bench_worker.py``: what a user would pick instead of botmesh.

    .venv-quix/bin/python bench/quix_side.py BOOTSTRAP SRC DST GROUP STATE_DIR
    .venv-quix/bin/python bench/quix_side.py --version

Runs in its own virtualenv (``make quix-venv``: quixstreams 3.28 needs confluent-kafka < 2.13,
botmesh pins 2.16), so it imports only quixstreams and the standard library, never botmesh.

A stateful Quix Streams application: for each record of SRC (JSON, keyed by chat id), a
stateful filter looks the record's ``id`` up in the Quix State of its key (RocksDB in
STATE_DIR, backed by Quix's changelog topic): seen, the record is dropped; else the id is
stored and a reply (``{"in_reply_to": id, "chat_id": ..., "text": ...}``, JSON, same key)
goes to DST. Quix's defaults otherwise: processing guarantee at-least-once, a checkpoint
(offsets committed, state flushed to RocksDB and its changelog) every 5 s (``commit_interval``;
``commit_every`` 0: no count trigger), changelog topics on, the idempotent producer
(``enable.idempotence``), to which ``acks=all`` is added explicitly. Not a default:
``auto_offset_reset="earliest"`` (Quix's is ``latest``), as for the other baselines, so that
no record sent before the group's first assignment is skipped. Stops on SIGTERM (Quix's own
handler: a last checkpoint).

``importlib`` keeps the quixstreams boundary ``Any``, so mypy in botmesh's venv (which
cannot have quixstreams) checks this file clean.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

#: Producer settings added to Quix's (``enable.idempotence`` already implies acks=all).
PRODUCER_EXTRA = {"acks": "all"}


def quixstreams() -> Any:
    return importlib.import_module("quixstreams")


def first_sighting(value: dict[str, Any], state: Any) -> bool:
    """Quix stateful filter: True (keep) the first time an ``id`` is seen under this key."""
    rid = value["id"]
    if state.exists(rid):
        return False
    state.set(rid, True)
    return True


def reply(value: dict[str, Any]) -> dict[str, Any]:
    return {"in_reply_to": value["id"], "chat_id": value["chat_id"], "text": value["text"]}


def build(bootstrap: str, src: str, dst: str, group: str, state_dir: str) -> Any:
    """The Quix ``Application``, its dataframe registered: SRC -> dedupe -> reply -> DST."""
    app = quixstreams().Application(
        broker_address=bootstrap,
        consumer_group=group,
        state_dir=state_dir,
        auto_offset_reset="earliest",
        producer_extra_config=PRODUCER_EXTRA,
    )
    inbound = app.topic(src, value_deserializer="json")  # key: bytes, passed through
    replies = app.topic(dst, value_serializer="json")
    sdf = app.dataframe(inbound)
    sdf = sdf.filter(first_sighting, stateful=True)
    sdf = sdf.apply(reply)
    sdf.to_topic(replies)
    return app


def main(argv: list[str]) -> int:
    if argv == ["--version"]:
        print(quixstreams().__version__)
        return 0
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    app = build(*argv)
    config = app.config
    print(
        f"quixstreams {quixstreams().__version__}: processing_guarantee "
        f"{config.processing_guarantee}, commit_interval {config.commit_interval} s, "
        f"commit_every {config.commit_every}, changelog topics {config.use_changelog_topics}, "
        f"producer {dict(config.producer_extra_config)}",
        flush=True,
    )
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
