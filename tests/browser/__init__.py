"""A real headless browser for the tests marked ``browser``: Debian's Chromium, driven by
Selenium 4 through Debian's ``chromedriver`` (built from the same source package as the
browser, so the two always have the same version; ``bash .ci/run`` installs both).

``start_chromium(folder)`` starts one browser with a fresh profile in ``folder``;
``open_chromium(folder)`` does the same as a context manager and quits it on exit (the
browser, then the chromedriver Selenium started); the ``browser`` fixture of ``conftest.py``
gives each test one. The helpers take the driver:

- ``wait_for(driver, css_selector, text=None)``: waits for the selector (and the text), fails
  naming what it saw;
- ``by_testid(name)``: the selector of ``[data-testid="name"]``;
- ``text_by_testid(driver, name)``: that element's rendered text;
- ``save_screenshot(driver, path)``: the page's viewport as a PNG;
- ``console_errors(driver)``: the page's JavaScript errors.

``BOTMESH_TEST_CHROMIUM`` / ``BOTMESH_TEST_CHROMEDRIVER`` name other binaries (default:
``chromium`` and ``chromedriver`` on ``PATH``). A missing browser is an error, never a skip,
as a missing server is (``tests/servers.py``): the message says what to install.

Selenium's calls block. In an async test (the server under test in the test's event loop),
call them in a thread: ``await asyncio.to_thread(wait_for, browser, sel, "ok")``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from selenium import webdriver
from selenium.common.exceptions import (
    InvalidSessionIdException,
    NoSuchElementException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

__all__ = [
    "ENV_CHROMEDRIVER",
    "ENV_CHROMIUM",
    "PAGE_LOAD_TIMEOUT",
    "WAIT_TIMEOUT",
    "WINDOW",
    "BrowserUnavailable",
    "by_testid",
    "console_errors",
    "open_chromium",
    "save_screenshot",
    "start_chromium",
    "text_by_testid",
    "wait_for",
]

ENV_CHROMIUM = "BOTMESH_TEST_CHROMIUM"
ENV_CHROMEDRIVER = "BOTMESH_TEST_CHROMEDRIVER"
#: The browser's window, in CSS pixels. Headless Chromium keeps room for its (invisible) tabs
#: and toolbar: the page's viewport, and so a screenshot, is 1280 wide and less than 900 high.
WINDOW = (1280, 900)
#: A hang guard, not a wait: a page of a local test server loads in milliseconds.
PAGE_LOAD_TIMEOUT = 30.0
#: How long ``wait_for`` waits by default, in seconds.
WAIT_TIMEOUT = 10.0
_POLL = 0.05

_PNG = b"\x89PNG\r\n\x1a\n"
_TESTID = re.compile(r"[A-Za-z0-9_.:-]+")


class BrowserUnavailable(RuntimeError):
    """No browser or no chromedriver here, or the two did not start a session."""


def _binary(env: str, name: str) -> str:
    given = os.environ.get(env)
    found = given or shutil.which(name)
    if not found or not os.access(found, os.X_OK):
        where = f"{env}={given} is not an executable" if given else f"no `{name}` on PATH"
        raise BrowserUnavailable(
            f"{where}: the browser tests need Debian's Chromium and its chromedriver. Install "
            f"them with `apt-get install -y chromium chromium-driver` (bash .ci/run does), or "
            f"name the binary in {env}"
        )
    return found


def start_chromium(folder: Path) -> WebDriver:
    """A headless Chromium with a fresh profile in ``folder`` (its chromedriver's log in
    ``folder / "chromedriver.log"``), the window ``WINDOW``, a page-load timeout of
    ``PAGE_LOAD_TIMEOUT``. The caller quits it (``driver.quit()``: the browser, then the
    chromedriver Selenium started). Raises ``BrowserUnavailable``."""
    chromium = _binary(ENV_CHROMIUM, "chromium")
    chromedriver = _binary(ENV_CHROMEDRIVER, "chromedriver")
    profile = folder / "profile"
    profile.mkdir(parents=True, exist_ok=True)
    log = folder / "chromedriver.log"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    options.add_argument("--headless=new")
    options.add_argument(f"--window-size={WINDOW[0]},{WINDOW[1]}")
    options.add_argument(f"--user-data-dir={profile}")
    # Docker gives /dev/shm 64 MB, too little for Chromium; Debian's launcher adds this flag
    # itself only when its check of /dev/shm works (it does not when /dev/shm is mounted twice).
    options.add_argument("--disable-dev-shm-usage")
    if os.geteuid() == 0:  # Chromium's sandbox refuses to run as root
        options.add_argument("--no-sandbox")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # for console_errors
    # An explicit chromedriver: Selenium Manager (which would download one) never runs.
    service = Service(executable_path=chromedriver, log_output=str(log))
    try:
        driver = webdriver.Chrome(options=options, service=service)
    except WebDriverException as exc:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise BrowserUnavailable(
            f"{chromedriver} did not start {chromium}: {exc.msg}\n{tail}".rstrip()
        ) from exc
    try:
        driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT)
    except BaseException:
        driver.quit()
        raise
    return driver


@contextmanager
def open_chromium(folder: Path) -> Iterator[WebDriver]:
    """``start_chromium(folder)``, quit on exit."""
    driver = start_chromium(folder)
    try:
        yield driver
    finally:
        driver.quit()


def by_testid(name: str) -> str:
    """The CSS selector of the element whose ``data-testid`` is ``name``."""
    if not _TESTID.fullmatch(name):
        raise ValueError(f"not a plain data-testid: {name!r}")
    return f'[data-testid="{name}"]'


def wait_for(
    driver: WebDriver, css_selector: str, text: str | None = None, timeout: float = WAIT_TIMEOUT
) -> WebElement:
    """Wait until an element matches ``css_selector`` and, when ``text`` is given, its
    rendered text contains ``text``; return it. Polls the page (no fixed sleep); an error of
    a page between two loads (a form just submitted) is polled over too. After ``timeout``
    seconds fails (``AssertionError``) naming the selector and what it saw last."""
    seen: list[str] = []

    def ready(d: WebDriver) -> Literal[False] | WebElement:
        try:
            element = d.find_element(By.CSS_SELECTOR, css_selector)
            if text is None:
                return element
            shown = element.text
        except NoSuchElementException:
            seen[:] = ["no element matched"]
            return False
        except InvalidSessionIdException:
            raise  # the browser is gone: no use waiting
        except WebDriverException as exc:  # stale element, a document being replaced
            seen[:] = [f"{type(exc).__name__}: {exc.msg}"]
            return False
        seen[:] = [f"its text was {shown!r}"]
        return element if text in shown else False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=_POLL).until(ready)
    except TimeoutException:
        what = f"{css_selector!r} with text {text!r}" if text is not None else repr(css_selector)
        saw = seen[0] if seen else "nothing"
        raise AssertionError(
            f"waited {timeout}s for {what} on {driver.current_url}: {saw}"
        ) from None


def text_by_testid(driver: WebDriver, name: str) -> str:
    """The rendered text of the element whose ``data-testid`` is ``name`` (now, no wait:
    ``wait_for`` first when the page fills it later). Fails naming the testids present."""
    try:
        return driver.find_element(By.CSS_SELECTOR, by_testid(name)).text
    except NoSuchElementException:
        present = driver.execute_script(
            "return [...document.querySelectorAll('[data-testid]')].map(e => e.dataset.testid)"
        )
        raise AssertionError(
            f"no data-testid={name!r} on {driver.current_url}; the page has {present}"
        ) from None


def save_screenshot(driver: WebDriver, path: Path) -> Path:
    """Save what the page shows (its viewport) as a PNG at ``path``, its folder made if
    missing; return ``path``."""
    png = driver.get_screenshot_as_png()
    if not png.startswith(_PNG):
        raise AssertionError(f"the browser's screenshot is not a PNG: {png[:16]!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    return path


def console_errors(driver: WebDriver) -> list[str]:
    """The messages the page logged at level SEVERE (uncaught errors, failed loads,
    ``console.error``) since the last call."""
    # Selenium leaves get_log unannotated.
    entries = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return [str(e["message"]) for e in entries if e["level"] == "SEVERE"]
