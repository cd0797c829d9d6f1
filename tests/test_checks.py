"""System checks for ACP_CHANNELS (acp_channels.E001...E033, W001...W004)."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from corsheaders.defaults import default_headers
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from acp_channels._checks import check_settings
from acp_channels._conf import DEFAULTS, AcpSettings, acp_settings
from acp_channels._cors import ACP_ALLOW_HEADERS, ACP_EXPOSE_HEADERS, cors_allow_headers

#: Referenced by ACP_CHANNELS["AGENT"] in a test: importable, but not callable.
NOT_CALLABLE = "an agent factory must be callable"

ORIGIN = "https://editor.example"


def check_ids() -> list[str]:
    return [message.id for message in check_settings()]  # type: ignore[misc]


def acp(settings: Any, **values: Any) -> None:
    """Set keys of ACP_CHANNELS, keeping the demo's other keys."""
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, **values}


def drop(settings: Any, key: str) -> None:
    settings.ACP_CHANNELS = {k: v for k, v in settings.ACP_CHANNELS.items() if k != key}


def test_demo_settings_are_clean() -> None:
    assert check_settings() == []


def test_demo_settings_with_cors_origins_are_clean(settings: Any) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN, "http://localhost:3000", "http://[::1]:8080"])
    assert check_settings() == []


# --------------------------------------------------------------------------------------------
# E000 / E001: the setting itself and AGENT


def test_acp_channels_not_a_dict(settings: Any) -> None:
    settings.ACP_CHANNELS = ["demo_project.agent.create_agent"]
    assert check_ids() == ["acp_channels.E000"]


def test_agent_missing_when_acp_channels_is_absent(settings: Any) -> None:
    acp_settings.ALLOW_ANONYMOUS  # noqa: B018  (read, and kept, as an earlier test may have)
    del settings.ACP_CHANNELS
    # pytest-django sends no setting_changed for a deleted setting: without this the values read
    # before would stay (the test failed when a test before it in its xdist worker had read them)
    acp_settings.reload()
    messages = check_settings()
    # ...and nothing says who may use the endpoint (DEBUG is False here).
    assert [m.id for m in messages] == ["acp_channels.E001", "acp_channels.W004"]
    assert isinstance(messages[0], Error)
    assert messages[0].msg == "ACP_CHANNELS['AGENT'] is not set."


@pytest.mark.parametrize("value", [None, "", 17, ["demo_project.agent.create_agent"]], ids=repr)
def test_agent_not_set(settings: Any, value: Any) -> None:
    acp(settings, AGENT=value)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E001"]
    assert messages[0].msg == "ACP_CHANNELS['AGENT'] is not set."


def test_agent_key_missing(settings: Any) -> None:
    drop(settings, "AGENT")
    assert check_ids() == ["acp_channels.E001"]


@pytest.mark.parametrize(
    "path",
    ["no_such_module.create", "demo_project.agent.no_such_factory", "demo_project", "demo_project.nope.x"],
)
def test_agent_unimportable(settings: Any, path: str) -> None:
    acp(settings, AGENT=path)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E001"]
    assert messages[0].msg.startswith(f"ACP_CHANNELS['AGENT'] = {path!r} cannot be imported: ")


def test_agent_not_callable(settings: Any) -> None:
    acp(settings, AGENT="tests.test_checks.NOT_CALLABLE")
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E001"]
    assert messages[0].msg == "ACP_CHANNELS['AGENT'] = 'tests.test_checks.NOT_CALLABLE' is not callable."


@pytest.mark.parametrize(
    "path", ["demo_project.agent.create_agent", "demo_project.agent.DemoAgent", "tests.wire_agent.create"]
)
def test_agent_callables_pass(settings: Any, path: str) -> None:
    acp(settings, AGENT=path)
    assert check_settings() == []


# --------------------------------------------------------------------------------------------
# E002-E006: numbers

