"""The demo behind ``make run``: Kafka, topics, the echo bot worker, traffic, receipts.

    python -m botmesh.examples.demo [--once] [--messages 300] [--chats 12] [--prefix botmesh]
                            [--app botmesh.examples.echo_bot:bot]

(``make run`` in a checkout; installed from a wheel, it needs ``KAFKA_BOOTSTRAP_SERVERS``).

1. a broker: ``KAFKA_BOOTSTRAP_SERVERS`` if set, else, in a botmesh checkout, the local
   Kafka of ``deploy/kafka/kafka.sh`` on 127.0.0.1:9092 (started, and stopped at the end, if
   it is not already running);
2. the topics of the prefix (``BOTMESH_TOPIC_PREFIX``, default ``botmesh``), created if missing;
3. ``botmesh worker --app botmesh.examples.echo_bot:bot`` (or the bot ``--app`` names, such as
   ``botmesh.examples.signup_bot:bot``: each demo message gets its one reply) as a subprocess (log
   in the data dir), on its default journal, on Kafka (``<prefix>.worker-journal-changelog``);
4. demo inbound messages over several chats, and each receipt as it comes back;
5. a summary: receipts, per-chat order, messages per second.

Then it keeps showing receipts (``botmesh produce`` sends more) until Ctrl-C, reads the
worker's journal back from its changelog (every inbound ``done``, every send ``sent``), and
stops the worker and the broker it started. ``--once`` exits after the summary (exit status
1 when a receipt is missing or out of order).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pkgutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from botmesh.examples.echo_bot import bot as echo_bot
from botmesh.streams.connection import local_kafka_script
from botmesh.streams.ops.tools import (
    Seen,
    demo_records,
    end_offsets,
    produce_inbound,
    read_journal,
    tail_receipts,
)
from botmesh.streams.provision import ensure_topics
from botmesh.streams.runner import BotDefinition
from botmesh.streams.table_kv import changelog_topic
from botmesh.topics.catalog import Catalog, prefix_from_env

__all__ = ["journal_summary", "main", "stop_process", "worker_command"]

WAIT_S = 120.0
#: What ``--app`` takes, said with a refused one.
_APP_HINT = "give module:attribute of a botmesh.Bot, e.g. botmesh.examples.echo_bot:bot"


class DemoError(RuntimeError):
    pass


def _broker() -> tuple[str, bool]:
    """(bootstrap, started_here)."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if env:
        print(f"demo: broker {env} (KAFKA_BOOTSTRAP_SERVERS)")
        return env, False
    kafka_sh = local_kafka_script()
    if kafka_sh is None:
        raise DemoError(
            "no broker: set KAFKA_BOOTSTRAP_SERVERS to a running one (for example "
            "`docker run -p 9092:9092 apache/kafka`, then KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092), "
            "or run `make run` in a clone of the botmesh repository: it starts a local Kafka"
        )
    port = os.environ.get("KAFKA_PORT", "9092")
    bootstrap = f"127.0.0.1:{port}"
    status = subprocess.run([str(kafka_sh), "status"], capture_output=True, text=True, check=False)
    if status.returncode == 0:
        print(f"demo: local Kafka already running on {bootstrap} (left running at the end)")
        return bootstrap, False
    print(f"demo: starting the local Kafka on {bootstrap} (deploy/kafka/kafka.sh start) ...")
    started = subprocess.run([str(kafka_sh), "start"], text=True, check=False)
    if started.returncode != 0:
        raise DemoError(
            "deploy/kafka/kafka.sh start failed (see above); `make kafka-jars` fetches the jars"
        )
    return bootstrap, True


def worker_command(*options: str, app: str = "botmesh.examples.echo_bot:bot") -> list[str]:
    """The command line of a ``botmesh worker`` child running ``app`` with ``options``."""
    return [sys.executable, "-m", "botmesh", "worker", "--app", app, *options]


