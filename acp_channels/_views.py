"""The HTTP edge of `/acp`: POST, GET (SSE), HEAD and DELETE, thin over the host.

Each handler applies the reference's checks in its order (docs/wire-contract.md §2.1-§2.3), using the rules in
`protocol`, and turns the result into host operations.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from acp_channels import _cors as cors
from acp_channels import _metrics as metrics
from acp_channels import _protocol as protocol
from acp_channels._attach import attach_request, open_attachment
from acp_channels._conf import acp_settings
from acp_channels._gateway import (
    AgentBusy,
    AgentClosed,
    AgentEnded,
    AgentNotStarted,
    HostHandle,
    HostUnreachable,
    LayerUnavailable,
    QuotaExceeded,
    ReplayUnavailable,
    ServerFull,
    ShuttingDown,
    StreamBusy,
    StreamReader,
    TooManyRequests,
    TooManyStreams,
    WorkerBusy,
    WorkerFailed,
    initialize_or_abandon,
    locate,
    open_connection,
)
from acp_channels._handler import LoopCloser
from acp_channels._identity import Principal
from acp_channels._lifecycle import lifecycle
from acp_channels._protocol import (
    ATTACH_CURSOR_HEADER,
    ATTACH_ROLE_HEADER,
    ATTACH_SESSION_HEADER,
    CONNECTION_HEADER,
    LAST_EVENT_ID_HEADER,
    SESSION_HEADER,
    Frame,
    SessionHeaderError,
    event_id,
)
from acp_channels.auth import Refused, RequestContext, authenticate
from acp_channels.errors import AcpError, NoSuchSession, TooManyAttachments

logger = logging.getLogger("acp_channels.views")

ALLOWED_METHODS = ["POST", "GET", "HEAD", "DELETE"]

CONTENT_TYPE_REQUIRED = "Content-Type must be application/json"
BODY_TOO_LARGE = "POST body too large"
CONNECTION_REQUIRED = "Acp-Connection-Id header required"
MUST_ACCEPT_SSE = "client must accept text/event-stream"
# Refusals of a connection, its streams and requests: their statuses, texts and Retry-After
# come from the error tree (acp_channels/errors.py), through error_response.


@csrf_exempt
async def acp_endpoint(request: HttpRequest) -> HttpResponseBase:
    # A disallowed Host or a foreign Origin (DNS rebinding). Preflights (django-cors-headers
    # grants them to listed origins only) and other methods (405) reach no agent.
    refusal = cors.refusal(request, reaches_agent=request.method in ALLOWED_METHODS)
    response = text_response(*refusal) if refusal is not None else await dispatch(request)
    cors.vary_on_origin(response)
    return response


async def dispatch(request: HttpRequest) -> HttpResponseBase:
    if request.method not in ALLOWED_METHODS:
        if request.method == "OPTIONS" and cors.cors_enabled():
            return cors.preflight_response()
        return method_not_allowed()
    # Every request that reaches a connection authenticates first; a connection is found only
    # by the principal that owns it (gateway.locate).
    try:
        principal = await authenticate(RequestContext.for_http(request))
    except Refused as refused:
        return error_response(refused)
    if request.method == "POST":
        return await post(request, principal)
    if request.method == "DELETE":
        return await delete(request, principal)
    return await open_stream(request, principal)


def error_response(error: AcpError) -> HttpResponse:
    """How every error is answered over HTTP, from the one tree (acp_channels/errors.py): its
    status and text, Retry-After where it has one, and a refusal's challenge."""
    response = text_response(error.status, error.text)
    if error.retry_after is not None:
        response["Retry-After"] = str(error.retry_after)
    if isinstance(error, Refused) and error.challenge is not None:  # a 401's, or a 403 insufficient_scope
        response["WWW-Authenticate"] = error.challenge
    return response


def method_not_allowed() -> HttpResponse:
    response = text_response(405)
    response["Allow"] = ",".join(ALLOWED_METHODS)
    return response


async def health(request: HttpRequest) -> HttpResponse:
    """GET /health: 200 `ok`, as the reference serves by default (§2)."""
    if request.method not in ("GET", "HEAD"):
        return text_response(405)
    return text_response(200, "ok")


def located(request: HttpRequest, principal: Principal) -> HostHandle | HttpResponse:
    """The connection the request names (Acp-Connection-Id), or the answer when there is none:
    400 without the header, 404 for an unknown id or another principal's connection."""
    connection_id = header(request, CONNECTION_HEADER)
    if connection_id is None:
        return text_response(400, CONNECTION_REQUIRED)
    return locate(connection_id, principal) or text_response(404)


def text_response(status: int, body: str = "") -> HttpResponse:
    """A plain-text answer, or a bare status with no body and no content type (§2)."""
    if body:
        return HttpResponse(body, status=status, content_type="text/plain; charset=utf-8")
    response = HttpResponse(status=status)
    del response["Content-Type"]
    return response


