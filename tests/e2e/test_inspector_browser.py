"""The web inspector in a real headless Chromium, against a real daemon.

The daemon runs with ``--inspector`` on a free port and is filled through the
Python SDK (tests/inspector_data.py); Selenium then drives Debian's chromium
with its chromedriver (``scripts/install-chromium.sh`` installs both). Without
them the tests are skipped, unless STRATAD_REQUIRE_CHROMIUM is set (CI): then
they fail. Screenshots go to tests/artifacts/ (not committed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from inspector_data import (
    AI_TEXT,
    DECISION,
    HUMAN_TEXT,
    LANGGRAPH_TENANT,
    QUESTION,
    TENANT,
    XSS,
    Filled,
    fill,
    fill_langgraph,
)

from stratad.server.auth import token_digest

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
WAIT_SECONDS = 20.0
#: How the page shows every time: ISO 8601 UTC.
ISO_UTC = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\b")
#: An epoch time in seconds (this century), as the page must never show one.
EPOCH = re.compile(r"\b1[5-9]\d{8}(\.\d+)?\b")

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

Daemon = Any
Driver = Any


def _browser_binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    reason = "chromium and chromedriver are not installed: run scripts/install-chromium.sh"
    if os.environ.get("STRATAD_REQUIRE_CHROMIUM", "") not in ("", "0"):
        pytest.fail(f"STRATAD_REQUIRE_CHROMIUM is set but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Driver]:
    chromium, chromedriver = _browser_binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--window-size=1280,1000",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    # An explicit driver path: Selenium Manager never downloads anything.
    service = webdriver.ChromeService(executable_path=chromedriver)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def _start_inspected(
    start_daemon: Callable[..., Daemon], port: int, *args: str
) -> tuple[Daemon, str]:
    """A daemon with its inspector on ``port``: (the daemon, the inspector's base URL)."""
    daemon = start_daemon("--inspector", f"127.0.0.1:{port}", *args)
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{base}/", timeout=10) as response:  # served once SERVING
        assert response.status == 200
    return daemon, base


def wait_for(driver: Driver, condition: Callable[[Driver], Any], what: str) -> Any:
    try:
        return WebDriverWait(driver, WAIT_SECONDS).until(condition)
    except TimeoutException:
        shot = _screenshot(driver, "failure")
        pytest.fail(f"timed out waiting for {what} (screenshot {shot})")


def rows(driver: Driver, testid: str) -> list[Any]:
    return list(driver.find_elements(By.CSS_SELECTOR, f'[data-testid="{testid}"]'))


def row_ids(driver: Driver, testid: str, attribute: str) -> list[str]:
    return [r.get_attribute(attribute) for r in rows(driver, testid)]


def _screenshot(driver: Driver, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"inspector-{name}.png"
    driver.save_screenshot(str(path))
    return path


def no_script_ran(driver: Driver) -> None:
    """The XSS payloads (in a label, a state, a task result) stayed text."""
    assert driver.execute_script("return window.__xss === undefined") is True
    assert driver.find_elements(By.CSS_SELECTOR, 'img[src="x"], main script') == []


def test_inspector_pages_in_chromium(
    start_daemon: Callable[..., Daemon], get_free_port: Callable[[], int], browser: Driver
) -> None:
    daemon, base = _start_inspected(start_daemon, get_free_port())
    filled = fill(daemon.target)

    _tenants_page(browser, base)
    _sessions_page_and_search(browser, base)
    _checkpoint_tree_and_diff(browser, base, filled)
    _structured_state(browser, base)
    _crystals_page(browser, base, filled)


def _tenants_page(driver: Driver, base: str) -> None:
    driver.get(f"{base}/#/")
    wait_for(driver, lambda d: len(rows(d, "tenant-row")) == 2, "the two tenants")
    assert [r.text.split()[0] for r in rows(driver, "tenant-row")] == [TENANT, "other"]


def _sessions_page_and_search(driver: Driver, base: str) -> None:
    driver.get(f"{base}/#/t/{TENANT}")
    wait_for(driver, lambda d: len(rows(d, "session-row")) == 3, "three sessions")
    assert row_ids(driver, "session-row", "data-session") == ["batch-7", "chat-1", "chat-1-fork"]
    chat = rows(driver, "session-row")[1]
    assert f"payload={XSS}" in chat.text  # the label shows as text
    no_script_ran(driver)
    _screenshot(driver, "sessions")

    search = driver.find_element(By.ID, "search")
    search.send_keys("fork")
    wait_for(
        driver,
        lambda d: row_ids(d, "session-row", "data-session") == ["chat-1-fork"],
        "the search to keep only chat-1-fork",
    )
    assert (
        "1 of 3 sessions"
        in driver.find_element(By.CSS_SELECTOR, '[data-testid="session-count"]').text
    )
    search.clear()
    search.send_keys("research")
    wait_for(
        driver,
        lambda d: row_ids(d, "session-row", "data-session") == ["batch-7"],
        "a label search to find batch-7",
    )


def _checkpoint_tree_and_diff(driver: Driver, base: str, f: Filled) -> None:
    driver.get(f"{base}/#/t/{TENANT}/s/chat-1")
    wait_for(driver, lambda d: len(rows(d, "checkpoint")) == 4, "four checkpoints in the tree")
    summary = driver.find_element(By.CSS_SELECTOR, "dl.summary").text
    assert "active" in summary and "team=support" in summary and "keep all" in summary
    # The main line, oldest first; c1b, a younger child of c1, is a branch.
    main_line = driver.find_elements(By.CSS_SELECTOR, 'ul[data-testid="tree"] > li')
    assert [li.get_attribute("data-checkpoint") for li in main_line] == [f.c1, f.c2, f.c3]
    # The fork hangs under the checkpoint it was made from...
    fork = driver.find_element(
        By.CSS_SELECTOR, f'li[data-checkpoint="{f.c2}"] > ul.forks > li[data-testid="fork"]'
    )
    assert fork.get_attribute("data-session") == "chat-1-fork"
    assert "chat-1-fork" in fork.text
    # ...and the branch (a second child of c1) under c1, apart from the main line.
    branch = driver.find_element(
        By.CSS_SELECTOR, f'li[data-checkpoint="{f.c1}"] > ul.branch li[data-checkpoint="{f.c1b}"]'
    )
    assert f.c1b in branch.text
    # Times in ISO 8601 UTC: the summary's and each checkpoint's.
    assert len(ISO_UTC.findall(summary)) == 2, summary
    created = driver.find_element(By.CSS_SELECTOR, f'li[data-checkpoint="{f.c1}"] .meta time')
    assert ISO_UTC.fullmatch(created.text) and created.get_attribute("datetime") == created.text

    _pick(driver, "pick-a", f.c2)
    _pick(driver, "pick-b", f.c3)
    driver.find_element(By.CSS_SELECTOR, '[data-testid="compare"]').click()
    wait_for(driver, lambda d: len(rows(d, "diff-row")) == 4, "the diff's four changes")
    changes = {
        (r.get_attribute("data-op"), r.get_attribute("data-pointer"))
        for r in rows(driver, "diff-row")
    }
    assert changes == {
        ("changed", "/step"),
        ("changed", "/messages/1/content"),
        ("added", "/note"),
        ("removed", "/draft"),
    }
    step = driver.find_element(By.CSS_SELECTOR, '[data-pointer="/step"]')
    assert step.text.split()[-2:] == ["2", "3"]
    assert (
        XSS.replace('"', '\\"')
        in driver.find_element(By.CSS_SELECTOR, '[data-pointer="/note"]').text
    )
    no_script_ran(driver)
    _screenshot(driver, "diff")

    driver.find_element(By.CSS_SELECTOR, f'li[data-checkpoint="{f.c3}"] a.ckpt').click()
    state = wait_for(
        driver,
        lambda d: d.find_elements(By.CSS_SELECTOR, '[data-testid="state-json"]'),
        "checkpoint c3's state",
    )[0]
    assert '"step": 3' in state.text and json.dumps(XSS) in state.text
    no_script_ran(driver)


def _pick(driver: Driver, name: str, checkpoint_id: str) -> None:
    driver.find_element(
        By.CSS_SELECTOR, f'li[data-checkpoint="{checkpoint_id}"] input[data-testid="{name}"]'
    ).click()


def _structured_state(driver: Driver, base: str) -> None:
    driver.get(f"{base}/#/t/{TENANT}/s/batch-7")
    cognitive = wait_for(
        driver,
        lambda d: d.find_elements(By.CSS_SELECTOR, '[data-testid="cognitive"]'),
        "the cognitive state",
    )[0]
    assert DECISION in cognitive.text
    # The cognitive state's times (created, last updated, the decision's) are ISO
    # 8601 UTC, not epoch seconds.
    assert len(ISO_UTC.findall(cognitive.text)) == 3, cognitive.text
    assert not EPOCH.search(cognitive.text), cognitive.text
    task = driver.find_element(By.CSS_SELECTOR, '[data-testid="task-row"]')
    assert "fetch-docs" in task.text and "completed" in task.text
    assert ISO_UTC.search(task.text), task.text
    assert (
        "summarise the docs" in driver.find_element(By.CSS_SELECTOR, '[data-testid="agent"]').text
    )
    no_script_ran(driver)
    _screenshot(driver, "structured")


def _crystals_page(driver: Driver, base: str, f: Filled) -> None:
    driver.get(f"{base}/#/t/{TENANT}/crystals")
    wait_for(driver, lambda d: len(rows(d, "crystal-row")) == 2, "two crystals")
    assert row_ids(driver, "crystal-row", "data-crystal") == [f.crystal_reused, f.crystal_plain]
    scores = [e.text for e in rows(driver, "effectiveness")]
    assert scores == ["0.900", "0.750"]
    assert [e.text for e in rows(driver, "success-score")] == ["0.800", "0.750"]
    _screenshot(driver, "crystals")


def test_inspector_decodes_langgraph_checkpoints_in_chromium(
    start_daemon: Callable[..., Daemon], get_free_port: Callable[[], int], browser: Driver
) -> None:
    daemon, base = _start_inspected(start_daemon, get_free_port())
    graphs = fill_langgraph(daemon.target)
    step_0, step_1 = graphs.by_step[0], graphs.by_step[1]
    browser.get(f"{base}/#/t/{LANGGRAPH_TENANT}/s/{graphs.session_id}")
    wait_for(browser, lambda d: len(rows(d, "checkpoint")) == 3, "three LangGraph checkpoints")
    badges = [e.text for e in rows(browser, "lg-step")]
    assert badges == [
        "LangGraph step -1 · input",
        "LangGraph step 0 · loop",
        "LangGraph step 1 · loop",
    ]

    # The state: the messages as a transcript, the channel values as JSON, not hex.
    browser.find_element(By.CSS_SELECTOR, f'li[data-checkpoint="{step_1}"] a.ckpt').click()
    wait_for(browser, lambda d: len(rows(d, "message")) == 2, "the checkpoint's two messages")
    human, ai = rows(browser, "message")
    assert human.get_attribute("data-type") == "human" and HUMAN_TEXT in human.text
    assert ai.get_attribute("data-type") == "ai" and AI_TEXT in ai.text
    channels = browser.find_element(By.CSS_SELECTOR, '[data-testid="state-channels"]').text
    assert '"destination": "Lyon"' in channels and AI_TEXT in channels
    metadata = browser.find_element(By.CSS_SELECTOR, '[data-testid="state-metadata"]').text
    assert '"step": 1' in metadata and '"source": "loop"' in metadata
    interrupt = browser.find_element(
        By.CSS_SELECTOR, '[data-testid="write-row"][data-channel="__interrupt__"]'
    )
    assert QUESTION in interrupt.text
    state = browser.find_element(By.CSS_SELECTOR, '[data-testid="state"]')
    assert "LangGraph checkpoint (msgpack), decoded" in state.text
    assert ISO_UTC.search(state.text) and not EPOCH.search(state.text)
    assert browser.find_elements(By.CSS_SELECTOR, "#state pre.hex") == []
    _screenshot(browser, "langgraph-state")

    # The diff between two checkpoints: the channels that changed, decoded.
    _pick(browser, "pick-a", step_0)
    _pick(browser, "pick-b", step_1)
    browser.find_element(By.CSS_SELECTOR, '[data-testid="compare"]').click()
    added = wait_for(
        browser,
        lambda d: d.find_elements(
            By.CSS_SELECTOR, '[data-pointer="/checkpoint/channel_values/messages/1"]'
        ),
        "the AI message in the diff",
    )[0]
    assert added.get_attribute("data-op") == "added" and AI_TEXT in added.text
    destination = browser.find_element(
        By.CSS_SELECTOR, '[data-pointer="/checkpoint/channel_values/destination"]'
    )
    assert destination.get_attribute("data-op") == "added" and "Lyon" in destination.text
    step = browser.find_element(By.CSS_SELECTOR, '[data-pointer="/metadata/step"]')
    assert step.text.split()[-2:] == ["0", "1"]
    summary = browser.find_element(By.CSS_SELECTOR, '[data-testid="diff-summary"]').text
    assert "two decoded LangGraph checkpoints" in summary
    # LangGraph's own bookkeeping (versions, IDs, times) is folded away.
    bookkeeping = browser.find_element(By.CSS_SELECTOR, '[data-testid="diff-bookkeeping"]')
    assert bookkeeping.get_attribute("open") is None
    assert not browser.find_element(
        By.CSS_SELECTOR, '[data-pointer="/checkpoint/id"]'
    ).is_displayed()
    _screenshot(browser, "langgraph-diff")


def test_inspector_asks_for_an_admin_token_when_auth_is_on(
    start_daemon: Callable[..., Daemon],
    get_free_port: Callable[[], int],
    browser: Driver,
    tmp_path: Path,
) -> None:
    tokens = tmp_path / "identities.toml"
    tokens.write_text(
        f'[tokens.{token_digest("root-token")}]\ntenant = "ops"\nrole = "admin"\n'
        f'[tokens.{token_digest("agent-token")}]\ntenant = "{TENANT}"\nrole = "agent"\n'
    )
    daemon, base = _start_inspected(
        start_daemon, get_free_port(), "--auth", "token", "--auth-tokens-file", str(tokens)
    )
    fill(daemon.target, token="root-token")

    browser.get(f"{base}/#/t/{TENANT}")
    token = wait_for(browser, lambda d: d.find_elements(By.ID, "token"), "the sign-in form")[0]
    token.send_keys("agent-token")
    token.submit()
    error = wait_for(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-testid="error"]'), "a refusal"
    )[0]
    assert "ADMIN_ROLE_REQUIRED" in error.text

    browser.find_element(By.ID, "sign-out").click()  # forgets the token, asks again
    token = wait_for(browser, lambda d: d.find_elements(By.ID, "token"), "the sign-in form")[0]
    token.send_keys("root-token")
    token.submit()
    wait_for(browser, lambda d: len(rows(d, "session-row")) == 3, "the sessions after sign-in")
    # The token lives in this tab's sessionStorage, never in a cookie or the URL.
    assert browser.execute_script("return sessionStorage.length") == 1
    assert browser.get_cookies() == [] and "root-token" not in browser.current_url
