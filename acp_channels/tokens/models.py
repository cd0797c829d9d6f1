"""The token model: a SHA-256 digest of a high-entropy secret, never the secret."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any, Final

from django.conf import settings
from django.db import models
from django.utils import timezone

#: Provisional names (ACP remote security draft): open a connection; watch, drive sessions.
CONNECT: Final = "acp:connect"
OBSERVE: Final = "acp:session:observe"
CONTROL: Final = "acp:session:control"
SCOPES: Final = (CONNECT, OBSERVE, CONTROL)
#: The secret's prefix: tells a leaked one apart (secret scanners), and fits a WebSocket subprotocol.
PREFIX: Final = "acp_"
#: `last_used` is written at most this often per token (not on every request).
LAST_USED_EVERY: Final = timedelta(minutes=1)


def token_digest(secret: str) -> str:
    """What is stored: the hex SHA-256 of the secret. Enough for 256-bit random secrets (slow
    password hashes are for guessable ones), and it finds the row by an index."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    """A new secret: 256 random bits, base64url (RFC 6455 token characters: a subprotocol fits)."""
    return PREFIX + secrets.token_urlsafe(32)


class AgentTokenQuerySet(models.QuerySet["AgentToken"]):
    def usable(self, now: datetime | None = None) -> AgentTokenQuerySet:
        """Not revoked, not expired, of an active user."""
        now = now or timezone.now()
        return self.filter(revoked=False, user__is_active=True).filter(
            models.Q(expires__isnull=True) | models.Q(expires__gt=now)
        )


class AgentToken(models.Model):
    """A bearer token of a user for /acp."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="acp_tokens")
    name = models.CharField(max_length=100, help_text="What it is for (an editor, a script).")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField(null=True, blank=True, help_text="Empty: never.")
    last_used = models.DateTimeField(null=True, blank=True, editable=False)
    #: Space-separated scope names (SCOPES).
    scopes = models.CharField(max_length=200, default=CONNECT, help_text="Space-separated: " + " ".join(SCOPES))
    revoked = models.BooleanField(default=False)

    objects = AgentTokenQuerySet.as_manager()

    class Meta:
        # Explicit: imported where the app is not installed (the public API's import test), the
        # model would otherwise register under the app `acp_channels`, whose module holds it.
        app_label = "acp_tokens"
        verbose_name = "agent token"
        ordering = ("-created",)
        permissions = [("use_agent", "Can use ACP agents")]

    def __str__(self) -> str:
        return f"{self.name} ({self.user})"

    @property
    def scope_list(self) -> list[str]:
        return self.scopes.split()

    @property
    def credential(self) -> str:
        """What a principal carries of this token (never the secret)."""
        return f"{CREDENTIAL_PREFIX}{self.pk}"

    def issue(self) -> str:
        """Give the token a new secret (stored as its digest) and return the secret: the only
        time it exists outside the client. Saves the token."""
        secret = new_secret()
        self.digest = token_digest(secret)
        self.save()
        return secret

    @classmethod
    def create(
        cls, user: Any, name: str, *, expires: datetime | None = None, scopes: list[str] | None = None
    ) -> tuple[AgentToken, str]:
        """A new token of `user` and its secret (shown once)."""
        token = cls(user=user, name=name, expires=expires, scopes=" ".join(scopes or [CONNECT]))
        return token, token.issue()

    def status(self, now: datetime | None = None) -> str:
        if self.revoked:
            return "revoked"
        if self.expires is not None and self.expires <= (now or timezone.now()):
            return "expired"
        return "active"


CREDENTIAL_PREFIX: Final = "acp_tokens:"
