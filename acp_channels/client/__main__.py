"""`python -m acp_channels.client URL` / `acp-client URL`: the terminal ACP client."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import sys
from urllib.parse import urlsplit

from .errors import ClientUsageError
from .http_client import DEFAULT_TIMEOUT, check_token, resolve_endpoint
from .terminal import run

__all__ = ["TOKEN_ENVIRONMENT_VARIABLE", "main"]

#: Where the terminal client reads its token when --token is not given.
TOKEN_ENVIRONMENT_VARIABLE = "ACP_TOKEN"


def _header(value: str) -> tuple[str, str]:
    name, colon, content = value.partition(":")
    if not colon or not name.strip():
        raise argparse.ArgumentTypeError(f"expected 'Name: value', got {value!r}")
    return name.strip(), content.strip()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="acp-client",
        description="Talk to an ACP agent over HTTP+SSE (http[s]://) or WebSocket (ws[s]://). "
        "'/acp' is appended to the URL unless it already ends with it.",
        epilog="Credentials: the token is read from the ACP_TOKEN environment variable (preferred: "
        "a command line is visible to other local users) or --token, and sent as "
        "'Authorization: Bearer <token>'. "
        "In the session: type a prompt and press Enter; Ctrl-C cancels the running turn "
        "(at the prompt, twice quits); /quit or Ctrl-D exits and closes the connection.",
    )
    p.add_argument("url", help="e.g. http://127.0.0.1:8000 or ws://127.0.0.1:8000/acp")
    p.add_argument("--cwd", help="working directory for the session (default: the current one)")
    p.add_argument(
        "--token",
        help=f"bearer token (default: ${TOKEN_ENVIRONMENT_VARIABLE}; prefer the variable, "
        "a command line is visible in the process list)",
    )
    p.add_argument(
        "--token-subprotocol",
        action="store_true",
        help="ws(s):// only: send the token as a browser does, in the WebSocket subprotocols "
        "(acp, acp.bearer.<token>), instead of the Authorization header",
    )
    p.add_argument(
        "-H",
        "--header",
        action="append",
        type=_header,
        default=[],
        metavar="'NAME: VALUE'",
        help="extra header on every request, e.g. -H 'Authorization: Bearer ...' (repeatable)",
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds to wait for each answer")
    p.add_argument(
        "--permissions",
        choices=("ask", "allow", "reject"),
        default="ask",
        help="answer permission requests by asking (default) or always allow / reject",
    )
    p.add_argument("--fs", action="store_true", help="let the agent read and write files through this client")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request of the transport on stderr")
    return p


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    token: str | None = args.token if args.token is not None else os.environ.get(TOKEN_ENVIRONMENT_VARIABLE) or None
    try:
        _, kind = resolve_endpoint(args.url)
        if token is not None:
            check_token(token, subprotocol=args.token_subprotocol)
        if args.token_subprotocol and (token is None or kind != "ws"):
            raise ClientUsageError(
                f"--token-subprotocol needs a ws(s):// URL and a token (--token or ${TOKEN_ENVIRONMENT_VARIABLE})"
            )
        if token is not None and any(name.lower() == "authorization" for name, _ in args.header):
            raise ClientUsageError("give a token or an Authorization header (-H), not both")
    except ClientUsageError as exc:
        print(f"acp-client: {exc}", file=sys.stderr)
        return 2
    if args.token is not None:
        print(
            f"acp-client: warning: a token given with --token is visible to other local users in the "
            f"process list; prefer the {TOKEN_ENVIRONMENT_VARIABLE} environment variable",
            file=sys.stderr,
        )
    parts = urlsplit(args.url)
    if token is not None and parts.scheme.lower() in ("http", "ws") and not _is_loopback(parts.hostname or ""):
        print(
            f"acp-client: warning: sending the token unencrypted to {parts.hostname} ({parts.scheme}://); use "
            f"{'https' if parts.scheme.lower() == 'http' else 'wss'}:// beyond this machine",
            file=sys.stderr,
        )
    # The acp SDK logs a traceback when its transport fails; we report the error ourselves.
    logging.basicConfig(
        level=logging.WARNING if args.verbose else logging.CRITICAL,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.verbose:
        logging.getLogger("acp_channels.client").setLevel(logging.DEBUG)
    try:
        return asyncio.run(
            run(
                args.url,
                cwd=os.path.abspath(args.cwd) if args.cwd else None,
                headers=dict(args.header),
                token=token,
                token_subprotocol=args.token_subprotocol,
                timeout=args.timeout,
                permissions=args.permissions,
                fs=args.fs,
            )
        )
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
