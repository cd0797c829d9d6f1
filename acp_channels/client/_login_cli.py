"""`acp-client login URL` and `acp-client logout URL`: the command lines (the work is in
`_oauth_login`). `acp-client` hands them its arguments when the first one is `login` or
`logout`: no URL is either word (a URL has a scheme), so `acp-client URL ...` is unchanged."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Final, NoReturn

from ._errors import ClientUsageError
from ._oauth_discovery import LoginError, resource_for
from ._oauth_login import DEFAULT_CLIENT_ID, LoginOptions, login, logout
from ._token_store import TokenStore, default_token_directory

__all__ = ["COMMANDS", "main"]

COMMANDS: Final = ("login", "logout")
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"error: {message}\n")


def parser(command: str) -> argparse.ArgumentParser:
    if command == "logout":
        p = _Parser(
            prog="acp-client logout",
            description="Forget the sign-in for the server at URL: its tokens are revoked where the server "
            f"offers it, and removed from {default_token_directory()}.",
        )
        p.add_argument("url", help="the server, as given to acp-client login")
        return p
    p = _Parser(
        prog="acp-client login",
        description="Sign in to the ACP server at URL with OAuth (the server must be an OAuth 2 protected "
        "resource: its 401 names its metadata). The authorization code flow with PKCE opens your browser and "
        "listens on 127.0.0.1 for its answer; --device, or no browser here, uses the device flow where the "
        "server offers it (a code to enter on any device). The tokens are kept, readable by you only, in "
        f"{default_token_directory()}; acp-client URL and acp-bridge URL then use them (renewing the access "
        "token as it expires) when given no --token, ACP_TOKEN or Authorization header.",
    )
    p.add_argument("url", help="the server, e.g. https://agents.example.com (as for acp-client URL)")
    p.add_argument(
        "--scope",
        action="append",
        default=[],
        metavar="SCOPE",
        help="a scope to ask for (repeatable, or several in one, space-separated; default: every scope the "
        "server lists, e.g. acp:connect acp:session:observe acp:session:control)",
    )
    p.add_argument(
        "--device",
        action="store_true",
        help="use the device flow: print a code and a URL to enter it at, from any browser (over ssh too)",
    )
    p.add_argument(
        "--no-browser", action="store_true", help="print the sign-in URL instead of opening a browser (on this machine)"
    )
    p.add_argument(
        "--client-id",
        default=DEFAULT_CLIENT_ID,
        help=f"the OAuth client id the site registered for acp-client (default: {DEFAULT_CLIENT_ID})",
    )
    return p


def _expiry(expires_at: float | None) -> str:
    if expires_at is None:
        return "no expiry given"
    minutes = max(0, round((expires_at - time.time()) / 60))
    return f"the access token is valid {minutes} min"


def main(argv: list[str]) -> int:
    """`argv` starts with the command (`login` or `logout`)."""
    command, rest = argv[0], argv[1:]
    args = parser(command).parse_args(rest)
    store = TokenStore()
    try:
        resource_for(args.url)  # a usage error before anything goes out
        if command == "logout":
            record, revoked = asyncio.run(logout(args.url, store=store))
            if record is None:
                print(f"Not signed in to {resource_for(args.url)}: nothing to do.")
            elif revoked:
                print(f"Signed out of {record.resource}: its tokens are revoked and forgotten.")
            else:
                print(
                    f"Signed out of {record.resource}: its tokens are forgotten (the server did not revoke them: "
                    "they stay valid until they expire)."
                )
            return 0
        options = LoginOptions(
            url=args.url,
            scopes=args.scope,
            device=args.device,
            open_browser=not args.no_browser,
            client_id=args.client_id,
        )
        record = asyncio.run(login(options, store=store))
    except ClientUsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LoginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:  # the token directory
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    renewal = "renewed with the refresh token" if record.refresh_token else "no refresh token: sign in again then"
    print(
        f"Signed in to {record.resource} (scopes: {record.scope}; {_expiry(record.expires_at)}, {renewal}).\n"
        f"acp-client {args.url} and acp-bridge {args.url} now use it. Tokens kept in {store.path(record.resource)}"
    )
    return 0
