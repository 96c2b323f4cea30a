"""``botmesh replay``, ``status`` and ``metrics``: call ``botmesh.streams.ops.operator``
and print what it returns, as ``rich`` tables or (``--json``) one JSON document on
stdout. Messages and the progress bar go to stderr. Exit statuses: ``botmesh._exit``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import SimpleNamespace as Args
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from botmesh._exit import Exit
from botmesh.streams.ops import operator as op
from botmesh.topics.catalog import Catalog

__all__ = ["cmd_metrics", "cmd_replay", "cmd_status"]


def _out() -> Console:
    return Console(highlight=False, soft_wrap=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _refused(command: str, message: str) -> int:
    _err().print(f"botmesh {command}: refused: {message}", markup=False)
    return Exit.REFUSED


def _missing(command: str, message: str) -> int:
    _err().print(f"botmesh {command}: {message}", markup=False)
    return Exit.UNREACHABLE


def _json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _offset(value: int | None) -> str:
    return "-" if value is None else str(value)


# -- replay ------------------------------------------------------------------------------------


def cmd_replay(args: Args, bootstrap: str, cat: Catalog) -> int:
    chosen = [args.from_offset is not None, args.from_time is not None, bool(args.to_earliest)]
    if sum(chosen) != 1:
        raise ValueError("give one of --from-offset N, --from-time TIME, --to-earliest")
    try:
        result = op.replay(
            bootstrap,
            cat,
            from_offset=args.from_offset,
            from_time_ms=op.parse_time(args.from_time) if args.from_time is not None else None,
            to_earliest=args.to_earliest,
            topics=list(args.topic) or ["inbound"],
            partitions=list(args.partition) or None,
            force=args.force,
            dry_run=args.dry_run,
            timeout=args.timeout,
        )
    except op.Refused as exc:
        return _refused("replay", str(exc))
    except op.TopicMissing as exc:
        return _missing("replay", str(exc))
    if args.json:
        _json(result.as_dict())
    else:
        _print_replay(result)
    if result.refused is not None:
        return _refused("replay", f"(dry run) the real run would be refused: {result.refused}")
    return Exit.OK


def _print_replay(result: op.ReplayResult) -> None:
    out = _out()
    if result.dry_run:
        title = f"dry run: the offsets a replay of {result.group} to {result.target} would set"
    else:
        title = f"replay of {result.group} to {result.target}"
    table = Table(title=title, title_justify="left")
    for name in ("topic", "partition", "committed", "new", "read again", "retained"):
        table.add_column(name, justify="left" if name == "topic" else "right", overflow="fold")
    for m in result.moves:
        table.add_row(
            m.topic,
            str(m.partition),
            _offset(m.current),
            str(m.new),
            str(m.records),
            f"{m.start}-{m.end}",
        )
    out.print(table)
    if result.removed:
        out.print(f"removed from the group first (--force): {', '.join(result.removed)}")
    if result.applied:
        out.print(
            f"set {len(result.moves)} partition(s) of {result.group}; the workers read from "
            "there when they start (the journal answers what it handled already)"
        )
    elif result.dry_run:
        out.print("dry run: nothing changed")


# -- status ------------------------------------------------------------------------------------


@contextmanager
def _progress(show: bool) -> Iterator[op.Progress | None]:
    """A progress bar on stderr (a terminal only) for the read of the journal."""
    err = _err()
    if not show or not err.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("reading the journal"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("journal", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def cmd_status(args: Args, bootstrap: str, cat: Catalog) -> int:
    try:
        with _progress(not args.no_journal) as progress:
            result = op.status(
                bootstrap,
                cat,
                journal=not args.no_journal,
                progress=progress,
                timeout=args.timeout,
            )
    except op.Refused as exc:
        return _refused("status", str(exc))
    except op.TopicMissing as exc:
        return _missing("status", str(exc))
    if args.json:
        _json(result.as_dict())
    else:
        _print_status(result)
    return Exit.OK


def _owned(partitions: dict[str, list[int]]) -> str:
    return "; ".join(f"{t} {','.join(map(str, ps))}" for t, ps in partitions.items()) or "-"


def _print_status(s: op.Status) -> None:
    out = _out()
    g = s.group
    out.print(f"group {g.group}: {g.state}, {len(g.members)} member(s)")
    if g.members:
        members = Table(title="members", title_justify="left")
        for name in ("instance id", "client id", "host", "partitions owned"):
            members.add_column(name, overflow="fold")
        for m in g.members:
            members.add_row(m.instance_id or "-", m.client_id, m.host, _owned(m.partitions))
        out.print(members)
    lag = Table(title=f"lag (total {s.total_lag})", title_justify="left")
    for name in ("topic", "partition", "committed", "end", "lag", "owner"):
        lag.add_column(name, justify="left" if name in {"topic", "owner"} else "right")
    for x in s.lags:
        lag.add_row(
            x.topic, str(x.partition), _offset(x.committed), str(x.end), str(x.lag), x.owner or "-"
        )
    out.print(lag)
    dead = Table(title="dead letters", title_justify="left")
    dead.add_column("topic", overflow="fold")
    dead.add_column("records", justify="right")
    for d in s.dead_letters:
        dead.add_row(d.topic, "missing" if d.records is None else str(d.records))
    out.print(dead)
    if s.parked:
        parked = Table(title="sends parked on the retry tiers", title_justify="left")
        parked.add_column("topic", overflow="fold")
        parked.add_column("parked", justify="right")
        for t in s.parked:
            parked.add_row(t.topic, "missing" if t.parked is None else str(t.parked))
        out.print(parked)
    j = s.journal
    if j is None:
        out.print("journal: not read (--no-journal, or no changelog topic yet)")
        return
    out.print(
        f"journal {j.topic}: {j.records} records read ({j.bytes} bytes of keys and values), "
        f"{j.keys} live keys; {j.offsets} offsets between the partitions' start and end"
    )
    out.print(f"ambiguous sends (outbox state unknown, ambiguous): {j.ambiguous}")


# -- metrics -----------------------------------------------------------------------------------


def cmd_metrics(args: Args, bootstrap: str, cat: Catalog) -> int:
    try:
        workers = op.read_metrics(bootstrap, cat, timeout=args.timeout)
    except op.Refused as exc:
        return _refused("metrics", str(exc))
    except op.TopicMissing as exc:
        return _missing("metrics", str(exc))
    total = op.sum_counters(workers)
    if args.json:
        _json({"topic": cat.metrics, "workers": [_w(w) for w in workers], "sum": total})
        return Exit.OK
    out = _out()
    if not workers:
        out.print(f"no worker has published counters on {cat.metrics} yet")
        return Exit.OK
    now = time.time()
    table = Table(title=f"counters on {cat.metrics}", title_justify="left")
    table.add_column("counter")
    for w in workers:
        table.add_column(w.instance, justify="right", overflow="fold")
    table.add_column("sum", justify="right", style="bold")
    for name in total:
        table.add_row(name, *(str(w.counters.get(name, 0)) for w in workers), str(total[name]))
    out.print(table)
    for w in workers:
        when = datetime.fromtimestamp(w.ts, UTC).isoformat(timespec="seconds")
        out.print(f"{w.instance}: published {when} ({now - w.ts:.0f} s ago)")
    return Exit.OK


def _w(w: op.WorkerMetrics) -> dict[str, Any]:
    return {"instance": w.instance, "ts": w.ts, "counters": w.counters}
