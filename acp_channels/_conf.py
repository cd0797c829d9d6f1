"""Our settings: the `ACP_CHANNELS` dict in Django settings, shadowed here with defaults.

Each key is declared once, on `AcpSettings`, with its default, the type mypy sees
(`acp_settings.MAX_BODY_BYTES` is an `int`) and, for numbers and flags, the rule `_checks.py`
applies with its system check id. Read through `acp_settings` at use time (not import time) so
`override_settings` works in tests; a value is remembered until `setting_changed` says
`ACP_CHANNELS` changed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from typing import Any, Final, Generic, TypeVar, overload

from django.conf import settings
from django.core.signals import setting_changed

T = TypeVar("T")
MiB: Final = 1024 * 1024


class Setting(Generic[T]):
    """One key of `ACP_CHANNELS`: its default, and what a value must be (`problem`)."""

    def __init__(self, default: T, check_id: str | None = None) -> None:
        self.default = default
        self.check_id = check_id
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, instance: AcpSettings, owner: type) -> T: ...

    def __get__(self, instance: AcpSettings | None, owner: type) -> Setting[T] | T:
        if instance is None:
            return self
        # Kept on the instance, where it shadows this descriptor until `reload` (the host reads
        # limits per message; Django's settings and our defaults cost a tenth of a message's CPU).
        value: T = instance.user_settings().get(self.name, self.default)
        instance.__dict__[self.name] = value
        return value

    def problem(self, value: Any) -> str | None:
        """Why `value` is not allowed (for the system check), or None. Checked in _checks.py
        when there is no rule here."""
        return None


N = TypeVar("N", bound=float)  # int or float (mypy takes an int where a float is expected)


class Number(Setting[N]):
    """A positive number (`zero`: or 0) of `kind`: int takes integers only, float any number."""

    def __init__(self, default: N, check_id: str, *, zero: bool = False) -> None:
        super().__init__(default, check_id)
        self.kind: type = type(default)
        self.zero = zero

    def allows(self, value: Any) -> bool:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and (self.kind is float or isinstance(value, int)) and (value > 0 or (value == 0 and self.zero))

    @property
    def allowed(self) -> str:
        allowed = "a positive number" if self.kind is float else "a positive integer"
        return allowed.replace("positive", "non-negative") if self.zero else allowed

    def problem(self, value: Any) -> str | None:
        return None if self.allows(value) else f"must be {self.allowed}, not {value!r}"


class OptionalNumber(Setting[N | None]):
    """A Number, or None (no limit)."""

    def __init__(self, default: N | None, kind: type[N], check_id: str) -> None:
        super().__init__(default, check_id)
        self.kind = kind
        self._number: Number[N] = Number(kind(1), check_id)

    def problem(self, value: Any) -> str | None:
        if value is None or self._number.allows(value):
            return None
        return f"must be {self._number.allowed} or None, not {value!r}"


class Flag(Setting[bool]):
    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else f"must be True or False, not {value!r}"


class Choice(Setting[str]):
    """One of a few names."""

    def __init__(self, default: str, choices: tuple[str, ...], check_id: str) -> None:
        super().__init__(default, check_id)
        self.choices = choices

    def problem(self, value: Any) -> str | None:
        if value in self.choices:
            return None
        return f"must be one of {', '.join(map(repr, self.choices))}, not {value!r}"


class AcpSettings:
    """Attribute access to `settings.ACP_CHANNELS` with our defaults filled in, typed."""

    # The agent each connection gets. A dotted path to a callable returning a fresh agent: an
    # object written with the official `acp` SDK (an Agent implementation). Or a stdio agent
    # program, one process per connection: {"command": [argv...], "cwd": None, "env_passthrough":
    # [names passed through from the server's environment], "env": {extra variables}}.
    AGENT: Setting[str | Mapping[str, Any] | None] = Setting(None, "acp_channels.E001")
    # Seconds a stdio agent gets to exit after its stdin is closed, and again after SIGTERM,
    # before it is killed.
    AGENT_SHUTDOWN_GRACE = Number(2.0, "acp_channels.E013", zero=True)
    # Largest POST body accepted; larger gets 413 (the reference's 16 MiB).
    MAX_BODY_BYTES = Number(16 * MiB, "acp_channels.E002")
    # An SSE stream idle this long gets a `: ` comment so proxies and clients keep it open.
    KEEPALIVE_SECONDS = Number(15.0, "acp_channels.E003")
    # Output one connection may hold for readers that are slow or absent, counting bytes handed
    # to the server and not yet written to the socket. Beyond it the host stops taking the
    # agent's output (backpressure) instead of growing without bound; nothing is dropped.
    MAX_BUFFERED_BYTES = Number(4 * MiB, "acp_channels.E004")
    # Per stream, events already sent that are kept so a reader that lost its connection can
    # resume (SSE Last-Event-ID, WebSocket reattach): at most this many, and this many bytes
    # (counted in MAX_BUFFERED_BYTES, and forgotten first when it is full).
    # The window must cover what the network holds at a cut: socket buffers on both ends and any
    # proxy (about 1.4 MB measured on loopback during a burst; more on long fat links).
    REPLAY_WINDOW_EVENTS = Number(16384, "acp_channels.E029", zero=True)
    REPLAY_WINDOW_BYTES = Number(2 * MiB, "acp_channels.E030", zero=True)
    # A WebSocket that drops without a clean close (a close code other than 1000) leaves its
    # connection and agent alive this long, for the client to reattach a new socket and resume
    # (docs/resumable-streams.md). 0: the connection ends with its socket, whatever the close.
    WEBSOCKET_RESUME_SECONDS = Number(60.0, "acp_channels.E032", zero=True)
    # The same, summed over every connection of one worker process: past it, every connection's
    # agent output waits, and initialize answers 503. Also bounds, each on its own, the request
    # bodies a worker holds at once and the bytes of requests waiting for agents.
    MAX_WORKER_BUFFERED_BYTES = Number(256 * MiB, "acp_channels.E015")
    # How long an initialize POST waits for the agent's reply before 504; None waits forever.
    INITIALIZE_TIMEOUT = OptionalNumber(60.0, float, "acp_channels.E005")
    # Connections one worker process hosts at once; beyond it initialize gets 503. None: no cap.
    MAX_CONNECTIONS = OptionalNumber(1000, int, "acp_channels.E006")
    # Session streams (mailboxes) one connection may have at once; a GET for another gets 429.
    MAX_SESSION_STREAMS = Number(64, "acp_channels.E016")
    # Client requests one connection may have waiting for the agent's reply; more get 429 (HTTP)
    # or a JSON-RPC error (WebSocket).
    MAX_PENDING_REQUESTS = Number(1000, "acp_channels.E017")
    # Entries in one JSON-RPC batch; a larger batch gets a -32600 error and none of it is
    # dispatched. Batches are processed in slices that let other clients run.
    MAX_BATCH_ENTRIES = Number(1000, "acp_channels.E018")
    # Seconds a client may take to send a request's headers, and then its body (slowloris);
    # past them the server answers 408 and closes the socket (under daphne).
    HEADER_TIMEOUT_SECONDS = Number(10.0, "acp_channels.E019")
    BODY_TIMEOUT_SECONDS = Number(60.0, "acp_channels.E020")
    # A connection with no POST and no stream reader for this long is ended (its agent shut
    # down), as if DELETEd: clients that vanish do not keep agents forever. None: never.
    IDLE_TIMEOUT_SECONDS = OptionalNumber(300.0, float, "acp_channels.E012")
    # Several workers: how long a worker may take to acknowledge a call from another one before
    # it is taken for dead (its connections then answer 404). Raise it for overloaded workers.
    WORKER_TIMEOUT_SECONDS = Number(1.5, "acp_channels.E014")
    # Where agents run (docs/runners.md): "workers", each web worker hosts the connections it
    # opens (one process, or several sharing a channel layer); "runners", web workers host none
    # and place each new connection on a runner process (`manage.py acp_runner`) with room.
    AGENT_HOSTS = Choice("workers", ("workers", "runners"), "acp_channels.E038")
    # On SIGTERM a runner takes no new connection and lets its connections go on for at most
    # this long (a turn finishes), then ends the rest with a reason the client can read.
    RUNNER_DRAIN_SECONDS = Number(60.0, "acp_channels.E039", zero=True)
    # Connections with a stdio agent (one process each) one process hosts at once; beyond it
    # initialize gets 503 (with runners: the next runner with room). None: MAX_CONNECTIONS only.
    MAX_STDIO_AGENTS = OptionalNumber(None, int, "acp_channels.E040")
    # On SIGTERM a worker drains (refuses new connections, ends its streams cleanly, shuts its
    # agents down) for at most this long, then exits.
    SHUTDOWN_GRACE_SECONDS = Number(10.0, "acp_channels.E011")
    # Authentication (docs/authentication.md). A dotted path to a callable (sync or async) that
    # takes an acp_channels.auth.RequestContext and returns an identity.Principal, or raises
    # auth.Refused (401/403). None: everyone is identity.ANONYMOUS (a system check warns).
    AUTHENTICATE: Setting[str | None] = Setting(None, "acp_channels.E021")
    # Explicitly allow unauthenticated access (silences the warning; required for stdio agents
    # without AUTHENTICATE).
    ALLOW_ANONYMOUS = Flag(False, "acp_channels.E026")
    # For the bearer-token authenticator: a dotted path to a callable (sync or async) taking the
    # token and returning a Django user, a Principal, or None.
    TOKEN_LOOKUP: Setting[str | None] = Setting(None, "acp_channels.E022")
    # For the settings token lookup (a shared team token): {token: principal id}.
    TOKENS: Setting[Mapping[str, str]] = Setting({}, "acp_channels.E024")
    # WebSocket tickets (POST <endpoint>/tickets, the acp-ticket.<ticket> subprotocol): how long
    # one is valid (at most 60: E090), and the alias in CACHES they are kept in, which every
    # worker must share (E091).
    TICKET_SECONDS = Number(60.0, "acp_channels.E090")
    TICKET_CACHE: Setting[str] = Setting("default", "acp_channels.E091")
    # Accept a bearer token in the WebSocket subprotocol acp.bearer.<token>, for old browser
    # clients (a system check warns: W090). Off: browsers use tickets.
    ALLOW_BEARER_SUBPROTOCOL = Flag(False, "acp_channels.E092")
    # A Django permission ("app_label.codename") a user must have, for the authenticators that
    # yield Django users. None: any authenticated user.
    REQUIRED_PERMISSION: Setting[str | None] = Setting(None, "acp_channels.E023")
    # Every this many seconds each process asks whether the credentials of its live connections
    # still hold: it ends those revoked (a token revoked or deleted, a user deactivated or without
    # REQUIRED_PERMISSION; reason "revoked") and closes the streams of those expired (the
    # connection lives: a new token of the same principal resumes it). None: never (their next
    # request is refused).
    REVALIDATE_SECONDS = OptionalNumber(5.0, float, "acp_channels.E060")
    # A connection whose credential expires within this many seconds is told so, once per
    # credential: the notification _acp-channels/auth_expiring {expiresAt} on its connection
    # stream (or socket), for the client to get a new token in time. None: no notice.
    AUTH_EXPIRING_SECONDS = OptionalNumber(60.0, float, "acp_channels.E062")
    # A dotted path to that check, sync or async: principals -> those no longer valid. None:
    # the built-in one (acp_channels.tokens' tokens, Django users' REQUIRED_PERMISSION).
    REVALIDATE: Setting[str | None] = Setting(None, "acp_channels.E061")
    # A Django permission ("app_label.codename") whose users see every principal's connections
    # and sessions in the directory (GET /acp/sessions). None: each sees only its own.
    SESSIONS_VIEW_ALL_PERMISSION: Setting[str | None] = Setting(None, "acp_channels.E042")
    # A connection whose clients are all gone (no stream reader, no socket, no POST) keeps its
    # agent this long (its turn goes on; its streams keep their replay window's worth of
    # output), for a client to attach again (docs/shared-sessions.md). Replaces
    # IDLE_TIMEOUT_SECONDS and WEBSOCKET_RESUME_SECONDS where longer; 0: those alone.
    DETACHED_SECONDS = Number(4 * 3600.0, "acp_channels.E043", zero=True)
    # Connections with nobody attached one principal may hold on a worker; beyond it initialize
    # gets 429 (attach to one, or end one). None: no cap but MAX_CONNECTIONS_PER_PRINCIPAL.
    MAX_DETACHED_PER_PRINCIPAL = OptionalNumber(8, int, "acp_channels.E044")
    # A permission request the agent sends while nobody is attached waits (the agent with it)
    # this long for someone to attach and answer; then it is answered as cancelled.
    PERMISSION_TIMEOUT_SECONDS = Number(3600.0, "acp_channels.E045")
    # Other clients attached to one session at once (attach gets 429 beyond).
    MAX_ATTACHMENTS_PER_SESSION = Number(8, "acp_channels.E046")
    # Django permissions ("app_label.codename") whose users may attach to any principal's
    # sessions, as observers (watch) or controllers (prompt, answer). None: own sessions only.
    SESSIONS_OBSERVE_PERMISSION: Setting[str | None] = Setting(None, "acp_channels.E047")
    SESSIONS_CONTROL_PERMISSION: Setting[str | None] = Setting(None, "acp_channels.E048")
    # OAuth 2 (acp_channels.oauth, the `oauth` extra; docs/authentication.md): the resource
    # identifier tokens are for (the https URL of the endpoint; None: the endpoint's URL as
    # requested), the authorization servers' issuer URLs the metadata names, and the scope of
    # each operation ({"connect"|"observe"|"control": scope}, over acp:connect,
    # acp:session:observe, acp:session:control).
    OAUTH_RESOURCE: Setting[str | None] = Setting(None, "acp_channels.E070")
    OAUTH_AUTHORIZATION_SERVERS: Setting[list[str]] = Setting([], "acp_channels.E071")
    OAUTH_SCOPES: Setting[Mapping[str, str]] = Setting({}, "acp_channels.E072")
    # Connections one principal may hold at once on a worker; beyond it initialize gets 429.
    # Anonymous access is bounded by MAX_CONNECTIONS only.
    MAX_CONNECTIONS_PER_PRINCIPAL = OptionalNumber(32, int, "acp_channels.E025")
    # Browser origins allowed to use the endpoint across origins (CORS through
    # django-cors-headers, and the WebSocket Origin check). Empty: cross-origin use is off.
    CORS_ALLOWED_ORIGINS: Setting[list[str]] = Setting([], "acp_channels.E007")
    # Serve this worker's Prometheus metrics at /metrics (next to /acp). Off by default: they tell
    # whoever can reach the URL how busy the site is; turn it on where only the scraper can reach
    # it (docs/operations.md).
    METRICS = Flag(False, "acp_channels.E033")

    @classmethod
    def declared(cls) -> dict[str, Setting[Any]]:
        """Every key, in declaration order."""
        return {name: value for name, value in vars(cls).items() if isinstance(value, Setting)}

    def reload(self) -> None:
        """Forget the values read so far: the next read sees the settings as they are now."""
        self.__dict__.clear()

    @staticmethod
    def user_settings() -> dict[str, Any]:
        value = getattr(settings, "ACP_CHANNELS", {})
        return value if isinstance(value, dict) else {}


def settings_from_environment(
    environ: Mapping[str, str] | None = None, prefix: str = "ACP_", *, skip: Collection[str] = ()
) -> dict[str, Any]:
    """`ACP_CHANNELS` keys from environment variables, for a settings module: `<prefix><KEY>`
    sets KEY (`ACP_MAX_CONNECTIONS=500`); a key without a variable (or in `skip`) is left out,
    so it keeps its default. Read by the kind of the key's default: flags are 1/true/yes/on
    (anything else is false), numbers are numbers, `none` is None (no limit), dicts are JSON,
    the rest (dotted paths, the permission) text. ValueError names a variable that does not
    read as its kind."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for key, setting in AcpSettings.declared().items():
        raw = environ.get(f"{prefix}{key}")
        if raw is None or key in skip:
            continue
        # A number whose default is None (no limit) still reads as its kind.
        default = setting.default if setting.default is not None else getattr(setting, "kind", str)(1)
        try:
            if raw.strip().lower() == "none":
                values[key] = None
            elif isinstance(default, bool):
                values[key] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif isinstance(default, dict | list | tuple):
                values[key] = json.loads(raw)
            elif isinstance(default, int | float):
                values[key] = type(default)(raw)
            else:
                values[key] = raw
        except ValueError as error:  # json's JSONDecodeError is one
            kind = type(default).__name__
            raise ValueError(f"{prefix}{key}={raw!r} is not a {kind}: {error}") from None
    return values


#: Every key's default, by name.
DEFAULTS: Final[Mapping[str, Any]] = {name: setting.default for name, setting in AcpSettings.declared().items()}

acp_settings = AcpSettings()


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "ACP_CHANNELS":
        acp_settings.reload()


setting_changed.connect(_settings_changed)
