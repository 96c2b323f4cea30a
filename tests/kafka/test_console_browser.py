"""``botmesh console`` in a real browser (Debian's headless Chromium through Selenium: see
``tests/browser``), against a real broker, real ``botmesh worker`` processes (the test bot)
and a real ``botmesh console`` process, with the one fake a channel's API (the
``Recorder``, or the test bot's file provider):

- the overview lists the running worker, then a second one joining the group: two rows,
  the partitions split between them, none twice, none left out; a replay's plan names both
  as the reason a real replay would be refused;
- a chat's timeline, asked for through its form, shows the inbound, its reply ``sent``
  after one refused attempt (2 attempts), the provider's message id and the receipt;
- a send the channel refused for good, retried from the dead-letters page (signed in
  through the login page, a dry run, a confirmation), reaches the channel exactly once and
  the page shows the owner's answer;
- signed out, the dead-letters page has no action button, and a retry posted from the
  page without a session (401), or signed in with a forged CSRF token (403), is refused:
  nothing reaches the control topic, nothing is sent, the send stays dead;
- two campaigns produced with ``botmesh broadcast`` (one ``--delay 1h``, one now): the
  campaigns page counts the first all pending and the second all sent once the channel has
  them, lists the scheduled sends soonest first with their chats, and a chat's link leads
  to its timeline, where the send says when it is scheduled for.

The screenshots go to the test's ``tmp_path``; with ``BOTMESH_UPDATE_SCREENSHOTS=1`` to
``docs/img/console/``, the ones docs/console.md shows. Every wait ends as soon as its
condition holds (the time limits are hang guards only); the pages have no script, so a
wait for the index or the group to change reloads the page.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from botmesh import Inbound
from botmesh.streams.ops.tools import end_offsets, produce_inbound
from botmesh.streams.provision import ensure_topics
from botmesh.topics import Catalog
from tests.browser import by_testid, save_screenshot, text_by_testid, wait_for
from tests.browser.conftest import browser
from tests.kafka.bot import reply_text
from tests.kafka.console import RunningConsole, start_console
from tests.kafka.recorder import Recorder
from tests.kafka.worker import PARTITIONS, WAIT_S, Worker

__all__ = ["browser"]  # the fixture, imported for the tests of this module

pytestmark = [pytest.mark.kafka, pytest.mark.browser, pytest.mark.xdist_group("browser")]

ROOT = Path(__file__).resolve().parents[2]
#: Set to 1 to write the screenshots where docs/console.md shows them.
UPDATE_ENV = "BOTMESH_UPDATE_SCREENSHOTS"
DOCS_SHOTS = ROOT / "docs" / "img" / "console"
_POLL = 0.2

T = TypeVar("T")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where this test's screenshots go."""
    return DOCS_SHOTS if os.environ.get(UPDATE_ENV) == "1" else tmp_path / "shots"


