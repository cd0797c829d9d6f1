"""`python -m acp_channels.client URL` / `acp-client URL`: the terminal ACP client.
`acp-client URL --list [--json]`: the principal's live sessions (the session directory).
`acp-client URL --attach SESSION_ID [--role observer]`: another client of a live session;
`acp-client URL --session SESSION_ID -p PROMPT`: one turn on it.
`acp-client login URL` / `acp-client logout URL`: sign in with OAuth, or forget it (_login_cli).

Exit status: 0 after /quit or Ctrl-D, 1 when the connection failed or was lost, 2 for a usage
error (bad arguments, URL or credentials: nothing was sent), 130 when interrupted while connecting.
Every error is one line starting `error: ` on stderr, warnings `warning: `.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from acp_channels import __version__

from ._cli import TOKEN_ENVIRONMENT_VARIABLE, ConnectionOptions, add_connection_arguments, connection_options
from ._directory import sessions_table
from ._errors import AcpClientError, ClientUsageError

#: The first words that are commands rather than a URL (`acp-client login URL`).
LOGIN_COMMANDS = ("login", "logout")

__all__ = ["EXIT_USAGE", "TOKEN_ENVIRONMENT_VARIABLE", "main"]

#: The exit status for a usage error (argparse's too).
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse with the client's one error prefix (`error: `, not `acp-client: error: `)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"error: {message}\n")


def default_history_path() -> Path:
    """`$XDG_STATE_HOME/acp-channels/history` (`~/.local/state/acp-channels/history`)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "acp-channels" / "history"


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="acp-client",
        description="Talk to an ACP agent over HTTP+SSE (http[s]://) or WebSocket (ws[s]://). "
        "'/acp' is appended to the URL unless it already ends with it.",
        epilog="Credentials: the token is read from the ACP_TOKEN environment variable (preferred: "
        "a command line is visible to other local users) or --token, and sent as "
        "'Authorization: Bearer <token>'; without either, the sign-in stored by 'acp-client login URL' "
        "(OAuth; 'acp-client login --help'), if any. "
        "In the session: type a prompt and press Enter; Ctrl-C cancels the running turn "
        "(at the prompt, twice quits); /quit or Ctrl-D exits and closes the connection; /help lists the "
        "commands. --list prints the live sessions instead (the server's session directory) and exits; "
        "--attach joins one of them (its turn, then your prompts), /detach leaves it running. "
        "Exit status: 0 done, 1 the connection failed or was lost, 2 usage error. "
        "NO_COLOR=1 turns colour off.",
    )
    # Before the URL is required: `acp-client --version` alone prints it and exits 0.
    p.add_argument("--version", action="version", version=f"acp-client {__version__}")
    add_connection_arguments(p)
    p.add_argument("--cwd", help="working directory for the session (default: the current one)")
    p.add_argument(
        "--permissions",
        choices=("ask", "allow", "reject"),
        default="ask",
        help="answer permission requests by asking (default) or always allow / reject",
    )
    p.add_argument("--fs", action="store_true", help="let the agent read and write files through this client")
    p.add_argument(
        "--no-history",
        action="store_true",
        help=f"keep the prompts' history in memory only (default: saved in {default_history_path()})",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log every request of the transport on stderr")
    p.add_argument(
        "-p",
        "--prompt",
        help="one turn: open a session, send PROMPT, print the turn and exit (0 when it ends with "
        "end_turn, 3 for another stop reason, 1 for an error)",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="print the sessions this token may see (session, connection, agent, turn running or idle, "
        "pending permission requests, readers attached, last activity) and exit; opens no session",
    )
    p.add_argument("--json", action="store_true", help="with --list: print the server's directory as JSON")
    p.add_argument(
        "--attach",
        metavar="SESSION_ID",
        help="attach to a live session (--list shows them) instead of opening one: print what it retained, "
        "follow a running turn to its end, then read prompts; /quit and /detach leave it running",
    )
    p.add_argument(
        "--session",
        metavar="SESSION_ID",
        help="with -p: run that one turn on this live session (attached; a running turn is followed first)",
    )
    p.add_argument(
        "--role",
        choices=("controller", "observer"),
        default=None,
        help="with --attach or --session: controller (default: prompts and answers) or observer (watches only)",
    )
    return p


async def list_sessions(options: ConnectionOptions, *, as_json: bool) -> int:
    """`--list`: print the session directory (a table, or the server's JSON); 1 when it failed."""
    client = options.client()
    try:
        directory = await client.list_sessions()
    except AcpClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.close()
    print(json.dumps(directory.document, indent=2) if as_json else sessions_table(directory))
    if not directory.complete:
        print("warning: some workers did not answer in time: the list may be incomplete", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments and arguments[0] in LOGIN_COMMANDS:  # never a URL: a URL has a scheme
        from ._login_cli import main as login_main

        return login_main(arguments)
    args = parser().parse_args(arguments)
    try:
        if args.json and not args.list:
            raise ClientUsageError("--json goes with --list")
        if args.session is not None and args.prompt is None:
            raise ClientUsageError("--session goes with -p (to attach and type prompts: --attach SESSION_ID)")
        if args.attach is not None and (args.prompt is not None or args.session is not None):
            raise ClientUsageError("--attach reads prompts; for one prompt on a live session: --session SESSION_ID -p")
        if args.role is not None and args.attach is None and args.session is None:
            raise ClientUsageError("--role goes with --attach or --session")
        if args.list and (args.attach is not None or args.session is not None or args.prompt is not None):
            raise ClientUsageError("--list goes alone (it opens no session)")
        options = connection_options(args)
    except ClientUsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for warning in options.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.list:
        try:
            return asyncio.run(list_sessions(options, as_json=args.json))
        except KeyboardInterrupt:
            return 130
    # The acp SDK logs a traceback when its transport fails; we report the error ourselves.
    logging.basicConfig(
        level=logging.WARNING if args.verbose else logging.CRITICAL,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.verbose:
        logging.getLogger("acp_channels.client").setLevel(logging.DEBUG)
    # Here, not at the top: `--help` and usage errors answer without loading the acp SDK, the
    # terminal's libraries and their models (most of a second of CPU).
    from ._terminal import run

    try:
        return asyncio.run(
            run(
                options.url,
                cwd=os.path.abspath(args.cwd) if args.cwd else None,
                headers=options.headers,
                token=options.token,
                token_subprotocol=options.token_subprotocol,
                timeout=options.timeout,
                permissions=args.permissions,
                fs=args.fs,
                reconnect=options.reconnect,
                restart=options.restart,
                history=None if args.no_history else default_history_path(),
                prompt=args.prompt,
                attach=args.attach if args.attach is not None else args.session,
                role=args.role or "controller",
            )
        )
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
