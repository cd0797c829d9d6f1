"""Request limits at the ASGI level, whatever the server: the ACP endpoint's body size.

Django's ASGI handler spools a request's whole body before any view runs, so the view's own
MAX_BODY_BYTES check comes after the server and Django have taken everything the client sent.
`BodyLimit` wraps the HTTP application (see routing.build_asgi_application): for requests to the
ACP endpoint it answers 413 as soon as the declared Content-Length, or the body received so far,
is over MAX_BODY_BYTES, and never holds more than that. Servers that stream the body through
`receive` (uvicorn) then read no more of it; daphne buffers bodies itself, so there the same
limit is enforced earlier, in Twisted (acp_channels._daphne_guards), and this guard only sees
bodies within it.

Only the ACP endpoint's limit lives here: the rest of a Django site keeps Django's own limits.
A request is the endpoint's when Django's URL resolver maps its path to the URL named
`cors.ENDPOINT_URL_NAME` (the same rule the CORS hook uses), so a site's prefix is honoured.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final, Protocol
from urllib.parse import unquote

from django.conf import settings
from django.urls import Resolver404, resolve

from acp_channels._conf import acp_settings
from acp_channels._cors import ENDPOINT_URL_NAME

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The answers' texts (413 matches the view's own).
BODY_TOO_LARGE: Final = "POST body too large"
HEADERS_TOO_LARGE: Final = "request header fields too large"
REQUEST_LINE_TOO_LONG: Final = "request line too long"
HEADERS_TIMEOUT: Final = "request headers not received in time"
BODY_TIMEOUT: Final = "request body not received in time"
BODIES_FULL: Final = "this server is receiving too many request bodies at once; try again"
#: Retry-After (seconds) of a 503 at the bodies' budget: bodies are in within BODY_TIMEOUT_SECONDS.
RETRY_AFTER_BODIES: Final = 1


class BodyBudget:
    """Bytes of ACP request bodies this process holds in memory at once, from the moment
    `BodyLimit` reads them until the view has answered, summed over every request: without it,
    many clients posting MAX_BODY_BYTES at once grow a worker by requests x MAX_BODY_BYTES
    (several times over: the body, its text, its parsed value). Past MAX_WORKER_BUFFERED_BYTES a
    body is refused with 503 and Retry-After; one body always fits when none is held. (While a
    large body arrives, daphne keeps it in a temporary file, not in memory.)"""

    def __init__(self) -> None:
        self.used = 0

    def reserve(self, size: int, held: int = 0) -> bool:
        """Count `size` more bytes of a body of which `held` are counted already (False: no room)."""
        if self.used > held and self.used + size > acp_settings.MAX_WORKER_BUFFERED_BYTES:
            return False
        self.used += size
        return True

    def release(self, size: int) -> None:
        self.used -= size


body_budget: Final = BodyBudget()


def is_acp_endpoint(path: str, root_path: str = "") -> bool:
    """Whether a request path (as the server saw it, before any script prefix is removed) is the
    ACP endpoint. `root_path` is the ASGI root_path; FORCE_SCRIPT_NAME wins, as in Django."""
    script_name: str = settings.FORCE_SCRIPT_NAME or root_path
    if script_name:
        path = path.removeprefix(script_name)  # as django.core.handlers.asgi.ASGIRequest does
    return _resolves_to_endpoint(path, settings.ROOT_URLCONF)


@functools.lru_cache(maxsize=256)
def _resolves_to_endpoint(path: str, urlconf: str) -> bool:
    """Cached: resolving costs about 15 us and runs up to three times per request (the Twisted
    guards and BodyLimit); sites have few paths, and the cache is bounded against made-up ones."""
    try:
        return resolve(path, urlconf).url_name == ENDPOINT_URL_NAME
    except Resolver404:
        return False


def is_acp_target(target: bytes, root_path: str = "") -> bool:
    """The same for a raw request-target (`/acp?x=1`), as an HTTP/1.1 parser sees it."""
    try:
        path = unquote(target.split(b"?", 1)[0].decode("ascii"))
    except UnicodeDecodeError:
        return False  # daphne answers 400 for such paths
    return is_acp_endpoint(path, root_path)


def plain_text_response(status: int, reason: str, text: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, for answers given by the server
    before any application runs."""
    body = text.encode()
    retry = f"Retry-After: {retry_after}\r\n" if retry_after is not None else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"{retry}"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class BodyLimit:
    """ASGI middleware: the ACP endpoint's requests carry at most MAX_BODY_BYTES of body.

    It reads the body itself (at most the limit plus one message) and hands it on as one
    message, counted in `body_budget` until the application returns (503 past it); over the
    limit it answers 413 `POST body too large` with `Connection: close`
    without running the application, and reads no more of the body. Under uvicorn a client
    still writing its body may then see a connection reset rather than the answer: uvicorn
    closes at once with the rest of the body unread (it has no lingering close; daphne's guard
    lingers, see daphne_guards).
    """

    def __init__(self, application: ASGIApp) -> None:
        self.application = application

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_acp_endpoint(scope["path"], scope.get("root_path", "")):
            await self.application(scope, receive, send)
            return
        limit: int = acp_settings.MAX_BODY_BYTES
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the client left before its body was in: nothing to answer
                chunk = message.get("body", b"")
                if size + len(chunk) > limit:
                    await _refuse(send)
                    return
                if chunk and not body_budget.reserve(len(chunk), size):
                    await _refuse(send, 503, BODIES_FULL, RETRY_AFTER_BODIES)
                    return
                size += len(chunk)
                if chunk:
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
            del chunks
            replayed = False

            async def receive_after_body() -> Message:
                nonlocal replayed, body
                if replayed:
                    return await receive()
                replayed = True
                message: Message = {"type": "http.request", "body": body, "more_body": False}
                body = b""
                return message

            await self.application(scope, receive_after_body, send)
        finally:
            body_budget.release(size)