INT_SETTINGS = [
    ("MAX_BODY_BYTES", "acp_channels.E002"),
    ("MAX_BUFFERED_BYTES", "acp_channels.E004"),
    ("MAX_WORKER_BUFFERED_BYTES", "acp_channels.E015"),
    ("MAX_SESSION_STREAMS", "acp_channels.E016"),
    ("MAX_PENDING_REQUESTS", "acp_channels.E017"),
    ("MAX_BATCH_ENTRIES", "acp_channels.E018"),
]
FLOAT_SETTINGS = [
    ("KEEPALIVE_SECONDS", "acp_channels.E003"),
    ("INITIALIZE_TIMEOUT", "acp_channels.E005"),
    ("HEADER_TIMEOUT_SECONDS", "acp_channels.E019"),
    ("BODY_TIMEOUT_SECONDS", "acp_channels.E020"),
]
OPTIONAL = {"INITIALIZE_TIMEOUT", "MAX_CONNECTIONS", "MAX_STDIO_AGENTS"}
ALL_NUMBERS = [
    *INT_SETTINGS,
    *FLOAT_SETTINGS,
    ("MAX_CONNECTIONS", "acp_channels.E006"),
    ("MAX_STDIO_AGENTS", "acp_channels.E040"),
]


@pytest.mark.parametrize(("key", "check_id"), ALL_NUMBERS)
@pytest.mark.parametrize("bad", [0, -1, -0.5, "10", True, False, [1]], ids=repr)
def test_numbers_must_be_positive_numbers(settings: Any, key: str, check_id: str, bad: Any) -> None:
    acp(settings, **{key: bad})
    messages = check_settings()
    assert [m.id for m in messages] == [check_id]
    assert isinstance(messages[0], Error)
    suffix = " or None" if key in OPTIONAL else ""
    kind = "a positive number" if (key, check_id) in FLOAT_SETTINGS else "a positive integer"
    assert messages[0].msg == f"ACP_CHANNELS['{key}'] must be {kind}{suffix}, not {bad!r}."


@pytest.mark.parametrize(("key", "check_id"), [*INT_SETTINGS, ("MAX_CONNECTIONS", "acp_channels.E006")])
def test_integer_settings_refuse_floats(settings: Any, key: str, check_id: str) -> None:
    acp(settings, **{key: 1.5})
    assert check_ids() == [check_id]
    acp(settings, **{key: 1.0})
    assert check_ids() == [check_id]


@pytest.mark.parametrize(("key", "check_id"), ALL_NUMBERS)
def test_positive_values_pass(settings: Any, key: str, check_id: str) -> None:
    acp(settings, **{"MAX_BUFFERED_BYTES": 1, "REPLAY_WINDOW_BYTES": 0, key: 1})
    assert check_settings() == []
    if (key, check_id) in FLOAT_SETTINGS:
        acp(settings, **{key: 0.25})
        assert check_settings() == []


@pytest.mark.parametrize(("key", "check_id"), [*INT_SETTINGS, ("KEEPALIVE_SECONDS", "acp_channels.E003")])
def test_none_is_refused_where_not_optional(settings: Any, key: str, check_id: str) -> None:
    acp(settings, **{key: None})
    assert check_ids() == [check_id]


@pytest.mark.parametrize("key", sorted(OPTIONAL))
def test_none_is_allowed_for_optional_numbers(settings: Any, key: str) -> None:
    acp(settings, **{key: None})
    assert check_settings() == []


def test_every_bad_value_is_reported(settings: Any) -> None:
    acp(
        settings,
        AGENT=None,
        MAX_BODY_BYTES=0,
        KEEPALIVE_SECONDS=0,
        MAX_BUFFERED_BYTES=0,
        INITIALIZE_TIMEOUT=0,
        MAX_CONNECTIONS=0,
        CORS_ALLOWED_ORIGINS="*",
        BOGUS=1,
    )
    assert check_ids() == [
        "acp_channels.E001",
        "acp_channels.E002",
        "acp_channels.E003",
        "acp_channels.E004",
        "acp_channels.E005",
        "acp_channels.E006",
        "acp_channels.E007",
        "acp_channels.W001",
    ]


@pytest.mark.parametrize("value", ["runner", "", None, 2], ids=repr)
def test_agent_hosts_is_workers_or_runners(settings: Any, value: Any) -> None:
    acp(settings, AGENT_HOSTS=value)
    assert check_ids() == ["acp_channels.E038"]


@pytest.mark.parametrize("bad", [-1, "10", None], ids=repr)
def test_runner_drain_seconds_is_a_non_negative_number(settings: Any, bad: Any) -> None:
    acp(settings, RUNNER_DRAIN_SECONDS=bad)
    assert check_ids() == ["acp_channels.E039"]