def retry_later(status: int, body: str, retry_after: int) -> HttpResponse:
    """A cap answer (429 for one connection's caps, 503 for the worker's): try again later."""
    response = text_response(status, body)
    response["Retry-After"] = str(retry_after)
    return response


def json_response(body: str, connection_id: str | None = None) -> HttpResponse:
    response = HttpResponse(body, content_type="application/json")
    if connection_id is not None:
        response[CONNECTION_HEADER] = connection_id
    return response


def header(request: HttpRequest, name: str) -> str | None:
    """The first value of a header (§3.1); Django's request.headers would join repeats."""
    scope = getattr(request, "scope", None)
    if scope is None:
        return protocol.header_value(request.headers.get(name))
    key = name.encode("latin-1")
    for header_name, value in scope["headers"]:
        if header_name == key:
            return protocol.header_value(value.decode("latin-1"))
    return None


# -- POST ------------------------------------------------------------------------------------


async def post(request: HttpRequest, principal: Principal) -> HttpResponseBase:
    if not protocol.is_json_content_type(header(request, "content-type")):
        return text_response(415, CONTENT_TYPE_REQUIRED)
    limit: int = acp_settings.MAX_BODY_BYTES
    declared = request.META.get("CONTENT_LENGTH", "")
    if declared.isdigit() and int(declared) > limit:
        return text_response(413, BODY_TOO_LARGE)
    # Read past Django's DATA_UPLOAD_MAX_MEMORY_SIZE on purpose: our own limit applies here.
    body = request.read(limit + 1)
    if len(body) > limit:
        return text_response(413, BODY_TOO_LARGE)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        return text_response(400, f"Invalid JSON-RPC: {error}")

    try:
        frame = await protocol.read_frame(text, lambda: acp_settings.MAX_BATCH_ENTRIES)
    except protocol.BatchTooLarge as too_large:
        return await refuse_batch(request, too_large, principal)
    init_index = protocol.initialize_entry(frame)
    if init_index is not None:
        return await initialize(request, frame, init_index, principal)

    handle = located(request, principal)
    if isinstance(handle, HttpResponse):
        return handle
    try:
        plan = await protocol.plan_inbound_in_slices(frame, header(request, SESSION_HEADER))
        await handle.submit(plan)
    except (SessionHeaderError, TooManyRequests, AgentClosed) as error:
        return error_response(error)
    except REACHING_THE_HOST as error:
        return host_unavailable(error)
    return text_response(202)


async def refuse_batch(
    request: HttpRequest, too_large: protocol.BatchTooLarge, principal: Principal
) -> HttpResponseBase:
    """A batch over MAX_BATCH_ENTRIES is answered by the transport, like a malformed POST: on
    the connection stream (202), or as the body of a would-be initialize (200, no connection)."""
    reply = protocol.dumps(too_large.reply)
    connection_id = header(request, CONNECTION_HEADER)
    if connection_id is None:
        return json_response(reply)
    handle = locate(connection_id, principal)
    if handle is None:
        return text_response(404)
    try:
        await handle.reply_from_transport(reply)
    except REACHING_THE_HOST as error:
        return host_unavailable(error)
    except AgentClosed as error:
        return error_response(error)
    return text_response(202)


async def initialize(request: HttpRequest, frame: Frame, init_index: int, principal: Principal) -> HttpResponseBase:
    """Create a connection from an initial initialize frame and answer with its reply (§5)."""
    if isinstance(frame, protocol.Batch):
        try:
            plan = await protocol.plan_inbound_in_slices(frame, header(request, SESSION_HEADER), skip_index=init_index)
        except SessionHeaderError as error:
            return error_response(error)
        frame = plan.frame
    init_id = protocol.frame_messages(frame)[_message_index(frame, init_index)]["id"]

    remote_address = RequestContext.for_http(request).remote_address
    try:
        attach = attach_request(
            header(request, ATTACH_SESSION_HEADER),
            header(request, ATTACH_ROLE_HEADER),
            header(request, ATTACH_CURSOR_HEADER),
        )
        if attach is None:
            connection = await open_connection("http", principal, remote_address)
        else:  # another client of a live session (docs/shared-sessions.md)
            connection = await open_attachment("http", principal, remote_address, attach)
    except ValueError as error:
        return text_response(400, str(error))
    except NOT_OPENED as error:  # ShuttingDown: another worker will
        return error_response(error)
    except REACHING_THE_HOST as error:
        return host_unavailable(error)
    timeout: float | None = acp_settings.INITIALIZE_TIMEOUT
    try:
        reply = await initialize_or_abandon(connection, frame, init_id, timeout)
    except NOT_OPENED as error:  # no runner took it
        return error_response(error)
    except REACHING_THE_HOST as error:
        return host_unavailable(error)
    except (AgentClosed, AgentEnded) as error:
        return error_response(error)
    except TimeoutError:
        return text_response(504, f"agent did not answer initialize within {timeout:g} s")
    if not reply.accepted:
        return json_response(reply.body)
    return json_response(reply.body, connection.connection_id)


