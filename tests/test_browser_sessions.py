"""Shared sessions in the browser (docs/shared-sessions.md, docs/browser.md): the demo page's
list of live sessions (`GET /acp/sessions`) and attaching to one from another tab with the
module's `attachSession`, in real headless Chromium (Debian's `chromium`, as tests/test_browser.py
drives it) against a real daphne process with a token (an anonymous caller lists nothing and
attaches to nothing).

Two tabs are two pages of one browser context; each asserts that its page threw nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Locator, Page, Playwright, expect, sync_playwright

from tests.live import DaphneServer
from tests.test_browser import TOKEN, TRANSPORTS, Demo, chromium_executable, origin

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    args = ["--disable-dev-shm-usage", *(["--no-sandbox"] if os.geteuid() == 0 else [])]
    launched = playwright.chromium.launch(executable_path=chromium_executable(), args=args)
    yield launched
    launched.close()


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    """The demo with one shared token: every tab is the same principal (token:team)."""
    started = DaphneServer(env={"ACP_TOKEN": TOKEN}).start()
    yield started
    started.stop()
    assert started.errors() == []


class Tabs:
    """Tabs of one browser context (one person's browser), each a `Demo`."""

    def __init__(self, context: BrowserContext) -> None:
        self.context = context
        self.errors: list[str] = []

    def open(self, server: DaphneServer, transport: str = "websocket") -> Demo:
        page: Page = self.context.new_page()
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        return Demo(page).open(server, transport=transport)


@pytest.fixture
def tabs(browser: Browser) -> Iterator[Tabs]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    opened = Tabs(context)
    yield opened
    context.close()
    assert opened.errors == [], opened.errors  # no uncaught exception in any tab


def connected_tab(tabs: Tabs, server: DaphneServer, transport: str) -> Demo:
    tab = tabs.open(server, transport)
    tab.connect(TOKEN)
    tab.expect_connected(transport)
    return tab


def directory_item(tab: Demo, session_id: str) -> Locator:
    """The session's row in the tab's list of live sessions, fetched afresh."""
    tab.page.click("#directory-button")
    expect(tab.page.locator("#refresh-directory")).to_be_enabled()  # the fetch is over
    return tab.page.locator(f'#directory-items li[data-session-id="{session_id}"]')


def attach(tab: Demo, session_id: str, action: str = "Attach") -> Locator:
    """Attach from the list (the form's token, no connection of the tab's own needed)."""
    tab.page.fill("#token", TOKEN)
    directory_item(tab, session_id).get_by_role("button", name=action).click()
    pane = tab.page.locator(f'#sessions .session[data-session-id="{session_id}"]')
    expect(pane.locator(".link")).to_have_text("watching" if action == "Watch" else "attached")
    # The link's text is there from the pane's start; this note only once the attachment's
    # initialize was answered, so the server holds the tap (what is said from now on reaches it).
    expect(pane.locator(".note", has_text="the session's output so far, then live")).to_have_count(1)
    return pane


def lines(pane: Locator) -> list[list[str]]:
    """Each agent message of the pane, as its lines."""
    return [[line for line in text.splitlines() if line] for text in pane.locator(".message.agent").all_inner_texts()]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_second_tab_attaches_from_the_list_and_sees_the_same_stream(
    tabs: Tabs, server: DaphneServer, transport: str
) -> None:
    """Tab A runs `tick 30 30`; tab B, attached from the list while it runs, shows every tick
    once, in order, from the first; then A's next turn live (its prompt, its output, its end)."""
    a = connected_tab(tabs, server, transport)
    pane_a = a.new_session()
    session_id = str(pane_a.get_attribute("data-session-id"))
    b = tabs.open(server, transport)
    a.prompt(pane_a, "tick 30 30")
    expect(pane_a.locator(".message.agent")).to_contain_text("tick 1")
    pane_b = attach(b, session_id)
    a.expect_turn(pane_a, "end_turn")
    expect(pane_b.locator(".message.agent").first).to_contain_text("tick 30")
    # Attached now: A's next turn reaches B live, prompt included.
    a.prompt(pane_a, "tick 5 10")
    a.expect_turn(pane_a, "end_turn")
    expect(pane_b.locator(".message.agent")).to_have_count(2)
    expect(pane_b.locator(".message.agent").last).to_contain_text("tick 5")
    b.expect_turn(pane_b, "end_turn")  # from _acp-channels/session/turn_ended
    first = [f"tick {index}" for index in range(1, 31)]
    second = [f"tick {index}" for index in range(1, 6)]
    assert lines(pane_b) == [first, second]  # every tick once, in order, from the start
    assert lines(pane_a) == [first, second]
    assert pane_b.locator(".message.user").all_inner_texts() == ["tick 5 10"]  # A's prompt, shown to B
    expect(pane_b.locator(".prompt-note")).to_be_hidden()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_prompt_while_a_turn_runs_elsewhere_is_refused_in_words(
    tabs: Tabs, server: DaphneServer, transport: str
) -> None:
    """B's prompt while A's turn runs is refused (-32012): B's prompt box says why and keeps the
    text; B cancels A's turn, sends again, and A sees B's prompt and its answer. A closing its
    connection (Disconnect) terminates the session: B's pane says so."""
    a = connected_tab(tabs, server, transport)
    pane_a = a.new_session()
    session_id = str(pane_a.get_attribute("data-session-id"))
    a.prompt(pane_a, "wait_for_cancel")
    expect(pane_a.locator(".turn")).to_have_attribute("data-turn", "running")
    own = directory_item(a, session_id)
    expect(own).to_contain_text("turn running")
    expect(own).to_contain_text("this tab's connection")
    expect(own.get_by_role("button")).to_have_text(["Open"])  # no attaching to one's own pane

    b = tabs.open(server, transport)
    pane_b = attach(b, session_id)
    expect(pane_b.locator(".turn")).to_have_text("running elsewhere…")  # the attachment's turnRunning
    b.prompt(pane_b, "echo too soon")
    note = pane_b.locator(".prompt-note")
    expect(note).to_contain_text("Not sent: a turn is running elsewhere on this session")
    expect(pane_b.locator("textarea")).to_have_value("echo too soon")  # the text is given back
    expect(pane_b.locator(".message.user")).to_have_count(0)
    expect(pane_b.locator(".turn")).to_have_attribute("data-turn", "elsewhere")

    pane_b.get_by_role("button", name="Cancel").click()  # a controller may cancel another's turn
    a.expect_turn(pane_a, "cancelled")
    b.expect_turn(pane_b, "cancelled")
    expect(note).to_be_hidden()
    pane_b.locator("textarea").press("Enter")  # the same text, now
    b.expect_turn(pane_b, "end_turn")
    expect(pane_b.locator(".message.agent").last).to_have_text("too soon")
    expect(pane_a.locator(".message.user").last).to_have_text("echo too soon")
    expect(pane_a.locator(".message.agent").last).to_have_text("too soon")
    a.expect_turn(pane_a, "end_turn")

    a.page.click("#disconnect-button")  # ends A's connection: the session with it
    expect(pane_b.locator(".note.bad")).to_have_text(f"the session {session_id} ended: its connection was terminated")
    expect(pane_b.locator(".link")).to_have_text("attached · disconnected")
    expect(pane_b.locator("textarea")).to_be_disabled()
    expect(directory_item(b, session_id)).to_have_count(0)


@pytest.mark.parametrize("answering", ["attached tab", "own tab"])
def test_a_permission_request_answered_in_one_tab_goes_from_the_other(
    tabs: Tabs, server: DaphneServer, answering: str
) -> None:
    """The demo agent's `permission`: shown in A (whose prompt it is) and in B (attached); the
    first answer wins, and the request goes from the other tab's page. C watches (an observer):
    no buttons, no prompt box, the same outcome."""
    a = connected_tab(tabs, server, "websocket")
    pane_a = a.new_session()
    session_id = str(pane_a.get_attribute("data-session-id"))
    b = tabs.open(server)
    pane_b = attach(b, session_id)
    c = tabs.open(server)
    pane_c = attach(c, session_id, "Watch")
    expect(pane_c.locator("textarea")).to_be_disabled()
    a.prompt(pane_a, "permission")
    expect(pane_c.locator(".message.user")).to_have_text("permission")  # A's prompt, shown to the others
    for pane in (pane_a, pane_b):
        expect(pane.locator(".permission")).to_contain_text("Demo permission request")
    answerer, other = (pane_b, pane_a) if answering == "attached tab" else (pane_a, pane_b)
    answerer.locator(".permission").get_by_role("button", name="Allow").click()
    expect(answerer.locator(".permission .chosen")).to_have_text("you chose: Allow")
    expect(other.locator(".permission")).to_have_count(0)  # _acp-channels/session/permission_resolved
    expect(other.locator(".note", has_text="permission answered elsewhere")).to_have_text(
        "permission answered elsewhere: Allow"
    )
    for pane in (pane_a, pane_b, pane_c):
        expect(pane.locator(".message.agent").last).to_have_text("permission: allow")
    for tab, pane in ((a, pane_a), (b, pane_b), (c, pane_c)):
        tab.expect_turn(pane, "end_turn")
    expect(pane_c.locator(".permission")).to_have_count(0)  # an observer is not asked
    expect(pane_a.locator(".permission")).to_have_count(1 if answering == "own tab" else 0)


def test_the_panes_fill_a_wide_window(browser: Browser, server: DaphneServer) -> None:
    """No fixed narrow column: one pane spans the window, two share it, side by side."""
    width = 2000
    context = browser.new_context(viewport={"width": width, "height": 900})
    try:
        tab = Demo(context.new_page()).open(server)
        tab.connect(TOKEN)
        tab.expect_connected("websocket")
        first = tab.new_session()
        usable = tab.page.evaluate("document.documentElement.clientWidth")  # without a scroll bar
        box = first.bounding_box()
        assert box is not None and box["width"] >= usable - 40, (box, usable)
        second = tab.new_session()
        boxes = [pane.bounding_box() for pane in (first, second)]
        assert all(box is not None for box in boxes)
        left, right = (box for box in boxes if box is not None)
        assert left["y"] == right["y"] and right["x"] > left["x"] + left["width"]  # one row
        assert left["width"] == right["width"] >= (usable - 60) / 2, (boxes, usable)
        directory = directory_item(tab, str(first.get_attribute("data-session-id")))
        expect(directory).to_contain_text("this tab's connection")
        listed = tab.page.locator("#directory").bounding_box()
        assert listed is not None and listed["width"] >= usable - 40
    finally:
        context.close()


@pytest.fixture
def fresh_server() -> Iterator[DaphneServer]:
    """A server of its own: no live session left by the other tests."""
    started = DaphneServer(env={"ACP_TOKEN": TOKEN}).start()
    yield started
    started.stop()
    assert started.errors() == []


def test_the_directory_without_credentials_says_why(tabs: Tabs, fresh_server: DaphneServer) -> None:
    server = fresh_server
    tab = tabs.open(server)
    tab.page.click("#directory-button")
    status = tab.page.locator("#directory-status")
    expect(status).to_contain_text("the directory failed: the server refused the credentials (401")
    expect(status).to_have_class("hint bad")
    expect(tab.page.locator("#directory-items li")).to_have_count(0)
    tab.page.fill("#token", TOKEN)
    tab.page.click("#refresh-directory")
    expect(status).to_have_text(
        "No live sessions. The server lists your own sessions only: without a token or a login it lists none."
    )
    # Anything listed is this principal's, across the server: nothing leaks to other callers.
    assert httpx.get(f"{origin(server)}/acp/sessions").status_code == 401
