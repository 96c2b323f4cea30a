"""The worker's consumer group seen through the admin API: its state and members
(``describe_group``), members removed (``remove_members``: LeaveGroup v3, which removes a
static member by its instance id), and the admin client's errors turned into a
``ConnectionError`` that names the bootstrap setting. Used by the worker's membership
watch and by the operator's tools alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String
from confluent_kafka import KafkaError, KafkaException

from botmesh.streams import connection
from botmesh.streams.connection import Brokers, aiokafka_options, servers

__all__ = [
    "GroupInfo",
    "Member",
    "admin_client",
    "describe",
    "describe_group",
    "error_code",
    "remove_members",
    "result_of",
    "unreachable",
]

_UNREACHABLE = {
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    client_id: str
    host: str
    instance_id: str | None
    #: topic -> partitions assigned to the member (the inbound, the requests and the
    #: journal's changelog, by Faust's assignor)
    partitions: dict[str, list[int]]

    def describe(self) -> str:
        who = self.instance_id or self.member_id
        return f"{who} (client {self.client_id} on {self.host.lstrip('/')})"


@dataclass(frozen=True, slots=True)
class GroupInfo:
    group: str
    #: ``stable``, ``empty``, ``preparing_rebalancing``, ``completing_rebalancing``, ``dead``
    #: (also: no such group), ``unknown``
    state: str
    members: list[Member]


def admin_client(bootstrap: Brokers, timeout: float) -> Any:
    return connection.admin(bootstrap, timeout)


def unreachable(bootstrap: Brokers, exc: BaseException) -> ConnectionError:
    return ConnectionError(
        f"cannot reach Kafka at {servers(bootstrap)!r}: {exc}; {connection.broker_hint()}"
    )


def error_code(exc: KafkaException) -> int | None:
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


def result_of(fut: Any, bootstrap: Brokers, timeout: float) -> Any:
    try:
        return fut.result(timeout)
    except KafkaException as exc:
        if error_code(exc) in _UNREACHABLE:
            raise unreachable(bootstrap, exc) from None
        raise


def describe_group(bootstrap: Brokers, group: str, timeout: float = 10.0) -> GroupInfo:
    """The group's state and members with their partitions (blocking)."""
    return describe(admin_client(bootstrap, timeout), group, bootstrap, timeout)


def describe(admin: Any, group: str, bootstrap: Brokers, timeout: float) -> GroupInfo:
    futs = admin.describe_consumer_groups([group], request_timeout=timeout)
    try:
        desc = result_of(futs[group], bootstrap, timeout)
    except KafkaException as exc:
        if error_code(exc) == KafkaError.GROUP_ID_NOT_FOUND:
            return GroupInfo(group, "dead", [])
        raise
    members = []
    for m in desc.members:
        owned: dict[str, list[int]] = {}
        for tp in m.assignment.topic_partitions if m.assignment is not None else []:
            owned.setdefault(tp.topic, []).append(tp.partition)
        members.append(
            Member(
                member_id=m.member_id,
                client_id=m.client_id,
                host=m.host,
                instance_id=m.group_instance_id,
                partitions={t: sorted(ps) for t, ps in sorted(owned.items())},
            )
        )
    state = desc.state.name.lower() if desc.state is not None else "unknown"
    members.sort(key=lambda m: (m.instance_id or "", m.member_id))
    return GroupInfo(group, state, members)


async def remove_members(
    bootstrap: Brokers, group: str, members: Sequence[Member], wait_s: float
) -> list[str]:
    """Remove ``members`` from ``group`` (LeaveGroup v3: a static member by its instance id,
    a dynamic one by its member id); returns who was removed."""
    client = AIOKafkaClient(**aiokafka_options(bootstrap), request_timeout_ms=int(wait_s * 1000))
    try:
        await client.bootstrap()
    except Exception as exc:  # aiokafka's KafkaConnectionError and its kin
        await client.close()
        raise unreachable(bootstrap, exc) from None
    try:
        node = await client.coordinator_lookup(CoordinationType.GROUP, group)
        leave = [("" if m.instance_id else m.member_id, m.instance_id) for m in members]
        response = await client.send(node, _RemoveMembers(group, leave))
    finally:
        await client.close()
    errors = [f"group: error {response.error_code}"] if response.error_code else []
    removed = []
    for member_id, instance_id, code in response.members:
        who = instance_id or member_id
        if code in (0, 25):  # 25 UNKNOWN_MEMBER_ID: gone already
            removed.append(who)
        else:
            errors.append(f"{who}: error {code}")
    if errors:
        raise RuntimeError(f"cannot remove the members of group {group!r}: {'; '.join(errors)}")
    return removed


class _LeaveGroupResponseV3(Response):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            Array(
                ("member_id", String("utf-8")),
                ("group_instance_id", String("utf-8")),
                ("error_code", Int16),
            ),
        ),
    )


class _LeaveGroupRequestV3(RequestStruct):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = _LeaveGroupResponseV3
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


class _RemoveMembers(Request[_LeaveGroupRequestV3]):  # type: ignore[misc]
    """LeaveGroup v3 (aiokafka has v0-v1 only: a member id, no instance id)."""

    API_KEY = 13

    def __init__(self, group: str, members: list[tuple[str, str | None]]) -> None:
        self._group = group
        self._members = members

    def build(self, request_struct_class: type[_LeaveGroupRequestV3]) -> _LeaveGroupRequestV3:
        return request_struct_class(self._group, self._members)