def _header(scope: Scope, name: bytes) -> str | None:
    for header_name, value in scope.get("headers", []):
        if header_name == name:
            return bytes(value).decode("latin-1").strip()
    return None


async def _refuse(send: Send, status: int = 413, text: str = BODY_TOO_LARGE, retry_after: int | None = None) -> None:
    body = text.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


#: How often the running read clocks are checked: the slack of a 408.
CLOCK_SWEEP_SECONDS: Final = 0.25


class ReadClock(Protocol):
    """A connection reading a request under a deadline (acp_channels._daphne_guards)."""

    #: When the request must be in (time.monotonic); infinity while no clock runs.
    clock_deadline: float

    def clock_expired(self) -> None: ...


class ReadClocks:
    """The running read clocks (headers or body) of a process's connections, checked by one
    timer that runs only while a clock does, instead of a timer started and cancelled for each
    request (daphne_guards says what that cost). `call_later(seconds, fn, *args)` is the
    server's timer (Twisted's `callLater`)."""

    def __init__(self) -> None:
        self._running: dict[ReadClock, None] = {}  # an insertion-ordered set
        self._sweep_call: Any = None

    def start(self, clock: ReadClock, call_later: Callable[..., Any]) -> None:
        self._running[clock] = None
        if self._sweep_call is None:
            self._sweep_call = call_later(CLOCK_SWEEP_SECONDS, self._sweep, call_later)

    def stop(self, clock: ReadClock) -> None:
        self._running.pop(clock, None)

    @property
    def running(self) -> int:
        return len(self._running)

    def _sweep(self, call_later: Callable[..., Any]) -> None:
        self._sweep_call = None
        now = time.monotonic()
        for clock in [clock for clock in self._running if clock.clock_deadline <= now]:
            self._running.pop(clock, None)
            clock.clock_expired()
        if self._running:
            self._sweep_call = call_later(CLOCK_SWEEP_SECONDS, self._sweep, call_later)


#: The process's read clocks.
read_clocks = ReadClocks()