def _start_worker(
    bootstrap: str, prefix: str, data_dir: Path, app: str = "botmesh.examples.echo_bot:bot"
) -> tuple[subprocess.Popen[bytes], Path]:
    log_path = data_dir / "worker.log"
    env = dict(os.environ, BOTMESH_CONSOLE_QUIET="1", PYTHONUNBUFFERED="1")
    env.pop("BOTMESH_JOURNAL", None)  # the demo shows the default: the journal on Kafka
    cmd = worker_command(
        "--bootstrap",
        bootstrap,
        "--prefix",
        prefix,
        "--data-dir",
        str(data_dir / "worker"),
        "--loglevel",
        "warning",
        app=app,
    )
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    print(f"demo: worker pid {proc.pid}: {' '.join(cmd[2:])}  (log {log_path})")
    print(f"demo: the worker's journal: on Kafka, {changelog_topic(Catalog(prefix))}")
    return proc, log_path


async def journal_summary(bootstrap: str, cat: Catalog, scope: str) -> dict[str, dict[str, int]]:
    """``{"inbound": {state: n}, "sends": {state: n}}`` of one bot scope in the worker's
    journal, read from its changelog topic."""
    journal = await read_journal(bootstrap, changelog_topic(cat), f"{scope}/")
    inbound = [
        e.value.get("state", "?") for k, e in journal.items() if k.startswith(f"{scope}/in/")
    ]
    sends = [e.value.get("state", "?") for k, e in journal.items() if k.startswith(f"{scope}/out/")]
    return {"inbound": _count(inbound), "sends": _count(sends)}


def _count(states: list[str]) -> dict[str, int]:
    return {s: states.count(s) for s in sorted(set(states))}


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a child we started, SIGKILL it after 60 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass(frozen=True, slots=True)
class _Receipts:
    """The receipts the demo waits for, and the worker whose exit (or silence) ends a wait."""

    stream: AsyncGenerator[Seen, None]
    proc: subprocess.Popen[bytes]
    log_path: Path

    def exited(self) -> DemoError:
        return DemoError(f"the worker exited with {self.proc.returncode}; see {self.log_path}")

    async def next(self, deadline: float) -> Seen:
        """The next receipt; ``DemoError`` if the worker exits or ``deadline`` passes first."""
        task = asyncio.ensure_future(anext(self.stream))
        while not task.done():
            if self.proc.poll() is not None:
                task.cancel()
                raise self.exited()
            if time.monotonic() > deadline:
                task.cancel()
                raise DemoError(f"no receipt for {WAIT_S:.0f} s; see {self.log_path}")
            await asyncio.wait({task}, timeout=0.5)
        return task.result()


async def _run(
    bootstrap: str,
    cat: Catalog,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    args: argparse.Namespace,
) -> bool:
    run = f"demo{uuid.uuid4().hex[:6]}"
    start = await end_offsets(bootstrap, cat.sent)
    receipts = _Receipts(tail_receipts(bootstrap, cat.sent, start=start), proc, log_path)
    await _warm_up(bootstrap, cat, receipts, run)
    ok = await _burst(bootstrap, cat, receipts, run, args)
    if args.once:
        await receipts.stream.aclose()
        return ok
    print(
        f"demo: running; send more with `botmesh produce --prefix {cat.prefix} -n 50`; Ctrl-C stops"
    )
    async for seen in receipts.stream:
        if proc.poll() is not None:
            raise receipts.exited()
        r = seen.receipt
        print(f"  [{r.chat_id}] {r.state} {r.key} -> {r.message_id}")
    return True


async def _warm_up(bootstrap: str, cat: Catalog, receipts: _Receipts, run: str) -> None:
    """One message, so the worker has joined the group before the clock starts."""
    print("demo: waiting for the worker (first receipt) ...")
    warm = demo_records(1, 1, run=f"{run}w")
    await produce_inbound(bootstrap, cat.inbound, warm)
    while True:
        seen = await receipts.next(time.monotonic() + WAIT_S)
        if seen.receipt.inbound_id == warm[0].id:
            break


