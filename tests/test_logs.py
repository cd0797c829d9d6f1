"""acp_channels._logs in process: the rate limit of WARNINGs a client can cause (a clock we
move), Django's request line dropped for a refusal we logged ourselves, and the authorization
codes oauthlib and django-oauth-toolkit log at DEBUG redacted."""

from __future__ import annotations

import logging

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils.log import log_response

from acp_channels._logs import CREDENTIAL_LOGGERS, ClientRefusals, RateLimited, logged_already


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def records(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[str, str]]:
    return [(record.levelname, record.getMessage()) for record in caplog.records if record.name == name]


def test_one_warning_per_interval_and_kind_the_repeats_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="test.rate")
    clock = Clock()
    limited = RateLimited(logging.getLogger("test.rate"), interval=60.0, clock=clock)
    for index in range(5):
        limited.warning("host", "bad host %s", index)
    limited.warning("other", "another kind")
    clock.now += 59.0
    limited.warning("host", "bad host %s", 5)
    clock.now += 1.0
    limited.warning("host", "bad host %s", 6)
    clock.now += 61.0
    limited.warning("host", "bad host %s", 7)
    assert records(caplog, "test.rate") == [
        ("WARNING", "bad host 0"),
        ("INFO", "bad host 1"),
        ("INFO", "bad host 2"),
        ("INFO", "bad host 3"),
        ("INFO", "bad host 4"),
        ("WARNING", "another kind"),
        ("INFO", "bad host 5"),
        ("WARNING", "bad host 6 (and 5 more like it, logged at INFO, in the 60 s before)"),
        ("WARNING", "bad host 7"),
    ]


def test_a_refusal_we_logged_is_not_logged_again_by_django(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="django.request")
    logger = logging.getLogger("django.request")
    refusals = ClientRefusals()
    logger.addFilter(refusals)
    try:
        factory = RequestFactory()
        ours, other = factory.post("/acp"), factory.post("/acp")
        logged_already(ours)
        for request in (ours, other):
            log_response("Forbidden: %s", request.path, response=HttpResponse(status=403), request=request)
    finally:
        logger.removeFilter(refusals)
    assert records(caplog, "django.request") == [("WARNING", "Forbidden: /acp")]  # other's; not resolved: as is


def test_the_oauth_libraries_debug_lines_show_no_authorization_code(caplog: pytest.LogCaptureFixture) -> None:
    """Their lines as oauthlib and django-oauth-toolkit write them (the app installed the filter
    on those loggers): the code's value is redacted, the rest of the line stays."""
    grant_logger, dot_logger = CREDENTIAL_LOGGERS
    for name in CREDENTIAL_LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    grant = {"code": "Kx9tQz3mL0aPq7", "state": "s1"}
    logging.getLogger(grant_logger).debug("Created authorization code grant %r for request %r.", grant, "R")
    success = "http://127.0.0.1:5/callback?code=Kx9tQz3mL0aPq7&state=s1"
    logging.getLogger(dot_logger).debug(f"Success url for the request: {success}")
    logging.getLogger(dot_logger).debug("grant_type=authorization_code&code=Kx9tQz3mL0aPq7&code_verifier=v3r1f13r")
    assert [message for _, message in records(caplog, grant_logger) + records(caplog, dot_logger)] == [
        "Created authorization code grant {'code': '[redacted]', 'state': 's1'} for request 'R'.",
        "Success url for the request: http://127.0.0.1:5/callback?code=[redacted]&state=s1",
        "grant_type=authorization_code&code=[redacted]&code_verifier=[redacted]",
    ]
