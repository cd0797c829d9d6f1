"""`python -m acp_channels.client URL` / `acp-client URL`: the terminal ACP client."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from .errors import ClientUsageError
from .http_client import DEFAULT_TIMEOUT, resolve_endpoint
from .terminal import run

__all__ = ["main"]


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
        epilog="In the session: type a prompt and press Enter; Ctrl-C cancels the running turn "
        "(at the prompt, twice quits); /quit or Ctrl-D exits and closes the connection.",
    )
    p.add_argument("url", help="e.g. http://127.0.0.1:8000 or ws://127.0.0.1:8000/acp")
    p.add_argument("--cwd", help="working directory for the session (default: the current one)")
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


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        resolve_endpoint(args.url)
    except ClientUsageError as exc:
        print(f"acp-client: {exc}", file=sys.stderr)
        return 2
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
                timeout=args.timeout,
                permissions=args.permissions,
                fs=args.fs,
            )
        )
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
