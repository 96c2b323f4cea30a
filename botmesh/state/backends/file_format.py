"""The on-disk format of the file journal: the snapshot and the append log.

Snapshot (``<path>``), two lines::

    {"format":"botmesh-file-journal","version":1,"seq":12,"count":2,"bytes":57,"crc32":…}
    [["key",{…value…},3,null,17.5],…]

The header names the format and its version, the sequence number of the last commit folded
into the snapshot (``seq``), the number of entries and the length and CRC-32 of the body
line (the CRC also covers the header's fields); an entry is
``[key, value, version, due, purge]``. Anything that does not check out
(truncated, flipped bits, zeroed blocks, an unknown version) is ``SNAPSHOT_CORRUPT``.

Append log (``<path>.log``), one JSON line per commit::

    {"seq":13,"label":"outbox.mark_sent","put":[["key",{…},4,null,null]],"del":["k2"],"crc32":…}

``put`` holds the new entry of each key the commit wrote, ``del`` the keys it deleted; the
CRC-32 covers every byte of the line before ``,"crc32":``. Sequence numbers follow each
other; lines at or below the snapshot's ``seq`` were already folded into it (a crash between
the snapshot rewrite and the log truncation) and are skipped on replay.

Reading the log: a bad *last* line (a crash mid-append: torn, or never completed) is cut;
a bad line followed by anything else is ``APPEND_LOG_CORRUPT`` with its line number and byte
offset, because cutting there would drop every later commit.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

from botmesh.state.errors import JournalCorruptError
from botmesh.state.kv import Entry

__all__ = [
    "FORMAT",
    "VERSION",
    "LogReplay",
    "decode_snapshot",
    "encode_entry",
    "encode_log_line",
    "encode_snapshot",
    "read_log",
]

FORMAT = "botmesh-file-journal"
VERSION = 1
SNAPSHOT_CORRUPT = "SNAPSHOT_CORRUPT"
APPEND_LOG_CORRUPT = "APPEND_LOG_CORRUPT"

_CRC_MARK = b',"crc32":'


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def encode_entry(entry: Entry) -> str:
    """One entry as its JSON array ``[key, value, version, due, purge]``.

    Raises ``TypeError`` naming the key when the value is not JSON-serializable.
    """
    try:
        return _dumps([entry.key, entry.value, entry.version, entry.due, entry.purge])
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"the value of journal key {entry.key!r} is not JSON-serializable ({exc}); "
            "journal values must be JSON objects (str, int, float, bool, None, list, dict)"
        ) from exc


def encode_snapshot(seq: int, fragments: list[str]) -> bytes:
    """The snapshot file for the entries encoded as ``fragments`` (see ``encode_entry``)."""
    body = ("[" + ",".join(fragments) + "]").encode()
    header = {
        "format": FORMAT,
        "version": VERSION,
        "seq": seq,
        "count": len(fragments),
        "bytes": len(body),
        "crc32": _snapshot_crc(seq, len(fragments), body),
    }
    return _dumps(header).encode() + b"\n" + body + b"\n"


def _snapshot_crc(seq: int, count: int, body: bytes) -> int:
    """CRC-32 of the body and of the header fields, so that a flipped ``seq`` shows too."""
    return zlib.crc32(body, zlib.crc32(f"{FORMAT}/{VERSION}/{seq}/{count}/{len(body)}/".encode()))


def encode_log_line(seq: int, label: str, puts: list[str], deletes: list[str]) -> bytes:
    """One log line: ``puts`` are encoded entries, ``deletes`` the deleted keys."""
    prefix = (
        '{"seq":'
        + str(seq)
        + ',"label":'
        + _dumps(label)
        + ',"put":['
        + ",".join(puts)
        + '],"del":'
        + _dumps(deletes)
    ).encode()
    return prefix + _CRC_MARK + str(zlib.crc32(prefix)).encode() + b"}\n"


def _entry_of(raw: Any) -> Entry:
    """An entry from its decoded JSON array; ``ValueError`` when it is not one."""
    if not (isinstance(raw, list) and len(raw) == 5):
        raise ValueError("an entry is not a [key, value, version, due, purge] array")
    key, value, version, due, purge = raw
    if not isinstance(key, str) or not isinstance(value, dict):
        raise ValueError("an entry's key is not a string or its value not an object")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"entry {key!r} has no valid version")
    for score in (due, purge):
        if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
            raise ValueError(f"entry {key!r} has a non-numeric index score")
    return Entry(
        key,
        value,
        version,
        float(due) if due is not None else None,
        float(purge) if purge is not None else None,
    )


def decode_snapshot(data: bytes, file: str) -> tuple[int, dict[str, Entry]]:
    """``(seq, entries)`` of a snapshot file's bytes; ``JournalCorruptError`` when damaged."""

    def corrupt(why: str) -> JournalCorruptError:
        return JournalCorruptError(
            SNAPSHOT_CORRUPT, file, f"the snapshot cannot be read back: {why}"
        )

    newline = data.find(b"\n")
    if newline < 0:
        raise corrupt("no header line (the file is truncated or not a journal)")
    try:
        header = json.loads(data[:newline])
    except (ValueError, UnicodeDecodeError):
        raise corrupt("the header line is not valid JSON") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise corrupt(f"the header does not name the {FORMAT!r} format")
    if header.get("version") != VERSION:
        raise corrupt(
            f"format version {header.get('version')!r} is not supported (this build reads "
            f"version {VERSION})"
        )
    seq, count, size, crc = (header.get(k) for k in ("seq", "count", "bytes", "crc32"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (seq, count, size, crc)):
        raise corrupt("the header lacks seq, count, bytes or crc32")
    assert isinstance(seq, int) and isinstance(size, int) and isinstance(count, int)  # mypy
    body = data[newline + 1 :]
    if len(body) != size + 1 or not body.endswith(b"\n"):
        raise corrupt(f"the body has {len(body)} bytes, the header says {size} and a newline")
    body = body[:-1]
    if _snapshot_crc(seq, count, body) != crc:
        raise corrupt("the snapshot fails its CRC-32 check")
    try:
        raw = json.loads(body)
        if not isinstance(raw, list) or len(raw) != count:
            raise ValueError("the body does not hold the number of entries the header says")
        entries: dict[str, Entry] = {}
        for item in raw:
            entry = _entry_of(item)
            if entry.key in entries:
                raise ValueError(f"key {entry.key!r} appears twice")
            entries[entry.key] = entry
    except (ValueError, UnicodeDecodeError) as exc:
        raise corrupt(str(exc)) from None
    return seq, entries


@dataclass(slots=True)
class LogCommit:
    """One decoded log line."""

    seq: int
    label: str
    puts: list[Entry]
    deletes: list[str]


@dataclass(slots=True)
class LogReplay:
    """What ``read_log`` found: the good commits, and where the good part of the file ends."""

    commits: list[LogCommit]
    #: Byte length of the valid prefix; the file is cut here when ``torn_bytes`` > 0.
    good_size: int
    #: Bytes of a torn last line after ``good_size`` (0: the file ends cleanly).
    torn_bytes: int
    #: 1-based line number of the torn line, when there is one.
    torn_line: int | None


def _decode_line(line: bytes) -> LogCommit:
    """One complete log line (without its newline); ``ValueError`` when it is damaged."""
    mark = line.rfind(_CRC_MARK)
    if mark < 0 or not line.endswith(b"}"):
        raise ValueError("no checksum")
    digits = line[mark + len(_CRC_MARK) : -1]
    if not digits.isdigit() or zlib.crc32(line[:mark]) != int(digits):
        raise ValueError("fails its CRC-32 check")
    try:
        raw = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("not valid JSON") from None
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    seq, label, puts, deletes = (raw.get(k) for k in ("seq", "label", "put", "del"))
    if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(label, str):
        raise ValueError("no seq or label")
    if not isinstance(puts, list) or not isinstance(deletes, list):
        raise ValueError("no put or del list")
    if not all(isinstance(k, str) for k in deletes):
        raise ValueError("a deleted key is not a string")
    return LogCommit(seq, label, [_entry_of(p) for p in puts], deletes)


def read_log(
    data: bytes, file: str, snapshot_seq: int, *, base_offset: int = 0, base_line: int = 0
) -> LogReplay:
    """Check the log's bytes against the snapshot's ``seq``: the commits to replay (those
    after ``snapshot_seq``), or ``JournalCorruptError`` (``APPEND_LOG_CORRUPT``) for a bad
    line with more after it. Never changes anything.

    ``data`` may be the tail of the log from byte ``base_offset`` (the start of line
    ``base_line + 1``), read by a journal that already replayed what comes before it:
    ``snapshot_seq`` is then the seq of the last line replayed. Offsets and line numbers,
    in the result and in errors, count from the start of the file either way."""
    commits: list[LogCommit] = []
    offset = 0
    line_no = base_line
    prev_seq: int | None = None
    size = len(data)
    while offset < size:
        line_no += 1
        newline = data.find(b"\n", offset)
        end = size if newline < 0 else newline
        why: str | None = None
        commit: LogCommit | None = None
        if newline < 0:
            why = "the line has no end (a torn write)"
        else:
            try:
                commit = _decode_line(data[offset:end])
            except ValueError as exc:
                why = f"the entry {exc}"
            else:
                if prev_seq is None:
                    if commit.seq > snapshot_seq + 1:
                        why = (
                            f"the entry has seq {commit.seq} but the snapshot ends at "
                            f"{snapshot_seq}: commits are missing in between"
                        )
                elif commit.seq != prev_seq + 1:
                    why = f"the entry has seq {commit.seq}, {prev_seq + 1} was expected"
        if why is not None:
            rest = end + 1 if newline >= 0 else size
            if rest < size:
                raise JournalCorruptError(
                    APPEND_LOG_CORRUPT,
                    file,
                    f"{why}, and more entries follow it; cutting the log here would drop them",
                    line=line_no,
                    offset=base_offset + offset,
                )
            return LogReplay(commits, base_offset + offset, size - offset, line_no)
        assert commit is not None
        prev_seq = commit.seq
        if commit.seq > snapshot_seq:
            commits.append(commit)
        offset = end + 1
    return LogReplay(commits, base_offset + size, 0, None)
