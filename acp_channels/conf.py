"""Our settings: the `ACP_CHANNELS` dict in Django settings, shadowed here with defaults.

Read through `acp_settings` at use time (not import time) so `override_settings` works in tests.
A value is remembered until `setting_changed` says `ACP_CHANNELS` changed (AcpSettings).
`checks.py` validates every value with a system check id.
"""

from __future__ import annotations

from typing import Any, Final

from django.conf import settings
from django.core.signals import setting_changed

DEFAULTS: Final[dict[str, Any]] = {
    # The agent each connection gets. A dotted path to a callable returning a fresh agent: an
    # object written with the official `acp` SDK (an Agent implementation). Or a stdio agent
    # program, one process per connection: {"command": [argv...], "cwd": None, "env_passthrough":
    # [names passed through from the server's environment], "env": {extra variables}}.
    "AGENT": None,
    # Seconds a stdio agent gets to exit after its stdin is closed, and again after SIGTERM,
    # before it is killed.
    "AGENT_SHUTDOWN_GRACE": 2.0,
    # Largest POST body accepted; larger gets 413 (the reference's 16 MiB).
    "MAX_BODY_BYTES": 16 * 1024 * 1024,
    # An SSE stream idle this long gets a `: ` comment so proxies and clients keep it open.
    "KEEPALIVE_SECONDS": 15.0,
    # Output one connection may hold for readers that are slow or absent, counting bytes handed
    # to the server and not yet written to the socket. Beyond it the host stops taking the
    # agent's output (backpressure) instead of growing without bound; nothing is dropped.
    "MAX_BUFFERED_BYTES": 4 * 1024 * 1024,
    # Per stream, events already sent that are kept so a reader that lost its connection can
    # resume (SSE Last-Event-ID, WebSocket reattach): at most this many, and this many bytes
    # (counted in MAX_BUFFERED_BYTES, and forgotten first when it is full).
    # The window must cover what the network holds at a cut: socket buffers on both ends and any
    # proxy (about 1.4 MB measured on loopback during a burst; more on long fat links).
    "REPLAY_WINDOW_EVENTS": 16384,
    "REPLAY_WINDOW_BYTES": 2 * 1024 * 1024,
    # A WebSocket that drops without a clean close (a close code other than 1000) leaves its
    # connection and agent alive this long, for the client to reattach a new socket and resume
    # (docs/resumable-streams.md). 0: the connection ends with its socket, whatever the close.
    "WEBSOCKET_RESUME_SECONDS": 60.0,
    # The same, summed over every connection of one worker process: past it, every connection's
    # agent output waits, and initialize answers 503.
    "MAX_WORKER_BUFFERED_BYTES": 256 * 1024 * 1024,
    # How long an initialize POST waits for the agent's reply before 504; None waits forever.
    "INITIALIZE_TIMEOUT": 60.0,
    # Connections one worker process hosts at once; beyond it initialize gets 503. None: no cap.
    "MAX_CONNECTIONS": 1000,
    # Session streams (mailboxes) one connection may have at once; a GET for another gets 429.
    "MAX_SESSION_STREAMS": 64,
    # Client requests one connection may have waiting for the agent's reply; more get 429 (HTTP)
    # or a JSON-RPC error (WebSocket).
    "MAX_PENDING_REQUESTS": 1000,
    # Entries in one JSON-RPC batch; a larger batch gets a -32600 error and none of it is
    # dispatched. Batches are processed in slices that let other clients run.
    "MAX_BATCH_ENTRIES": 1000,
    # Seconds a client may take to send a request's headers, and then its body (slowloris);
    # past them the server answers 408 and closes the socket (under daphne).
    "HEADER_TIMEOUT_SECONDS": 10.0,
    "BODY_TIMEOUT_SECONDS": 60.0,
    # A connection with no POST and no stream reader for this long is ended (its agent shut
    # down), as if DELETEd: clients that vanish do not keep agents forever. None: never.
    "IDLE_TIMEOUT_SECONDS": 300.0,
    # Several workers: how long a worker may take to acknowledge a call from another one before
    # it is taken for dead (its connections then answer 404). Raise it for overloaded workers.
    "WORKER_TIMEOUT_SECONDS": 1.5,
    # On SIGTERM a worker drains (refuses new connections, ends its streams cleanly, shuts its
    # agents down) for at most this long, then exits.
    "SHUTDOWN_GRACE_SECONDS": 10.0,
    # Authentication (docs/authentication.md). A dotted path to a callable (sync or async) that
    # takes an acp_channels.auth.RequestContext and returns an identity.Principal, or raises
    # auth.Refused (401/403). None: everyone is identity.ANONYMOUS (a system check warns).
    "AUTHENTICATE": None,
    # Explicitly allow unauthenticated access (silences the warning; required for stdio agents
    # without AUTHENTICATE).
    "ALLOW_ANONYMOUS": False,
    # For the bearer-token authenticator: a dotted path to a callable (sync or async) taking the
    # token and returning a Django user, a Principal, or None.
    "TOKEN_LOOKUP": None,
    # For the settings token lookup (a shared team token): {token: principal id}.
    "TOKENS": {},
    # A Django permission ("app_label.codename") a user must have, for the authenticators that
    # yield Django users. None: any authenticated user.
    "REQUIRED_PERMISSION": None,
    # Connections one principal may hold at once on a worker; beyond it initialize gets 429.
    # Anonymous access is bounded by MAX_CONNECTIONS only.
    "MAX_CONNECTIONS_PER_PRINCIPAL": 32,
    # Browser origins allowed to use the endpoint across origins (CORS through
    # django-cors-headers, and the WebSocket Origin check). Empty: cross-origin use is off.
    "CORS_ALLOWED_ORIGINS": [],
    # Serve this worker's Prometheus metrics at /metrics (next to /acp). Off by default: they tell
    # whoever can reach the URL how busy the site is; turn it on where only the scraper can reach
    # it (docs/operations.md).
    "METRICS": False,
}


class AcpSettings:
    """Attribute access to `settings.ACP_CHANNELS` with our defaults filled in.

    A value read once is kept as a plain attribute (the host reads limits per message; the
    lookup through Django's settings and our defaults cost a tenth of a streamed message's CPU)
    until `ACP_CHANNELS` changes through Django's `setting_changed` signal (override_settings,
    pytest-django's `settings`)."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(name)
        value = self.__dict__[name] = self.user_settings().get(name, DEFAULTS[name])
        return value

    def reload(self) -> None:
        """Forget the values read so far: the next read sees the settings as they are now."""
        self.__dict__.clear()

    @staticmethod
    def user_settings() -> dict[str, Any]:
        value = getattr(settings, "ACP_CHANNELS", {})
        return value if isinstance(value, dict) else {}


acp_settings = AcpSettings()


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "ACP_CHANNELS":
        acp_settings.reload()


setting_changed.connect(_settings_changed)