async def _burst(
    bootstrap: str, cat: Catalog, receipts: _Receipts, run: str, args: argparse.Namespace
) -> bool:
    """Produces the demo's messages, waits for each receipt and prints the summary; whether
    every receipt came back in per-chat order."""
    records = demo_records(args.messages, args.chats, run=run)
    want = {r.id for r in records}
    index = {r.id: i for i, r in enumerate(records)}
    print(f"demo: producing {len(records)} messages over {args.chats} chats to {cat.inbound}")
    t0 = time.monotonic()
    producing = asyncio.ensure_future(produce_inbound(bootstrap, cat.inbound, records))
    got: dict[str, list[int]] = {}
    count, t_last = 0, t0
    while count < len(want):
        seen = await receipts.next(time.monotonic() + WAIT_S)
        r = seen.receipt
        if r.inbound_id not in want:
            continue
        count += 1
        t_last = seen.arrived
        got.setdefault(r.chat_id, []).append(index[r.inbound_id])
        if not args.quiet:
            print(f"  [{r.chat_id}] {r.state} {r.key} -> {r.message_id}")
    await producing
    elapsed = max(t_last - t0, 1e-9)
    order_ok = all(seq == sorted(seq) for seq in got.values())
    rate = count / elapsed
    print(
        f"demo: summary: {count}/{len(records)} receipts, {len(got)} chats, per-chat order "
        f"{'OK' if order_ok else 'BROKEN'}, {elapsed:.2f} s, {rate:.0f} messages/s"
    )
    return order_ok and count == len(records)


def _show_journal(bootstrap: str, cat: Catalog, scope: str = echo_bot.scope) -> None:
    try:
        summary = asyncio.run(journal_summary(bootstrap, cat, scope))
    except Exception as exc:  # the demo's last line; the worker's log says more
        print(f"demo: cannot read the journal: {exc}", file=sys.stderr)
        return
    shown = {k: ", ".join(f"{n} {s}" for s, n in v.items()) or "none" for k, v in summary.items()}
    print(
        f"demo: journal {changelog_topic(cat)}: inbound {shown['inbound']}; sends {shown['sends']}"
    )


def _scope_of(app: str) -> str | None:
    """The journal scope of the bot ``app`` (``module:attribute``) names, read before anything
    starts so that a wrong ``--app`` stops the demo at once; ``None`` (said on stderr) when
    it names no bot."""
    try:
        bot = pkgutil.resolve_name(app)
    except (ImportError, AttributeError, ValueError) as exc:
        print(f"demo: --app {app!r}: {type(exc).__name__}: {exc}; {_APP_HINT}", file=sys.stderr)
        return None
    if not isinstance(bot, BotDefinition):
        print(
            f"demo: --app {app!r} is a {type(bot).__name__}, not a bot; {_APP_HINT}",
            file=sys.stderr,
        )
        return None
    return str(getattr(bot, "scope", echo_bot.scope))


def _sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m botmesh.examples.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--once", action="store_true", help="exit after the summary")
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--chats", type=int, default=12)
    parser.add_argument("--prefix", help="topic prefix (env BOTMESH_TOPIC_PREFIX)")
    parser.add_argument("--quiet", action="store_true", help="do not print each receipt")
    parser.add_argument("--data-dir", help="worker data and log (default: a temporary dir)")
    parser.add_argument(
        "--app",
        default="botmesh.examples.echo_bot:bot",
        help="the bot the worker runs, module:attribute (default botmesh.examples.echo_bot:bot)",
    )
    args = parser.parse_args(argv)
    scope = _scope_of(args.app)
    if scope is None:
        return 2
    signal.signal(signal.SIGTERM, _sigterm)
    cat = Catalog(args.prefix) if args.prefix else Catalog(prefix_from_env())
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="botmesh-demo-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    started = False
    bootstrap = ""
    proc: subprocess.Popen[bytes] | None = None
    ok = False
    try:
        bootstrap, started = _broker()
        result = ensure_topics(bootstrap, cat.specs(partitions=4))
        print(
            f"demo: topics {cat.prefix}.*: {len(result.created)} created, "
            f"{len(result.existing)} existed"
        )
        proc, log_path = _start_worker(bootstrap, cat.prefix, data_dir, args.app)
        ok = asyncio.run(_run(bootstrap, cat, proc, log_path, args))
    except KeyboardInterrupt:
        print("\ndemo: stopping ...")
        ok = True
    except (DemoError, ConnectionError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
    finally:
        if proc is not None:
            stop_process(proc)
            print(f"demo: worker stopped (exit {proc.returncode})")
            _show_journal(bootstrap, cat, scope)
        if started:
            subprocess.run([str(local_kafka_script()), "stop"], check=False)
            print("demo: local Kafka stopped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
