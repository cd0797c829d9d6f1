"""What operators and their tools ask a worker: is it ready to serve (`/ready`), and its
Prometheus metrics (`/metrics`, when ACP_CHANNELS["METRICS"] is on). `/health` (views.health)
stays a liveness probe: it answers as long as the process does."""

from __future__ import annotations

from typing import Final

from django.http import HttpRequest, HttpResponse

from acp_channels._conf import acp_settings
from acp_channels._lifecycle import lifecycle

#: How long /ready waits for its round trip through the channel layer (a load balancer's probe
#: usually gives up after a few seconds).
READY_TIMEOUT: Final = 1.0
#: Retry-After seconds: a shutdown takes SHUTDOWN_GRACE_SECONDS at most, then another worker
#: (or this one restarted) answers; a channel layer that is down is retried sooner.
RETRY_AFTER_DRAINING: Final = 10
RETRY_AFTER_LAYER: Final = 2
DRAINING: Final = "draining: this worker is shutting down"
LAYER_UNREACHABLE: Final = "channel layer unreachable: {reason}"
AT_CAPACITY: Final = "at capacity: "


def _text(status: int, body: str, retry_after: int | None = None) -> HttpResponse:
    response = HttpResponse(body, status=status, content_type="text/plain; charset=utf-8")
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _refuse_method(request: HttpRequest) -> HttpResponse | None:
    if request.method in ("GET", "HEAD"):
        return None
    response = HttpResponse(status=405)
    response["Allow"] = "GET,HEAD"
    return response


async def ready(request: HttpRequest) -> HttpResponse:
    """GET /ready: 200 `ready` when this worker can take a new connection; else 503 with a
    one-line reason and Retry-After, so a balancer sends new clients elsewhere: it is draining,
    it is at MAX_CONNECTIONS or holds its whole output budget (what initialize would answer), or
    a message through the channel layer to its own inbox did not come back within READY_TIMEOUT."""
    from acp_channels._cluster_admin import ClusterUnreachable, ping_self
    from acp_channels._gateway import ShuttingDown, admission_refusal

    if (refused := _refuse_method(request)) is not None:
        return refused
    if (full := admission_refusal()) is not None:
        if isinstance(full, ShuttingDown):
            return _text(503, DRAINING, RETRY_AFTER_DRAINING)
        return _text(503, f"{AT_CAPACITY}{full.text}", full.retry_after)
    try:
        await ping_self(READY_TIMEOUT)
    except ClusterUnreachable as error:
        return _text(503, LAYER_UNREACHABLE.format(reason=str(error).splitlines()[0]), RETRY_AFTER_LAYER)
    if lifecycle.draining:  # it began while we waited
        return _text(503, DRAINING, RETRY_AFTER_DRAINING)
    return _text(200, "ready")


async def metrics(request: HttpRequest) -> HttpResponse:
    """GET /metrics: this worker's metrics in the Prometheus text format; 404 unless enabled."""
    if acp_settings.METRICS is not True:
        return HttpResponse(status=404)
    if (refused := _refuse_method(request)) is not None:
        return refused
    from acp_channels._metrics import exposition
    from acp_channels._metrics_collector import ScrapeTimeCollector  # noqa: F401  (registered)

    body, content_type = exposition(request.headers.get("accept"))
    return HttpResponse(body, content_type=content_type)
