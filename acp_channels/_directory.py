"""The session directory (docs/shared-sessions.md): a principal's live connections and their
sessions across every worker and runner, as `GET <endpoint>/sessions` answers it.

Each host reports what it saw on the wire (acp_channels._host.sessions); the web worker that
serves the request asks every live worker for its principal's connections only
(gateway.cluster_connections). A user with ACP_CHANNELS["SESSIONS_VIEW_ALL_PERMISSION"] sees
everyone's; an anonymous caller, nothing. A worker that does not answer in time leaves
`complete` false.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from django.http import HttpRequest, HttpResponseBase, JsonResponse

from acp_channels import _cors as cors
from acp_channels import _gateway as gateway
from acp_channels._conf import acp_settings
from acp_channels._host import extensions
from acp_channels._identity import ANONYMOUS, Principal
from acp_channels._inventory import ConnectionInfo
from acp_channels._views import error_response, text_response
from acp_channels.auth import RequestContext, authenticate, user_has_permission
from acp_channels.errors import Refused


async def sessions_endpoint(request: HttpRequest) -> HttpResponseBase:
    """GET (or HEAD): the directory as JSON; authenticated as the endpoint is."""
    refusal = cors.refusal(request, reaches_agent=request.method in ("GET", "HEAD"))
    if refusal is not None:
        return text_response(*refusal)
    if request.method not in ("GET", "HEAD"):
        response = text_response(405)
        response["Allow"] = "GET, HEAD"
        return response
    try:
        principal = await authenticate(RequestContext.for_http(request))
    except Refused as refused:
        return error_response(refused)
    response = JsonResponse(await directory(principal))
    response["Cache-Control"] = "no-store"
    cors.vary_on_origin(response)
    return response


async def directory(principal: Principal) -> dict[str, Any]:
    """What `principal` may see: its own connections, or everyone's with the permission. An
    anonymous caller sees none: anonymous clients are not one party, and a connection id is all
    that keeps one's connection from another's."""
    if principal == ANONYMOUS:
        return render([], complete=True)
    permission: str | None = acp_settings.SESSIONS_VIEW_ALL_PERMISSION
    everyone = permission is not None and await user_has_permission(principal, permission)
    connections, silent = await gateway.cluster_connections(None if everyone else principal)
    return render(connections, complete=not silent)


extensions.register(extensions.SESSIONS_LIST, directory)


def _iso(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def render(connections: list[ConnectionInfo], *, complete: bool) -> dict[str, Any]:
    """The directory's JSON: sessions (the most recently active first) and connections."""
    now = time.time()
    sessions: list[tuple[float, dict[str, Any]]] = []
    listed: list[dict[str, Any]] = []
    for info in connections:
        last = max([now - info.idle_seconds, *(session.last_activity for session in info.activity)])
        listed.append(
            {
                "connectionId": info.connection_id,
                "principal": info.principal,
                "agent": info.agent,
                "transport": info.transport,
                "created": _iso(now - info.age_seconds),
                "lastActivity": _iso(last),
                "attachments": info.attachments,
                "sessions": [session.session_id for session in info.activity],
                # Another client of a session: the connection whose session it carries.
                "attachedTo": info.attached_to,
            }
        )
        if info.attached_to is not None:
            continue  # its session is listed with the connection hosting it
        for session in info.activity:
            entry = {
                "sessionId": session.session_id,
                "connectionId": info.connection_id,
                "principal": info.principal,
                "agent": info.agent,
                "created": _iso(session.created),
                "lastActivity": _iso(session.last_activity),
                "turnRunning": session.turn_running,
                "pendingPermissions": session.pending_permissions,
                "attachments": info.attachments,
            }
            sessions.append((session.last_activity, entry))
    sessions.sort(key=lambda pair: -pair[0])
    return {"sessions": [entry for _, entry in sessions], "connections": listed, "complete": complete}