def test_runners_need_a_shared_channel_layer(settings: Any) -> None:
    acp(settings, AGENT_HOSTS="runners")
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    assert check_ids() == ["acp_channels.E041"]
    settings.CHANNEL_LAYERS = {}
    assert check_ids() == ["acp_channels.E041"]
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "acp_channels.layers.RedisChannelLayer"}}
    assert check_ids() == []


def test_connection_budget_larger_than_worker_budget_warns(settings: Any) -> None:
    acp(settings, MAX_BUFFERED_BYTES=2048, MAX_WORKER_BUFFERED_BYTES=1024)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.W003"]
    assert isinstance(messages[0], Warning)


def test_defaults_are_production_caps() -> None:
    """Safe by default: every cap is on without configuration."""

    for key in ("MAX_CONNECTIONS", "MAX_SESSION_STREAMS", "MAX_PENDING_REQUESTS", "MAX_BATCH_ENTRIES"):
        assert isinstance(DEFAULTS[key], int), key
    assert DEFAULTS["MAX_BUFFERED_BYTES"] <= 8 * 1024 * 1024
    assert DEFAULTS["MAX_BUFFERED_BYTES"] < DEFAULTS["MAX_WORKER_BUFFERED_BYTES"]
    assert DEFAULTS["IDLE_TIMEOUT_SECONDS"] <= 600


# --------------------------------------------------------------------------------------------
# E007-E010: CORS


@pytest.mark.parametrize("value", ["*", ORIGIN, None, {ORIGIN: True}, [ORIGIN, 5], [None]], ids=repr)
def test_origins_must_be_a_list_of_strings(settings: Any, value: Any) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=value)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E007"]
    assert messages[0].msg == "ACP_CHANNELS['CORS_ALLOWED_ORIGINS'] must be a list of origin strings."


def test_origins_may_be_a_tuple(settings: Any) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=(ORIGIN,))
    assert check_settings() == []


@pytest.mark.parametrize(
    "origin",
    [
        "editor.example",
        "*",
        "null",
        "",
        "ftp://editor.example",
        "ws://editor.example",
        "https://",
        "https://editor.example/",
        "https://editor.example/path",
        "//editor.example",
    ],
)
def test_bad_origin_strings(settings: Any, origin: str) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN, origin])
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E007"]
    assert messages[0].msg == f"{origin!r} is not an origin (scheme://host[:port], no path)."


@pytest.mark.parametrize(
    "origin",
    [
        "https://editor.example?x=1",
        "https://editor.example#top",
        "https://user@editor.example",
        "https://editor.example ",
    ],
)
def test_origins_with_extra_parts_are_refused(settings: Any, origin: str) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[origin])
    assert check_ids() == ["acp_channels.E007"]


def test_each_bad_origin_is_reported(settings: Any) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=["a.example", ORIGIN, "https://b.example/x"])
    assert check_ids() == ["acp_channels.E007", "acp_channels.E007"]


def test_cors_needs_the_corsheaders_middleware(settings: Any) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN])
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if not m.endswith("CorsMiddleware")]
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E008"]
    assert messages[0].msg == "CORS_ALLOWED_ORIGINS needs django-cors-headers."


def test_cors_needs_the_corsheaders_app(settings: Any) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN])
    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app != "corsheaders"]
    assert check_ids() == ["acp_channels.E008"]


def test_missing_corsheaders_is_fine_without_origins(settings: Any) -> None:
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if not m.endswith("CorsMiddleware")]
    del settings.CORS_EXPOSE_HEADERS
    del settings.CORS_ALLOW_HEADERS
    assert check_settings() == []


@pytest.mark.parametrize(
    "exposed",
    [None, [], ["acp-connection-id"], ["acp-session-id"], ["content-type"]],
    ids=["unset", "empty", "no-session", "no-connection", "other"],
)
def test_expose_headers_must_include_acp_headers(settings: Any, exposed: list[str] | None) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN])
    if exposed is None:
        del settings.CORS_EXPOSE_HEADERS
    else:
        settings.CORS_EXPOSE_HEADERS = exposed
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E009"]
    assert messages[0].msg == "CORS_EXPOSE_HEADERS must include the ACP response headers."


def test_expose_headers_are_case_insensitive(settings: Any) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN])
    settings.CORS_EXPOSE_HEADERS = ["Acp-Connection-Id", "ACP-SESSION-ID", "x-extra"]
    assert check_settings() == []


