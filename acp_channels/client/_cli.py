"""The command-line options every acp_channels program that connects to a server shares
(`acp-client`, `acp-bridge`): the URL, the token and its warnings, extra headers, the timeout."""

from __future__ import annotations

import argparse
import ipaddress
import os
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from ._errors import ClientUsageError
from ._http_client import DEFAULT_TIMEOUT, HttpClient, check_token, resolve_endpoint
from ._oauth_login import StoredLogin
from ._reconnect import DEFAULT_BACKOFF, Backoff
from ._token_source import TokenSource

__all__ = ["TOKEN_ENVIRONMENT_VARIABLE", "ConnectionOptions", "add_connection_arguments", "connection_options"]

#: Where the programs read their token when --token is not given.
TOKEN_ENVIRONMENT_VARIABLE = "ACP_TOKEN"


def _header(value: str) -> tuple[str, str]:
    name, colon, content = value.partition(":")
    if not colon or not name.strip():
        raise argparse.ArgumentTypeError(f"expected 'Name: value', got {value!r}")
    return name.strip(), content.strip()


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """URL, --token, --token-subprotocol, -H/--header, --timeout, --no-reconnect / --reconnect-for, --restart."""
    parser.add_argument("url", help="e.g. http://127.0.0.1:8000 or ws://127.0.0.1:8000/acp")
    parser.add_argument(
        "--token",
        help=f"bearer token (default: ${TOKEN_ENVIRONMENT_VARIABLE}; prefer the variable, "
        "a command line is visible in the process list)",
    )
    parser.add_argument(
        "--token-subprotocol",
        action="store_true",
        help="ws(s):// only: send the token as a browser does, in the WebSocket subprotocols "
        "(acp, acp.bearer.<token>), instead of the Authorization header",
    )
    parser.add_argument(
        "-H",
        "--header",
        action="append",
        type=_header,
        default=[],
        metavar="'NAME: VALUE'",
        help="extra header on every request, e.g. -H 'Authorization: Bearer ...' (repeatable)",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds to wait for each answer")
    reconnect = parser.add_mutually_exclusive_group()
    reconnect.add_argument(
        "--no-reconnect",
        action="store_true",
        help="a dropped stream or WebSocket ends the program (default: resume it when the server can)",
    )
    reconnect.add_argument(
        "--reconnect-for",
        type=float,
        default=DEFAULT_BACKOFF.give_up_after,
        metavar="SECONDS",
        help="how long to keep trying to resume a dropped stream or WebSocket "
        f"(default {DEFAULT_BACKOFF.give_up_after:g})",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="when the server has forgotten the connection, start a new one and session/load the open sessions "
        "(the agent must support loadSession; messages sent meanwhile are lost)",
    )


@dataclass(frozen=True)
class ConnectionOptions:
    """What the connection arguments say, checked."""

    url: str
    token: str | TokenSource | None
    """A fixed token (--token, $ACP_TOKEN), or a `TokenSource` handed in by the caller, e.g.
    `dataclasses.replace(options, token=source)`: refreshed when the server refuses or expires it."""
    token_subprotocol: bool
    headers: dict[str, str]
    timeout: float
    warnings: tuple[str, ...]
    """Things the user should know (a token on the command line, a token sent unencrypted)."""
    reconnect: Backoff | None = DEFAULT_BACKOFF
    restart: bool = False

    def client(self, **options: object) -> HttpClient:
        """An `HttpClient` for these options (`options`: further HttpClient arguments)."""
        return HttpClient(
            self.url,
            token=self.token,
            websocket_token="subprotocol" if self.token_subprotocol else "header",
            headers=self.headers,
            timeout=self.timeout,
            reconnect=self.reconnect,
            restart=self.restart,
            **options,  # type: ignore[arg-type]
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def connection_options(args: argparse.Namespace) -> ConnectionOptions:
    """Check the parsed connection arguments; raises `ClientUsageError` with a one-line reason.
    A token (--token, else $ACP_TOKEN) and an Authorization header (-H) together are an error;
    with neither, the sign-in stored by `acp-client login URL` is the token (a `StoredLogin`)."""
    headers = dict(args.header)
    header_credentials = any(name.lower() == "authorization" for name in headers)
    token: str | None = args.token if args.token is not None else os.environ.get(TOKEN_ENVIRONMENT_VARIABLE) or None
    _, kind = resolve_endpoint(args.url)
    if token is not None:
        check_token(token, subprotocol=args.token_subprotocol)
    if args.token_subprotocol and (token is None or kind != "ws"):
        raise ClientUsageError(
            f"--token-subprotocol needs a ws(s):// URL and a token (--token or ${TOKEN_ENVIRONMENT_VARIABLE})"
        )
    if token is not None and header_credentials:
        raise ClientUsageError("give a token or an Authorization header (-H), not both")
    warnings: list[str] = []
    source: str | TokenSource | None = token
    if token is None and not header_credentials:
        try:  # the sign-in of `acp-client login URL`, if any
            source = StoredLogin.for_url(args.url)
        except OSError as exc:
            warnings.append(f"cannot read the stored sign-in: {type(exc).__name__}: {exc}")
    if args.token is not None:
        warnings.append(
            "a token given with --token is visible to other local users in the process list; "
            f"prefer the {TOKEN_ENVIRONMENT_VARIABLE} environment variable"
        )
    parts = urlsplit(args.url)
    if (source is not None or header_credentials) and parts.scheme.lower() in ("http", "ws"):
        if not _is_loopback(parts.hostname or ""):
            secure = "https" if parts.scheme.lower() == "http" else "wss"
            warnings.append(
                f"sending the token unencrypted to {parts.hostname} ({parts.scheme}://); "
                f"use {secure}:// beyond this machine"
            )
    if args.reconnect_for < 0:
        raise ClientUsageError("--reconnect-for must not be negative")
    if args.restart and args.no_reconnect:
        raise ClientUsageError("--restart needs reconnecting (it happens when a resume finds the connection gone)")
    return ConnectionOptions(
        url=args.url,
        token=source,
        token_subprotocol=args.token_subprotocol,
        headers=headers,
        timeout=args.timeout,
        warnings=tuple(warnings),
        reconnect=None if args.no_reconnect else replace(DEFAULT_BACKOFF, give_up_after=args.reconnect_for),
        restart=args.restart,
    )
