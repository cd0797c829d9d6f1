"""acp_channels._handler: requests start no OS thread when none of their calls needs one, and
everything Django promises still happens (signals sent, sync code in one thread per request).

Driven in-process through the application `build_asgi_application` makes, with asgiref's
ApplicationCommunicator; threads are counted by wrapping `threading.Thread.start`."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core import signals
from django.core.cache import caches, close_caches
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import reset_urlconf
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import include, path

from acp_channels._handler import AcpASGIHandler, LoopCloser, RequestExecutor, close_runs_on_loop
from acp_channels._limits import BodyLimit


async def two_sync_calls(request: HttpRequest) -> HttpResponse:
    first = await sync_to_async(threading.get_ident)()
    second = await sync_to_async(threading.get_ident)()
    return JsonResponse({"first": first, "second": second, "loop": threading.get_ident()})


FILE_CONTENT = b"file content\n" * 100


async def a_file(request: HttpRequest) -> FileResponse:
    return FileResponse(io.BytesIO(FILE_CONTENT))  # a file-like object the response closes


urlpatterns = [
    path("", include("acp_channels.urls")),
    path("two-sync-calls", two_sync_calls),
    path("a-file", a_file),
]


@pytest.fixture(autouse=True)
def urls(settings: Any) -> None:
    settings.ROOT_URLCONF = __name__


@pytest.fixture
def thread_starts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    started: list[str] = []
    real = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started.append(self.name)
        real(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    yield started


async def request(
    app: Callable[..., Awaitable[None]], method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    status, content, _ = await exchange(app, method, url, body, headers)
    return status, content


async def exchange(
    app: Callable[..., Awaitable[None]], method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    communicator = ApplicationCommunicator(app, http_scope(url, method, headers))
    await communicator.send_input({"type": "http.request", "body": body})
    start = await communicator.receive_output(5)
    content = b""
    while True:
        message = await communicator.receive_output(5)
        content += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(5)
    response_headers = {name.decode().lower(): value.decode() for name, value in start["headers"]}
    return start["status"], content, response_headers


def http_scope(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": url,
        "raw_path": url.encode(),
        "query_string": b"",
        "headers": [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 5000),
        "root_path": "",
    }


JSON_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
NOTIFICATION = json.dumps({"jsonrpc": "2.0", "method": "custom/noop"}).encode()


INITIALIZE = json.dumps(
    {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}}
).encode()


@pytest.mark.parametrize(("handler", "fewest"), [(AcpASGIHandler, 0), (ASGIHandler, 200)])
async def test_a_hundred_posts_start_threads_only_under_djangos_own_handler(
    handler: type[ASGIHandler], fewest: int, thread_starts: list[str]
) -> None:
    app = BodyLimit(handler())
    status, _, response_headers = await exchange(app, "POST", "/acp", INITIALIZE, JSON_HEADERS)
    assert status == 200
    connection_id = response_headers["acp-connection-id"]
    headers = {**JSON_HEADERS, "acp-connection-id": connection_id}
    assert (await request(app, "POST", "/acp", NOTIFICATION, headers))[0] == 202  # warm
    thread_starts.clear()
    statuses = {(await request(app, "POST", "/acp", NOTIFICATION, headers))[0] for _ in range(100)}
    assert statuses == {202}
    if fewest:
        assert len(thread_starts) >= fewest  # what the stock handler costs: two threads a request
    else:
        assert thread_starts == []
    assert (await request(app, "DELETE", "/acp", headers=headers))[0] in (200, 202, 204)


async def test_request_finished_still_reaches_a_sites_receiver_once_per_request_off_the_loop() -> None:
    calls: list[int] = []

    def receiver(sender: object, **kwargs: Any) -> None:
        calls.append(threading.get_ident())

    signals.request_finished.connect(receiver)
    try:
        app = AcpASGIHandler()
        for _ in range(5):
            assert (await request(app, "GET", "/health"))[0] == 200
    finally:
        signals.request_finished.disconnect(receiver)
    assert len(calls) == 5
    assert threading.get_ident() not in calls  # a receiver we do not know runs where Django runs it


async def test_an_async_request_finished_receiver_is_still_sent() -> None:
    calls: list[str] = []

    async def receiver(sender: object, **kwargs: Any) -> None:
        calls.append("finished")

    signals.request_finished.connect(receiver)
    try:
        assert (await request(AcpASGIHandler(), "GET", "/health"))[0] == 200
    finally:
        signals.request_finished.disconnect(receiver)
    assert calls == ["finished"]


async def test_sync_calls_of_one_request_share_one_thread_that_is_not_the_loops() -> None:
    status, body = await request(AcpASGIHandler(), "GET", "/two-sync-calls")
    assert status == 200
    threads = json.loads(body)
    assert threads["first"] == threads["second"] != threads["loop"]


@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous iterators")
async def test_a_file_response_is_closed_in_the_requests_thread(thread_starts: list[str]) -> None:
    status, body = await request(AcpASGIHandler(), "GET", "/a-file")
    assert status == 200 and body == FILE_CONTENT
    assert any(name.startswith("acp-request") for name in thread_starts)


@pytest.fixture
def finished_receivers(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """request_finished's sync receivers as close_runs_on_loop sees them (Django's two by default;
    what other tests connected or opened does not leak in)."""
    receivers: list[Any] = [reset_urlconf, close_caches]
    monkeypatch.setattr(signals.request_finished, "_live_receivers", lambda sender: (receivers, []))
    monkeypatch.setattr(caches, "all", lambda initialized_only=False: [])
    return receivers


def test_what_keeps_the_close_off_the_loop(finished_receivers: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    plain = HttpResponse("x")
    assert close_runs_on_loop(plain, RequestExecutor(), AcpASGIHandler)
    with_file = FileResponse(io.BytesIO(FILE_CONTENT))
    try:
        assert not close_runs_on_loop(with_file, RequestExecutor(), AcpASGIHandler)
    finally:
        with_file.close()
    used = RequestExecutor()
    assert used.submit(threading.get_ident).result() != threading.get_ident()
    try:
        assert not close_runs_on_loop(plain, used, AcpASGIHandler)  # a thread of the request exists
    finally:
        used.shutdown()
    monkeypatch.setattr(caches, "all", lambda initialized_only=False: ["a cache the request opened"])
    assert not close_runs_on_loop(plain, RequestExecutor(), AcpASGIHandler)
    monkeypatch.setattr(caches, "all", lambda initialized_only=False: [])
    finished_receivers.append(lambda sender, **kwargs: None)  # a site's own receiver
    assert not close_runs_on_loop(plain, RequestExecutor(), AcpASGIHandler)


async def test_the_executor_starts_its_thread_on_the_first_call_and_keeps_it() -> None:
    executor = RequestExecutor()
    loop = asyncio.get_running_loop()
    assert not executor.started_thread
    first = await loop.run_in_executor(executor, threading.get_ident)
    assert executor.started_thread and first != threading.get_ident()
    assert await loop.run_in_executor(executor, threading.get_ident) == first
    executor.shutdown()
    assert not executor.started_thread


@pytest.mark.parametrize("handler", [AcpASGIHandler, ASGIHandler])
async def test_tasks_and_sync_to_async_calls_per_request(
    handler: type[ASGIHandler], finished_receivers: list[Any], sync_to_async_calls: list[Any]
) -> None:
    """Ours: the request's task and one watching for the client to leave, and no
    sync_to_async to close the response; Django's: one task more, and the sync_to_async."""
    app = handler()
    assert (await request(app, "GET", "/health"))[0] == 200  # warm
    tasks: list[Any] = []
    loop = asyncio.get_running_loop()

    def counting_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        tasks.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    calls = sync_to_async_calls
    calls.clear()  # the warm-up's
    previous = loop.get_task_factory()
    loop.set_task_factory(counting_factory)  # type: ignore[arg-type]
    try:
        for _ in range(10):
            assert (await request(app, "GET", "/health"))[0] == 200
    finally:
        loop.set_task_factory(previous)
    # ApplicationCommunicator runs each request in a task of its own: one a request.
    if handler is AcpASGIHandler:
        assert (len(tasks), len(calls)) == (20, 0)
    else:
        assert (len(tasks), len(calls)) == (30, 10)