@pytest.mark.parametrize("missing", ACP_ALLOW_HEADERS)
def test_allow_headers_must_include_each_acp_header(settings: Any, missing: str) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN])
    settings.CORS_ALLOW_HEADERS = [h for h in (*default_headers, *ACP_ALLOW_HEADERS) if h != missing]
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E010"]
    assert messages[0].msg == "CORS_ALLOW_HEADERS must include the ACP request headers."


def test_allow_headers_default_lacks_acp_headers(settings: Any) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN])
    del settings.CORS_ALLOW_HEADERS  # django-cors-headers' default_headers
    assert check_ids() == ["acp_channels.E010"]


def test_allow_headers_are_case_insensitive(settings: Any) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN])
    settings.CORS_ALLOW_HEADERS = [h.upper() for h in ACP_ALLOW_HEADERS]
    assert check_settings() == []


def test_all_cors_problems_at_once(settings: Any) -> None:
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN, "bad"])
    settings.MIDDLEWARE = []
    settings.CORS_EXPOSE_HEADERS = []
    settings.CORS_ALLOW_HEADERS = []
    assert check_ids() == ["acp_channels.E007", "acp_channels.E008", "acp_channels.E009", "acp_channels.E010"]


def test_cors_header_constants() -> None:
    assert ACP_EXPOSE_HEADERS == ("acp-connection-id", "acp-session-id")
    assert set(ACP_ALLOW_HEADERS) >= {"content-type", "acp-connection-id", "acp-session-id", "accept"}


# --------------------------------------------------------------------------------------------
# W001, W002


def test_unknown_key_warns(settings: Any) -> None:
    acp(settings, KEEPALIVE=5, agent="lowercase")
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.W001", "acp_channels.W001"]
    assert all(isinstance(m, Warning) and not isinstance(m, Error) for m in messages)
    assert messages[0].msg == "ACP_CHANNELS has an unknown key 'KEEPALIVE'."
    assert messages[1].msg == "ACP_CHANNELS has an unknown key 'agent'."
    assert "KEEPALIVE_SECONDS" in (messages[0].hint or "")


def test_gzip_middleware_warns(settings: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.W002"]
    assert isinstance(messages[0], Warning)
    assert messages[0].msg == "GZipMiddleware compresses the SSE stream of /acp, which delays events."


# --------------------------------------------------------------------------------------------
# through manage.py check


def test_check_command_passes_with_demo_settings() -> None:
    out = StringIO()
    call_command("check", stdout=out, stderr=StringIO())
    assert "System check identified no issues" in out.getvalue()


def test_check_command_fails_on_a_bad_setting(settings: Any) -> None:
    acp(settings, MAX_BODY_BYTES=-1, SURPRISE=True)
    with pytest.raises(SystemCheckError) as raised:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    report = str(raised.value)
    assert "acp_channels.E002" in report
    assert "ACP_CHANNELS['MAX_BODY_BYTES'] must be a positive integer, not -1." in report
    assert "acp_channels.W001" in report


def test_check_command_reports_warnings_without_failing(settings: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "acp_channels.W002" in out.getvalue() + err.getvalue()


# --------------------------------------------------------------------------------------------
# E021-E028, W004: authentication

STDIO_AGENT = {"command": ["python", "-c", "pass"]}
DJANGO_USER = "acp_channels.auth.django_user"
BEARER = "acp_channels.auth.bearer_token"
SETTINGS_TOKENS = "acp_channels.auth.settings_tokens"
SESSION_APPS = ["django.contrib.auth", "django.contrib.sessions"]
SESSION_MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]


def unauthenticated(settings: Any, **values: Any) -> None:
    """The demo's settings without its explicit ALLOW_ANONYMOUS."""
    drop(settings, "ALLOW_ANONYMOUS")
    acp(settings, **values)


def with_sessions(settings: Any) -> None:
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "django.contrib.sessions"]
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, *SESSION_MIDDLEWARE]


@pytest.mark.parametrize("key", ["AUTHENTICATE", "TOKEN_LOOKUP", "REVALIDATE"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("no_such_module.auth", "cannot be imported"),
        ("tests.test_checks.NOT_CALLABLE", "is not callable"),
        (17, "must be a dotted path to a callable"),
        ("", "must be a dotted path to a callable"),
    ],
    ids=["unimportable", "not-callable", "number", "empty"],
)
def test_authentication_callables_must_be_importable(settings: Any, key: str, value: Any, message: str) -> None:
    """An error with a hint that says what the setting must name."""
    acp(settings, **{key: value})
    check_id, named = {
        "AUTHENTICATE": ("acp_channels.E021", "acp_channels.auth.django_user"),
        "TOKEN_LOOKUP": ("acp_channels.E022", "acp_channels.tokens"),
        "REVALIDATE": ("acp_channels.E061", "principals"),
    }[key]
    messages = check_settings()
    assert [m.id for m in messages] == [check_id]
    assert isinstance(messages[0], Error) and message in messages[0].msg
    assert messages[0].hint is not None and named in messages[0].hint


