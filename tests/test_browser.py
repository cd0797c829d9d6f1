"""The demo page (`/`, demo_project/pages and demo_project/static) and the reusable module
acp_channels/static/acp_channels/acp-client.js in a real headless Chromium: Debian's `chromium`,
driven by Playwright for Python through `executable_path` (never a browser download), against
real daphne processes on loopback.

Each test gets a fresh browser context (its own sessionStorage and cookies) in one browser per
module; the servers are per module too. `-m browser` selects these tests. When `chromium` is
not on PATH the module installs Debian's package (as root, with apt-get); if it still cannot
start a browser the tests fail: they are never skipped.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, Playwright, Request, expect, sync_playwright

from tests.cluster import Cluster, RedisServer
from tests.cut_proxy import ThreadedCutProxy, streams
from tests.live import ROOT, DaphneServer

pytestmark = pytest.mark.browser

TRANSPORTS = ["websocket", "http"]
TOKEN = "browser-test-token_0123456789"
TIMEOUT_MS = 15_000
SCREENSHOTS = ROOT / "docs" / "images"
#: `ACP_SCREENSHOTS=update` rewrites the README's screenshots; otherwise they are taken into a
#: temporary directory (and written to docs/images only when missing), so a test run leaves the
#: checkout clean.
UPDATE_SCREENSHOTS = os.environ.get("ACP_SCREENSHOTS") == "update"

expect.set_options(timeout=TIMEOUT_MS)


def chromium_executable() -> str:
    """Debian's chromium. `./dev.sh test` installs it when missing; run on their own, the tests do
    the same (as root, with apt-get), so they start on a bare machine too."""
    path = shutil.which("chromium")
    if path is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            subprocess.run(command, check=True, env=env, capture_output=True, timeout=1200)
        path = shutil.which("chromium")
    if path is None:
        pytest.fail("the browser tests need Debian's chromium: apt-get install chromium (as root)")
    return path


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    # As root (CI containers) Chromium's sandbox cannot start; /dev/shm is small in containers.
    args = ["--disable-dev-shm-usage", *(["--no-sandbox"] if os.geteuid() == 0 else [])]
    launched = playwright.chromium.launch(executable_path=chromium_executable(), args=args)
    yield launched
    launched.close()


def serve(env: dict[str, str] | None = None) -> Iterator[DaphneServer]:
    server = DaphneServer(env=env or {}).start()
    yield server
    server.stop()
    assert server.errors() == []


@pytest.fixture(scope="module")
def server() -> Iterator[DaphneServer]:
    """The demo as `./dev.sh demo` serves it: anonymous, no CORS list."""
    yield from serve()


@pytest.fixture(scope="module")
def cluster(redis_server: RedisServer) -> Iterator[Cluster]:
    """The demo on three workers sharing Redis (tests/cluster.py)."""
    started = Cluster(redis_server).start()
    yield started
    started.stop()
    assert started.errors() == []


@pytest.fixture(scope="module")
def token_server() -> Iterator[DaphneServer]:
    yield from serve({"ACP_TOKEN": TOKEN})


@pytest.fixture(scope="module")
def page_server() -> Iterator[DaphneServer]:
    """The same page on another origin (another port), allowed to connect to ACP servers on any
    loopback port (its Content-Security-Policy's connect-src)."""
    yield from serve({"ACP_DEMO_CONNECT_SRC": "http://127.0.0.1:* ws://127.0.0.1:*"})


@pytest.fixture(scope="module")
def cors_server(page_server: DaphneServer) -> Iterator[DaphneServer]:
    """An ACP server that lists the page server's origin in CORS_ALLOWED_ORIGINS."""
    yield from serve({"ACP_CORS_ALLOWED_ORIGINS": origin(page_server)})


@dataclass
class LoginSite:
    """tests/auth_site.py: the demo with Django users, logged in by session cookie."""

    server: DaphneServer
    cookies: dict[str, str]


@pytest.fixture(scope="module")
def login_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoginSite]:
    database = tmp_path_factory.mktemp("browser-login") / "db.sqlite3"
    env = {"DJANGO_SETTINGS_MODULE": "tests.auth_site", "ACP_TEST_DATABASE": str(database)}
    prepared = subprocess.run(
        [sys.executable, "-m", "tests.auth_site"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for server in serve(env):
        yield LoginSite(server, json.loads(prepared.stdout))


def origin(server: DaphneServer | int) -> str:
    return f"http://127.0.0.1:{server if isinstance(server, int) else server.port}"


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    # Every state the page shows, in order (a MutationObserver: "reconnecting" may last a moment),
    # and `__reached(state, ms)`: a promise settled when the page has shown it. Waited for through
    # page.evaluate, not wait_for_function: that one evals its predicate in the page, which the
    # demo's CSP (no 'unsafe-eval') refused once in a full run (an EvalError).
    opened.add_init_script(
        """
        window.__states = [];
        const waiting = [];
        window.__reached = (state, ms) => new Promise((resolve, reject) => {
          if (window.__states.includes(state)) return resolve(true);
          waiting.push({ state, resolve });
          setTimeout(() => reject(new Error(`the page did not show ${state} in ${ms} ms`)), ms);
        });
        new MutationObserver((changes) => {
          for (const change of changes) {
            if (change.target.id !== "state") continue;
            const state = change.target.dataset.state;
            window.__states.push(state);
            for (const waiter of waiting) if (waiter.state === state) waiter.resolve(true);
          }
        }).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-state"] });
        """
    )
    yield opened
    context.close()
    assert errors == [], errors  # no uncaught exception in the page


@dataclass
class Demo:
    """The demo page, driven as a person would: the form, the buttons, the prompt boxes."""

    page: Page

    def open(self, server: DaphneServer | int, acp_url: str | None = None, transport: str = "websocket") -> Demo:
        """The page from `server`, talking to `acp_url` (default: the page's own server)."""
        query = f"?transport={transport}" + (f"&server={acp_url}" if acp_url is not None else "")
        self.page.goto(f"{origin(server)}/{query}")
        return self

    def connect(self, token: str | None = None) -> None:
        if token is not None:
            self.page.fill("#token", token)
        self.page.click("#connect-button")

    def expect_connected(self, transport: str) -> None:
        expect(self.page.locator("#state")).to_have_attribute("data-state", "connected")
        label = "HTTP + SSE" if transport == "http" else "WebSocket"
        expect(self.page.locator("#state")).to_contain_text(label)

    def new_session(self) -> Locator:
        count = self.panes().count()
        self.page.click("#new-session")
        pane = self.panes().nth(count)
        expect(pane).to_be_visible()
        return pane

    def panes(self) -> Locator:
        return self.page.locator("#sessions .session")

    def prompt(self, pane: Locator, text: str) -> None:
        pane.locator("textarea").fill(text)
        pane.locator("textarea").press("Enter")

    def expect_turn(self, pane: Locator, stop_reason: str) -> None:
        expect(pane.locator(".turn")).to_have_text(f"stop reason: {stop_reason}")

    def states(self) -> list[str]:
        return list(self.page.evaluate("window.__states"))

    def wait_for_state(self, state: str) -> None:
        """Until the page has shown `state`, if only for a moment."""
        assert self.page.evaluate("([state, ms]) => window.__reached(state, ms)", [state, TIMEOUT_MS]) is True


@pytest.fixture
def demo(page: Page) -> Demo:
    return Demo(page)


def connected(demo: Demo, server: DaphneServer, transport: str) -> Demo:
    demo.open(server, transport=transport).connect()
    demo.expect_connected(transport)
    return demo


# ---------------------------------------------------------------- serving


def test_page_is_served_with_a_strict_content_security_policy(server: DaphneServer) -> None:
    base = origin(server)
    page = httpx.get(f"{base}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = {part.split()[0]: part.split()[1:] for part in page.headers["content-security-policy"].split("; ")}
    assert policy["default-src"] == ["'none'"]
    assert policy["script-src"] == ["'self'"] and policy["connect-src"] == ["'self'"]
    # What the policy would block anyway: no inline script, no inline event handler.
    assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", page.text))
    assert re.search(r"<[^>]+\son\w+=", page.text) is None
    module = httpx.get(f"{base}/static/acp_channels/acp-client.js")
    assert module.status_code == 200 and "javascript" in module.headers["content-type"]
    assert "export class AcpClient" in module.text


# ---------------------------------------------------------------- both transports


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_connects_and_renders_markdown_safely(demo: Demo, server: DaphneServer, transport: str) -> None:
    connected(demo, server, transport)
    pane = demo.new_session()
    demo.prompt(
        pane,
        "echo **bold** _it_ `code` <img src=x onerror=alert(1)> [bad](javascript:alert(1)) [ok](https://example.com/x)",
    )
    demo.expect_turn(pane, "end_turn")
    answer = pane.locator(".message.agent")
    expect(answer.locator("strong")).to_have_text("bold")
    expect(answer.locator("em")).to_have_text("it")
    expect(answer.locator("code")).to_have_text("code")
    expect(answer).to_contain_text("<img src=x onerror=alert(1)>")  # shown as text, not made an element
    assert answer.locator("img").count() == 0
    links = answer.locator("a")
    expect(links).to_have_count(1)  # the javascript: link stays text
    expect(links).to_have_attribute("href", "https://example.com/x")
    expect(answer).to_contain_text("[bad](javascript:alert(1))")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_long_answer_streams_in_whole_and_in_order(demo: Demo, server: DaphneServer, transport: str) -> None:
    connected(demo, server, transport)
    pane = demo.new_session()
    count, size = 400, 50
    demo.prompt(pane, f"stream {count} {size}")
    demo.expect_turn(pane, "end_turn")
    expected = "".join(f"{index:03d}:" + "x" * (size - 4) for index in range(count))
    expect(pane.locator(".message.agent")).to_have_count(1)
    assert pane.locator(".message.agent").text_content() == expected


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_permission_requests_are_buttons_approve_and_reject(demo: Demo, server: DaphneServer, transport: str) -> None:
    connected(demo, server, transport)
    pane = demo.new_session()
    for turn, (choice, outcome) in enumerate((("Allow", "allow"), ("Reject", "reject"))):
        demo.prompt(pane, "permission")
        request = pane.locator(".permission").nth(turn)
        expect(request).to_contain_text("Demo permission request")
        request.get_by_role("button", name=choice).click()
        expect(request.locator(".chosen")).to_have_text(f"you chose: {choice}")
        expect(pane.locator(".message.agent").last).to_have_text(f"permission: {outcome}")
        demo.expect_turn(pane, "end_turn")
    expect(pane.locator(".permission button:disabled")).to_have_count(4)  # answered once each


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cancel_ends_a_running_turn(demo: Demo, server: DaphneServer, transport: str) -> None:
    connected(demo, server, transport)
    pane = demo.new_session()
    demo.prompt(pane, "wait_for_cancel")
    expect(pane.locator(".turn")).to_have_attribute("data-turn", "running")
    pane.get_by_role("button", name="Cancel").click()
    demo.expect_turn(pane, "cancelled")
    expect(pane.get_by_role("button", name="Cancel")).to_be_disabled()
    demo.prompt(pane, "echo still here")  # the session goes on
    demo.expect_turn(pane, "end_turn")
    expect(pane.locator(".message.agent").last).to_have_text("still here")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tool_calls_and_plans_show_their_status_and_content(demo: Demo, server: DaphneServer, transport: str) -> None:
    connected(demo, server, transport)
    pane = demo.new_session()
    demo.prompt(pane, "tool_calls")
    demo.expect_turn(pane, "end_turn")
    tool = pane.locator(".tool")
    expect(tool.locator(".tool-title")).to_have_text("read: Reading demo data")
    expect(tool.locator(".badge")).to_have_attribute("data-status", "completed")
    expect(tool.locator(".tool-content")).to_have_text("demo tool output")
    demo.prompt(pane, "plan")
    demo.expect_turn(pane, "end_turn")
    steps = pane.locator(".plan li")
    expect(steps).to_have_count(3)
    expect(pane.locator('.plan li[data-status="completed"]')).to_have_count(3)
    expect(steps.first).to_have_text("Read the request (completed)")


#: Counts the session streams (GETs with Acp-Session-Id) the page's script holds open, from its
#: own fetch calls: one is open from the call until its request is aborted (it gave its place
#: up) or answered with something other than a stream. (The browser's network events report an
#: aborted request a moment after the next one started, so they cannot tell four from five.)
COUNT_SESSION_STREAMS = """
window.__sessionStreams = { open: 0, most: 0, sessions: [] };
const pageFetch = window.fetch;
window.fetch = function (input, init = {}) {
  const headers = new Headers(init.headers || {});
  const stream = (init.method || "GET") === "GET" && headers.has("acp-session-id")
    && (headers.get("accept") || "").includes("text/event-stream");
  const called = pageFetch.call(this, input, init);
  if (!stream) return called;
  const count = window.__sessionStreams;
  count.open += 1;
  count.most = Math.max(count.most, count.open);
  if (!count.sessions.includes(headers.get("acp-session-id"))) count.sessions.push(headers.get("acp-session-id"));
  let counted = true;
  const release = () => { if (counted) { counted = false; count.open -= 1; } };
  init.signal?.addEventListener("abort", release);
  return called.then((response) => { if (response.status !== 200) release(); return response; },
                     (error) => { release(); throw error; });
};
"""


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_eight_sessions_at_once(demo: Demo, server: DaphneServer, transport: str) -> None:
    """Eight turns running together, each waiting for its permission, then each streaming its
    answer: over HTTP/1.1 the module holds at most four session streams and rotates them."""
    demo.page.add_init_script(COUNT_SESSION_STREAMS)
    connected(demo, server, transport)
    panes = [demo.new_session() for _ in range(8)]
    for pane in panes:
        demo.prompt(pane, "permission")
    for pane in panes:  # all eight turns run at once: every request arrives
        expect(pane.locator(".permission")).to_contain_text("Demo permission request")
    for pane in panes:
        pane.get_by_role("button", name="Allow").click()
    for pane in panes:
        expect(pane.locator(".message.agent").last).to_have_text("permission: allow")
        demo.expect_turn(pane, "end_turn")
    for index, pane in enumerate(panes):
        demo.prompt(pane, f"echo session {index}")
    for index, pane in enumerate(panes):
        demo.expect_turn(pane, "end_turn")
        expect(pane.locator(".message.agent").last).to_have_text(f"session {index}")
    session_ids = {pane.get_attribute("data-session-id") for pane in panes}
    assert len(session_ids) == 8
    streams = demo.page.evaluate("window.__sessionStreams")
    if transport == "http":  # every session had a stream in turn, never more than four at once
        assert set(streams["sessions"]) == session_ids and streams["most"] == 4
    else:  # one socket for everything
        assert streams["sessions"] == [] and streams["most"] == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_reload_resumes_the_connection_and_loads_a_session(demo: Demo, server: DaphneServer, transport: str) -> None:
    connected(demo, server, transport)
    pane = demo.new_session()
    session_id = pane.get_attribute("data-session-id")
    demo.prompt(pane, "echo remember *this*")
    demo.expect_turn(pane, "end_turn")
    demo.page.reload()
    demo.expect_connected(transport)
    expect(demo.page.locator("#state")).to_contain_text("resumed")
    shown = [state for state, _ in itertools.groupby(demo.states()) if state != "idle"]
    assert shown[:2] == ["reconnecting", "connected"]  # "reconnecting" while it resumed
    expect(demo.panes()).to_have_count(0)
    demo.page.click("#list-sessions")
    item = demo.page.locator(f'#session-list-items li[data-session-id="{session_id}"]')
    expect(item).to_contain_text("echo remember *this*")  # the session's title: its first prompt
    item.get_by_role("button", name="Load").click()
    loaded = demo.page.locator(f'#sessions .session[data-session-id="{session_id}"]')
    expect(loaded.locator(".note")).to_have_text("history loaded")
    expect(loaded.locator(".message.user")).to_have_text("echo remember *this*")
    expect(loaded.locator(".message.agent em")).to_have_text("this")
    demo.prompt(loaded, "echo after the reload")
    demo.expect_turn(loaded, "end_turn")
    expect(loaded.locator(".message.agent").last).to_have_text("after the reload")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_reload_after_the_connection_is_gone_starts_a_new_one(
    demo: Demo, server: DaphneServer, transport: str
) -> None:
    connected(demo, server, transport)
    # What the tab remembers now names a connection the server does not have (as after a restart).
    demo.page.evaluate(
        """() => {
          for (const key of Object.keys(sessionStorage).filter((key) => key.startsWith("acp-client "))) {
            const saved = JSON.parse(sessionStorage.getItem(key));
            sessionStorage.setItem(key, JSON.stringify({ ...saved, connectionId: "gone." + saved.connectionId }));
          }
        }"""
    )
    demo.page.reload()
    demo.expect_connected(transport)
    expect(demo.page.locator("#state")).not_to_contain_text("resumed")
    shown = [state for state, _ in itertools.groupby(demo.states()) if state != "idle"]
    assert shown == ["reconnecting", "connecting", "connected"]
    expect(demo.page.locator("#error")).to_be_hidden()
    pane = demo.new_session()
    demo.prompt(pane, "echo a new connection")
    demo.expect_turn(pane, "end_turn")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_connection_the_server_ends_is_shown_closed(demo: Demo, server: DaphneServer, transport: str) -> None:
    connected(demo, server, transport)
    pane = demo.new_session()
    demo.prompt(pane, "wait_for_cancel")
    expect(pane.locator(".turn")).to_have_attribute("data-turn", "running")
    connection_id = demo.page.evaluate(
        """() => JSON.parse(sessionStorage.getItem(Object.keys(sessionStorage).find((key) =>
             key.startsWith("acp-client ")))).connectionId"""
    )
    # Someone else ends it (an operator, the idle reaper): DELETE with its id.
    assert httpx.delete(server.url, headers={"Acp-Connection-Id": connection_id}).status_code == 202
    expect(demo.page.locator("#state")).to_have_attribute("data-state", "closed")
    expect(demo.page.locator("#error-text")).to_have_text("the server ended the connection")
    expect(pane.locator(".note.bad")).to_have_text("the prompt failed: the server ended the connection")
    expect(pane.locator("textarea")).to_be_disabled()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_agent_error_is_shown_in_its_session(demo: Demo, server: DaphneServer, transport: str) -> None:
    connected(demo, server, transport)
    pane = demo.new_session()
    demo.prompt(pane, "fail")
    expect(pane.locator(".turn")).to_have_attribute("data-turn", "error")
    expect(pane.locator(".note.bad")).to_have_text("the prompt failed: demo failure")
    demo.prompt(pane, "echo fine again")
    demo.expect_turn(pane, "end_turn")


# ---------------------------------------------------------------- credentials and origins


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_token_is_needed_and_accepted(demo: Demo, token_server: DaphneServer, transport: str) -> None:
    """Over HTTP the token is an Authorization header; over WebSocket it buys a single-use ticket
    (POST /acp/tickets) that the socket offers as a subprotocol. Never in a URL, never in the
    upgrade, never in the server's log."""
    requests: list[Request] = []
    sockets: list[str] = []
    demo.page.on("request", lambda request: requests.append(request))
    demo.page.on("websocket", lambda socket: sockets.append(socket.url))
    demo.open(token_server, transport=transport).connect()
    expect(demo.page.locator("#error")).to_contain_text("refused the credentials (401")
    expect(demo.page.locator("#state")).to_have_attribute("data-state", "closed")
    demo.connect(TOKEN)
    demo.expect_connected(transport)
    expect(demo.page.locator("#error")).to_be_hidden()
    pane = demo.new_session()
    demo.prompt(pane, "whoami")
    demo.expect_turn(pane, "end_turn")
    expect(pane.locator(".message.agent")).to_contain_text("principal=token:team ")
    expect(pane.locator(".message.agent")).to_contain_text(f" transport={transport} ")
    acp = [request for request in requests if request.url == token_server.url]
    assert not any(TOKEN in url for url in [*(request.url for request in requests), *sockets])
    if transport == "http":
        assert acp and all(request.headers.get("authorization") == f"Bearer {TOKEN}" for request in acp[-3:])
    else:
        # Refused without the token (the ticket's POST: 401, so no socket), then accepted with it:
        # the ticket was bought with the token, and the socket's URL has neither.
        tickets = [request for request in requests if request.url == token_server.url + "/tickets"]
        assert [request.method for request in tickets] == ["POST", "POST"]
        assert "authorization" not in tickets[0].headers
        assert tickets[1].headers.get("authorization") == f"Bearer {TOKEN}"
        assert sockets == [token_server.ws_url]
    assert TOKEN not in "".join(token_server.log)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_logged_in_user_needs_no_token(page: Page, login_site: LoginSite, transport: str) -> None:
    """The site's session cookie goes along (same origin: fetch's credentials and the upgrade);
    a user without the required permission gets a plain 403."""
    demo = Demo(page)
    for name in ("carol", "alice"):  # carol lacks REQUIRED_PERMISSION
        page.context.add_cookies(
            [{"name": "sessionid", "value": login_site.cookies[name], "url": origin(login_site.server)}]
        )
        demo.open(login_site.server, transport=transport).connect()
        if name == "carol":
            expect(page.locator("#error")).to_contain_text("the server refused access (403")
            expect(page.locator("#state")).to_have_attribute("data-state", "closed")
    demo.expect_connected(transport)
    pane = demo.new_session()
    demo.prompt(pane, "whoami")
    demo.expect_turn(pane, "end_turn")
    expect(pane.locator(".message.agent")).to_contain_text("principal=user:alice ")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_dropped_connection_resumes_and_shows_reconnecting(demo: Demo, server: DaphneServer, transport: str) -> None:
    """The network drops every stream (or the socket) in the middle of a turn: the page shows
    "reconnecting", resumes, and the turn's end still arrives."""
    with (cutter := ThreadedCutProxy(server.port)) as proxy:
        demo.open(proxy.port, transport=transport).connect()
        demo.expect_connected(transport)
        pane = demo.new_session()
        demo.prompt(pane, "wait_for_cancel")
        expect(pane.locator(".turn")).to_have_attribute("data-turn", "running")
        # Over HTTP the connection stream and the session's; over WebSocket the socket.
        cutter.wait_for(lambda: len(proxy.live(streams)) == (2 if transport == "http" else 1))
        assert cutter.cut(streams) == (2 if transport == "http" else 1)
        demo.wait_for_state("reconnecting")
        expect(demo.page.locator("#state")).to_have_attribute("data-state", "connected")
        shown = [state for state, _ in itertools.groupby(demo.states())]
        assert shown[-2:] == ["reconnecting", "connected"]
        pane.get_by_role("button", name="Cancel").click()
        demo.expect_turn(pane, "cancelled")
        demo.prompt(pane, "echo after the drop")
        demo.expect_turn(pane, "end_turn")
        expect(pane.locator(".message.agent").last).to_have_text("after the drop")


@pytest.mark.parametrize("shape", ["one-worker", "three-workers"])
def test_a_prompt_lost_with_the_socket_is_sent_again_and_answered_once(
    demo: Demo, request: pytest.FixtureRequest, shape: str
) -> None:
    """The socket dies right as the page sends a prompt, before the server gets it (the proxy
    swallows the frame, then cuts): the reattached socket's first message says what the server
    has, so the page sends the prompt again, and its answer arrives exactly once. On three
    workers the reattach lands on another worker than the connection's host."""
    if shape == "one-worker":
        server: DaphneServer = request.getfixturevalue("server")
        host_port, reattach_port = server.port, server.port
    else:
        workers = request.getfixturevalue("cluster").workers
        host_port, reattach_port = workers[0].port, workers[1].port
    with (cutter := ThreadedCutProxy(host_port)) as proxy:
        demo.open(proxy.port).connect()
        demo.expect_connected("websocket")
        pane = demo.new_session()
        cutter.route_to(reattach_port)  # the socket stays where it is; the next one goes there
        cut = cutter.cut_before_text_frame()
        demo.prompt(pane, "echo before the drop")
        cut.result(TIMEOUT_MS / 1000)  # the prompt never reached the server on that socket
        demo.wait_for_state("reconnecting")
        demo.expect_turn(pane, "end_turn")
        expect(demo.page.locator("#state")).to_have_attribute("data-state", "connected")
        # A second turn after it: a duplicate of the first would have been answered by then.
        demo.prompt(pane, "echo after the drop")
        expect(pane.locator(".message.agent").last).to_have_text("after the drop")
        demo.expect_turn(pane, "end_turn")
        answers = pane.locator(".message.agent").all_inner_texts()
        assert answers == ["before the drop", "after the drop"], answers
        sockets = [connection.upstream for connection in proxy.connections if connection.websocket]
        assert sockets == [host_port, reattach_port]  # one reattach, no more, where it was sent


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_another_origin_that_is_allowed_connects(
    demo: Demo, page_server: DaphneServer, cors_server: DaphneServer, transport: str
) -> None:
    demo.open(page_server, cors_server.url, transport).connect()
    demo.expect_connected(transport)
    assert demo.page.evaluate("location.origin") != origin(cors_server)
    pane = demo.new_session()
    demo.prompt(pane, "permission")
    pane.get_by_role("button", name="Reject").click()
    expect(pane.locator(".message.agent").last).to_have_text("permission: reject")
    demo.expect_turn(pane, "end_turn")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_another_origin_that_is_not_allowed_gets_a_clear_error(
    demo: Demo, page_server: DaphneServer, server: DaphneServer, transport: str
) -> None:
    demo.open(page_server, server.url, transport).connect()
    error = demo.page.locator("#error")
    expect(error).to_contain_text(f"the server at {origin(server)} refused this page's origin ({origin(page_server)})")
    expect(error).to_contain_text("CORS_ALLOWED_ORIGINS")
    expect(demo.page.locator("#state")).to_have_attribute("data-state", "closed")
    expect(demo.page.locator("#new-session")).to_be_disabled()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_server_that_is_not_there_is_said_so(demo: Demo, page_server: DaphneServer, transport: str) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    demo.open(page_server, f"{origin(port)}/acp", transport).connect()
    expect(demo.page.locator("#error-text")).to_have_text(f"cannot reach the server at {origin(port)}")
    expect(demo.page.locator("#state")).to_have_attribute("data-state", "closed")


# ---------------------------------------------------------------- the module's JSDoc types

TSC = ROOT / "tests" / "interop" / "js" / "node_modules" / ".bin" / "tsc"
MODULE = ROOT / "acp_channels" / "static" / "acp_channels" / "acp-client.js"


def test_the_module_type_checks_under_strict_typescript() -> None:
    """Its JSDoc types are the API's documentation: TypeScript (tests/interop/js, pinned there)
    checks the module as a strict TypeScript project would, with the browser's DOM types."""
    if not TSC.exists():
        pytest.fail("needs `npm ci` in tests/interop/js (./dev.sh test does it)")
    options = ["--allowJs", "--checkJs", "--noEmit", "--strict", "--skipLibCheck"]
    target = ["--target", "es2022", "--module", "esnext", "--lib", "es2022,dom,dom.iterable"]
    result = subprocess.run(
        [str(TSC), *options, *target, str(MODULE)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- the Markdown renderer


MARKDOWN_CASES = {
    "# Title\nplain": "<h3>Title</h3><p>plain</p>",
    "a\nb\n\nc": "<p>a<br>b</p><p>c</p>",
    "- one\n- **two**\n\n1. first": "<ul><li>one</li><li><strong>two</strong></li></ul><ol><li>first</li></ol>",
    "```py\nx = '<b>'\n```": "<pre><code data-language=\"py\">x = '&lt;b&gt;'</code></pre>",
    "snake_case_name and _em_": "<p>snake_case_name and <em>em</em></p>",
    "<script>alert(1)</script>": "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>",
    "[x](data:text/html,hi) [y](/relative)": "<p>[x](data:text/html,hi) [y](/relative)</p>",
    '[a "quote"](https://e.com/?q=1&r=2)': '<p><a href="https://e.com/?q=1&amp;r=2" rel="noopener noreferrer nofollow"'
    ' target="_blank">a "quote"</a></p>',
    "> quoted `code`": "<blockquote><p>quoted <code>code</code></p></blockquote>",
}


def test_the_markdown_renderer_builds_only_safe_elements(page: Page, server: DaphneServer) -> None:
    page.goto(f"{origin(server)}/")
    rendered = page.evaluate(
        """async (cases) => {
          const { renderMarkdown } = await import("/static/demo/markdown.js");
          const out = {};
          for (const text of cases) {
            const box = document.createElement("div");
            renderMarkdown(text, box);
            out[text] = box.innerHTML;
          }
          return out;
        }""",
        list(MARKDOWN_CASES),
    )
    assert rendered == MARKDOWN_CASES


# ---------------------------------------------------------------- the README's screenshots


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", header[16:24])
    return width, height


@pytest.mark.parametrize(
    ("name", "viewport"),
    [("desktop", {"width": 1280, "height": 800}), ("phone", {"width": 390, "height": 844})],
    ids=["desktop", "phone"],
)
def test_screenshots_for_the_readme(
    browser: Browser, server: DaphneServer, tmp_path: Path, name: str, viewport: dict[str, int]
) -> None:
    context = browser.new_context(viewport=viewport, device_scale_factor=1)
    try:
        demo = Demo(context.new_page())
        connected(demo, server, "websocket")
        first = demo.new_session()
        demo.prompt(
            first,
            "echo Here is **Markdown**: `inline code`, a list\n- one\n- two\nand a [link](https://agentclientprotocol.com).",
        )
        demo.expect_turn(first, "end_turn")
        demo.prompt(first, "tool_calls")
        demo.expect_turn(first, "end_turn")
        demo.prompt(first, "plan")
        demo.expect_turn(first, "end_turn")
        if name == "desktop":
            second = demo.new_session()
            demo.prompt(second, "stream 6 24")
            demo.expect_turn(second, "end_turn")
            demo.prompt(second, "permission")
            expect(second.locator(".permission")).to_be_visible()
        target = SCREENSHOTS / f"browser-{name}.png"
        path = target if UPDATE_SCREENSHOTS or not target.exists() else tmp_path / target.name
        path.parent.mkdir(parents=True, exist_ok=True)
        demo.page.screenshot(path=str(path))
        assert png_size(path) == (viewport["width"], viewport["height"])
        assert f"docs/images/browser-{name}.png" in (ROOT / "README.md").read_text()
    finally:
        context.close()
