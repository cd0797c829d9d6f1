"""`acp-bridge URL` / `python -m acp_channels.bridge URL`: serve a remote ACP agent on stdio."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from acp_channels import _protocol as protocol
from acp_channels.client import ClientUsageError
from acp_channels.client._cli import ConnectionOptions, add_connection_arguments, connection_options
from acp_channels.client._http_client import shown_url

from ._attach import ROLES, Attachment
from ._relay import Bridge, BridgeEnd, log_reconnect
from ._stdio import StdinLines, StdoutLines

__all__ = ["main", "parser"]

logger = logging.getLogger("acp_channels.bridge")

#: The reference's body limit: larger messages would be refused by the server (HTTP 413).
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
#: Messages from the remote may be larger than what we send (SSE events, WebSocket messages).
RECEIVE_LIMIT = 64 * 1024 * 1024


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="acp-bridge",
        description="A stdio ACP agent that forwards everything to a remote ACP endpoint over HTTP+SSE "
        "(http[s]://) or WebSocket (ws[s]://). Launch it from an editor as the agent command. "
        "'/acp' is appended to the URL unless it already ends with it.",
        epilog="Messages are newline-delimited JSON-RPC on stdin and stdout; logs go to stderr. "
        "Exit status: 0 after stdin closed, 1 when the remote went away or refused the connection, "
        "2 on bad usage, 128+N after signal N (SIGINT, SIGTERM). The token is read from ACP_TOKEN "
        "(preferred) or --token and sent as 'Authorization: Bearer <token>'.",
    )
    add_connection_arguments(p)
    p.add_argument(
        "--max-message-size",
        type=int,
        default=DEFAULT_MAX_MESSAGE_SIZE,
        metavar="BYTES",
        help="largest message read from stdin; a longer line is answered with an error "
        f"(default {DEFAULT_MAX_MESSAGE_SIZE})",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="after stdin closes, how long to wait for answers to requests still pending (default 10)",
    )
    p.add_argument(
        "--attach",
        metavar="SESSION_ID",
        help="hand the editor this live session, started by another client (its first session/new is "
        "answered with it); see docs/bridge.md",
    )
    p.add_argument(
        "--role",
        choices=ROLES,
        help="with --attach: controller (default: prompts, cancels, answers permissions) or observer (watches)",
    )
    verbosity = p.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true", help="log every request of the transport")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="log errors only")
    return p


def _configure_logging(verbose: bool, quiet: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("acp-bridge: %(message)s"))
    for name, level in (
        ("acp_channels.bridge", logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO),
        ("acp_channels.client", logging.DEBUG if verbose else logging.WARNING),
    ):
        named = logging.getLogger(name)
        named.addHandler(handler)
        named.setLevel(level)
        named.propagate = False


def _attachment(args: argparse.Namespace, options: ConnectionOptions) -> Attachment | None:
    """The `--attach` asked for (ClientUsageError for options that do not go with it)."""
    if args.attach is None:
        if args.role is not None:
            raise ClientUsageError("--role goes with --attach")
        return None
    if options.restart:
        raise ClientUsageError("--restart and --attach do not go together (a restart would start a new agent)")
    named = {name.lower() for name in options.headers}
    if {protocol.ATTACH_SESSION_HEADER, protocol.ATTACH_ROLE_HEADER} & named:
        raise ClientUsageError("give --attach or an Acp-Attach-Session header (-H), not both")
    try:
        return Attachment(args.attach, args.role or "controller")
    except ValueError as exc:
        raise ClientUsageError(str(exc)) from None


async def _serve(
    options: ConnectionOptions, max_message_size: int, drain_timeout: float, attach: Attachment | None
) -> int:
    # With --attach the client attaches: its initialize (HTTP: the POST; WebSocket: the upgrade)
    # asks for the session, and over HTTP the session's stream opens right after it.
    attaching = {"attach": attach.session_id, "role": attach.role} if attach is not None else {}
    client = options.client(
        max_message_size=max(max_message_size, RECEIVE_LIMIT), on_reconnect=log_reconnect, **attaching
    )
    sink = StdoutLines()
    bridge = Bridge(
        client,
        StdinLines(max_message_size),
        sink,
        drain_timeout=drain_timeout,
        close_timeout=min(options.timeout, 10.0) if options.timeout else 10.0,
        attach=attach,
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, bridge.interrupt, signum)
    shape = "HTTP+SSE" if client.kind == "http" else "WebSocket"
    logger.info("relaying stdio to %s (%s)", shown_url(client.url), shape)
    if attach is not None:
        logger.info("attaching to session %s as %s", attach.session_id, attach.role)
    try:
        end = await bridge.run()
    finally:
        await sink.close()
    if end is BridgeEnd.INTERRUPTED:
        assert bridge.signal is not None
        return 128 + int(bridge.signal)
    status: int = end.value
    return status


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    _configure_logging(args.verbose, args.quiet)
    try:
        options = connection_options(args)
        if args.max_message_size <= 0:
            raise ClientUsageError("--max-message-size must be positive")
        if args.drain_timeout < 0:
            raise ClientUsageError("--drain-timeout must not be negative")
        attach = _attachment(args, options)
    except ClientUsageError as exc:
        print(f"acp-bridge: {exc}", file=sys.stderr)
        return 2
    for warning in options.warnings:
        logger.warning("warning: %s", warning)
    return asyncio.run(_serve(options, args.max_message_size, args.drain_timeout, attach))


if __name__ == "__main__":
    sys.exit(main())
