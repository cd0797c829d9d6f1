"""Django's ASGI handler, finishing a response without an OS thread when nothing needs one.

Django's `ASGIHandler` ends every request with `await sync_to_async(response.close)()` inside a
`ThreadSensitiveContext`: the first sync call of a request starts a thread for that request,
and leaving the context starts another to join it. So every POST, and every SSE stream once it
ends, cost two thread starts and joins (strace: 2 `clone3` and ~35 `futex` per POST), a tenth
of a small POST's CPU, though `response.close()` usually has nothing to do but send
`request_finished` to no receiver.

`AcpASGIHandler` is that handler with three changes. The request's thread-sensitive calls go to an
executor of its own (`RequestExecutor`), which starts the request's thread only when a call needs
it, and `response.close()` runs right on the event loop, not through `sync_to_async`, when it is
safe:

- no sync code of this request ran in a thread (so no database connection of it is open there:
  Django refuses sync database use on the event loop's thread), and
- the response holds nothing to close but the request (its spooled body: Django closes it with
  the response) and `LoopCloser`s (no files, no sync iterators), and
- every `request_finished` receiver is one Django connects and known to be harmless on the
  loop's thread (`SAFE_ON_LOOP`: django.db's `close_old_connections` closes the connections of
  the thread it runs on, and the loop's has none; `reset_urlconf` clears a context-local
  setting; `close_caches` only when the request opened no cache).

Third, one task watches for the client to leave while the view runs and the response is sent,
where Django starts two (the view's and the watcher's) and waits for the first: the view is
cancelled as in Django when the client leaves. Together these are most of what Django's handler
costs a small POST beyond the view itself (bench/PROFILE.md).

Anything else (a receiver of the site's own, a sync middleware that ran, a FileResponse) takes
the thread as before: nothing Django promises is skipped, no signal is left unsent. Every other
thread-sensitive call of the request (sync middleware, `sync_to_async` in a view) runs as Django
runs it: one thread per request, the same one for all of the request's calls.

On a site with databases, django.db's `request_started` receivers are sync, so each request
still starts its thread there (`acp_channels.apps` disconnects them when no database is
configured). See docs/deployment.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Callable
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import HttpRequest, HttpResponseBase
from django.urls import set_script_prefix

__all__ = ["SAFE_ON_LOOP", "AcpASGIHandler", "LoopCloser", "RequestExecutor", "close_runs_on_loop"]


def _safe_receivers() -> dict[Callable[..., Any], Callable[[], bool]]:
    from django.core.cache import caches, close_caches
    from django.core.handlers.base import reset_urlconf
    from django.db import close_old_connections

    return {
        # Closes the database connections of the thread it runs on: the loop's has none.
        close_old_connections: lambda: True,
        # Clears a context-local setting.
        reset_urlconf: lambda: True,
        # Closes the caches this request's context opened (network clients may block): only
        # when it opened none.
        close_caches: lambda: not caches.all(initialized_only=True),
    }


#: Sync `request_finished` receivers Django connects, and when each may run on the loop's thread.
SAFE_ON_LOOP: dict[Callable[..., Any], Callable[[], bool]] = _safe_receivers()

_current: contextvars.ContextVar[RequestExecutor | None] = contextvars.ContextVar("acp_request_executor", default=None)


class RequestExecutor(concurrent.futures.Executor):
    """One request's thread-sensitive calls, in a thread of the request's own started on the
    first call that needs one (as Django's per-request executor), joined off the loop."""

    def __init__(self) -> None:
        self._thread_pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def started_thread(self) -> bool:
        return self._thread_pool is not None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        if self._thread_pool is None:
            self._thread_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="acp-request")
        return self._thread_pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pool, self._thread_pool = self._thread_pool, None
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)


class LoopCloser:
    """A response closer that touches asyncio state (a stream's lease): it must run on the
    event loop. AcpASGIHandler runs it there; when Django closes the response in a thread, it
    is handed back to the loop instead of running there (where it could not reach the loop)."""

    def __init__(self, close: Callable[[], None]) -> None:
        self._close = close
        self._loop = asyncio.get_running_loop()

    def __call__(self) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._close()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._close)