@pytest.fixture
def workers(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, recorder: Recorder
) -> Iterator[Callable[[str], Worker]]:
    """``workers(instance)``: a worker of the test's prefix (not started), its sends to the
    recorder, its counters published every second; all closed after the test."""
    ensure_topics(kafka_bootstrap, Catalog(topic_prefix).specs(partitions=PARTITIONS))
    env = {
        "BOTMESH_TEST_OUTBOX_INLINE": "0.5ms",
        "BOTMESH_TEST_OUTBOX_RETRIES": "2",
        "BOTMESH_METRICS_INTERVAL": "1",
    }
    made: list[Worker] = []

    def make(instance: str) -> Worker:
        folder = tmp_path / f"worker-{instance}"
        folder.mkdir()
        w = Worker(
            kafka_bootstrap,
            topic_prefix,
            folder,
            env=env,
            instance=instance,
            recorder=recorder.url,
        )
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def reload_until(
    driver: WebDriver,
    url: str,
    ready: Callable[[WebDriver], T | None],
    what: str,
    alive: Callable[[], None] = lambda: None,
) -> T:
    """Load ``url`` again and again until ``ready(driver)`` returns something (not None);
    return it. ``alive`` fails the test early (a worker that exited)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        driver.get(url)
        got = ready(driver)
        if got is not None:
            return got
        alive()
        if time.monotonic() > deadline:
            body = driver.find_element(By.TAG_NAME, "main").text
            raise AssertionError(f"{url} never showed {what}; it shows:\n{body[-3000:]}")
        time.sleep(_POLL)


def find(scope: WebDriver | WebElement, testid: str, **data: str) -> list[WebElement]:
    """The elements of ``data-testid`` ``testid`` (with these ``data-*`` values) in ``scope``."""
    selector = by_testid(testid) + "".join(
        f'[data-{name.replace("_", "-")}="{value}"]' for name, value in data.items()
    )
    return scope.find_elements(By.CSS_SELECTOR, selector)


def one(scope: WebDriver | WebElement, testid: str, **data: str) -> WebElement:
    found = find(scope, testid, **data)
    assert len(found) == 1, f"{len(found)} elements {testid} {data}, not one"
    return found[0]


def status_code(driver: WebDriver) -> int:
    """The HTTP status of the page the browser shows (its navigation's timing entry)."""
    status = driver.execute_script(
        "return performance.getEntriesByType('navigation')[0].responseStatus"
    )
    assert isinstance(status, int), status
    return status


def sign_in(driver: WebDriver, console: RunningConsole) -> None:
    """Through the login page, as an operator does: the header's link, the token, submit."""
    assert console.token is not None
    driver.get(console.url + "/dead-letters")
    wait_for(driver, by_testid("nav-login")).click()
    wait_for(driver, by_testid("login-token")).send_keys(console.token)
    one(driver, "login-submit").click()
    wait_for(driver, by_testid("whoami"), text=f"signed in as {console.who}")


def send_entry(driver: WebDriver, key: str, state: str) -> WebElement | None:
    """The timeline's entry of send ``key`` once it is ``state`` with a receipt saying so."""
    found = find(driver, "timeline-entry", kind="send", key=key, state=state)
    if found and find(found[0], "send-receipt", state=state):
        return found[0]
    return None


async def wait_until(what: str, check: Callable[[], bool], worker: Worker) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        worker.check_alive()
        assert time.monotonic() < deadline, f"still waiting for {what}"
        await asyncio.sleep(_POLL)


# -- the overview ------------------------------------------------------------------------------


def worker_rows(driver: WebDriver) -> dict[str, tuple[list[int], str]]:
    """Instance id -> (the inbound partitions it owns, its status), as the overview lists."""
    rows: dict[str, tuple[list[int], str]] = {}
    for row in find(driver, "worker-row"):
        shown = one(row, "worker-partitions").text
        parts = [] if shown == "none" else [int(p) for p in shown.split(", ")]
        status = one(row, "worker-status").get_attribute("data-status") or ""
        rows[row.get_attribute("data-instance") or ""] = (parts, status)
    return rows


async def test_the_overview_shows_a_second_worker_joining(
    workers: Callable[[str], Worker], browser: WebDriver, shots: Path, tmp_path: Path
) -> None:
    first, second = workers("0"), workers("1")
    first.start()
    with start_console(first.bootstrap, first.prefix, tmp_path / "console") as console:

        def alive() -> None:
            for w in (first, second):
                if w.child is not None:
                    w.check_alive()

        def alone() -> dict[str, tuple[list[int], str]]:
            def by_itself(d: WebDriver) -> dict[str, tuple[list[int], str]] | None:
                rows = worker_rows(d)
                every = {first.instance_id: (list(range(PARTITIONS)), "ready")}
                return rows if rows == every else None

            return reload_until(
                browser,
                console.url + "/",
                by_itself,
                f"{first.instance_id} alone, ready, with every partition",
                alive,
            )

        await asyncio.to_thread(alone)
        second.start()

        def joined() -> dict[str, tuple[list[int], str]]:
            def settled(d: WebDriver) -> dict[str, tuple[list[int], str]] | None:
                rows = worker_rows(d)
                done = len(rows) == 2 and all(p and s == "ready" for p, s in rows.values())
                return rows if done else None

            rows = reload_until(
                browser,
                console.url + "/",
                settled,
                "two workers, each ready with partitions",
                alive,
            )
            save_screenshot(browser, shots / "overview.png")
            return rows

        rows = await asyncio.to_thread(joined)
        assert set(rows) == {first.instance_id, second.instance_id}
        owned = [p for parts, _ in rows.values() for p in parts]
        assert sorted(owned) == list(range(PARTITIONS)), rows  # each once, none left out

        # a replay's plan while both run: every partition, and the refusal naming both
        def plan() -> tuple[int, str]:
            browser.get(console.url + "/replay")
            wait_for(browser, by_testid("replay-mode-to-earliest")).click()
            one(browser, "replay-submit").click()
            wait_for(browser, by_testid("replay-move"))
            save_screenshot(browser, shots / "replay.png")
            return len(find(browser, "replay-move")), text_by_testid(browser, "replay-refusal")

        moves, refusal = await asyncio.to_thread(plan)
        assert moves == PARTITIONS
        assert first.instance_id in refusal and second.instance_id in refusal
    assert second.stop() == 0
    assert first.stop() == 0


# -- a chat's timeline ------------------------------------------------------------------------


async def test_a_timeline_shows_a_reply_its_retry_and_its_receipt(
    workers: Callable[[str], Worker],
    recorder: Recorder,
    browser: WebDriver,
    shots: Path,
    tmp_path: Path,
) -> None:
    worker = workers("0")
    reply = reply_text("m-retry", "hello there")
    recorder.script(reply, [(500, None)])  # the channel fails the first attempt
    inbound = Inbound(id="m-retry", chat_id="c-retry", text="hello there")
    await produce_inbound(worker.bootstrap, Catalog(worker.prefix).inbound, [inbound])
    worker.start()
    with start_console(worker.bootstrap, worker.prefix, tmp_path / "console") as console:

        def steps() -> dict[str, Any]:
            browser.get(console.url + "/")
            wait_for(browser, by_testid("nav-timeline")).click()
            wait_for(browser, by_testid("timeline-chat")).send_keys("c-retry")
            one(browser, "timeline-submit").click()
            wait_for(browser, by_testid("timeline"))
            asked = browser.current_url
            entry = reload_until(
                browser,
                asked,
                lambda d: send_entry(d, "m-retry:1", "sent"),
                "the reply sent, with its receipt",
                worker.check_alive,
            )
            save_screenshot(browser, shots / "timeline.png")
            inbound = one(browser, "timeline-entry", kind="inbound", id="m-retry")
            return {
                "url": asked,
                "chat": one(browser, "timeline").get_attribute("data-chat"),
                "inbound": inbound.get_attribute("data-state"),
                "inbound sends": len(find(inbound, "timeline-entry", kind="send")),
                "attempts": one(entry, "send-attempts").text,
                "message id": one(entry, "send-message-id").text,
                "receipts": [r.get_attribute("data-state") for r in find(entry, "send-receipt")],
                "entries": len(find(browser, "timeline-entry")),
            }

        shown = await asyncio.to_thread(steps)
    assert worker.stop() == 0
    [call] = recorder.calls()
    assert call.text == reply
    assert [(r.text, r.status) for r in recorder.refusals()] == [(reply, 500)]
    assert shown == {
        "url": f"{console.url}/timeline?chat_id=c-retry",
        "chat": "c-retry",
        "inbound": "done",
        "inbound sends": 1,  # the reply, under its inbound
        "attempts": "2",  # the refused attempt and its retry
        "message id": call.message_id,
        "receipts": ["sent"],
        "entries": 2,
    }


# -- dead letters -----------------------------------------------------------------------------


async def test_a_dead_send_retried_from_the_page_is_sent_exactly_once(
    workers: Callable[[str], Worker],
    recorder: Recorder,
    browser: WebDriver,
    shots: Path,
    tmp_path: Path,
) -> None:
    worker = workers("0")
    cat = Catalog(worker.prefix)
    bad = reply_text("m-dead", "t")
    recorder.refuse(bad)  # a final refusal: the send ends dead at once
    await produce_inbound(
        worker.bootstrap, cat.inbound, [Inbound(id="m-dead", chat_id="c-dead", text="t")]
    )
    worker.start()
    with start_console(worker.bootstrap, worker.prefix, tmp_path / "console") as console:

        def listed() -> None:
            sign_in(browser, console)
            reload_until(
                browser,
                console.url + "/dead-letters?kind=outbox",
                lambda d: find(d, "dlq-row", key="m-dead:1", reason="send-refused") or None,
                "the dead send",
                worker.check_alive,
            )
            save_screenshot(browser, shots / "dead-letters.png")

        await asyncio.to_thread(listed)
        assert recorder.calls() == []
        recorder.allow(bad)  # the channel takes it now
        before = await end_offsets(worker.bootstrap, cat.control)

        def dry_run() -> list[tuple[str | None, str | None]]:
            row = one(browser, "dlq-row", key="m-dead:1")
            one(row, "dlq-action-retry").click()
            wait_for(browser, by_testid("action-dry-run"))
            assert find(browser, "action-confirm")
            return [
                (r.get_attribute("data-target"), r.get_attribute("data-outcome"))
                for r in find(browser, "action-result-row")
            ]

        assert await asyncio.to_thread(dry_run) == [("m-dead:1", "would retry")]
        assert await end_offsets(worker.bootstrap, cat.control) == before  # nothing asked
        assert recorder.calls() == []

        def confirm() -> tuple[list[tuple[str | None, str | None]], str]:
            one(browser, "action-confirm").click()
            wait_for(browser, by_testid("action-result"))
            save_screenshot(browser, shots / "action.png")
            results = [
                (r.get_attribute("data-target"), r.get_attribute("data-outcome"))
                for r in find(browser, "action-result-row")
            ]
            return results, text_by_testid(browser, "action-summary")

        results, summary = await asyncio.to_thread(confirm)
        assert results == [("m-dead:1", "done")]
        assert "1 of 1 done" in summary
        await wait_until("the retried send", lambda: bool(recorder.calls()), worker)

        def journal() -> str | None:
            entry = reload_until(
                browser,
                console.url + "/timeline?chat_id=c-dead",
                lambda d: send_entry(d, "m-dead:1", "sent"),
                "the retried send sent, with its receipt",
                worker.check_alive,
            )
            return one(entry, "send-message-id").text

        message_id = await asyncio.to_thread(journal)
    assert worker.stop() == 0  # a clean stop: whatever it still had to send, it sent
    [call] = recorder.calls()  # exactly once
    assert (call.text, call.message_id) == (bad, message_id)


async def test_an_action_without_the_token_is_refused(
    workers: Callable[[str], Worker],
    recorder: Recorder,
    browser: WebDriver,
    shots: Path,
    tmp_path: Path,
) -> None:
    worker = workers("0")
    cat = Catalog(worker.prefix)
    bad = reply_text("m-keep", "t")
    recorder.refuse(bad)
    await produce_inbound(
        worker.bootstrap, cat.inbound, [Inbound(id="m-keep", chat_id="c-keep", text="t")]
    )
    worker.start()
    with start_console(worker.bootstrap, worker.prefix, tmp_path / "console") as console:
        url = console.url + "/dead-letters"

        def signed_out() -> list[str]:
            reload_until(
                browser,
                url,
                lambda d: find(d, "dlq-row", key="m-keep:1") or None,
                "the dead send",
                worker.check_alive,
            )
            assert find(browser, "nav-login")
            return [
                str(b.get_attribute("data-testid"))
                for b in browser.find_elements(
                    By.CSS_SELECTOR, '[data-testid^="dlq-action-"], [data-testid^="dlq-bulk-"]'
                )
            ]

        assert await asyncio.to_thread(signed_out) == []
        recorder.allow(bad)  # a retry that got through would send it now
        before = await end_offsets(worker.bootstrap, cat.control)

        def without_a_session() -> tuple[int, str]:
            # the retry form a signed-in page has, confirmed, posted from this page
            browser.execute_script(
                """
                const form = document.createElement('form');
                form.method = 'post';
                form.action = '/dead-letters/action';
                for (const [name, value] of Object.entries(arguments[0])) {
                  const input = document.createElement('input');
                  input.type = 'hidden'; input.name = name; input.value = value;
                  form.appendChild(input);
                }
                document.body.appendChild(form);
                form.submit();
                """,
                {"command": "retry", "key": "m-keep:1", "confirm": "yes", "csrf": "guessed"},
            )
            refused = wait_for(browser, by_testid("action-refused")).text
            save_screenshot(browser, shots / "refused.png")
            return status_code(browser), refused

        status, refused = await asyncio.to_thread(without_a_session)
        assert status == 401 and "sign in first" in refused

        def forged_csrf() -> tuple[int, str]:
            sign_in(browser, console)
            browser.get(url)
            form = one(one(browser, "dlq-row", key="m-keep:1"), "dlq-action-retry")
            form = form.find_element(By.XPATH, "./ancestor::form")
            browser.execute_script(
                """
                const form = arguments[0];
                form.querySelector('input[name=csrf]').value = 'forged';
                const confirm = document.createElement('input');
                confirm.type = 'hidden'; confirm.name = 'confirm'; confirm.value = 'yes';
                form.appendChild(confirm);
                """,
                form,
            )
            one(browser, "dlq-action-retry").click()
            refused = wait_for(browser, by_testid("action-refused")).text
            return status_code(browser), refused

        status, refused = await asyncio.to_thread(forged_csrf)
        assert status == 403 and "CSRF token" in refused

        def still_dead() -> int:
            reload_until(
                browser,
                console.url + "/timeline?chat_id=c-keep",
                lambda d: find(d, "timeline-entry", kind="send", key="m-keep:1") or None,
                "the send",
                worker.check_alive,
            )
            one(browser, "timeline-entry", kind="send", key="m-keep:1", state="dead")
            browser.get(url)
            return len(find(browser, "dlq-row", key="m-keep:1"))

        assert await asyncio.to_thread(still_dead) == 1
        assert await end_offsets(worker.bootstrap, cat.control) == before  # nothing asked
    assert worker.stop() == 0
    assert recorder.calls() == []  # nothing sent
    log = "\n".join(console.lines)
    assert "refused POST /dead-letters/action" in log


# -- campaigns and scheduled sends ------------------------------------------------------------


def broadcast(worker: Worker, folder: Path, campaign: str, chats: list[str], *args: str) -> None:
    """``botmesh broadcast --no-follow`` as an operator runs it (the recipients in a file)."""
    recipients = folder / f"{campaign}.txt"
    recipients.write_text("\n".join(chats) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "botmesh", "broadcast", "--bootstrap", worker.bootstrap,
         "--prefix", worker.prefix, "--campaign", campaign, "--recipients", str(recipients),
         "--text", "news", "--no-follow", *args],
        capture_output=True, text=True, timeout=WAIT_S, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, f"botmesh broadcast: {done.returncode}\n{done.stderr[-3000:]}"


def campaign_counts(driver: WebDriver) -> dict[str, dict[str, str]]:
    """Campaign -> its counts by state and its progress, as the campaigns page lists them."""
    shown: dict[str, dict[str, str]] = {}
    for row in find(driver, "campaign-row"):
        counts = {
            name: one(row, f"campaign-{name}").text
            for name in ("pending", "sent", "dead", "expired", "unknown", "cancelled", "total")
        }
        progress = one(row, "campaign-progress")
        counts["settled"] = progress.get_attribute("data-settled") or ""
        shown[row.get_attribute("data-campaign") or ""] = counts
    return shown


def _counts(pending: int, sent: int) -> dict[str, str]:
    every = {"pending": pending, "sent": sent, "dead": 0, "expired": 0, "unknown": 0,
             "cancelled": 0, "total": pending + sent, "settled": sent}  # fmt: skip
    return {k: str(v) for k, v in every.items()}


async def test_the_campaigns_page_shows_a_scheduled_campaign_and_a_sent_one(
    workers: Callable[[str], Worker],
    recorder: Recorder,
    browser: WebDriver,
    shots: Path,
    tmp_path: Path,
) -> None:
    worker = workers("0")
    worker.start()
    later, now = ["l-1", "l-2", "l-3"], ["n-1", "n-2"]
    before = time.time()
    await asyncio.to_thread(broadcast, worker, tmp_path, "later", later, "--delay", "1h")
    after = time.time()
    await asyncio.to_thread(broadcast, worker, tmp_path, "now", now)
    expected = {"later": _counts(3, 0), "now": _counts(0, 2)}
    with start_console(worker.bootstrap, worker.prefix, tmp_path / "console") as console:

        def campaigns() -> dict[str, Any]:
            browser.get(console.url + "/")
            wait_for(browser, by_testid("nav-campaigns")).click()
            wait_for(browser, by_testid("campaigns"))
            reload_until(
                browser,
                console.url + "/campaigns",
                lambda d: campaign_counts(d) == expected or None,
                "both campaigns: later all pending, now all sent",
                worker.check_alive,
            )
            save_screenshot(browser, shots / "campaigns.png")
            rows = find(browser, "scheduled-row")
            return {
                "campaigns": [
                    r.get_attribute("data-campaign") for r in find(browser, "campaign-row")
                ],
                "scheduled": [
                    (r.get_attribute("data-key"), one(r, "scheduled-chat").text) for r in rows
                ],
                "at": {float(one(r, "scheduled-at").get_attribute("data-at") or 0) for r in rows},
                "count": text_by_testid(browser, "scheduled-count"),
            }

        shown = await asyncio.to_thread(campaigns)

        def to_the_timeline() -> tuple[str, str | None]:
            one(one(browser, "scheduled-row", key="campaign:later:l-2"), "scheduled-chat").click()
            entry = wait_for(
                browser,
                by_testid("timeline-entry") + '[data-key="campaign:later:l-2"]',
            )
            return browser.current_url, one(entry, "send-at").get_attribute("data-at")

        url, at = await asyncio.to_thread(to_the_timeline)
    assert worker.stop() == 0
    # the channel got the campaign sent now, each recipient once, and none of the later one
    assert sorted((c.chat_id, c.text) for c in recorder.calls()) == [
        ("n-1", "news"),
        ("n-2", "news"),
    ]
    assert set(shown["campaigns"]) == {"later", "now"}
    # soonest first: the three share one time (the command's), so in chat order
    assert shown["scheduled"] == [(f"campaign:later:{c}", c) for c in later]
    assert shown["count"] == "3"
    [scheduled_at] = shown["at"]
    assert before + 3600 <= scheduled_at <= after + 3600
    assert url == f"{console.url}/timeline?chat_id=l-2"
    assert at is not None and float(at) == scheduled_at