waits: dict[str, Any] = {}


async def waits_forever(request: HttpRequest) -> HttpResponse:
    waits["started"].set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        waits["events"].append("view cancelled")
        raise
    return HttpResponse("never")


async def streams_then_waits(request: HttpRequest) -> StreamingHttpResponse:
    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"first"
            await asyncio.Event().wait()
        finally:
            waits["events"].append("body closed")

    response = StreamingHttpResponse(body())
    response._resource_closers.append(lambda: waits["events"].append("response closed"))  # type: ignore[attr-defined]
    return response


urlpatterns += [path("waits-forever", waits_forever), path("streams-then-waits", streams_then_waits)]


@pytest.fixture
def finished_sent() -> Iterator[list[str]]:
    waits["started"] = asyncio.Event()
    waits["events"] = []

    def receiver(sender: object, **kwargs: Any) -> None:
        waits["events"].append("request_finished")

    signals.request_finished.connect(receiver)
    yield waits["events"]
    signals.request_finished.disconnect(receiver)


@pytest.mark.parametrize("handler", [AcpASGIHandler, ASGIHandler])
async def test_a_client_that_leaves_cancels_the_view_as_in_django(
    handler: type[ASGIHandler], finished_sent: list[str]
) -> None:
    communicator = ApplicationCommunicator(handler(), http_scope("/waits-forever"))
    await communicator.send_input({"type": "http.request", "body": b""})
    await asyncio.wait_for(waits["started"].wait(), 5)
    await communicator.send_input({"type": "http.disconnect"})
    await communicator.wait(5)  # the handler returns: nothing hangs
    assert finished_sent == ["view cancelled", "request_finished"]
    assert await communicator.receive_nothing()  # no response for a client that left


@pytest.mark.parametrize("handler", [AcpASGIHandler, ASGIHandler])
async def test_a_client_that_leaves_a_stream_closes_its_body_and_the_response(
    handler: type[ASGIHandler], finished_sent: list[str]
) -> None:
    communicator = ApplicationCommunicator(handler(), http_scope("/streams-then-waits"))
    await communicator.send_input({"type": "http.request", "body": b""})
    assert (await communicator.receive_output(5))["status"] == 200
    assert (await communicator.receive_output(5))["body"] == b"first"
    await communicator.send_input({"type": "http.disconnect"})
    await communicator.wait(5)
    assert finished_sent == ["body closed", "response closed", "request_finished"]


async def test_a_request_that_ends_leaves_no_task_behind() -> None:
    before = asyncio.all_tasks()
    assert (await request(AcpASGIHandler(), "GET", "/health"))[0] == 200
    await asyncio.sleep(0)  # the watcher's cancellation is delivered
    assert asyncio.all_tasks() - before == set()


async def test_a_loop_closer_called_from_a_thread_runs_on_the_loop() -> None:
    ran_on: list[int] = []
    done = asyncio.Event()

    def close() -> None:
        ran_on.append(threading.get_ident())
        done.set()

    closer = LoopCloser(close)
    await asyncio.get_running_loop().run_in_executor(None, closer)  # as Django's close in a thread
    await done.wait()
    assert ran_on == [threading.get_ident()]
    closer()  # on the loop: at once
    assert ran_on == [threading.get_ident()] * 2
