"""The worker's consumer group seen through the admin API: its state and members
(``describe_group``), members removed (``remove_members``: LeaveGroup v3, which removes a
static member by its instance id), and the admin client's errors turned into a
``ConnectionError`` that names the bootstrap setting. Used by the worker's membership
watch and by the operator's tools alike.

librdkafka has no call that removes another member (Java's
``Admin.removeMembersFromConsumerGroup``), so ``remove_members`` speaks the three requests
it takes itself, over the connection settings of every other client (``connection``):
TLS with the same CA, certificate and host check; SASL PLAIN, SCRAM-SHA-256/512 or
OAUTHBEARER (``SaslHandshake`` v1, ``SaslAuthenticate`` v1; RFC 5802 for SCRAM; RFC 7628
for OAUTHBEARER, with a token from the token endpoint, ``connection.oauthbearer_token``,
as librdkafka gets its own); then
``FindCoordinator`` v2 for the group and ``LeaveGroup`` v3 to its coordinator. Each is a
version every broker since Kafka 2.4 answers, none of the versions Kafka 4 removed."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from botmesh.streams import connection
from botmesh.streams.connection import Brokers, servers, settings_of

__all__ = [
    "GroupInfo",
    "Member",
    "admin_client",
    "coordinated",
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
    #: topic -> partitions the group assigned to the member (the worker's: the inbound; it
    #: takes the same partitions of the requests and control topics itself)
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


#: A coordinator that is loading, moving or not known yet (a broker's first group request
#: creates ``__consumer_offsets``): the answer a moment later is as good.
_COORDINATOR_PASSING = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
    }
)
#: An attempt that timed out (asked again while time is left; see ``coordinated``).
_ATTEMPT_TIMED_OUT = frozenset({KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT})
#: An attempt whose connection went down under it (asked again while time is left): an
#: admin client closes a connection idle for ``ADMIN_IDLE_MS`` (``connection.admin``), and
#: a request that meets the closing connection fails at once with ``_TRANSPORT``. A
#: worker's membership questions met it three times in a row, every 15 s for minutes in
#: one process, and the worker refused its own journal writes for it.
_CONNECTION_DROPPED = frozenset({KafkaError._TRANSPORT})
#: The first attempt's time; each next one has twice as long, up to the time left.
FIRST_ATTEMPT_S = 2.0


def coordinated(ask: Callable[[float], Any], bootstrap: Brokers, timeout: float) -> Any:
    """The result of a request to a group's coordinator, ``ask(request_timeout)`` giving
    its future, asked again up to ``timeout`` seconds: while the coordinator loads or
    moves, and after an attempt that timed out. The first attempt has
    ``FIRST_ATTEMPT_S``, each next one twice as long, because librdkafka (2.16) leaves a
    group request waiting out its whole timeout once its ``FindCoordinator`` was answered
    ``COORDINATOR_NOT_AVAILABLE`` three times in a row (its retries spent; librdkafka
    PR #3847, open): as on a broker's first group request, which creates
    ``__consumer_offsets``, or while a coordinator moves. A new request finds the
    coordinator. An attempt that failed because its connection went down is asked again
    too (a new connection carries the next). Other errors, and the last attempt's, are
    raised (``result_of``)."""
    deadline = time.monotonic() + timeout
    window = FIRST_ATTEMPT_S
    while True:
        left = deadline - time.monotonic()
        step = max(min(window, left), 0.5)
        fut = ask(step)
        try:
            return fut.result(step + 5.0)  # librdkafka ends it at ``step``: a margin only
        except KafkaException as exc:
            code = error_code(exc)
            passing = (
                code in _COORDINATOR_PASSING
                or code in _ATTEMPT_TIMED_OUT
                or code in _CONNECTION_DROPPED
            )
            if not passing or time.monotonic() + 0.2 >= deadline:
                return result_of(fut, bootstrap, 0)  # raised as result_of names it
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise unreachable(bootstrap, TimeoutError(f"no answer in {timeout:g}s")) from None
        window *= 2
        time.sleep(0.2)


def describe(admin: Any, group: str, bootstrap: Brokers, timeout: float) -> GroupInfo:
    """``describe_group`` with an admin client of the caller's (asked again while the
    group's coordinator loads, up to ``timeout`` seconds: ``coordinated``)."""

    def ask(step: float) -> Any:
        return admin.describe_consumer_groups([group], request_timeout=step)[group]

    try:
        desc = coordinated(ask, bootstrap, timeout)
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
    leave = [("" if m.instance_id else m.member_id, m.instance_id) for m in members]
    try:
        async with asyncio.timeout(wait_s):
            code, results = await _leave_group(bootstrap, group, leave, wait_s)
    except connection.KafkaAuthError:
        raise  # the token endpoint refused the client (OAUTHBEARER): named already
    except (OSError, EOFError, TimeoutError, struct.error, _Protocol) as exc:
        # a broker away or cut off (a TLS or SASL listener?), a login refused, the token
        # endpoint out of reach: named below
        raise (await asyncio.to_thread(connection.connect_error, bootstrap, exc)) from None
    errors = [f"group: error {code}"] if code else []
    removed = []
    for member_id, instance_id, member_code in results:
        who = instance_id or member_id
        if member_code in (0, _UNKNOWN_MEMBER_ID):  # gone already
            removed.append(who)
        else:
            errors.append(f"{who}: error {member_code}")
    if errors:
        raise RuntimeError(f"cannot remove the members of group {group!r}: {'; '.join(errors)}")
    return removed


# -- LeaveGroup v3, spoken here ----------------------------------------------------------------

_FIND_COORDINATOR, _LEAVE_GROUP, _SASL_HANDSHAKE, _SASL_AUTHENTICATE = 10, 13, 17, 36
_UNKNOWN_MEMBER_ID = 25
#: FindCoordinator's and LeaveGroup's errors that a new lookup of the coordinator cures
_MOVED = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, _NOT_AVAILABLE, NOT_COORDINATOR


class _Protocol(Exception):
    """A broker's answer this client cannot use (a refused login, an unknown mechanism)."""


def _str(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _nullable(value: str | None) -> bytes:
    return struct.pack(">h", -1) if value is None else _str(value)


def _bytes(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def _take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._data, self._at)
        self._at += struct.calcsize(fmt)
        return value

    def int8(self) -> int:
        return int(self._take(">b"))

    def int16(self) -> int:
        return int(self._take(">h"))

    def int32(self) -> int:
        return int(self._take(">i"))

    def int64(self) -> int:
        return int(self._take(">q"))

    def string(self) -> str | None:
        n = self.int16()
        if n < 0:
            return None
        raw = self._data[self._at : self._at + n]
        self._at += n
        return raw.decode()

    def bytes(self) -> bytes | None:
        n = self.int32()
        if n < 0:
            return None
        raw = self._data[self._at : self._at + n]
        self._at += n
        return raw


class _Connection:
    """One connection to one broker: TLS and SASL as ``connection`` says, then requests
    (header v1) and their responses (header v0), one at a time."""

    _ids = itertools.count(1)

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    async def open(cls, settings: connection.KafkaSettings, host: str, port: int) -> _Connection:
        sec = settings.security
        tls = sec.ssl_context
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls is not None else None
        )
        conn = cls(reader, writer)
        try:
            if sec.sasl:
                await conn._login(sec)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def request(self, api_key: int, version: int, body: bytes) -> _Reader:
        correlation = next(self._ids) & 0x7FFFFFFF
        header = struct.pack(">hhi", api_key, version, correlation) + _str("botmesh-admin")
        frame = header + body
        self._writer.write(struct.pack(">i", len(frame)) + frame)
        await self._writer.drain()
        (size,) = struct.unpack(">i", await self._reader.readexactly(4))
        answer = _Reader(await self._reader.readexactly(size))
        if answer.int32() != correlation:
            raise _Protocol(f"a response to another request (api {api_key})")
        return answer

    async def _login(self, sec: connection.Security) -> None:
        mechanism = sec.sasl_mechanism or ""
        token = ""
        if sec.oauthbearer:  # before the handshake: the broker waits for no one
            token = await asyncio.to_thread(connection.oauthbearer_token, sec)
        answer = await self.request(_SASL_HANDSHAKE, 1, _str(mechanism))
        code = answer.int16()
        if code:
            offered = [answer.string() for _ in range(answer.int32())]
            raise _Protocol(f"the broker does not take SASL {mechanism} (it takes {offered})")
        if sec.oauthbearer:
            await self._oauthbearer(token, sec.sasl_oauthbearer_extensions)
            return
        user = sec.sasl_username or ""
        password = sec.sasl_password.reveal() if sec.sasl_password is not None else ""
        if mechanism == "PLAIN":
            await self._authenticate(f"\0{user}\0{password}".encode())
            return
        scram = _Scram(mechanism, user, password)
        server_first = await self._authenticate(scram.first())
        server_final = await self._authenticate(scram.final(server_first))
        scram.check(server_final)

    async def _oauthbearer(self, token: str, extensions: str | None) -> None:
        """RFC 7628's initial response: ``n,,`` then ``auth=Bearer <token>`` and each
        extension, each followed by ``\\x01``, and one more. A refused token is answered
        with an error document; the client's ``\\x01`` then has the broker fail the
        authentication with its reason."""
        pairs = [f"auth=Bearer {token}"]
        pairs += [item.strip() for item in (extensions or "").split(",") if item.strip()]
        message = "n,,\x01" + "".join(f"{pair}\x01" for pair in pairs) + "\x01"
        challenge = await self._authenticate(message.encode())
        if challenge:
            await self._authenticate(b"\x01")  # raises, naming the broker's reason
            raise _Protocol(f"SASL authentication failed ({challenge.decode(errors='replace')})")

    async def _authenticate(self, token: bytes) -> bytes:
        answer = await self.request(_SASL_AUTHENTICATE, 1, _bytes(token))
        code, message, reply = answer.int16(), answer.string(), answer.bytes()
        if code:
            raise _Protocol(f"SASL authentication failed (error {code}: {message})")
        return reply or b""

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


class _Scram:
    """The client's side of SCRAM-SHA-256/512 (RFC 5802, no channel binding)."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self._hash = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
        self._password = password.encode()
        self._nonce = base64.b64encode(os.urandom(24)).decode()
        name = user.replace("=", "=3D").replace(",", "=2C")
        self._first_bare = f"n={name},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        fields = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
        nonce = fields.get("r", "")
        if not nonce.startswith(self._nonce) or "s" not in fields or "i" not in fields:
            raise _Protocol("SASL authentication failed (a SCRAM answer that does not fit)")
        salted = hashlib.pbkdf2_hmac(
            self._hash, self._password, base64.b64decode(fields["s"]), int(fields["i"])
        )
        client_key = hmac.new(salted, b"Client Key", self._hash).digest()
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        message = f"{self._first_bare},{text},{without_proof}".encode()
        signature = hmac.new(stored_key, message, self._hash).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", self._hash).digest()
        self._server_signature = hmac.new(server_key, message, self._hash).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check(self, server_final: bytes) -> None:
        fields = dict(i.split("=", 1) for i in server_final.decode().split(",") if "=" in i)
        if "e" in fields:
            raise _Protocol(f"SASL authentication failed ({fields['e']})")
        if not hmac.compare_digest(base64.b64decode(fields.get("v", "")), self._server_signature):
            raise _Protocol("SASL authentication failed (the broker's SCRAM proof is wrong)")


def _addresses(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


async def _open_any(settings: connection.KafkaSettings) -> _Connection:
    """A connection to the first bootstrap broker that takes one."""
    failure: BaseException = OSError(f"no broker in {settings.bootstrap!r}")
    for host, port in _addresses(settings.bootstrap):
        try:
            return await _Connection.open(settings, host, port)
        except _Protocol:
            raise
        except OSError as exc:
            failure = exc
    raise failure


async def _leave_group(
    bootstrap: Brokers, group: str, leave: list[tuple[str, str | None]], wait_s: float
) -> tuple[int, list[tuple[str, str | None, int]]]:
    """LeaveGroup v3 at the group's coordinator (found again while it moves): the group's
    error code and each member's."""
    settings = settings_of(bootstrap)
    deadline = time.monotonic() + wait_s
    while True:
        conn = await _open_any(settings)
        try:
            answer = await conn.request(_FIND_COORDINATOR, 2, _str(group) + struct.pack(">b", 0))
        finally:
            await conn.close()
        answer.int32()  # throttle time
        code, _message = answer.int16(), answer.string()
        _node, host, port = answer.int32(), answer.string() or "", answer.int32()
        if code in _MOVED and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            continue
        if code:
            raise RuntimeError(f"cannot find the coordinator of group {group!r}: error {code}")
        conn = await _Connection.open(settings, host, port)
        try:
            body = _str(group) + struct.pack(">i", len(leave))
            body += b"".join(_str(member) + _nullable(instance) for member, instance in leave)
            answer = await conn.request(_LEAVE_GROUP, 3, body)
        finally:
            await conn.close()
        answer.int32()  # throttle time
        code = answer.int16()
        if code in _MOVED and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            continue
        results = []
        for _ in range(answer.int32()):
            member_id, instance_id = answer.string() or "", answer.string()
            results.append((member_id, instance_id, answer.int16()))
        return code, results
