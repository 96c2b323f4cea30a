"""The console's HTTP server (aiohttp): its routes, who may act, and the data each page
reads. See ``botmesh.console`` for the routes and the page elements.

Reading needs nothing: every ``GET`` page is served to whoever reaches the console (it
binds to 127.0.0.1 unless told otherwise). Acting (``POST``) is refused in read-only mode
(``--read-only``, or no token given) with 403; otherwise it needs ``Authorization: Bearer
<token>``, or the session cookie a sign-in set together with that session's CSRF token in
the form (401 without either, 403 with a CSRF token missing or wrong, or a request from
another origin). Every action is logged at info with who (the token's name, never the
token) and what (the command, the filter, the keys), and so is every refusal, at warning.

The pages read: the overview, ``botmesh.streams.ops.operator.status`` (the group, the lag,
the dead letters' counts, the parked sends; in a thread: its admin client blocks) and the
index; a chat's timeline, the index only (a dictionary read); the campaigns and the
scheduled sends, the index (its two small tables of them); the dead letters, the index; an
action, the dead-letter topic itself (``read_dead_letters``) and then
``botmesh.streams.ops.dlq.act``, exactly as ``botmesh dlq`` does; a replay's plan,
``botmesh.streams.ops.operator.replay`` with ``dry_run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from botmesh.console import pages
from botmesh.console.auth import SESSION_COOKIE, SESSION_TTL, Session, Sessions, Tokens, csrf_ok
from botmesh.console.index import Index
from botmesh.console.render import CSP
from botmesh.observability.http import serving_app
from botmesh.streams.connection import Brokers, servers
from botmesh.streams.ops import dlq
from botmesh.streams.ops import operator as op
from botmesh.streams.ops.tail import Follower
from botmesh.topics.catalog import Catalog

__all__ = ["Console", "ConsoleConfig", "serve", "serving"]

log = logging.getLogger("botmesh.console")

#: The default port of ``botmesh console``.
DEFAULT_PORT = 8470
#: The scheduled sends the campaigns page lists (the soonest; it says how many more).
SCHEDULED_LISTED = 500
#: Seconds a refused sign-in is answered late (a brake on guessing).
_REFUSED_DELAY = 0.5

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """What ``botmesh console`` serves, and how."""

    bootstrap: Brokers
    prefix: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    tokens: Tokens = field(default_factory=Tokens)
    #: no action, whatever the token
    read_only: bool = False
    #: show message texts (else ``hidden (N chars)``)
    show_texts: bool = False
    #: seconds each request to the broker may take
    timeout: float = 10.0
    #: seconds an action waits for the chats' owners to answer
    wait: float = 30.0

    @property
    def read_only_why(self) -> str | None:
        """Why actions are off, or ``None`` when they are on."""
        if self.read_only:
            return "started with --read-only: retry, replay and discard are off"
        if not self.tokens.any:
            return (
                "no token was given (--token-file, or BOTMESH_CONSOLE_TOKEN): retry, replay "
                "and discard are off"
            )
        return None


class Console:
    """The console of one prefix: its index (kept by a follower thread) and its web app."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.cat = Catalog(config.prefix)
        self.index = Index(self.cat)
        self.follower = Follower(
            config.bootstrap,
            self.index.topics,
            self.index.apply,
            group_id=f"{config.prefix}.console",
        )
        self.sessions = Sessions()
        self._names = {
            self.index.changelog: "journal changelog",
            self.cat.sent: "receipts",
            self.cat.inbound_dlq: "inbound.dlq",
            self.cat.outbox_dlq: "outbox.dlq",
            self.cat.requests_dlq: "requests.dlq",
            self.cat.metrics: "metrics",
        }

    def start(self) -> None:
        """Start following the topics (the index fills in the background)."""
        self.follower.start()

    def close(self) -> None:
        self.follower.stop()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_headers])
        app.add_routes(
            [
                web.get("/", self.overview),
                web.get("/timeline", self.timeline),
                web.get("/campaigns", self.campaigns),
                web.get("/dead-letters", self.dead_letters),
                web.post("/dead-letters/action", self.act),
                web.get("/replay", self.replay),
                web.get("/login", self.login_page),
                web.post("/login", self.login),
                web.post("/logout", self.logout),
                web.get("/healthz", self.healthz),
            ]
        )
        return app

    # -- who is asking ---------------------------------------------------------------------

    def _session(self, request: web.Request) -> Session | None:
        return self.sessions.get(request.cookies.get(SESSION_COOKIE))

    def _view(self, request: web.Request) -> pages.View:
        read_only = self.config.read_only_why
        session = None if read_only is not None else self._session(request)
        return pages.View(
            prefix=self.cat.prefix,
            who=session.who if session is not None else None,
            csrf=session.csrf if session is not None else None,
            read_only=read_only,
            show_texts=self.config.show_texts,
            progress=self.follower.progress(),
            names=self._names,
            follower_error=self.follower.error,
            chats=self.index.chats,
        )

    def _refuse(self, request: web.Request, status: int, why: str) -> web.Response:
        log.warning(
            "console: refused %s %s from %s: %s", request.method, request.path, request.remote, why
        )
        html = pages.message(self._view(request), "Refused", why, testid="action-refused")
        return _html(html, status)

    async def _actor(self, request: web.Request, form: Mapping[str, Any]) -> str | web.Response:
        """Who asks for this action, or the refusal (403 read-only, 401 no credentials,
        403 a CSRF token missing or wrong, or another origin)."""
        why = self.config.read_only_why
        if why is not None:
            return self._refuse(request, 403, f"read-only: {why}")
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            who = self.config.tokens.who(token.strip())
            if who is None:
                return self._refuse(request, 401, "the bearer token is not one of the console's")
            return who
        session = self._session(request)
        if session is None:
            return self._refuse(
                request,
                401,
                "sign in first (/login), or send Authorization: Bearer <token>",
            )
        if not _same_origin(request):
            return self._refuse(request, 403, "the request came from another site")
        if not csrf_ok(session, _field(form, "csrf")):
            return self._refuse(
                request,
                403,
                "the form's CSRF token is missing or not this session's: reload the page and "
                "try again",
            )
        return session.who

    # -- pages -----------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def overview(self, request: web.Request) -> web.Response:
        status, error = None, None
        try:
            status = await asyncio.to_thread(
                op.status,
                self.config.bootstrap,
                self.cat,
                journal=False,
                timeout=self.config.timeout,
            )
        except (op.TopicMissing, ConnectionError) as exc:
            error = str(exc)
        except Exception as exc:
            log.exception("console: the overview could not read the group")
            error = f"could not read the group from Kafka ({type(exc).__name__}: {exc})"
        html = pages.overview(
            self._view(request),
            status,
            error,
            inbound=self.cat.inbound,
            workers=self.index.workers(),
            dead=self.index.dead_counts(),
            ambiguous=self.index.ambiguous(),
            history=self.index.history(),
            counters=request.query.getall("counter", []),
            scheduled=self.index.scheduled(time.time(), 0)[1],
            running=sum(1 for c in self.index.campaigns() if c.status.pending),
        )
        return _html(html, 200 if error is None else 503)

    async def timeline(self, request: web.Request) -> web.Response:
        chat = request.query.get("chat_id", "").strip() or None
        found = self.index.timeline(chat) if chat is not None else None
        return _html(pages.timeline(self._view(request), chat, found))

    async def campaigns(self, request: web.Request) -> web.Response:
        now = time.time()
        listed, waiting, due = self.index.scheduled(now, SCHEDULED_LISTED)
        html = pages.campaigns(
            self._view(request),
            self.index.campaigns(),
            listed,
            waiting=waiting,
            due=due,
            now=now,
        )
        return _html(html)

    def _fields(self, source: Mapping[str, Any]) -> dict[str, str]:
        return {k: _field(source, k) for k in pages.FILTER_FIELDS}

    @staticmethod
    def _filter(fields: Mapping[str, str]) -> dlq.Filter:
        """The dead letters the fields pick; ``ValueError`` naming a bad time."""
        return dlq.Filter(
            chat=fields["chat_id"] or None,
            key=fields["key"] or None,
            reason=fields["reason"] or None,
            since=dlq.parse_when(fields["since"] or None, "since"),
            until=dlq.parse_when(fields["until"] or None, "until"),
        )

    async def dead_letters(self, request: web.Request) -> web.Response:
        fields = self._fields(request.query)
        kind = fields["kind"]
        error = None
        letters = self.index.dead_letters()
        try:
            if kind and kind not in dlq.KINDS:
                raise ValueError(f"kind {kind!r}: use one of {', '.join(dlq.KINDS)}")
            flt = self._filter(fields)
        except ValueError as exc:
            error, letters = str(exc), []
        else:
            letters = [
                d
                for d in letters
                if flt.match(d) and (not kind or self.index.dlq_kinds[d.topic] == kind)
            ]
        html = pages.dead_letters(self._view(request), letters, self.index.dlq_kinds, fields, error)
        return _html(html, 200 if error is None else 400)

    async def act(self, request: web.Request) -> web.Response:
        form = await request.post()
        who = await self._actor(request, form)
        if isinstance(who, web.Response):
            return who
        view = self._view(request)
        command = _field(form, "command")
        fields = self._fields(form)
        try:
            kind = dlq.command_kind(command)
            flt = self._filter(fields)
        except ValueError as exc:
            return _html(pages.message(view, "Bad request", str(exc), testid="error"), 400)
        confirmed = _field(form, "confirm") == "yes"
        asked = ", ".join(f"{k}={v}" for k, v in fields.items() if v and k != "kind") or "all"
        log.info(
            "console: %s asks to %s the %s dead letters matching %s (%s)",
            who,
            command,
            kind,
            asked,
            "confirmed" if confirmed else "dry run",
        )
        report = await self._carry_out(view, who, command, kind, flt, confirmed=confirmed)
        if isinstance(report, web.Response):
            return report
        log.info(
            "console: %s %s: %s [%s]",
            who,
            command,
            report.summary,
            ", ".join(f"{r.get('target')}: {r['outcome']}" for r in report.results),
        )
        html = pages.action(
            view,
            command,
            fields,
            report.results,
            report.summary,
            dry_run=not confirmed,
            nothing=report.nothing,
            control=self.cat.control,
        )
        return _html(html)

    async def _carry_out(
        self,
        view: pages.View,
        who: str,
        command: str,
        kind: str,
        flt: dlq.Filter,
        *,
        confirmed: bool,
    ) -> dlq.ActionReport | web.Response:
        """Reads the dead letters ``flt`` picks and asks their owners to act (or only plans
        it, unless ``confirmed``); the error page (503) if Kafka fails on the way."""
        try:
            letters = await dlq.read_dead_letters(
                self.config.bootstrap, [dlq.dlq_topic(self.cat, kind)], flt
            )
            report = await dlq.act(
                self.config.bootstrap,
                self.cat,
                command,
                letters,
                dry_run=not confirmed,
                wait_s=self.config.wait,
                by=f"console:{who}",
            )
        except (ConnectionError, LookupError) as exc:  # no broker, or a topic missing
            log.warning("console: %s's %s failed: %s", who, command, exc)
            return _html(pages.message(view, f"{command}: failed", str(exc), testid="error"), 503)
        except Exception as exc:  # the broker went away in the middle, and its kin
            log.exception("console: %s's %s failed", who, command)
            text = (
                f"{type(exc).__name__}: {exc}; nothing is known to be done: look at the dead "
                "letters and the timeline, then try again"
            )
            return _html(pages.message(view, f"{command}: failed", text, testid="error"), 503)
        return report

    async def replay(self, request: web.Request) -> web.Response:
        q = request.query
        topics = [t for t in q.getall("topic", []) if t] or ["inbound"]
        fields = {
            "mode": q.get("mode", ""),
            "value": q.get("value", "").strip(),
            "partition": q.get("partition", "").strip(),
            "topic": ",".join(topics),
        }
        view = self._view(request)
        if not fields["mode"]:
            return _html(pages.replay(view, fields, None, None, []))
        result, error, words = None, None, ["replay"]
        try:
            kwargs, words = _replay_args(fields, topics)
            result = await asyncio.to_thread(
                op.replay,
                self.config.bootstrap,
                self.cat,
                dry_run=True,
                timeout=self.config.timeout,
                **kwargs,
            )
        except ValueError as exc:
            error = str(exc)
        except (op.TopicMissing, ConnectionError) as exc:
            error = str(exc)
        status = 200 if error is None else 400
        return _html(pages.replay(view, fields, result, error, words), status)

    # -- signing in and out ----------------------------------------------------------------

    async def login_page(self, request: web.Request) -> web.Response:
        view = self._view(request)
        if view.read_only is not None:
            return _html(
                pages.message(view, "Sign in", f"read-only: {view.read_only}", testid="error"),
                403,
            )
        return _html(pages.login(view, None, _local(request.query.get("next", "/"))))

    async def login(self, request: web.Request) -> web.Response:
        view = self._view(request)
        if view.read_only is not None:
            return self._refuse(request, 403, f"read-only: {view.read_only}")
        if not _same_origin(request):
            return self._refuse(request, 403, "the request came from another site")
        form = await request.post()
        who = self.config.tokens.who(_field(form, "token"))
        next_path = _local(_field(form, "next") or "/")
        if who is None:
            log.warning("console: a sign-in with a token that is not one of the console's")
            await asyncio.sleep(_REFUSED_DELAY)
            html = pages.login(view, "that token is not one of the console's", next_path)
            return _html(html, 401)
        session = self.sessions.open(who)
        log.info("console: %s signed in from %s", who, request.remote)
        response = web.Response(status=303, headers={"Location": next_path})
        response.set_cookie(
            SESSION_COOKIE,
            session.id,
            max_age=int(SESSION_TTL),
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )
        return response

    async def logout(self, request: web.Request) -> web.Response:
        form = await request.post()
        session = self._session(request)
        if session is None:
            return web.Response(status=303, headers={"Location": "/"})
        if not csrf_ok(session, _field(form, "csrf")):
            return self._refuse(request, 403, "the form's CSRF token is missing or wrong")
        self.sessions.close(session.id)
        log.info("console: %s signed out", session.who)
        response = web.Response(status=303, headers={"Location": "/"})
        response.del_cookie(SESSION_COOKIE, path="/")
        return response