def test_bearer_token_with_a_lookup_is_clean(settings: Any) -> None:
    acp(settings, AUTHENTICATE=BEARER, TOKEN_LOOKUP="tests.auth_fixtures.lookup")
    assert check_settings() == []


def test_bearer_token_needs_a_lookup(settings: Any) -> None:
    acp(settings, AUTHENTICATE=BEARER)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E022"]
    assert messages[0].msg == "The bearer_token authenticator needs ACP_CHANNELS['TOKEN_LOOKUP']."


@pytest.mark.parametrize("value", ["use_agent", "acp.", ".use", "acp.use agent", 5, ["acp.use"]], ids=repr)
def test_required_permission_form(settings: Any, value: Any) -> None:
    acp(settings, REQUIRED_PERMISSION=value)
    assert check_ids() == ["acp_channels.E023"]


def test_required_permission_accepts_app_label_codename(settings: Any) -> None:
    acp(settings, REQUIRED_PERMISSION="acp.use_agent")
    assert check_settings() == []


@pytest.mark.parametrize(
    "tokens", [["secret"], {"": "team"}, {"secret": ""}, {"secret": 5}, {5: "team"}, "secret=team"], ids=repr
)
def test_tokens_must_be_a_dict_of_strings(settings: Any, tokens: Any) -> None:
    acp(settings, TOKENS=tokens)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E024"]
    assert "secret" not in messages[0].msg  # a check never prints a token


def test_settings_tokens_lookup_needs_tokens(settings: Any) -> None:
    acp(settings, AUTHENTICATE=BEARER, TOKEN_LOOKUP=SETTINGS_TOKENS)
    assert check_ids() == ["acp_channels.E024"]
    acp(settings, TOKENS={"a-long-secret": "team"})
    assert check_settings() == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, "32", True], ids=repr)
def test_max_connections_per_principal(settings: Any, bad: Any) -> None:
    acp(settings, MAX_CONNECTIONS_PER_PRINCIPAL=bad)
    assert check_ids() == ["acp_channels.E025"]
    acp(settings, MAX_CONNECTIONS_PER_PRINCIPAL=None)  # no per-principal cap, as MAX_CONNECTIONS
    assert check_settings() == []


@pytest.mark.parametrize("bad", [1, "yes", None], ids=repr)
def test_allow_anonymous_must_be_a_bool(settings: Any, bad: Any) -> None:
    acp(settings, ALLOW_ANONYMOUS=bad, AUTHENTICATE=DJANGO_USER)
    with_sessions(settings)
    assert check_ids() == ["acp_channels.E026"]


def test_no_authentication_warns_when_debug_is_off(settings: Any) -> None:
    settings.DEBUG = False
    unauthenticated(settings)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.W004"]
    assert isinstance(messages[0], Warning) and not isinstance(messages[0], Error)


def test_no_authentication_is_quiet_in_debug(settings: Any) -> None:
    settings.DEBUG = True
    unauthenticated(settings)
    assert check_settings() == []


def test_explicit_anonymous_access_is_quiet(settings: Any) -> None:
    settings.DEBUG = False
    acp(settings, ALLOW_ANONYMOUS=True)
    assert check_settings() == []


@pytest.mark.parametrize("debug", [False, True])
def test_stdio_agent_without_authentication_is_an_error(settings: Any, debug: bool) -> None:
    settings.DEBUG = debug
    unauthenticated(settings, AGENT=STDIO_AGENT)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E027"]
    assert isinstance(messages[0], Error)


def test_stdio_agent_with_authentication_or_explicit_anonymous_passes(settings: Any) -> None:
    unauthenticated(settings, AGENT=STDIO_AGENT, AUTHENTICATE=BEARER, TOKEN_LOOKUP="tests.auth_fixtures.lookup")
    assert check_settings() == []
    drop(settings, "AUTHENTICATE")
    acp(settings, ALLOW_ANONYMOUS=True)
    assert check_settings() == []