def _closes_on_loop(closer: Callable[[], Any]) -> bool:
    """Closers quick and safe on the loop: a LoopCloser, and the request, which Django closes
    with its response (the body it spooled, in memory or a temporary file once large)."""
    if isinstance(closer, LoopCloser):
        return True
    return isinstance(getattr(closer, "__self__", None), HttpRequest) and getattr(closer, "__name__", "") == "close"


def close_runs_on_loop(response: HttpResponseBase, executor: RequestExecutor, sender: type) -> bool:
    """Whether `response.close()` may run on the event loop (see the module's docstring);
    `sender` is the handler class `request_finished` will name."""
    if executor.started_thread or not all(map(_closes_on_loop, getattr(response, "_resource_closers", ()))):
        return False
    try:
        sync_receivers, async_receivers = signals.request_finished._live_receivers(sender)
    except (AttributeError, TypeError, ValueError):  # another Django's internals: take the thread
        return False
    harmless = (SAFE_ON_LOOP.get(receiver) for receiver in sync_receivers)
    return not async_receivers and all(check is not None and check() for check in harmless)


class AcpASGIHandler(ASGIHandler):
    """`django.core.asgi.get_asgi_application()`'s handler, whose requests start a thread only
    when one of their calls needs it (this module's docstring)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = RequestExecutor()
        try:
            context = ThreadSensitiveContext(executor=executor)
        except TypeError:  # asgiref before 3.13 takes no executor: Django's own way
            async with ThreadSensitiveContext():
                await super().handle(scope, receive, send)
            return
        token = _current.set(executor)
        try:
            async with context:
                await self.handle(scope, receive, send)
        finally:
            _current.reset(token)
            if executor.started_thread:
                # Joined off the loop, as asgiref joins its own (the thread may wait for the loop).
                threading.Thread(target=executor.shutdown, name="acp-request-join", daemon=True).start()

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's `ASGIHandler.handle`, step for step and with its signals, but with one task
        watching for the client to leave (Django starts two tasks and waits for the first) and
        `response.close()` on the loop when `close_runs_on_loop` says it may run there."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        await signals.request_started.asend(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            assert error_response is not None
            body_file.close()
            await self.send_response(error_response, send)
            await self.close_response(error_response)
            return
        response = await self.respond_until_the_client_leaves(request, receive, send)
        if response is None:  # the client left before the view answered: the view was cancelled
            await signals.request_finished.asend(sender=self.__class__)
        else:
            await self.close_response(response)
        body_file.close()

    async def respond_until_the_client_leaves(
        self, request: HttpRequest, receive: Any, send: Any
    ) -> HttpResponseBase | None:
        """Make and send the response; when the client leaves meanwhile (`http.disconnect`),
        the view or the sending is cancelled, as Django does. None when the view was."""
        responding = asyncio.current_task()
        assert responding is not None
        left: list[BaseException] = []

        def client_left(watch: asyncio.Task[None]) -> None:
            if not watch.cancelled() and not left and not sent:
                left.append(watch.exception() or RequestAborted())
                responding.cancel()

        sent = False
        watch = asyncio.ensure_future(self.listen_for_disconnect(receive))
        watch.add_done_callback(client_left)
        response: HttpResponseBase | None = None
        try:
            response = await self.run_get_response(request)
            await self.send_response(response, send)
        except asyncio.CancelledError:
            if not left:
                raise
            responding.uncancel()
        finally:
            sent = True
            watch.cancel()
        if left and not isinstance(left[0], RequestAborted):
            raise left[0]  # a server that sent something else than http.disconnect, as Django
        return response

    async def close_response(self, response: HttpResponseBase) -> None:
        executor = _current.get()
        if executor is not None and close_runs_on_loop(response, executor, self.__class__):
            response.close()
        else:
            await sync_to_async(response.close)()