def _message_index(frame: Frame, entry_index: int) -> int:
    """Position of batch entry `entry_index` among the frame's valid messages."""
    if not isinstance(frame, protocol.Batch):
        return 0
    return sum(1 for entry in frame.entries[:entry_index] if not isinstance(entry, protocol.MalformedEntry))


# -- GET (SSE) -------------------------------------------------------------------------------


async def open_stream(request: HttpRequest, principal: Principal) -> HttpResponseBase:
    accept = header(request, "accept")
    if accept is None or "text/event-stream" not in accept:
        return text_response(406, MUST_ACCEPT_SSE)
    connection_id = header(request, CONNECTION_HEADER)
    if connection_id is None:
        return text_response(400, CONNECTION_REQUIRED)
    handle = locate(connection_id, principal)
    if handle is None:
        return text_response(404)
    session_id = header(request, SESSION_HEADER)
    try:
        lease = await handle.lease(session_id, header(request, LAST_EVENT_ID_HEADER))
    except (StreamBusy, ReplayUnavailable, TooManyStreams) as error:
        return error_response(error)
    except REACHING_THE_HOST as error:
        return host_unavailable(error)
    if request.method == "HEAD":
        lease.release()
        response: HttpResponseBase = HttpResponse(content_type="text/event-stream")
    else:
        response = EventStreamResponse(sse_body(lease, acp_settings.KEEPALIVE_SECONDS))
        # If the body is never iterated (the client left at once), closing frees the stream (on
        # the loop: a lease is asyncio state, and a remote one sends its release from there).
        response._resource_closers.append(LoopCloser(lease.release))  # type: ignore[attr-defined]
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: never buffer an event stream
    response[CONNECTION_HEADER] = connection_id
    if session_id is not None:
        response[SESSION_HEADER] = session_id
    return response


class EventStreamResponse(StreamingHttpResponse):
    """An SSE response that always closes its event generator when the response ends.

    Django wraps a streaming body in a generator of its own and closes only that one when the
    client disconnects while a chunk is being sent; ours would then wait for the garbage
    collector to run its `finally`, and the stream would stay leased (409) until then.
    """

    def __init__(self, events: AsyncGenerator[bytes, None]) -> None:
        super().__init__(events, content_type="text/event-stream")
        self._events = events

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._events:
                yield chunk
        finally:
            await self._events.aclose()


async def sse_body(lease: StreamReader, keepalive: float) -> AsyncGenerator[bytes, None]:
    """The events of one leased stream; ends once the connection is closed and drained, or
    once its credential expired (after a comment saying so: the connection lives, a new token
    resumes the stream; docs/authentication.md, expiry).

    The opening comment makes daphne send the status line and headers at once: clients wait
    for them before they POST (§13).
    """
    lifecycle.stream_opened()
    metrics.record_stream_opened("sse")
    try:
        yield protocol.SSE_OPENING
        tag = lease.tag
        while (items := await lease.take(keepalive)) is not None:
            if items:
                first = items.first_seq
                yield b"".join(protocol.sse_event(item, event_id(tag, seq)) for seq, item in enumerate(items, first))
            else:
                yield protocol.SSE_KEEPALIVE
        if lease.end_reason == "expired":
            yield protocol.SSE_EXPIRED
    finally:
        lease.release()
        lifecycle.stream_closed()
        metrics.record_stream_closed("sse")


# -- DELETE ----------------------------------------------------------------------------------


async def delete(request: HttpRequest, principal: Principal) -> HttpResponseBase:
    handle = located(request, principal)
    if isinstance(handle, HttpResponse):
        return handle
    try:
        await handle.terminate()
    except REACHING_THE_HOST as error:
        return host_unavailable(error)
    return text_response(202)


#: Why a new connection was not opened (with runners: on none of them).
NOT_OPENED = (
    ShuttingDown,
    QuotaExceeded,
    ServerFull,
    AgentNotStarted,
    NoSuchSession,
    TooManyAttachments,
    ReplayUnavailable,
)
#: What can go wrong reaching a host on another worker.
REACHING_THE_HOST = (HostUnreachable, LayerUnavailable, AgentBusy, WorkerFailed)


def host_unavailable(error: AcpError) -> HttpResponse:
    """The host's worker is gone (404: its heartbeat is gone), the layer is down or the live
    worker too busy to take the call (503, try again), or the agent is stuck (503); the host's
    worker failed to handle the call (500, and a log line here too)."""
    if isinstance(error, WorkerFailed):
        logger.error("%s", error)
    elif isinstance(error, LayerUnavailable):
        logger.warning("channel layer unavailable: %s", error)
    elif isinstance(error, WorkerBusy):
        logger.warning("%s", error)
    return error_response(error)
