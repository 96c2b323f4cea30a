"""The browser harness itself, in the real headless Chromium: an aiohttp server on a free port
of 127.0.0.1 serves a form with a CSRF hidden field that posts back, and a page whose
``data-testid`` element one line of JavaScript fills. The browser submits the form (the
server sees the token it issued), reads the filled element, logs no error and saves a PNG;
``wait_for`` and ``text_by_testid`` fail, naming what they saw, when the page is not what
the test expects; a missing browser fails naming the packages to install.
"""

from __future__ import annotations

import asyncio
import html
import secrets
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from tests.browser import (
    ENV_CHROMIUM,
    WINDOW,
    BrowserUnavailable,
    by_testid,
    console_errors,
    save_screenshot,
    start_chromium,
    text_by_testid,
    wait_for,
)

# One browser at a time: in a parallel run (make test: --dist loadgroup) the browser tests
# share one worker (once pytest-xdist works with pytest 9.2 again: see conftest.py).
pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("browser")]

_HEAD = '<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,">'


class Site:
    """Two pages: ``/form`` (GET: the form with this site's CSRF token; POST: a greeting,
    or 403 for another token) and ``/script`` (an element filled by JavaScript)."""

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(16)
        self.posted: list[dict[str, str]] = []
        self.app = web.Application()
        self.app.router.add_get("/form", self.form)
        self.app.router.add_post("/form", self.post)
        self.app.router.add_get("/script", self.script)

    async def form(self, request: web.Request) -> web.Response:
        return web.Response(
            content_type="text/html",
            text=f"""{_HEAD}<title>form</title>
<form method="post" action="/form">
  <input type="hidden" name="csrf" value="{self.token}">
  <label>Name <input name="name" data-testid="name"></label>
  <button type="submit" data-testid="send">Send</button>
</form>""",
        )

    async def post(self, request: web.Request) -> web.Response:
        data = await request.post()
        fields = {k: v for k, v in data.items() if isinstance(v, str)}
        self.posted.append(fields)
        if fields.get("csrf") != self.token:
            return web.Response(
                status=403,
                content_type="text/html",
                text=f'{_HEAD}<p data-testid="refused">refused: not our CSRF token</p>',
            )
        name = html.escape(fields.get("name", ""))
        return web.Response(
            content_type="text/html",
            text=f'{_HEAD}<title>done</title><p data-testid="greeting">Hello, {name}</p>',
        )

    async def script(self, request: web.Request) -> web.Response:
        return web.Response(
            content_type="text/html",
            text=f"""{_HEAD}<title>script</title><p data-testid="filled"></p>
<script>document.querySelector('[data-testid="filled"]').textContent = ["filled", "by", "script"].join(" ") + " in " + innerWidth + "x" + innerHeight;</script>""",  # noqa: E501
        )


@asynccontextmanager
async def serve(site: Site) -> AsyncIterator[str]:
    """Serve ``site`` on a free port of 127.0.0.1 (the system picks it); yield its base URL."""
    runner = web.AppRunner(site.app)
    await runner.setup()
    try:
        tcp = web.TCPSite(runner, "127.0.0.1", 0)
        await tcp.start()
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def test_form_and_script_in_a_real_browser(browser: WebDriver, tmp_path: Path) -> None:
    site = Site()

    def steps(base: str) -> tuple[str, str, list[str], dict[str, int]]:
        browser.get(f"{base}/form")
        wait_for(browser, by_testid("name")).send_keys("Ada <Lovelace>")
        browser.find_element(By.CSS_SELECTOR, by_testid("send")).click()
        greeting = wait_for(browser, by_testid("greeting"), text="Hello, Ada").text
        browser.get(f"{base}/script")
        wait_for(browser, by_testid("filled"), text="filled by script")
        filled = text_by_testid(browser, "filled")
        save_screenshot(browser, tmp_path / "shots" / "script.png")
        return greeting, filled, console_errors(browser), browser.get_window_size()

    async with serve(site) as base:
        greeting, filled, errors, window = await asyncio.to_thread(steps, base)

    assert greeting == "Hello, Ada <Lovelace>"  # escaped by the server, shown as typed
    assert site.posted == [{"csrf": site.token, "name": "Ada <Lovelace>"}]
    assert (window["width"], window["height"]) == WINDOW
    viewport = filled.removeprefix("filled by script in ")
    width, height = (int(n) for n in viewport.split("x"))
    assert width == WINDOW[0] and 0 < height <= WINDOW[1], filled
    assert errors == []
    assert _png_size(tmp_path / "shots" / "script.png") == (width, height)  # the viewport


async def test_another_csrf_token_is_refused(browser: WebDriver) -> None:
    site = Site()

    def steps(base: str) -> str:
        browser.get(f"{base}/form")
        browser.execute_script("document.querySelector('input[name=csrf]').value = 'forged'")
        wait_for(browser, by_testid("name")).send_keys("Mallory")
        browser.find_element(By.CSS_SELECTOR, by_testid("send")).click()
        return wait_for(browser, by_testid("refused")).text

    async with serve(site) as base:
        refused = await asyncio.to_thread(steps, base)

    assert refused == "refused: not our CSRF token"
    assert site.posted == [{"csrf": "forged", "name": "Mallory"}]


async def test_the_helpers_fail_naming_what_they_saw(browser: WebDriver) -> None:
    def steps(base: str) -> None:
        browser.get(f"{base}/script")
        wait_for(browser, by_testid("filled"), text="filled")
        with pytest.raises(AssertionError, match=r"with text 'wrong text'.*'filled by script"):
            wait_for(browser, by_testid("filled"), text="wrong text", timeout=0.5)
        with pytest.raises(AssertionError, match="no element matched"):
            wait_for(browser, by_testid("absent"), timeout=0.2)
        with pytest.raises(AssertionError, match=r"no data-testid='absent'.*\['filled'\]"):
            text_by_testid(browser, "absent")

    async with serve(Site()) as base:
        await asyncio.to_thread(steps, base)


def test_a_missing_browser_fails_naming_the_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_CHROMIUM, str(tmp_path / "no-chromium"))
    with pytest.raises(BrowserUnavailable, match="apt-get install -y chromium chromium-driver"):
        start_chromium(tmp_path)