@pytest.mark.parametrize("missing", ["django.contrib.sessions", "django.contrib.auth", "AuthenticationMiddleware"])
def test_django_user_needs_sessions_and_auth(settings: Any, missing: str) -> None:
    acp(settings, AUTHENTICATE=DJANGO_USER)
    with_sessions(settings)
    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app != missing]
    settings.MIDDLEWARE = [entry for entry in settings.MIDDLEWARE if not entry.endswith(missing)]
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E028"]
    assert missing in messages[0].msg


def test_django_user_with_sessions_is_clean(settings: Any) -> None:
    acp(settings, AUTHENTICATE=DJANGO_USER, REQUIRED_PERMISSION="auth.view_user")
    with_sessions(settings)
    assert check_settings() == []


# E029-E031: the replay window


@pytest.mark.parametrize(
    ("key", "check_id"), [("REPLAY_WINDOW_EVENTS", "acp_channels.E029"), ("REPLAY_WINDOW_BYTES", "acp_channels.E030")]
)
@pytest.mark.parametrize("bad", [-1, 1.5, "10", None, True])
def test_replay_window_sizes_are_non_negative_integers(settings: Any, key: str, check_id: str, bad: Any) -> None:
    acp(settings, **{key: bad})
    assert check_ids() == [check_id]
    acp(settings, **{key: 0})  # zero: no replay (a dropped stream cannot resume)
    assert check_settings() == []


def test_the_replay_window_must_fit_in_the_connection_budget(settings: Any) -> None:
    acp(settings, MAX_BUFFERED_BYTES=1024 * 1024, REPLAY_WINDOW_BYTES=1024 * 1024)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E031"]
    assert "must be less than MAX_BUFFERED_BYTES" in messages[0].msg
    acp(settings, REPLAY_WINDOW_BYTES=1024 * 1024 - 1)
    assert check_settings() == []


# E032: how long a dropped WebSocket's connection waits for a reattach


@pytest.mark.parametrize("bad", [-1, -0.5, "60", None, True, [60]], ids=repr)
def test_websocket_resume_seconds_is_a_non_negative_number(settings: Any, bad: Any) -> None:
    acp(settings, WEBSOCKET_RESUME_SECONDS=bad)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E032"]
    assert messages[0].msg == f"ACP_CHANNELS['WEBSOCKET_RESUME_SECONDS'] must be a non-negative number, not {bad!r}."


@pytest.mark.parametrize("good", [0, 0.5, 60, 3600.0])
def test_websocket_resume_seconds_may_be_zero(settings: Any, good: float) -> None:
    acp(settings, WEBSOCKET_RESUME_SECONDS=good)  # zero: the connection ends with its socket
    assert check_settings() == []


def test_allow_headers_hint_names_each_header_once(settings: Any) -> None:
    """The E010 hint once concatenated django-cors-headers' defaults with ours, listing `accept`
    and `content-type` twice; following it now passes the check with every name once."""
    acp(settings, CORS_ALLOWED_ORIGINS=[ORIGIN])
    del settings.CORS_ALLOW_HEADERS
    (message,) = check_settings()
    assert "cors_allow_headers(" in (message.hint or "") and "*" not in (message.hint or "")
    settings.CORS_ALLOW_HEADERS = cors_allow_headers(default_headers)
    assert check_settings() == []


def test_cors_allow_headers_lists_each_name_once_defaults_first() -> None:
    merged = cors_allow_headers(default_headers, ["X-Site-Header", "Accept"])
    assert len(merged) == len(set(merged))
    assert merged[: len(default_headers)] == tuple(default_headers)
    assert set(merged) == {*default_headers, "x-site-header", *ACP_ALLOW_HEADERS}


# E033: Prometheus metrics at /metrics


@pytest.mark.parametrize("bad", [1, "yes", None, "True"], ids=repr)
def test_metrics_is_a_boolean(settings: Any, bad: Any) -> None:
    acp(settings, METRICS=bad)
    messages = check_settings()
    assert [m.id for m in messages] == ["acp_channels.E033"]
    assert messages[0].msg == f"ACP_CHANNELS['METRICS'] must be True or False, not {bad!r}."


@pytest.mark.parametrize("good", [True, False])
def test_metrics_may_be_on_or_off(settings: Any, good: bool) -> None:
    acp(settings, METRICS=good)
    assert check_settings() == []


