"""A real ``botmesh console`` process for the tests (the Kafka tests and the browser tests):
started as an operator starts it, on 127.0.0.1 and a free port, with a token file of its
own, against the test's broker and topic prefix.

    with start_console(kafka_bootstrap, topic_prefix, tmp_path) as console:
        console.url            # http://127.0.0.1:<port>
        console.token          # the operator's token (its name: ``console.who``)
        console.get("/")       # (status, HTML), urllib: usable from sync and async tests
        console.wait_for("/timeline?chat_id=c1", 'data-state="sent"')

``token=None`` starts it without a token (read-only, as the console says); ``read_only``
and ``show_texts`` pass ``--read-only`` and ``--show-texts``. ``signed_in()`` signs in
with the token and returns a ``Browser``: a cookie jar and the session's CSRF token, for
form posts as a browser makes them. Every wait ends as soon as its condition holds; the
time limits are hang guards only.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import re
import secrets
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.kill import Child

__all__ = ["WHO", "Browser", "RunningConsole", "csrf_of", "start_console"]

#: The name the console logs for the test's token.
WHO = "tester"
WAIT_S = 120.0  # hang guard only
_LISTENING = "botmesh console: listening on "


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry (signed in only)."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF token on the page: not signed in?"
    return found[1]


@dataclass
class Browser:
    """Requests with the session cookie of a sign-in, as a browser sends them."""

    base: str
    opener: urllib.request.OpenerDirector
    csrf: str = ""

    def get(self, path: str) -> tuple[int, str]:
        return _call(self.opener, self.base + path)

    def post(self, path: str, form: Mapping[str, str], *, csrf: bool = True) -> tuple[int, str]:
        """A form post; with the session's CSRF token unless ``csrf`` is false (or the form
        gives its own)."""
        data = {"csrf": self.csrf, **form} if csrf else dict(form)
        return _call(self.opener, self.base + path, data)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _call(
    opener: urllib.request.OpenerDirector,
    url: str,
    form: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    request = urllib.request.Request(url, data=data, headers=dict(headers or {}))
    try:
        with opener.open(request, timeout=WAIT_S) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@dataclass
class RunningConsole:
    child: Child
    url: str
    token: str | None
    who: str = WHO
    lines: list[str] = field(default_factory=list)

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, str]:
        return _call(urllib.request.build_opener(), self.url + path, headers=headers)

    def post(
        self, path: str, form: Mapping[str, str], headers: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        """A form post without a session (a script's, with ``headers``)."""
        return _call(urllib.request.build_opener(), self.url + path, form, headers)

    def wait_for(self, path: str, *texts: str, timeout: float = WAIT_S) -> str:
        """The page at ``path`` once it holds every one of ``texts``."""
        deadline = time.monotonic() + timeout
        while True:
            status, html = self.get(path)
            if status == 200 and all(t in html for t in texts):
                return html
            assert self.child.alive(), f"the console exited:\n{self.child.tail(40)}"
            assert time.monotonic() < deadline, f"{path} never showed {texts!r}:\n{html[-3000:]}"
            time.sleep(0.2)

    def signed_in(self) -> Browser:
        """A browser signed in with the token, and its session's CSRF token."""
        assert self.token is not None, "started without a token"
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), _NoRedirect())
        status, _ = _call(opener, self.url + "/login", {"token": self.token, "next": "/"})
        assert status == 303, f"the sign-in answered {status}"
        browser = Browser(self.url, opener)
        _, page = browser.get("/dead-letters")
        browser.csrf = csrf_of(page)
        return browser

    def stop(self) -> int:
        return self.child.stop()


@contextlib.contextmanager
def start_console(
    bootstrap: str,
    prefix: str,
    tmp: Path,
    *,
    token: str | None = "generate",
    read_only: bool = False,
    show_texts: bool = False,
    wait: float = 30.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[RunningConsole]:
    """``botmesh console`` on 127.0.0.1 and a free port, until the block ends (SIGTERM)."""
    if token == "generate":
        token = secrets.token_urlsafe(24)
    args = [
        sys.executable,
        "-m",
        "botmesh",
        "console",
        "--bootstrap",
        bootstrap,
        "--prefix",
        prefix,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--wait",
        str(wait),
    ]
    if token is not None:
        tmp.mkdir(parents=True, exist_ok=True)
        token_file = tmp / "console-tokens"
        token_file.write_text(f"{WHO}:{token}\n")
        args += ["--token-file", str(token_file)]
    if read_only:
        args.append("--read-only")
    if show_texts:
        args.append("--show-texts")
    base_env = {"PYTHONUNBUFFERED": "1", "BOTMESH_CONSOLE_TOKEN": ""}
    child = Child(args, env={**base_env, **(env or {})})
    with child:
        line = child.wait_for(_LISTENING, timeout=WAIT_S)
        console = RunningConsole(child, line.removeprefix(_LISTENING).strip(), token)
        try:
            yield console
        finally:
            if child.alive():
                status = child.stop()
                assert status == 0, f"the console stopped with {status}:\n{child.tail(40)}"
            console.lines = list(child.lines)
