"""Log levels that fit who caused what.

Django's `django.request` logger reports every response of 400 and above: 4xx at WARNING, 5xx
at ERROR. On the ACP endpoint and its probes most of those are refusals a client caused (a
missing or wrong token, an unknown connection, a cap: 401, 403, 404, 409, 429) or the capacity
answer a balancer acts on (503 with Retry-After), and a burst of them would bury real trouble:
one burst at the connection cap logged 1,007 ERROR lines. `ClientRefusals`, a standard logging
filter installed on `django.request` by the app, lowers those records to INFO. 500s stay ERROR,
and the 503s that mean trouble on our side (the channel layer down, a worker too busy) are
logged at WARNING by the code that meets them.

A refusal our own code has logged already, with its reason (a disallowed Host, a foreign Origin:
acp_channels._cors), is marked with `logged_already(request)`; the filter then drops Django's
line for it, so each refused request costs one line.

What a client can repeat at will and an operator should still hear of (a disallowed Host, which
Django's security logger reports) goes through `RateLimited`: one WARNING per interval and kind,
the repeats at INFO, the next WARNING saying how many there were.

No credential in a log line, ours or a library's the site runs for us: at DEBUG, oauthlib and
django-oauth-toolkit write the authorization codes they issue (the grant, the redirect URL);
`RedactCredentials` on those loggers replaces the values with `[redacted]`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final

#: The URL names whose refusals are the client's (acp_channels/urls.py).
OUR_URL_NAMES: Final = frozenset({"acp", "acp-tickets", "acp-health", "acp-ready", "acp-metrics"})

#: Requests whose refusal our code has logged (weak: a request is forgotten with its response).
_logged: weakref.WeakSet[object] = weakref.WeakSet()


def logged_already(request: object) -> None:
    """Our code has logged why `request` is refused: Django's `django.request` line for its
    response is dropped (one line per refused request)."""
    _logged.add(request)


class ClientRefusals(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        request = getattr(record, "request", None)
        if request is not None and request in _logged:
            return False
        match = getattr(request, "resolver_match", None)
        if (
            isinstance(status, int)
            and (status < 500 or status == 503)
            and record.levelno > logging.INFO
            and getattr(match, "url_name", None) in OUR_URL_NAMES
        ):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


#: The loggers that write credentials at DEBUG (tests/test_auth_recipes.py finds them): oauthlib's
#: "Created authorization code grant {'code': ...}" and "Saving grant ...", django-oauth-toolkit's
#: "Success url for the request: ...?code=...".
CREDENTIAL_LOGGERS: Final = ("oauthlib.oauth2.rfc6749.grant_types.authorization_code", "oauth2_provider")
#: A credential's value after its name: `'code': 'value'` (a dict's repr) or `code=value` (a URL).
_CREDENTIAL: Final = re.compile(
    r"""(?P<name>\b(?:code|access_token|refresh_token|id_token|code_verifier|client_secret|password)['"]?(?:: |=))"""
    r"""(?P<quote>['"]?)[^'"&\s,}]+"""
)


class RedactCredentials(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _CREDENTIAL.sub(r"\g<name>\g<quote>[redacted]", message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def install() -> None:
    """ClientRefusals on `django.request`, RedactCredentials on CREDENTIAL_LOGGERS (once each)."""
    _add_once(logging.getLogger("django.request"), ClientRefusals)
    for name in CREDENTIAL_LOGGERS:
        _add_once(logging.getLogger(name), RedactCredentials)


def _add_once(logger: logging.Logger, kind: type[logging.Filter]) -> None:
    if not any(isinstance(existing, kind) for existing in logger.filters):
        logger.addFilter(kind())


#: Seconds between two WARNINGs of one kind.
RATE_LIMIT_SECONDS: Final = 60.0


class RateLimited:
    """WARNINGs a client can cause at will, at most one per `interval` seconds per kind: the
    repeats within the interval are logged at INFO (nothing is lost where INFO is logged), and
    the next WARNING of the kind says how many there were. A site that logs at WARNING sees one
    line per interval, however hard a client tries."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = RATE_LIMIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        #: kind -> (when its last WARNING was logged, repeats logged at INFO since)
        self._kinds: dict[str, tuple[float, int]] = {}

    def warning(self, kind: str, message: str, *args: object) -> None:
        now = self._clock()
        with self._lock:
            last = self._kinds.get(kind)
            if last is not None and now - last[0] < self.interval:
                self._kinds[kind] = (last[0], last[1] + 1)
                repeated = True
            else:
                self._kinds[kind] = (now, 0)
                repeated = False
        if repeated:
            self.logger.info(message, *args)
        elif last is not None and last[1]:
            self.logger.warning(
                f"{message} (and %d more like it, logged at INFO, in the %.0f s before)", *args, last[1], now - last[0]
            )
        else:
            self.logger.warning(message, *args)
