"""Log levels that fit who caused what.

Django's `django.request` logger reports every response of 400 and above: 4xx at WARNING, 5xx
at ERROR. On the ACP endpoint and its probes most of those are refusals a client caused (a
missing or wrong token, an unknown connection, a cap: 401, 403, 404, 409, 429) or the capacity
answer a balancer acts on (503 with Retry-After), and a burst of them would bury real trouble:
one burst at the connection cap logged 1,007 ERROR lines. `ClientRefusals`, a standard logging
filter installed on `django.request` by the app, lowers those records to INFO. 500s stay ERROR,
and the 503s that mean trouble on our side (the channel layer down, a worker too busy) are
logged at WARNING by the code that meets them.
"""

from __future__ import annotations

import logging
from typing import Final

#: The URL names whose refusals are the client's (acp_channels/urls.py).
OUR_URL_NAMES: Final = frozenset({"acp", "acp-health", "acp-ready", "acp-metrics"})


class ClientRefusals(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        request = getattr(record, "request", None)
        match = getattr(request, "resolver_match", None)
        if (
            isinstance(status, int)
            and (status < 500 or status == 503)
            and record.levelno > logging.INFO
            and getattr(match, "url_name", None) in OUR_URL_NAMES
        ):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def install() -> None:
    """Add the filter to `django.request` (once)."""
    logger = logging.getLogger("django.request")
    if not any(isinstance(existing, ClientRefusals) for existing in logger.filters):
        logger.addFilter(ClientRefusals())
