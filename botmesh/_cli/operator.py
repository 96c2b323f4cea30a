"""``botmesh replay``, ``status`` and ``metrics``: call ``botmesh.streams.ops.operator``
and print what it returns, as ``rich`` tables or (``--json``) one JSON document on stdout.
Messages and the progress bar go to stderr. The three share their options (the connection,
``--json``, ``--timeout``) and their tail (``_answer``): a refused precondition exits 1, a
missing topic 3 (``botmesh._cli.exit``)."""

# the operator's tools (and Kafka with them) and rich load only when a command runs:
# ruff: noqa: PLC0415

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from botmesh._cli.exit import Exit
from botmesh._cli.options import (
    CONTEXT,
    bootstrap_of,
    catalog_of,
    check_seconds,
    connection_options,
    json_option,
    timeout_option,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from botmesh.streams.ops import operator as op
    from botmesh.topics.catalog import Catalog

__all__ = ["metrics", "replay", "status"]

R = TypeVar("R")


def _out() -> Console:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def _err() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _refused(command: str, message: str) -> Exit:
    _err().print(f"botmesh {command}: refused: {message}", markup=False)
    return Exit.REFUSED


def _answer(
    command: str,
    ask: Callable[[], R],
    as_json: bool,
    data: Callable[[R], Any],
    show: Callable[[R], None],
) -> R | Exit:
    """What ``ask()`` returns, printed: ``data`` of it as one JSON document with ``--json``,
    else ``show`` of it. A precondition that does not hold (exit 1) or a topic missing (exit
    3) is said on stderr instead, and its status returned."""
    from botmesh.streams.ops import operator as op

    try:
        result = ask()
    except op.Refused as exc:
        return _refused(command, str(exc))
    except op.TopicMissing as exc:
        _err().print(f"botmesh {command}: {exc}", markup=False)
        return Exit.UNREACHABLE
    if as_json:
        print(json.dumps(data(result), indent=2, sort_keys=True))
    else:
        show(result)
    return result


def _offset(value: int | None) -> str:
    return "-" if value is None else str(value)


# -- replay ------------------------------------------------------------------------------------


@click.command("replay", context_settings=CONTEXT)
@click.option("--from-offset", type=int, metavar="N", help="this offset (clamped)")
@click.option(
    "--from-time",
    metavar="TIME",
    help="the first record at or after TIME: ISO 8601 (no zone: UTC) or epoch seconds",
)
@click.option("--to-earliest", is_flag=True, help="the earliest retained record")
@click.option(
    "--topic",
    multiple=True,
    type=click.Choice(["inbound", "requests"]),
    help="the topic to reset (repeatable)  [default: inbound]",
)
@click.option(
    "--partition",
    multiple=True,
    type=int,
    metavar="P",
    help="only this partition (repeatable)  [default: all]",
)
@click.option(
    "--force", is_flag=True, help="remove the group's listed members first (stop them first)"
)
@click.option("--dry-run", is_flag=True, help="print the offsets it would set; change nothing")
@connection_options
@json_option
@timeout_option
def replay(
    *,
    from_offset: int | None,
    from_time: str | None,
    to_earliest: bool,
    topic: tuple[str, ...],
    partition: tuple[int, ...],
    force: bool,
    dry_run: bool,
    prefix: str,
    bootstrap: str,
    as_json: bool,
    timeout: float,
) -> int:
    """Reset the worker group's offsets (<prefix>.worker) to replay records: one of
    --from-offset, --from-time, --to-earliest. Refused (exit 1) while the group lists
    members, unless --force. The journal answers what it handled already: handlers run
    again, no send goes out twice."""
    from botmesh.streams.ops import operator as op

    check_seconds("--timeout", timeout)
    servers, cat = bootstrap_of(bootstrap), catalog_of(prefix)
    if sum([from_offset is not None, from_time is not None, to_earliest]) != 1:
        raise ValueError("give one of --from-offset N, --from-time TIME, --to-earliest")
    result = _answer(
        "replay",
        lambda: op.replay(
            servers,
            cat,
            from_offset=from_offset,
            from_time_ms=op.parse_time(from_time) if from_time is not None else None,
            to_earliest=to_earliest,
            topics=list(topic) or ["inbound"],
            partitions=list(partition) or None,
            force=force,
            dry_run=dry_run,
            timeout=timeout,
        ),
        as_json,
        lambda r: r.as_dict(),
        _print_replay,
    )
    if isinstance(result, Exit):
        return result
    if result.refused is not None:
        return _refused("replay", f"(dry run) the real run would be refused: {result.refused}")
    return Exit.OK


def _print_replay(result: op.ReplayResult) -> None:
    from rich.table import Table

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
def _journal_progress(show: bool) -> Iterator[op.Progress | None]:
    """A progress bar on stderr (a terminal only) for the read of the journal."""
    err = _err()
    if not show or not err.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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


@click.command("status", context_settings=CONTEXT)
@click.option(
    "--no-journal",
    is_flag=True,
    help="do not read the journal's changelog (no journal size, no ambiguous sends)",
)
@connection_options
@json_option
@timeout_option
def status(*, no_journal: bool, prefix: str, bootstrap: str, as_json: bool, timeout: float) -> int:
    """The worker group, its lag, the journal and the dead letters."""
    from botmesh.streams.ops import operator as op

    check_seconds("--timeout", timeout)
    servers, cat = bootstrap_of(bootstrap), catalog_of(prefix)

    def ask() -> op.Status:
        with _journal_progress(not no_journal) as progress:
            return op.status(
                servers, cat, journal=not no_journal, progress=progress, timeout=timeout
            )

    result = _answer("status", ask, as_json, lambda s: s.as_dict(), _print_status)
    return result if isinstance(result, Exit) else Exit.OK


def _owned(partitions: dict[str, list[int]]) -> str:
    return "; ".join(f"{t} {','.join(map(str, ps))}" for t, ps in partitions.items()) or "-"


def _per_topic(title: str, column: str, rows: list[tuple[str, int | None]]) -> Table:
    """A table of one count per topic (``missing``: the topic does not exist)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("topic", overflow="fold")
    table.add_column(column, justify="right")
    for topic, n in rows:
        table.add_row(topic, "missing" if n is None else str(n))
    return table


def _print_status(s: op.Status) -> None:
    from rich.table import Table

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
    out.print(_per_topic("dead letters", "records", [(d.topic, d.records) for d in s.dead_letters]))
    if s.parked:
        parked = [(t.topic, t.parked) for t in s.parked]
        out.print(_per_topic("sends parked on the retry tiers", "parked", parked))
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


@click.command("metrics", context_settings=CONTEXT)
@connection_options
@json_option
@timeout_option
def metrics(*, prefix: str, bootstrap: str, as_json: bool, timeout: float) -> int:
    """The counters each worker published on <prefix>.metrics."""
    from botmesh.streams.ops import operator as op

    check_seconds("--timeout", timeout)
    servers, cat = bootstrap_of(bootstrap), catalog_of(prefix)

    def data(workers: list[op.WorkerMetrics]) -> dict[str, Any]:
        listed = [{"instance": w.instance, "ts": w.ts, "counters": w.counters} for w in workers]
        return {"topic": cat.metrics, "workers": listed, "sum": op.sum_counters(workers)}

    result = _answer(
        "metrics",
        lambda: op.read_metrics(servers, cat, timeout=timeout),
        as_json,
        data,
        lambda workers: _print_metrics(cat, workers),
    )
    return result if isinstance(result, Exit) else Exit.OK


def _print_metrics(cat: Catalog, workers: list[op.WorkerMetrics]) -> None:
    from rich.table import Table

    from botmesh.streams.ops import operator as op

    out = _out()
    if not workers:
        out.print(f"no worker has published counters on {cat.metrics} yet")
        return
    total = op.sum_counters(workers)
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
