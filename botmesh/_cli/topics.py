"""``botmesh topics create|list``: the topics of a prefix (``botmesh.topics.catalog``), made
or listed with whether they exist."""

# the Kafka admin client loads only when a command runs (import cost ~1 s):
# ruff: noqa: PLC0415

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from botmesh._cli.options import (
    CONTEXT,
    bootstrap_of,
    catalog_of,
    connection_options,
    count,
    json_option,
)
from botmesh.topics.catalog import DEFAULT_PARTITIONS

__all__ = ["topics"]

F = TypeVar("F", bound=Callable[..., Any])


@click.group("topics", context_settings=CONTEXT)
def topics() -> None:
    """Create or list the topics of a prefix."""


def _partitions_option(text: str) -> Callable[[F], F]:
    """``--partitions``, its help starting with ``text``."""
    return click.option(
        "--partitions",
        type=int,
        help=f"{text}  [env var: BOTMESH_PARTITIONS; default: {DEFAULT_PARTITIONS}]",
    )


def _partitions(partitions: int | None) -> int:
    """The partitions of ``--partitions``, else ``BOTMESH_PARTITIONS``, else the default."""
    return count(partitions, "--partitions", "BOTMESH_PARTITIONS", DEFAULT_PARTITIONS)


@topics.command("create", context_settings=CONTEXT)
@connection_options
@_partitions_option("partitions of each")
@click.option(
    "--replication",
    type=int,
    help="replication factor of each, at most the cluster's brokers  [env var: "
    "BOTMESH_REPLICATION; default: 1]",
)
@json_option
def create(
    *, prefix: str, bootstrap: str, partitions: int | None, replication: int | None, as_json: bool
) -> int:
    """Create the catalog's topics (idempotent)."""
    from botmesh.streams.provision import ensure_topics, existing_topics

    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
    wanted = _partitions(partitions)
    factor = count(replication, "--replication", "BOTMESH_REPLICATION", 1)
    specs = cat.specs_beside(existing_topics(servers), wanted, factor)
    result = ensure_topics(servers, specs)
    shape = {s.name: (s.partitions, s.replication) for s in specs}
    if as_json:
        mismatched = {
            n: {"asked": want, "partitions": got} for n, (want, got) in result.mismatched.items()
        }
        made = {n: {"partitions": p, "replication": r} for n, (p, r) in shape.items()}
        print(
            json.dumps(
                {
                    "created": result.created,
                    "existing": result.existing,
                    "mismatched": mismatched,
                    "topics": made,
                }
            )
        )
        return 0
    for name in result.created:
        partitions_of, replication_of = shape[name]
        print(f"created  {name} ({partitions_of} partitions, replication {replication_of})")
    for name in result.existing:
        print(f"exists   {name}")
    for name, (want, got) in result.mismatched.items():
        print(f"note     {name} has {got} partitions (asked {want}); left as is")
    return 0


@topics.command("list", context_settings=CONTEXT)
@connection_options
@_partitions_option("partitions wanted")
@json_option
def list_(*, prefix: str, bootstrap: str, partitions: int | None, as_json: bool) -> int:
    """The catalog's topics and whether they exist."""
    from botmesh.streams.provision import existing_topics

    cat, servers = catalog_of(prefix), bootstrap_of(bootstrap)
    specs = cat.specs(_partitions(partitions))
    have = existing_topics(servers)
    if as_json:
        rows = [
            {
                "name": spec.name,
                "role": spec.role,
                "cleanup_policy": spec.config.get("cleanup.policy", "delete"),
                "partitions": have.get(spec.name),
            }
            for spec in specs
        ]
        print(json.dumps({"prefix": cat.prefix, "topics": rows}))
        return 0
    for spec in specs:
        state = f"{have[spec.name]} partitions" if spec.name in have else "missing"
        policy = spec.config.get("cleanup.policy", "delete")
        print(f"{spec.name:<50} {spec.role:<10} {policy:<8} {state}")
    return 0