# --------------------------------------------------------------------------------------------
# Typed settings: each rule comes from its declaration (conf.AcpSettings)

RULED = [name for name, setting in AcpSettings.declared().items() if setting.problem("x") is not None]


def test_every_setting_is_declared_with_a_check_id() -> None:
    declared = AcpSettings.declared()
    assert list(declared) == list(DEFAULTS)
    assert all(setting.check_id and setting.check_id.startswith("acp_channels.E") for setting in declared.values())
    assert {"MAX_BODY_BYTES", "METRICS", "MAX_CONNECTIONS", "WEBSOCKET_RESUME_SECONDS"} <= set(RULED)


@pytest.mark.parametrize("name", RULED)
def test_a_declared_rule_is_its_system_check(settings: Any, name: str) -> None:
    acp(settings, **{name: "x"})
    errors = [message for message in check_settings() if isinstance(message, Error)]
    assert [error.id for error in errors] == [AcpSettings.declared()[name].check_id]
    assert errors[0].msg.startswith(f"ACP_CHANNELS['{name}'] must be ")


# --------------------------------------------------------------------------------------------
# Issue 28's named cases: each a system check error with a hint


def issue_28_messages(settings: Any, monkeypatch: pytest.MonkeyPatch, case: str) -> list[Any]:
    """The messages of the checks that concern `case`, with the demo's settings changed as it says."""
    from acp_channels import _oauth_checks
    from acp_channels._startup import check_required_permission
    from acp_channels._tickets import check_tickets

    if case == "authenticator-unimportable":
        acp(settings, AUTHENTICATE="mysite.auth.nowhere")
    elif case == "token-lookup-unimportable":
        acp(settings, AUTHENTICATE=BEARER, TOKEN_LOOKUP="mysite.tokens.nowhere")
    elif case == "revalidate-unimportable":
        acp(settings, REVALIDATE="mysite.tokens.nowhere")
    elif case in ("permission-of-no-app", "permission-no-model-declares"):
        with_sessions(settings)
        permission = "agents.use_agent" if case == "permission-of-no-app" else "auth.use_agent"
        acp(settings, AUTHENTICATE=DJANGO_USER, REQUIRED_PERMISSION=permission)
        return check_required_permission()
    elif case == "oauth-without-the-extra":
        acp(settings, AUTHENTICATE="acp_channels.oauth.access_token")
        monkeypatch.setattr(_oauth_checks.importlib.util, "find_spec", lambda name, *args: None)
        return _oauth_checks.check_oauth()
    elif case in ("tickets-in-one-process", "tickets-in-a-dummy-cache"):
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "acp_channels.layers.RedisChannelLayer"}}
        if case == "tickets-in-a-dummy-cache":
            settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
        return check_tickets()
    return check_settings()


@pytest.mark.parametrize(
    ("case", "check_id", "hinted"),
    [
        ("authenticator-unimportable", "acp_channels.E021", "python -c"),
        ("token-lookup-unimportable", "acp_channels.E022", "acp_channels.tokens"),
        ("revalidate-unimportable", "acp_channels.E061", "leave REVALIDATE unset"),
        ("permission-of-no-app", "acp_channels.E035", "Meta.permissions"),
        ("permission-no-model-declares", "acp_channels.E035", "only superusers are let in"),
        ("oauth-without-the-extra", "acp_channels.E073", "pip install 'acp-channels[oauth]'"),
        ("tickets-in-one-process", "acp_channels.E091", "RedisCache"),
        ("tickets-in-a-dummy-cache", "acp_channels.E091", "RedisCache"),
    ],
)
def test_issue_28s_cases_are_errors_with_hints(
    settings: Any, monkeypatch: pytest.MonkeyPatch, case: str, check_id: str, hinted: str
) -> None:
    """An authenticator, token lookup or REVALIDATE check that cannot be imported; a permission
    that does not exist (the demo has no database: `check` tells from the code alone; with one,
    an undeclared codename is looked up at the start, tests/test_startup_checks.py); the OAuth
    settings without django-oauth-toolkit; WebSocket tickets in one process's memory (or none)
    while a Redis channel layer says there are several workers."""
    [message] = issue_28_messages(settings, monkeypatch, case)
    assert message.id == check_id and isinstance(message, Error), message
    assert message.hint is not None and hinted in message.hint, message.hint
