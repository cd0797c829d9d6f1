"""The session directory, as a client reads it: `GET <endpoint>/sessions` (docs/shared-sessions.md)
parsed into `SessionDirectory`, `SessionEntry` and `ConnectionEntry`, and the table
`acp-client --list` prints.

The request carries the client's credentials (Authorization, cookies) and TLS settings; it
needs no ACP connection and does not touch the one the client may have open: an error here is
raised to the caller and does not end the transport.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from ._errors import NetworkError, ProtocolViolationError, TransportTimeoutError, status_error

__all__ = [
    "ConnectionEntry",
    "SessionDirectory",
    "SessionEntry",
    "directory_url",
    "fetch_directory",
    "parse_directory",
    "sessions_table",
]

_ERROR_BODY_LIMIT: Final = 2000
_HTTP_SCHEMES: Final = {"ws": "http", "wss": "https"}
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SessionEntry:
    """One live session in the directory."""

    session_id: str
    connection_id: str
    #: Who owns it, for people ("token:alice", "user:bob").
    principal: str
    #: The agent's name from its initialize result; None when it gave none.
    agent: str | None
    created: datetime.datetime
    last_activity: datetime.datetime
    #: A `session/prompt` is being answered right now.
    turn_running: bool
    #: Permission requests of the agent still waiting for an answer.
    pending_permissions: int
    #: Readers attached to its connection now (SSE streams, or the WebSocket).
    attachments: int


@dataclass(frozen=True, slots=True)
class ConnectionEntry:
    """One live connection in the directory."""

    connection_id: str
    principal: str
    agent: str | None
    #: "http" or "websocket", as the server names it.
    transport: str
    created: datetime.datetime
    last_activity: datetime.datetime
    attachments: int
    #: The ids of its sessions.
    sessions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SessionDirectory:
    """What `HttpClient.list_sessions()` returns: the sessions (the most recently active first),
    the connections, and whether every worker answered (`complete`: False means some sessions
    may be missing). `document` is the JSON the server sent, as it came."""

    sessions: tuple[SessionEntry, ...]
    connections: tuple[ConnectionEntry, ...]
    complete: bool
    document: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def http_endpoint(endpoint: str) -> str:
    """The endpoint over http(s), for a ws(s) endpoint too (a DELETE goes there)."""
    parts = urlsplit(endpoint)
    return urlunsplit(parts._replace(scheme=_HTTP_SCHEMES.get(parts.scheme.lower(), parts.scheme), fragment=""))


def directory_url(endpoint: str) -> str:
    """`<endpoint>/sessions`, over http(s) for a ws(s) endpoint too (the query is kept)."""
    parts = urlsplit(http_endpoint(endpoint))
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/sessions", parts.query, ""))


# ------------------------------------------------------------------------------------ parsing


class _Malformed(ValueError):
    pass


def _get(entry: Mapping[str, Any], where: str, name: str, check: Callable[[Any], bool], expected: str) -> Any:
    if name not in entry:
        raise _Malformed(f"{where} has no {name!r}")
    value = entry[name]
    if not check(value):
        raise _Malformed(f"{where}.{name} is not {expected}: {value!r:.80}")
    return value


def _text(entry: Mapping[str, Any], where: str, name: str) -> str:
    value: str = _get(entry, where, name, lambda value: isinstance(value, str), "a string")
    return value


def _optional_text(entry: Mapping[str, Any], where: str, name: str) -> str | None:
    value: str | None = _get(entry, where, name, lambda value: value is None or isinstance(value, str), "a string")
    return value


def _flag(entry: Mapping[str, Any], where: str, name: str) -> bool:
    value: bool = _get(entry, where, name, lambda value: isinstance(value, bool), "true or false")
    return value


def _count(entry: Mapping[str, Any], where: str, name: str) -> int:
    def check(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    value: int = _get(entry, where, name, check, "a count")
    return value


def _moment(entry: Mapping[str, Any], where: str, name: str) -> datetime.datetime:
    text = _text(entry, where, name)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise _Malformed(f"{where}.{name} is not an ISO 8601 time: {text!r:.80}") from None
    if moment.tzinfo is None:
        raise _Malformed(f"{where}.{name} has no time zone: {text!r:.80}")
    return moment


def _objects(document: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
    entries = _get(document, "the directory", name, lambda value: isinstance(value, list), "a list")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise _Malformed(f"{name}[{index}] is not an object: {entry!r:.80}")
    return list(entries)


def _session(entry: Mapping[str, Any], where: str) -> SessionEntry:
    return SessionEntry(
        session_id=_text(entry, where, "sessionId"),
        connection_id=_text(entry, where, "connectionId"),
        principal=_text(entry, where, "principal"),
        agent=_optional_text(entry, where, "agent"),
        created=_moment(entry, where, "created"),
        last_activity=_moment(entry, where, "lastActivity"),
        turn_running=_flag(entry, where, "turnRunning"),
        pending_permissions=_count(entry, where, "pendingPermissions"),
        attachments=_count(entry, where, "attachments"),
    )


def _connection(entry: Mapping[str, Any], where: str) -> ConnectionEntry:
    sessions = _get(
        entry,
        where,
        "sessions",
        lambda value: isinstance(value, list) and all(isinstance(item, str) for item in value),
        "a list of session ids",
    )
    return ConnectionEntry(
        connection_id=_text(entry, where, "connectionId"),
        principal=_text(entry, where, "principal"),
        agent=_optional_text(entry, where, "agent"),
        transport=_text(entry, where, "transport"),
        created=_moment(entry, where, "created"),
        last_activity=_moment(entry, where, "lastActivity"),
        attachments=_count(entry, where, "attachments"),
        sessions=tuple(sessions),
    )


def parse_directory(document: Any) -> SessionDirectory:
    """The directory a decoded JSON document describes; raises `ValueError` saying what is
    wrong with it. Fields the client does not know are ignored."""
    if not isinstance(document, dict):
        raise _Malformed(f"the directory is not a JSON object: {document!r:.80}")
    return SessionDirectory(
        sessions=tuple(_session(entry, f"sessions[{i}]") for i, entry in enumerate(_objects(document, "sessions"))),
        connections=tuple(
            _connection(entry, f"connections[{i}]") for i, entry in enumerate(_objects(document, "connections"))
        ),
        complete=_flag(document, "the directory", "complete"),
        document=document,
    )


# ------------------------------------------------------------------------------------ request


async def fetch_directory(
    http: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    timeout: float | None,
    redact: Callable[[str], str],
    credentials_sent: bool,
) -> SessionDirectory:
    """GET the directory at `url` with `headers`. Raises `AuthenticationError` (401, 403),
    `HttpStatusError` (any other status but 200: 404 from a server without a directory),
    `TransportTimeoutError`, `NetworkError`, or `ProtocolViolationError` for a body that is
    not a directory. Credentials never appear in a message (`redact`)."""
    what = f"GET {urlsplit(url).path}"
    try:
        response = await http.get(url, headers={**headers, "Accept": "application/json"}, timeout=timeout)
    except httpx.TimeoutException as exc:
        raise TransportTimeoutError(f"{what}: no answer within {timeout:g}s") from exc
    except httpx.HTTPError as exc:
        raise NetworkError(redact(f"{what}: {type(exc).__name__}: {exc}")) from exc
    if response.status_code != 200:
        challenge = response.headers.get("www-authenticate")
        raise status_error(
            what,
            response.status_code,
            redact(response.text[:_ERROR_BODY_LIMIT]),
            www_authenticate=redact(challenge) if challenge is not None else None,
            credentials_sent=credentials_sent,
        )
    try:
        return parse_directory(json.loads(response.content))
    except ValueError as exc:  # bad JSON (json.JSONDecodeError, UnicodeDecodeError) or a bad shape
        detail = str(exc) if isinstance(exc, _Malformed) else f"not JSON: {redact(response.text[:200])!r}"
        raise ProtocolViolationError(f"{what}: the answer is not a session directory: {detail}") from exc


# -------------------------------------------------------------------------------------- table

COLUMNS: Final = ("SESSION", "CONNECTION", "AGENT", "TURN", "PERMISSIONS", "ATTACHED", "LAST ACTIVITY")


def _shown_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def sessions_table(directory: SessionDirectory) -> str:
    """The sessions as a plain-text table, one line each, columns padded to their widest cell
    (the most recently active first, as the server sent them); "no sessions" when empty."""
    if not directory.sessions:
        return "no sessions"
    rows = [COLUMNS] + [
        (
            entry.session_id,
            entry.connection_id,
            entry.agent or "-",
            "running" if entry.turn_running else "idle",
            str(entry.pending_permissions),
            str(entry.attachments),
            _shown_time(entry.last_activity),
        )
        for entry in directory.sessions
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )
