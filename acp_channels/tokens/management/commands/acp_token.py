"""`manage.py acp_token create USER [--name NAME] [--expires 30d|2027-01-31] [--scope S ...]`,
`acp_token list [USER] [--all]`, `acp_token revoke ID [ID ...]`: the tokens of
acp_channels.tokens. `create` prints the secret once, on stdout alone (what follows is on
stderr): it is stored as a digest and never shown again."""

from __future__ import annotations

import re
from argparse import ArgumentParser
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from acp_channels.tokens.models import CONNECT, SCOPES, AgentToken

DURATION = re.compile(r"^(\d+)([dhm])$")
UNITS = {"d": "days", "h": "hours", "m": "minutes"}
COLUMNS = ("ID", "USER", "NAME", "SCOPES", "CREATED", "EXPIRES", "LAST USED", "STATUS")


def parse_expires(value: str) -> datetime:
    """`30d`, `12h`, `15m` from now, or an ISO date (its start, in the current time zone) or datetime."""
    if match := DURATION.match(value):
        return timezone.now() + timedelta(**{UNITS[match[2]]: int(match[1])})
    moment = parse_datetime(value)
    if moment is None and (day := parse_date(value)) is not None:
        moment = datetime(day.year, day.month, day.day)
    if moment is None:
        raise CommandError(f"--expires {value!r}: give 30d, 12h, 15m, or a date (2027-01-31) or datetime")
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


def shown(moment: datetime | None) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M") if moment is not None else "-"


class Command(BaseCommand):
    help = "Create, list and revoke the bearer tokens of acp_channels.tokens."

    def add_arguments(self, parser: ArgumentParser) -> None:
        commands = parser.add_subparsers(dest="action", required=True)
        create = commands.add_parser("create", help="issue a token for USER and print it (once)")
        create.add_argument("user", help="the username")
        create.add_argument("--name", default="token", help="what it is for (default: token)")
        create.add_argument("--expires", help="30d, 12h, 15m, or a date/datetime (default: never)")
        create.add_argument(
            "--scope",
            action="append",
            choices=SCOPES,
            help=f"a scope (repeatable; default {CONNECT}); names from the ACP remote security draft",
        )
        listing = commands.add_parser("list", help="the tokens (never their secrets)")
        listing.add_argument("user", nargs="?", help="only this user's")
        listing.add_argument("--all", action="store_true", help="revoked and expired ones too")
        revoke = commands.add_parser("revoke", help="revoke tokens by id (their connections end)")
        revoke.add_argument("ids", nargs="+", type=int, metavar="ID")

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, f"handle_{options['action']}")(**options)

    def handle_create(self, *, user: str, name: str, expires: str | None, scope: list[str] | None, **_: Any) -> None:
        model: Any = get_user_model()
        try:
            owner = model._default_manager.get_by_natural_key(user)
        except model.DoesNotExist:
            raise CommandError(f"no user {user!r}") from None
        token, secret = AgentToken.create(
            owner, name, expires=parse_expires(expires) if expires else None, scopes=scope or [CONNECT]
        )
        self.stdout.write(secret)
        self.stderr.write(
            f"token {token.pk} {name!r} of {owner.get_username()} (scopes {token.scopes}, expires "
            f"{shown(token.expires)}). The line above is its secret: it is shown this once."
        )

    def handle_list(self, *, user: str | None, all: bool, **_: Any) -> None:
        now = timezone.now()
        tokens = AgentToken.objects.select_related("user").order_by("pk")
        if user is not None:
            tokens = tokens.filter(**{f"user__{get_user_model().USERNAME_FIELD}": user})
        rows = [
            (
                str(token.pk),
                token.user.get_username(),
                token.name,
                token.scopes,
                shown(token.created),
                shown(token.expires),
                shown(token.last_used),
                token.status(now),
            )
            for token in tokens
            if all or token.status(now) == "active"
        ]
        widths = [max(len(row[i]) for row in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
        for row in [COLUMNS, *rows]:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())

    def handle_revoke(self, *, ids: list[int], **_: Any) -> None:
        found = set(AgentToken.objects.filter(pk__in=ids).values_list("pk", flat=True))
        if missing := sorted(set(ids) - found):
            raise CommandError(f"no token {', '.join(map(str, missing))}")
        AgentToken.objects.filter(pk__in=ids).update(revoked=True)
        self.stdout.write(f"revoked {', '.join(map(str, sorted(found)))}")