def _field(source: Mapping[str, Any], name: str) -> str:
    value = source.get(name)
    return value.strip() if isinstance(value, str) else ""


def _local(path: str) -> str:
    """A path on this site to go back to (anything else, ``//host`` or ``/\\host`` which
    browsers read as another site included: ``/``)."""
    ok = path.startswith("/") and path[1:2] not in ("/", "\\") and "\n" not in path
    return path if ok else "/"


def _same_origin(request: web.Request) -> bool:
    """No ``Origin`` header (not a browser's cross-site form), or this site's own."""
    if request.headers.get("Sec-Fetch-Site", "") == "cross-site":
        return False
    origin = request.headers.get("Origin")
    return origin is None or origin == f"{request.scheme}://{request.host}"


def _replay_args(fields: Mapping[str, str], topics: list[str]) -> tuple[dict[str, Any], list[str]]:
    """``op.replay``'s keywords from the replay form, and the command line that says the
    same; ``ValueError`` naming what is wrong."""
    mode, value = fields["mode"], fields["value"]
    kwargs: dict[str, Any] = {"topics": topics}
    words = ["replay"]
    if mode == "from-offset":
        if not value.isdigit():
            raise ValueError(f"--from-offset {value!r}: give a whole number of offsets (120)")
        kwargs["from_offset"] = int(value)
        words += ["--from-offset", value]
    elif mode == "from-time":
        kwargs["from_time_ms"] = op.parse_time(value)
        words += ["--from-time", value]
    elif mode == "to-earliest":
        kwargs["to_earliest"] = True
        words.append("--to-earliest")
    else:
        raise ValueError(f"mode {mode!r}: choose from-offset, from-time or to-earliest")
    raw = [p.strip() for p in fields["partition"].split(",") if p.strip()]
    if not all(p.isdigit() for p in raw):
        raise ValueError(
            f"partitions {fields['partition']!r}: give partition numbers separated by commas "
            "(0,2), or leave it empty for all"
        )
    kwargs["partitions"] = [int(p) for p in raw] or None
    for t in topics:
        words += ["--topic", t]
    for p in raw:
        words += ["--partition", p]
    return kwargs, words


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")
    # not "no-referrer": under it a browser sends `Origin: null` with the page's own form
    # posts, which _same_origin refuses as another site's
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


@contextlib.asynccontextmanager
async def serving(console: Console, host: str, port: int) -> AsyncIterator[str]:
    """Run ``console`` on ``host:port`` (0: any free port) until the block ends; yields its
    base URL."""
    app = console.app()
    console.start()
    try:
        async with serving_app(app, host, port) as url:
            yield url
    finally:
        await asyncio.to_thread(console.close)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(config: ConsoleConfig) -> int:
    """``botmesh console``: serve until SIGTERM or SIGINT; 0 after a clean stop."""
    console = Console(config)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with serving(console, config.host, config.port) as url:
            why = config.read_only_why
            log.info(
                "console: listening on %s for prefix %s (Kafka at %s)",
                url,
                config.prefix,
                servers(config.bootstrap),
            )
            if not _loopback(config.host):
                log.warning(
                    "console: listening on %s, not on this host only: anyone who reaches it "
                    "reads the group, the lag and the dead letters",
                    config.host,
                )
            if why is not None:
                print(f"botmesh console: read-only: {why}", flush=True)
            print(f"botmesh console: listening on {url}", flush=True)  # the last: it is up
            await stop.wait()
            log.info("console: stopping")
        return 0

    return asyncio.run(main())
